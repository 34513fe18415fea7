"""The ``current`` namespace: the current state of each ``upsert`` and ``debezium`` topic, at
zero lag.

A LoadTable of ``current.<topic>`` reads the topic's state table in the lake (the pipeline keeps
it, :mod:`bergstream.pipeline.state_table`; absent, the state starts empty) and the log's rows
the state has not applied yet: every offset from the state's boundary up to the last stable
offset, from the log's coldset where the pipeline copied it already and from Kafka beyond
(the chunks ``merged`` lists). It applies those rows with
:func:`~bergstream.core.api.reduce_changes`, the rule the pipeline follows, and serves one
snapshot made of

- the state table's data files, under gateway keys (``files/<path>``, like the coldset's);
- a *rows* file: the last change of each key the new records touched;
- a *deletes* file: position deletes of every state row those keys replace, with the
  deletes the state table has itself (its files name the lake's paths, not the gateway's).

So a record acked before the LoadTable is applied in what it returns. The snapshot id hashes
the state snapshot, its boundary, the layout and the last stable offsets; the rows and deletes
files are keyed by it (:class:`~.paths.ChangesKey`), kept in the file store, and built again
from the snapshot's recorded state if the cache lost them. Snapshots join the table's history
like ``merged``'s (time travel by id and timestamp); a snapshot that deletes rows is an
``overwrite``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    Boundary,
    ChunkEntry,
    StateChanges,
    StateIndex,
    StateLayout,
    StateLayoutError,
    TableMode,
    TablesSettings,
    arrow_type,
    format_boundary,
    log_rows_between,
    mode_rule_for,
    position_deletes_table,
    project_array,
    reduce_changes,
    rejected_layout,
    state_layout,
)
from bergstream.plugins.isk_gateway.files.data_files import chunk_key, chunks_timestamp_ms
from bergstream.plugins.isk_gateway.files.digests import state_digest
from bergstream.plugins.isk_gateway.files.manifests import ManifestGroup
from bergstream.plugins.isk_gateway.files.state_files import (
    UNPARTITIONED,
    StateFiles,
    deletes_file,
    rows_file,
)
from bergstream.plugins.isk_gateway.files.table_metadata import (
    HOTSET_OFFSETS_PROPERTY,
    SnapshotPlan,
)
from bergstream.plugins.isk_gateway.kafka.reader import PartitionOffsets
from bergstream.plugins.isk_gateway.metrics import ISK_LOAD_TABLES
from bergstream.plugins.isk_gateway.tables.coldset import (
    ColdsetProvider,
    ColdSnapshot,
    relative_path,
    with_path,
)
from bergstream.plugins.isk_gateway.tables.derived_files import DerivedFiles
from bergstream.plugins.isk_gateway.tables.history import (
    PLAN_ATTEMPTS,
    SnapshotState,
    history_contended,
    history_table_name,
    hot_floor,
    kafka_holds,
)
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.lake_schemas import CONTRACT_BASE
from bergstream.plugins.isk_gateway.tables.lake_states import LakeState, LakeStates
from bergstream.plugins.isk_gateway.tables.paths import (
    CURRENT,
    HOTSET,
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
    TableNotServable,
)

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic

__all__ = ["Applied", "CurrentProvider", "StateView", "conform_rows"]

#: Snapshots whose changes (rows, deletes, rejected rows) are kept in memory, all tables.
_KEPT_CHANGES = 8
_MAX_INT64 = 2**63 - 1


@dataclass(frozen=True)
class StateView:
    """What one snapshot of ``current.<topic>`` is made of."""

    topic: str
    layout: StateLayout
    typed: TypedTopic | None
    #: The state table's snapshot it starts from (None: the lake has no state table).
    state: LakeState | None
    #: The log's coldset snapshot (None: no lake, or no log table yet).
    cold: ColdSnapshot | None
    #: Hot chunks from the coldset's boundary (or Kafka's log start) up to ``ends``.
    chunks: Sequence[ChunkEntry]
    #: The last stable offset of every partition: the snapshot applies every offset below.
    ends: Mapping[int, int]
    #: Kafka's offsets of the topic's partitions when the view was taken.
    offsets: Mapping[int, PartitionOffsets]

    @property
    def start(self) -> Boundary:
        """The offsets the state table has applied (none without one)."""
        return dict(self.state.boundary) if self.state is not None else {}

    @property
    def log_schema(self) -> Schema:
        """The log table's schema the view's rows come in."""
        if self.typed is not None:
            return self.typed.schema
        if self.cold is not None:
            return self.cold.base.schema
        return CONTRACT_BASE.schema

    @property
    def digest(self) -> str | None:
        """The typed layout's digest (None: a raw topic)."""
        return self.typed.digest if self.typed is not None else None

    @property
    def snapshot_id(self) -> int:
        """Positive int64 hashed from what the snapshot applies: the same state snapshot and
        the same last stable offsets give the same id on every instance."""
        state = [
            self.topic,
            self.layout.mode.value,
            list(self.layout.identity),
            self.digest,
            self.state.snapshot_id if self.state is not None else None,
            format_boundary(self.start),
            format_boundary(self.ends),
            self.layout.schema.model_dump(mode="json"),
        ]
        return int(state_digest(state)[:16], 16) & _MAX_INT64 or 1

    def hot_chunks(self) -> list[ChunkEntry]:
        """The chunks with rows the state has not applied."""
        start = self.start
        return [c for c in self.chunks if c.row_count and c.end_offset > start.get(c.partition, 0)]


@dataclass(frozen=True)
class Applied:
    """The changes of one snapshot, and the files made of them."""

    changes: StateChanges
    files: StateFiles


class CurrentProvider(DerivedFiles):
    """Serves the ``current`` namespace over the hotset (Kafka), the coldset (the log's lake
    table, optional) and the lake's state tables (optional)."""

    def __init__(
        self,
        hotset: HotsetProvider,
        coldset: ColdsetProvider | None,
        states: LakeStates | None,
        tables: TablesSettings,
        compression: str = "snappy",
    ) -> None:
        self.hotset = hotset
        self.coldset = coldset
        self.states = states
        self.tables = tables
        self.compression = compression
        self.cluster = hotset.cluster
        self.bucket = hotset.bucket
        self.store = hotset.store
        self._applied: OrderedDict[tuple[str, int], Applied] = OrderedDict()
        self._building: dict[tuple[str, int], asyncio.Future[Applied]] = {}

    # ------------------------------------------------------------------ catalog

    @staticmethod
    def history_name(topic: str, mode: TableMode, digest: str | None) -> str:
        """The name of ``current.<topic>``'s history: a new mode or typed layout starts a new
        history (its snapshots have another schema)."""
        return history_table_name(CURRENT, topic, f"{mode.value}.{digest or 'raw'}")

    def mode_of(self, topic: str) -> TableMode:
        """The mode the ``tables:`` section gives ``topic``."""
        rule = mode_rule_for(self.tables, topic)
        return rule.mode if rule is not None else TableMode.APPEND

    async def list_tables(self, namespace: str) -> list[str]:
        """The upsert and debezium topics among Kafka's topics and the lake's state tables."""
        self._check_namespace(namespace)
        topics = set(await self.hotset.source.topics())
        if self.states is not None:
            topics |= set(
                await asyncio.to_thread(self.states.topics, self.states.lake.current_namespace)
            )
        return sorted(
            t for t in topics if not t.startswith("__") and self.mode_of(t) is not TableMode.APPEND
        )

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        """The current state of topic ``table`` as of now."""
        self._check_namespace(namespace)
        if table.startswith("__"):
            raise NoSuchTable(f"{table!r} is an internal topic, not served as a table")
        if self.mode_of(table) is TableMode.APPEND:
            raise NoSuchTable(
                f"topic {table!r} is an append topic (a log): current.{table} holds the state "
                "of upsert and debezium topics; give it a rule in the tables: section (mode: "
                f"upsert or debezium), or query merged.{table}"
            )
        for attempt in range(PLAN_ATTEMPTS):
            loaded = await self._load(table, synced=attempt > 0)
            if loaded is not None:
                ISK_LOAD_TABLES.labels(self.cluster, CURRENT).inc()
                return loaded
        raise ProviderUnavailable(history_contended(CURRENT, table))

    async def view(
        self,
        topic: str,
        state_snapshot: int | None = None,
        ends: Mapping[int, int] | None = None,
    ) -> StateView:
        """What ``current.<topic>`` is made of now: the state table's current snapshot (or
        ``state_snapshot``) and the log up to its last stable offsets (or ``ends``)."""
        rule = mode_rule_for(self.tables, topic)
        if rule is None or rule.mode is TableMode.APPEND:
            raise NoSuchTable(f"topic {topic!r} has no current state (an append topic)")
        cold = await self.coldset.snapshot(topic) if self.coldset is not None else None
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
        try:
            layout = state_layout(log_schema, last_column_id, rule)
        except StateLayoutError as error:
            raise TableNotServable(f"current.{topic}: {error}") from error
        state = None
        if self.states is not None:
            state = await self.states.state(topic, layout, state_snapshot)
        upto = offsets
        if ends is not None:  # a recorded snapshot's ends, for its files built again
            upto = {
                p: dataclasses.replace(o, last_stable=min(o.last_stable, ends.get(p, 0)))
                for p, o in offsets.items()
            }
        floors = cold.boundary if cold is not None else {}
        chunks = await self.hotset.indexer.live_chunks(
            topic, upto, floors, typed, seal_tail=ends is None
        )
        end_offsets = {p: o.last_stable for p, o in upto.items()}
        return StateView(topic, layout, typed, state, cold, chunks, end_offsets, offsets)

    async def _load(self, topic: str, synced: bool) -> LoadedTable | None:
        view = await self.view(topic)
        name = self.history_name(topic, view.layout.mode, view.digest)
        if not synced and await self.hotset.histories.sync(name):
            return await self._load(topic, synced=True)
        applied = await self.applied(view)
        plan = self._plan(view, applied)
        state_ids = view.state.snapshot_ids if view.state is not None else frozenset()
        offsets = view.offsets
        built = await self.hotset.histories.serve(
            name,
            SnapshotState(
                plan,
                view.ends,
                hot_floor(view.hot_chunks()),
                view.state.snapshot_id if view.state is not None else None,
                list(view.chunks),
                self.hotset.indexer.index_name(topic, view.typed),
            ),
            self.hotset.build,
            servable=lambda snapshot: (
                kafka_holds(snapshot, offsets)
                and (snapshot.cold_snapshot_id is None or snapshot.cold_snapshot_id in state_ids)
            ),
        )
        if built is None:
            return None
        for older in built[:-1]:
            await self.hotset.keep_metadata(older)
        latest = built[-1]
        await self.hotset.keep_metadata(latest)
        self.store.set_listing(CURRENT, topic, self._listing(view, applied, latest.files))
        return LoadedTable(latest.metadata_location, latest.metadata)

    # ------------------------------------------------------------------ applying changes

    async def applied(self, view: StateView) -> Applied:
        """The changes ``view`` applies and their files (built once per snapshot, however
        many ask at once)."""
        memo_key = (view.topic, view.snapshot_id)
        found = self._applied.get(memo_key)
        if found is not None:
            self._applied.move_to_end(memo_key)
            return found
        running = self._building.get(memo_key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        self._building[memo_key] = future
        try:
            applied = await self._apply(view)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: waiters get it, nobody else must
            raise
        finally:
            del self._building[memo_key]
        future.set_result(applied)
        self._applied[memo_key] = applied
        while len(self._applied) > _KEPT_CHANGES:
            self._applied.popitem(last=False)
        for synthesized in (applied.files.rows, applied.files.deletes):
            if synthesized is not None:
                key = key_from_uri(self.bucket, synthesized.data_file.file_path)
                await self.store.keep(key, synthesized.parquet)
        return applied

    async def log_rows(self, view: StateView) -> pa.Table:
        """The log rows ``view`` applies: offsets from the state's boundary up to its ends,
        from the log's coldset below the coldset's boundary, from Kafka above it."""
        start = view.start
        schema = arrow_type(view.log_schema)
        parts: list[pa.Table] = []
        cold = view.cold
        if cold is not None and self.coldset is not None:
            gap = {p: b for p, b in cold.boundary.items() if b > start.get(p, 0)}
            gap = {p: min(b, view.ends.get(p, b)) for p, b in gap.items()}
            if gap:
                log = await asyncio.to_thread(self.coldset.lake_table, view.topic)
                if log is not None:
                    parts.append(await asyncio.to_thread(log_rows_between, log, start, gap))
        for chunk in view.hot_chunks():
            key = chunk_key(self.cluster, chunk, self.hotset.unit, HOTSET, view.digest).key
            data = await self.hotset.read_file(key)
            rows = pq.read_table(pa.BufferReader(data))
            floor = start.get(chunk.partition, 0)
            if chunk.start_offset < floor:
                rows = rows.filter(pc.greater_equal(rows.column("kafka_offset"), floor))
            parts.append(rows)
        return conform_rows(parts, schema)

    async def _apply(self, view: StateView) -> Applied:
        rows = await self.log_rows(view)
        return await asyncio.to_thread(self._files, view, rows)

    def _files(self, view: StateView, rows: pa.Table) -> Applied:
        index = view.state.index if view.state is not None else None
        index = index or StateIndex()
        log_schema = view.log_schema
        rejected = arrow_type(rejected_layout(log_schema))
        changes = reduce_changes(view.layout, rows, rejected, index)
        deleted = index.all_deleted(changes.removed)
        snapshot_id = view.snapshot_id
        rows_out = None
        if changes.upserts.num_rows:
            key = ChangesKey(self.cluster, view.topic, snapshot_id, "rows", CURRENT, view.digest)
            rows_out = rows_file(
                uri(self.bucket, key.key), changes.upserts, view.layout.schema, self.compression
            )
        deletes_out = None
        if deleted:
            assert view.state is not None
            gateway = {
                self._state_uri(view.state, path): positions for path, positions in deleted.items()
            }
            key = ChangesKey(self.cluster, view.topic, snapshot_id, "deletes", CURRENT, view.digest)
            deletes_out = deletes_file(
                uri(self.bucket, key.key), position_deletes_table(gateway), self.compression
            )
        return Applied(changes, StateFiles(rows_out, deletes_out))

    def _state_uri(self, state: LakeState, path: str) -> str:
        relative = relative_path(state.location, path)
        return uri(self.bucket, ColdFileKey(self.cluster, state.topic, relative, CURRENT).key)

    # ------------------------------------------------------------------ the plan

    def _plan(self, view: StateView, applied: Applied) -> SnapshotPlan:
        data: list[DataFile] = []
        timestamp_ms = chunks_timestamp_ms(view.hot_chunks())
        if view.state is not None:
            data += [
                with_path(f, self._state_uri(view.state, f.file_path))
                for f in view.state.data_files
            ]
            timestamp_ms = max(timestamp_ms, view.state.timestamp_ms)
        files = applied.files
        if files.rows is not None:
            data.append(files.rows.data_file)
        groups = [ManifestGroup(UNPARTITIONED, data)]
        if files.deletes is not None:
            groups.append(
                ManifestGroup(UNPARTITIONED, [files.deletes.data_file], ManifestContent.DELETES)
            )
        summary = {HOTSET_OFFSETS_PROPERTY: format_boundary(view.ends)}
        if view.start:
            summary[BOUNDARY_PROPERTY] = format_boundary(view.start)
        has_files = bool(data)
        return SnapshotPlan(
            namespace=CURRENT,
            topic=view.topic,
            snapshot_id=view.snapshot_id if has_files else None,
            timestamp_ms=timestamp_ms,
            groups=groups,
            summary=summary,
            schema=view.layout.schema,
            specs=(UNPARTITIONED,),
            default_spec_id=UNPARTITIONED.spec_id,
            sort_order=UNSORTED_SORT_ORDER,
            properties={"bergstream.table-mode": view.layout.mode.value},
            last_column_id=view.layout.last_column_id,
        )

    def _listing(
        self, view: StateView, applied: Applied, metadata: Mapping[str, bytes]
    ) -> dict[str, int]:
        listing = {key: len(data) for key, data in metadata.items()}
        if view.state is not None:
            for file in view.state.data_files:
                key = key_from_uri(self.bucket, self._state_uri(view.state, file.file_path))
                listing[key] = file.file_size_in_bytes
        for synthesized in (applied.files.rows, applied.files.deletes):
            if synthesized is not None:
                key = key_from_uri(self.bucket, synthesized.data_file.file_path)
                listing[key] = synthesized.data_file.file_size_in_bytes
        return listing

    @staticmethod
    def _check_namespace(namespace: str) -> None:
        if namespace != CURRENT:
            raise NoSuchNamespace(f"no namespace {namespace!r} (this provider serves {CURRENT!r})")

    # ------------------------------------------------------------------ files

    def _lake_namespace(self) -> str:
        assert self.states is not None
        return self.states.lake.current_namespace

    async def _changes_file(self, key: ChangesKey) -> bytes | memoryview:
        """A rows or deletes file: kept, or built again from the snapshot's recorded state."""
        found = await self.store.get(key.key)
        if found is not None:
            return found
        name = self.history_name(key.topic, self.mode_of(key.topic), key.layout)
        history = await self.hotset.histories.snapshots(name)
        recorded = next((s for s in history if s.snapshot_id == key.snapshot_id), None)
        if recorded is None:
            raise NoSuchFile(f"no such key {key.key!r} (snapshot {key.snapshot_id} is not kept)")
        view = await self.view(key.topic, recorded.cold_snapshot_id, recorded.ends)
        if view.snapshot_id != key.snapshot_id:
            raise NoSuchFile(f"no such key {key.key!r} (its snapshot can no longer be built)")
        applied = await self.applied(view)
        synthesized = applied.files.rows if key.kind == "rows" else applied.files.deletes
        if synthesized is None:
            raise NoSuchFile(f"no such key {key.key!r}")
        return synthesized.parquet


def conform_rows(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """``parts`` (log rows of possibly older layouts) as one table of ``schema``."""
    tables = []
    for part in parts:
        columns = []
        for field in schema:
            if field.name in part.column_names:
                column = part.column(field.name).combine_chunks()
                columns.append(project_array(column, field.type))
            else:
                columns.append(pa.nulls(part.num_rows, field.type))
        tables.append(pa.Table.from_arrays(columns, schema=schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()
