"""The lake's state and rejected tables of upsert and debezium topics, as ISK reads them.

The pipeline keeps a topic's state table in ``lake.current_namespace`` and the records it could
not apply in ``lake.rejected_namespace`` (see :mod:`bergstream.pipeline.state_table`). For each
snapshot ISK serves over one, it needs the table's data files and position delete files
(PyIceberg ``DataFile``\\ s, to re-publish under gateway keys), its boundary (the log offsets it
has applied) and, for a state table, the index of its live rows (which row each key has), so
that it can delete the rows the records not yet in the lake replace. A snapshot's reading is
kept (a few per table), and each data file's keys are read once
(:class:`~bergstream.core.api.FileRowsCache`).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from bergstream.core.api import (
    Boundary,
    FileRowsCache,
    ResolvedLake,
    StateIndex,
    StateLayout,
    boundary_of_ancestry,
    read_state_snapshot,
    state_identities,
)
from bergstream.plugins.isk_gateway.tables.lake_schemas import open_lake_catalog
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile, ProviderUnavailable

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

__all__ = ["LakeState", "LakeStates"]

#: Snapshots' readings kept per process (each holds its index: about 30 bytes and the key per
#: live row, 40 MB for a million rows of 16-byte keys).
_KEPT_SNAPSHOTS = 8


@dataclass(frozen=True)
class LakeState:
    """One snapshot of a topic's state (or rejected) table in the lake."""

    topic: str
    namespace: str
    snapshot_id: int | None
    timestamp_ms: int
    #: The log offsets the snapshot has applied (next offset per partition).
    boundary: Boundary
    location: str
    io: FileIO = field(repr=False)
    #: Live data files and the position delete files that apply to them (PyIceberg).
    data_files: list[Any] = field(default_factory=list, repr=False)
    delete_files: list[Any] = field(default_factory=list, repr=False)
    #: A state table's live rows (None for a rejected table).
    index: StateIndex | None = field(default=None, repr=False)
    #: Every snapshot the table still has.
    snapshot_ids: frozenset[int] = frozenset()
    schema: Schema | None = None


def _ancestry(table: Table, snapshot_id: int | None) -> Iterator[dict[str, str] | None]:
    metadata = table.metadata
    snapshot = metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    seen: set[int] = set()
    while snapshot is not None and snapshot.snapshot_id not in seen:
        seen.add(snapshot.snapshot_id)
        yield dict(snapshot.summary.additional_properties) if snapshot.summary else None
        if snapshot.parent_snapshot_id is None:
            return
        snapshot = metadata.snapshot_by_id(snapshot.parent_snapshot_id)


class LakeStates:
    """Reads the state and rejected tables of topics from the lake's catalog (PyIceberg)."""

    def __init__(self, lake: ResolvedLake) -> None:
        self.lake = lake
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()
        self._rows = FileRowsCache()
        self._kept: OrderedDict[tuple[Any, ...], LakeState] = OrderedDict()

    def _open(self) -> Catalog:
        with self._lock:
            if self._catalog is None:
                self._catalog = open_lake_catalog(self.lake)
            return self._catalog

    def table(self, namespace: str, topic: str) -> Table | None:
        """The lake table ``namespace.topic``; None if it does not exist."""
        try:
            return self._open().load_table((namespace, topic))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except Exception as error:
            raise ProviderUnavailable(f"the lake table {namespace}.{topic}: {error}") from error

    def read(
        self, namespace: str, topic: str, path: str, start: int | None, end: int | None
    ) -> bytes:
        """Bytes ``[start, end)`` (all for None) of the file at ``path`` under the location of
        the lake table ``namespace.topic``; :class:`NoSuchFile` if there is none."""
        table = self.table(namespace, topic)
        if table is None:
            raise NoSuchFile(f"no table {namespace}.{topic} in the lake")
        location = f"{table.metadata.location.rstrip('/')}/{path}"
        try:
            with table.io.new_input(location).open(seekable=True) as stream:
                if start is None:
                    return stream.read()
                stream.seek(start)
                return stream.read((end or start) - start)
        except FileNotFoundError:
            raise NoSuchFile(f"no file {location!r} in the lake") from None
        except OSError as error:
            raise ProviderUnavailable(f"reading {location!r} from the lake: {error}") from error

    def topics(self, namespace: str) -> list[str]:
        """The tables of ``namespace`` in the lake (topic names)."""
        try:
            identifiers = self._open().list_tables(namespace)
        except NoSuchNamespaceError:
            return []
        except Exception as error:
            raise ProviderUnavailable(f"the lake catalog cannot list tables: {error}") from error
        return sorted(identifier[-1] for identifier in identifiers)

    def _read(
        self,
        namespace: str,
        topic: str,
        layout: StateLayout | None,
        snapshot_id: int | None,
    ) -> LakeState | None:
        table = self.table(namespace, topic)
        if table is None:
            return None
        metadata = table.metadata
        if snapshot_id is None:
            current = metadata.current_snapshot()
            snapshot_id = current.snapshot_id if current else None
        identity = layout.identity if layout is not None else ()
        memo_key = (namespace, topic, snapshot_id, identity, layout.mode if layout else None)
        with self._lock:
            found = self._kept.get(memo_key)
            if found is not None:
                self._kept.move_to_end(memo_key)
                return found
        snapshot = metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
        try:
            read = read_state_snapshot(
                table,
                (lambda rows: state_identities(layout, rows)) if layout is not None else _no_ids,
                identity,
                self._rows,
                snapshot_id,
            )
        except ValueError as error:  # an equality delete file
            raise ProviderUnavailable(str(error)) from error
        state = LakeState(
            topic=topic,
            namespace=namespace,
            snapshot_id=snapshot_id,
            timestamp_ms=snapshot.timestamp_ms if snapshot else metadata.last_updated_ms,
            boundary=boundary_of_ancestry(_ancestry(table, snapshot_id)),
            location=metadata.location,
            io=table.io,
            data_files=read.data_files,
            delete_files=read.delete_files,
            index=read.index if layout is not None else None,
            snapshot_ids=frozenset(s.snapshot_id for s in metadata.snapshots),
            schema=metadata.schema(),
        )
        with self._lock:
            self._kept[memo_key] = state
            while len(self._kept) > _KEPT_SNAPSHOTS:
                self._kept.popitem(last=False)
        return state

    async def state(
        self, topic: str, layout: StateLayout, snapshot_id: int | None = None
    ) -> LakeState | None:
        """The state table of ``topic`` at ``snapshot_id`` (None: its current snapshot), with
        the index of its live rows named as ``layout`` names them; None if the lake has no
        state table for the topic."""
        return await asyncio.to_thread(
            self._read, self.lake.current_namespace, topic, layout, snapshot_id
        )

    async def rejected(self, topic: str, snapshot_id: int | None = None) -> LakeState | None:
        """The rejected table of ``topic`` (its current snapshot, or ``snapshot_id``); None
        if the lake has none."""
        return await asyncio.to_thread(
            self._read, self.lake.rejected_namespace, topic, None, snapshot_id
        )


def _no_ids(rows: Any) -> Any:
    import pyarrow as pa

    return pa.nulls(rows.num_rows, pa.large_binary())
