"""The schema a topic's typed layout starts from: its coldset table's, or the row contract's.

The hotset of a topic the pipeline copies takes the coldset's columns (ids included) so that
``merged`` is one schema; a topic without a coldset table starts from the row contract.
:class:`LakeSchemas` reads a coldset table's schema, last column id and ``bergstream.schema.*``
properties with PyIceberg, kept for a few seconds (the background indexer and every hotset
LoadTable ask), and refreshed whenever the coldset or merged namespace loads the table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.schema import Schema

from bergstream.core.api import ROW_SCHEMA, SCHEMA_PROPERTY_PREFIX, ResolvedLake, load_catalog
from bergstream.plugins.isk_gateway.tables.provider import ProviderUnavailable

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table.metadata import TableMetadata

__all__ = ["CONTRACT_BASE", "BaseSchema", "LakeSchemas", "base_of"]

#: Seconds a coldset table's schema is reused before it is read again.
_TTL_SECONDS = 5.0


@dataclass(frozen=True)
class BaseSchema:
    """A table's current schema and what else a layout keeps from it."""

    schema: Schema
    last_column_id: int
    #: the table's ``bergstream.schema.<id>`` properties
    properties: Mapping[str, str] = field(default_factory=dict)


#: The base of a topic without a coldset table: the row contract.
CONTRACT_BASE = BaseSchema(ROW_SCHEMA, ROW_SCHEMA.highest_field_id)


def base_of(metadata: TableMetadata) -> BaseSchema:
    """The base a coldset table's metadata gives."""
    return BaseSchema(
        metadata.schema(),
        metadata.last_column_id,
        {k: v for k, v in metadata.properties.items() if k.startswith(SCHEMA_PROPERTY_PREFIX)},
    )


class LakeSchemas:
    """Coldset tables' bases, by topic (thread-safe; call from worker threads)."""

    def __init__(self, lake: ResolvedLake, clock: Callable[[], float] = time.monotonic) -> None:
        self.lake = lake
        self._clock = clock
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, BaseSchema | None]] = {}

    def remember(self, topic: str, base: BaseSchema | None) -> None:
        """A base just read by someone else (the coldset or merged namespace's load)."""
        with self._lock:
            self._known[topic] = (self._clock(), base)

    def base(self, topic: str) -> BaseSchema | None:
        """The base of ``topic``'s coldset table; None when the lake has no table for it.
        :class:`ProviderUnavailable` if the lake's catalog cannot answer."""
        with self._lock:
            known = self._known.get(topic)
        if known is not None and self._clock() - known[0] < _TTL_SECONDS:
            return known[1]
        catalog = self._open()
        try:
            table = catalog.load_table(self.lake.table_identifier(topic))
        except (NoSuchTableError, NoSuchNamespaceError):
            found = None
        except Exception as error:
            raise ProviderUnavailable(f"the coldset table of {topic!r}: {error}") from error
        else:
            found = base_of(table.metadata)
        self.remember(topic, found)
        return found

    def _open(self) -> Catalog:
        with self._lock:
            if self._catalog is None:
                self._catalog = open_lake_catalog(self.lake)
            return self._catalog


def open_lake_catalog(lake: ResolvedLake) -> Catalog:
    """The lake's catalog, or :class:`ProviderUnavailable` (a retriable error for clients) when
    it cannot be opened."""
    try:
        return load_catalog(lake)
    except Exception as error:
        raise ProviderUnavailable(f"the lake catalog cannot be opened: {error}") from error
