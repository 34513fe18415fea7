"""The ``rejected`` namespace: every record a topic's tables could not use, with the reason.

``rejected.<topic>`` has the log table's columns and ``reason``:

- for an ``upsert`` or ``debezium`` topic, the records its state could not apply (no key, a key
  that did not decode, a malformed change event, a key in two partitions): those the pipeline
  rejected are in the lake's rejected table (``lake.rejected_namespace``, served under gateway
  keys), those after it the ``current`` namespace's reduction rejects (a rows file per
  snapshot, :class:`~.paths.ChangesKey`);
- for any other topic, the records whose value or key did not decode (typed topics): from the
  log's coldset (a scan that skips every file whose error columns are all null, by their
  statistics) and from Kafka beyond the coldset's boundary (each hot chunk's file read once).

Nothing is dropped: a rejected record also stays in the log tables as it is. ListTables names
the topics known to have rejected records (a lake rejected table, or rows found by a load since
ISK started); LoadTable answers for every topic, an empty table when it has none.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from bergstream.core.api import (
    KEY_ERROR_COLUMN,
    VALUE_ERROR_COLUMN,
    TableMode,
    arrow_type,
    format_boundary,
    rejected_layout,
    rejected_log_rows,
    undecodable_reasons,
)
from bergstream.plugins.isk_gateway.files.data_files import chunk_key
from bergstream.plugins.isk_gateway.files.digests import state_digest
from bergstream.plugins.isk_gateway.files.manifests import ManifestGroup
from bergstream.plugins.isk_gateway.files.state_files import UNPARTITIONED, rows_file
from bergstream.plugins.isk_gateway.files.synthesis import SynthesizedFile
from bergstream.plugins.isk_gateway.files.table_metadata import (
    HOTSET_OFFSETS_PROPERTY,
    SnapshotPlan,
)
from bergstream.plugins.isk_gateway.metrics import ISK_LOAD_TABLES
from bergstream.plugins.isk_gateway.tables.coldset import relative_path, with_path
from bergstream.plugins.isk_gateway.tables.current import CurrentProvider, StateView, conform_rows
from bergstream.plugins.isk_gateway.tables.derived_files import DerivedFiles
from bergstream.plugins.isk_gateway.tables.history import (
    PLAN_ATTEMPTS,
    SnapshotState,
    history_contended,
    history_table_name,
    hot_floor,
    kafka_holds,
)
from bergstream.plugins.isk_gateway.tables.lake_schemas import CONTRACT_BASE
from bergstream.plugins.isk_gateway.tables.lake_states import LakeState
from bergstream.plugins.isk_gateway.tables.paths import (
    HOTSET,
    REJECTED,
    ChangesKey,
    ColdFileKey,
    key_from_uri,
    uri,
)
from bergstream.plugins.isk_gateway.tables.provider import (
    LoadedTable,
    NoSuchFile,
    NoSuchNamespace,
    NoSuchTable,
    ProviderUnavailable,
)

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from bergstream.core.api import ChunkEntry

__all__ = ["RejectedProvider"]

_MAX_INT64 = 2**63 - 1
#: Hot chunks whose rejected rows are kept in memory (all tables).
_KEPT_CHUNKS = 4096
#: Built rejected rows files kept in memory (all tables).
_KEPT_FILES = 64


@dataclass(frozen=True)
class _Rejections:
    """One snapshot of ``rejected.<topic>``: what it lists and the file it adds."""

    snapshot_id: int
    schema: Schema
    last_column_id: int
    lake: LakeState | None
    rows: SynthesizedFile | None
    ends: Mapping[int, int]
    chunks: list[ChunkEntry]
    timestamp_ms: int
    lake_snapshot_id: int | None


class RejectedProvider(DerivedFiles):
    """Serves the ``rejected`` namespace beside a :class:`~.current.CurrentProvider`."""

    def __init__(self, current: CurrentProvider) -> None:
        self.current = current
        self.states = current.states
        self.hotset = current.hotset
        self.cluster = current.cluster
        self.bucket = current.bucket
        self.store = current.store
        #: Topics found to have rejected records since start.
        self._seen: set[str] = set()
        self._chunk_rows: OrderedDict[str, pa.Table] = OrderedDict()
        self._cold_rows: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._built: OrderedDict[str, SynthesizedFile] = OrderedDict()

    # ------------------------------------------------------------------ catalog

    async def list_tables(self, namespace: str) -> list[str]:
        """Topics known to have rejected records."""
        self._check_namespace(namespace)
        topics = set(self._seen)
        states = self.current.states
        if states is not None:
            topics |= set(await asyncio.to_thread(states.topics, states.lake.rejected_namespace))
        return sorted(topics)

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        """The rejected records of topic ``table`` as of now."""
        self._check_namespace(namespace)
        if table.startswith("__"):
            raise NoSuchTable(f"{table!r} is an internal topic, not served as a table")
        for _ in range(PLAN_ATTEMPTS):
            loaded = await self._load(table)
            if loaded is not None:
                ISK_LOAD_TABLES.labels(self.cluster, REJECTED).inc()
                return loaded
        raise ProviderUnavailable(history_contended(REJECTED, table))

    async def _load(self, topic: str) -> LoadedTable | None:
        if self.current.mode_of(topic) is TableMode.APPEND:
            found, offsets, digest = await self._of_log(topic)
        else:
            view = await self.current.view(topic)
            found = await self._of_state(view)
            offsets, digest = view.offsets, view.digest
        name = history_table_name(REJECTED, topic, digest)
        await self.hotset.histories.sync(name)
        plan = self._plan(topic, found)
        lake_ids = found.lake.snapshot_ids if found.lake is not None else frozenset()
        built = await self.hotset.histories.serve(
            name,
            SnapshotState(
                plan,
                found.ends,
                hot_floor(found.chunks),
                found.lake_snapshot_id,
                found.chunks,
                self.hotset.indexer.index_name(topic, None),
            ),
            self.hotset.build,
            servable=lambda snapshot: (
                kafka_holds(snapshot, offsets)
                and (snapshot.cold_snapshot_id is None or snapshot.cold_snapshot_id in lake_ids)
            ),
        )
        if built is None:
            return None
        for older in built:
            await self.hotset.keep_metadata(older)
        if found.rows is not None:
            await self.store.keep(key_from_uri(self.bucket, found.rows.data_file.file_path),
                                  found.rows.parquet)  # fmt: skip
        listing = {key: len(data) for key, data in built[-1].files.items()}
        for file in self._files(topic, found):
            listing[key_from_uri(self.bucket, file.file_path)] = file.file_size_in_bytes
        self.store.set_listing(REJECTED, topic, listing)
        if plan.snapshot_id is not None and int(
            built[-1].metadata["snapshots"][-1]["summary"].get("total-records", "0")
        ):
            self._seen.add(topic)
        return LoadedTable(built[-1].metadata_location, built[-1].metadata)

    # ------------------------------------------------------------------ rejections

    async def _of_state(self, view: StateView) -> _Rejections:
        """An upsert or debezium topic's: the lake's rejected table and what the current
        state's reduction rejects beyond the state's boundary (not yet in that table)."""
        states = self.current.states
        lake = await states.rejected(view.topic) if states is not None else None
        applied = await self.current.applied(view)
        rejected = applied.changes.rejected
        if lake is not None and lake.boundary and rejected.num_rows:
            partitions = rejected.column("kafka_partition").to_numpy(zero_copy_only=False)
            offsets = rejected.column("kafka_offset").to_numpy(zero_copy_only=False)
            floor = np.array([lake.boundary.get(int(p), 0) for p in partitions], dtype=np.int64)
            rejected = rejected.filter(pa.array(offsets >= floor))
        log_schema = view.log_schema
        schema = rejected_layout(log_schema)
        state = [
            view.topic,
            view.snapshot_id,
            lake.snapshot_id if lake is not None else None,
            schema.model_dump(mode="json"),
        ]
        snapshot_id = int(state_digest(state)[:16], 16) & _MAX_INT64 or 1
        rows = self._rows_file(view.topic, snapshot_id, rejected, schema, view.digest)
        timestamp = max(
            view.state.timestamp_ms if view.state is not None else 0,
            lake.timestamp_ms if lake is not None else 0,
        )
        return _Rejections(
            snapshot_id,
            schema,
            max(view.layout.last_column_id, schema.highest_field_id),
            lake,
            rows,
            view.ends,
            view.hot_chunks(),
            timestamp,
            lake.snapshot_id if lake is not None else None,
        )

    async def _of_log(self, topic: str) -> tuple[_Rejections, Mapping[int, object], str | None]:
        """An append topic's: the records of its log whose value or key did not decode."""
        coldset = self.current.coldset
        cold = await coldset.snapshot(topic) if coldset is not None else None
        try:
            offsets = await self.hotset.source.offsets(topic)
        except NoSuchTable:
            if cold is None:
                raise
            offsets = {}
        base = cold.base if cold is not None else CONTRACT_BASE
        typed = None
        layouts = self.hotset.layouts
        if layouts is not None:
            layouts.remember_base(topic, cold.base if cold is not None else None)
            typed = await layouts.resolve(topic, base)
        log_schema = typed.schema if typed is not None else base.schema
        last_column_id = typed.last_column_id if typed is not None else base.last_column_id
        schema = rejected_layout(log_schema)
        arrow_schema = arrow_type(schema)
        floors = cold.boundary if cold is not None else {}
        chunks = await self.hotset.indexer.live_chunks(topic, offsets, floors, typed)
        chunks = [c for c in chunks if c.row_count]
        ends = {p: o.last_stable for p, o in offsets.items()}
        parts: list[pa.Table] = []
        typed_log = any(f.name in (VALUE_ERROR_COLUMN, KEY_ERROR_COLUMN) for f in log_schema.fields)
        if typed_log:
            if cold is not None and cold.snapshot_id is not None:
                parts.append(await self._cold_rejections(topic, cold.snapshot_id, arrow_schema))
            digest = typed.digest if typed is not None else None
            for chunk in chunks:
                key = chunk_key(self.cluster, chunk, self.hotset.unit, HOTSET, digest).key
                parts.append(await self._chunk_rejections(key, arrow_schema))
        rejected = conform_rows(parts, arrow_schema)
        digest = typed.digest if typed is not None else None
        state = [
            topic,
            cold.snapshot_id if cold is not None else None,
            format_boundary(ends),
            digest,
            schema.model_dump(mode="json"),
        ]
        snapshot_id = int(state_digest(state)[:16], 16) & _MAX_INT64 or 1
        rows = self._rows_file(topic, snapshot_id, rejected, schema, digest)
        found = _Rejections(
            snapshot_id,
            schema,
            max(last_column_id, schema.highest_field_id),
            None,
            rows,
            ends,
            chunks,
            cold.timestamp_ms if cold is not None else 0,
            None,
        )
        return found, offsets, digest

    async def _cold_rejections(self, topic: str, snapshot_id: int, schema: pa.Schema) -> pa.Table:
        """The undecodable rows of the log's coldset at ``snapshot_id`` (kept per snapshot)."""
        memo_key = (topic, snapshot_id)
        found = self._cold_rows.get(memo_key)
        if found is not None:
            return found
        coldset = self.current.coldset
        assert coldset is not None

        def scan() -> pa.Table:
            from pyiceberg.expressions import NotNull, Or

            table = coldset.lake_table(topic)
            if table is None:
                return schema.empty_table()
            names = {f.name for f in table.schema().fields}
            nulls = [NotNull(c) for c in (VALUE_ERROR_COLUMN, KEY_ERROR_COLUMN) if c in names]
            if not nulls:
                return schema.empty_table()
            condition = nulls[0] if len(nulls) == 1 else Or(*nulls)
            rows = table.scan(row_filter=condition, snapshot_id=snapshot_id).to_arrow()
            return rejected_log_rows(rows, undecodable_reasons(rows), schema)

        found = await asyncio.to_thread(scan)
        self._cold_rows[memo_key] = found
        while len(self._cold_rows) > _KEPT_FILES:
            self._cold_rows.popitem(last=False)
        return found

    async def _chunk_rejections(self, key: str, schema: pa.Schema) -> pa.Table:
        """The undecodable rows of one hot chunk's file (read once, kept)."""
        found = self._chunk_rows.get(key)
        if found is not None:
            return found
        data = await self.hotset.read_file(key)
        rows = pq.read_table(pa.BufferReader(data))
        errors = [c for c in (VALUE_ERROR_COLUMN, KEY_ERROR_COLUMN) if c in rows.column_names]
        if errors:
            mask = pc.is_valid(rows.column(errors[0]))
            for name in errors[1:]:
                mask = pc.or_(mask, pc.is_valid(rows.column(name)))
            rows = rows.filter(mask)
        else:
            rows = rows.slice(0, 0)
        found = rejected_log_rows(rows, undecodable_reasons(rows), schema)
        self._chunk_rows[key] = found
        while len(self._chunk_rows) > _KEPT_CHUNKS:
            self._chunk_rows.popitem(last=False)
        return found

    def _rows_file(
        self, topic: str, snapshot_id: int, rows: pa.Table, schema: Schema, digest: str | None
    ) -> SynthesizedFile | None:
        if not rows.num_rows:
            return None
        key = ChangesKey(self.cluster, topic, snapshot_id, "rows", REJECTED, digest).key
        found = self._built.get(key)
        if found is None:
            ordered = rows.sort_by(
                [("kafka_partition", "ascending"), ("kafka_offset", "ascending")]
            )
            found = rows_file(uri(self.bucket, key), ordered, schema, self.current.compression)
            self._built[key] = found
            while len(self._built) > _KEPT_FILES:
                self._built.popitem(last=False)
        return found

    # ------------------------------------------------------------------ the plan

    def _files(self, topic: str, found: _Rejections) -> list[DataFile]:
        files = []
        if found.lake is not None:
            for file in found.lake.data_files:
                relative = relative_path(found.lake.location, file.file_path)
                key = ColdFileKey(self.cluster, topic, relative, REJECTED).key
                files.append(with_path(file, uri(self.bucket, key)))
        if found.rows is not None:
            files.append(found.rows.data_file)
        return files

    def _plan(self, topic: str, found: _Rejections) -> SnapshotPlan:
        files = self._files(topic, found)
        return SnapshotPlan(
            namespace=REJECTED,
            topic=topic,
            snapshot_id=found.snapshot_id if files else None,
            timestamp_ms=found.timestamp_ms,
            groups=[ManifestGroup(UNPARTITIONED, files)],
            summary={HOTSET_OFFSETS_PROPERTY: format_boundary(found.ends)},
            schema=found.schema,
            specs=(UNPARTITIONED,),
            default_spec_id=UNPARTITIONED.spec_id,
            sort_order=UNSORTED_SORT_ORDER,
            last_column_id=found.last_column_id,
        )

    @staticmethod
    def _check_namespace(namespace: str) -> None:
        if namespace != REJECTED:
            raise NoSuchNamespace(f"no namespace {namespace!r} (this provider serves {REJECTED!r})")

    # ------------------------------------------------------------------ files

    def _lake_namespace(self) -> str:
        assert self.current.states is not None
        return self.current.states.lake.rejected_namespace

    async def _changes_file(self, key: ChangesKey) -> bytes | memoryview:
        found = await self.store.get(key.key)
        if found is None:
            built = self._built.get(key.key)
            found = built.parquet if built is not None else None
        if found is None:
            # a rows file lost from the cache: a load of its table builds the current one again
            raise NoSuchFile(f"no such key {key.key!r} (not built by this gateway, or evicted)")
        return found
