"""A typed topic's layout as ISK builds files with it: the table schema, the decoder of its rows,
and the digest naming both in data keys, index names and snapshot ids.

A topic whose values (or keys) a codec rule types (the ``codecs:`` section) gets the typed
columns of a :class:`~bergstream.core.api.TypedLayout` in its hotset files: the row contract's
columns, then the schema id and error columns and the value's (key's) fields. Everything a file's
bytes depend on beyond the log enters :attr:`TypedTopic.digest`: the layout's fingerprint (its
schema with ids, accepted and rejected schema ids), the codec rule and
:data:`TYPED_LAYOUT_VERSION`. A data key carries the digest, so a file of one layout is never
served under a key of another (a new schema version, a changed coldset schema, other codec
settings), and a file rebuilt from its key has the bytes its manifest states.

Decoding never turns a registry outage into rows: ``RegistryUnavailable`` becomes
:class:`~..tables.provider.ProviderUnavailable` (retry later) and no file is built.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema

from bergstream.core.api import (
    KEY_ERROR_COLUMN,
    VALUE_ERROR_COLUMN,
    RegistryUnavailable,
    SchemaRegistryError,
    TypedLayout,
    TypedRows,
    report_undecodable,
)
from bergstream.plugins.isk_gateway.tables.paths import LAYOUT_DIGEST_LENGTH
from bergstream.plugins.isk_gateway.tables.provider import ProviderUnavailable, TableNotServable

__all__ = ["TYPED_LAYOUT_VERSION", "TypedTopic", "layout_digest"]

#: Bumped whenever ISK writes other bytes for the same typed rows (enters every digest).
TYPED_LAYOUT_VERSION = 1


def layout_digest(layout: TypedLayout, rule: Mapping[str, object]) -> str:
    """The digest of a layout and the codec rule decoding into it (hex, data-key length)."""
    text = json.dumps(
        [TYPED_LAYOUT_VERSION, layout.fingerprint, rule], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:LAYOUT_DIGEST_LENGTH]


@dataclass
class TypedTopic:
    """One topic's typed layout and the decoder of its rows (shared by every file built with
    it; thread-safe)."""

    topic: str
    layout: TypedLayout
    rows: TypedRows
    digest: str
    #: Per partition, the highest offset whose undecodable records were counted already: files
    #: are built again (unsealed tails, cache misses), records are counted once per layout.
    _counted: dict[int, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def schema(self) -> Schema:
        """The table schema: the row contract's columns, then the typed columns."""
        return self.layout.schema

    @property
    def last_column_id(self) -> int:
        """The table's last column id."""
        return self.layout.last_column_id

    @property
    def properties(self) -> dict[str, str]:
        """``bergstream.schema.<id>`` of every schema of the layout (KSI rebuilds bytes from
        them with the registry gone)."""
        return self.layout.schema_properties()

    def decode(self, rows: pa.Table) -> pa.Table:
        """``rows`` (``ROW_ARROW_SCHEMA``) decoded into the layout's columns; undecodable ones
        keep their bytes and say why. A registry outage raises
        :class:`~..tables.provider.ProviderUnavailable` (nothing is built from a guess)."""
        try:
            decoded = self.rows.decode(rows)
        except RegistryUnavailable as error:
            raise ProviderUnavailable(
                f"the Schema Registry cannot be reached to decode topic {self.topic!r}: {error}"
            ) from error
        except SchemaRegistryError as error:
            raise TableNotServable(
                f"the Schema Registry refused a request for topic {self.topic!r}: {error}"
            ) from error
        if decoded.causes:
            self._count_undecodable(decoded.table)
        return decoded.table

    def _count_undecodable(self, table: pa.Table) -> None:
        """Count and log (once per cause) the undecodable records of ``table`` not counted yet."""
        offsets = np.asarray(table.column("kafka_offset").to_numpy())
        partitions = np.asarray(table.column("kafka_partition").to_numpy())
        fresh = np.zeros(len(offsets), bool)
        with self._lock:
            for partition in np.unique(partitions):
                rows = partitions == partition
                seen = self._counted.get(int(partition), -1)
                fresh |= rows & (offsets > seen)
                self._counted[int(partition)] = max(seen, int(offsets[rows].max()))
        if not fresh.any():
            return
        causes: Counter[tuple[str, str]] = Counter()
        mask = pa.array(fresh)
        for side, column in (("value", VALUE_ERROR_COLUMN), ("key", KEY_ERROR_COLUMN)):
            if column not in table.column_names:
                continue
            errors = pc.filter(table.column(column), mask)
            if errors.null_count == len(errors):
                continue
            for item in pc.value_counts(errors.drop_null()).to_pylist():
                causes[(side, item["values"])] += item["counts"]
        report_undecodable("isk", self.topic, causes)
