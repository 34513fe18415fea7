"""Snapshot history of the synthesized tables: a Kafka log's high watermarks, kept as Iceberg
snapshots.

A hotset or merged table's state is a set of high watermarks (plus, for ``merged``, the coldset
snapshot and boundary it merges). Each time a LoadTable serves a new state it becomes a new
snapshot whose parent is the one before: the files of the parent that it still lists are carried
over as EXISTING (added by the snapshot that first listed them), the others are ADDED by it.
Chunks are cut at every served watermark (:meth:`..hotset_index.HotsetIndexer.live_chunks`), so
new records always come in new files and a snapshot that only sees new records is an APPEND:
Spark's incremental reads and Iceberg streaming see exactly the records between two snapshots.
A state that also drops files (the coldset took over offsets, Kafka deleted them, or the
indexer rebuilt small files as one) is recorded in two steps: first the same watermarks with the
new files (a REPLACE when the rows are the same, else a DELETE or OVERWRITE), then the APPEND of
the new records; with no new record, only the first step (a rebuild is then a REPLACE at the
same watermarks, after which the same state gives the same bytes again).

Every snapshot is kept in the index backend (:meth:`IndexBackend.put_snapshot`) with its time
(the oldest record it adds, or just after its parent's, never in the future), and listed by
every later LoadTable within the retention (``snapshot_max_age_seconds``,
``snapshot_max_count``). A snapshot whose files Kafka no longer holds (and the coldset snapshot it
merges, if the lake expired it) is dropped from the history rather than served incomplete.

ISK instances sharing a cache backend with ``put_if_absent`` also keep one log of each history
in it (:mod:`.shared_history`): a LoadTable first adopts the snapshots others recorded
(:meth:`SnapshotHistories.sync`), then plans; recording takes the log's next position or, if
another instance took it first, adopts that one and has the caller plan again. So every
instance lists the same snapshots and cuts chunks at the same watermarks: one log state has
one metadata file, whichever instance serves it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import ManifestContent
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.types import TimestamptzType

from bergstream.core.api import TIMESTAMP_ID, ChunkEntry, IndexBackend, SnapshotRecord
from bergstream.plugins.isk_gateway.files.manifests import SEQUENCE_NUMBER
from bergstream.plugins.isk_gateway.files.table_metadata import BuiltTable, SnapshotPlan
from bergstream.plugins.isk_gateway.kafka.reader import PartitionOffsets
from bergstream.plugins.isk_gateway.tables.shared_history import SharedEntry, SharedLog

__all__ = [
    "CHECKPOINT_POSITIONS",
    "PLAN_ATTEMPTS",
    "HistoricSnapshot",
    "HistorySettings",
    "SnapshotHistories",
    "SnapshotState",
    "chunks_up_to",
    "history_contended",
    "history_table_name",
    "hot_floor",
    "kafka_holds",
]

_STATE_FORMAT = 1
#: Every this many positions, a shared log entry lists all of its snapshot's chunks.
CHECKPOINT_POSITIONS = 64
#: Plans a LoadTable makes while other instances keep recording snapshots before it.
PLAN_ATTEMPTS = 8

log = logging.getLogger("bergstream.isk.history")


@dataclass(frozen=True)
class HistorySettings:
    """How long and how many snapshots a table's history keeps."""

    max_age_seconds: float = 7 * 24 * 3600.0
    max_count: int = 500


@dataclass(frozen=True)
class HistoricSnapshot:
    """One recorded snapshot: what its metadata entry needs, and what tells whether it can still
    be served (its watermarks, the lowest offset each partition's hot files need from Kafka,
    the coldset snapshot it merges)."""

    snapshot_id: int
    parent_id: int | None
    sequence_number: int
    timestamp_ms: int
    manifest_list: str
    summary: Mapping[str, str]
    schema_id: int
    #: Data file path -> (id, sequence number) of the snapshot that added it.
    files: Mapping[str, tuple[int, int]]
    #: Total records the snapshot lists.
    records: int
    #: Next offset per partition the snapshot covers.
    ends: Mapping[int, int] = field(default_factory=dict)
    #: Lowest offset per partition its hot files read from Kafka.
    hot_floor: Mapping[int, int] = field(default_factory=dict)
    cold_snapshot_id: int | None = None
    #: When ISK recorded it (wall clock, ms): what the retention's age counts from.
    recorded_ms: int = 0
    #: Its position in the table's shared log (:mod:`.shared_history`); None: this ISK's own.
    position: int | None = None

    def snapshot(self) -> Snapshot:
        """The Iceberg snapshot of the table metadata."""
        summary = dict(self.summary)
        operation = Operation(summary.pop("operation", Operation.APPEND.value))
        return Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self.parent_id,
            sequence_number=self.sequence_number,
            timestamp_ms=self.timestamp_ms,
            manifest_list=self.manifest_list,
            summary=Summary(operation, **summary),
            schema_id=self.schema_id,
        )

    def record(self) -> SnapshotRecord:
        """The index backend's record of it."""
        state = {
            "format": _STATE_FORMAT,
            "parent": self.parent_id,
            "manifest_list": self.manifest_list,
            "summary": dict(self.summary),
            "schema_id": self.schema_id,
            "files": {path: list(origin) for path, origin in sorted(self.files.items())},
            "records": self.records,
            "ends": {str(p): o for p, o in sorted(self.ends.items())},
            "hot_floor": {str(p): o for p, o in sorted(self.hot_floor.items())},
            "cold_snapshot_id": self.cold_snapshot_id,
            "recorded_ms": self.recorded_ms,
            "position": self.position,
        }
        return SnapshotRecord(
            snapshot_id=self.snapshot_id,
            sequence_number=self.sequence_number,
            timestamp_ms=self.timestamp_ms,
            state=json.dumps(state, separators=(",", ":")),
        )

    @classmethod
    def from_record(cls, record: SnapshotRecord) -> HistoricSnapshot | None:
        """The snapshot an index record holds (None: a format this version does not read)."""
        try:
            state: dict[str, Any] = json.loads(record.state)
        except ValueError:
            return None
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            return None
        return cls(
            snapshot_id=record.snapshot_id,
            parent_id=state["parent"],
            sequence_number=record.sequence_number,
            timestamp_ms=record.timestamp_ms,
            manifest_list=state["manifest_list"],
            summary=state["summary"],
            schema_id=state["schema_id"],
            files={path: (int(o[0]), int(o[1])) for path, o in state["files"].items()},
            records=int(state["records"]),
            ends={int(p): int(o) for p, o in state["ends"].items()},
            hot_floor={int(p): int(o) for p, o in state["hot_floor"].items()},
            cold_snapshot_id=state["cold_snapshot_id"],
            recorded_ms=int(state["recorded_ms"]),
            position=state.get("position"),
        )


def history_contended(namespace: str, table: str) -> str:
    """The error of a LoadTable that lost :data:`PLAN_ATTEMPTS` races for the shared log."""
    return (
        f"{namespace}.{table}: other ISK instances recorded {PLAN_ATTEMPTS} snapshots while "
        "this one planned; retry the request"
    )


def history_table_name(namespace: str, table: str, layout: str | None) -> str:
    """The name a table's history is kept under in the index: its namespace, topic and typed
    layout (a new layout starts a new history: its snapshots have another schema)."""
    return f"{namespace}/{table}#{layout or 'raw'}"


def hot_floor(chunks: Sequence[ChunkEntry]) -> dict[int, int]:
    """The lowest offset per partition that the files of ``chunks`` (those with rows) read."""
    floor: dict[int, int] = {}
    for chunk in chunks:
        if chunk.row_count:
            floor[chunk.partition] = min(floor.get(chunk.partition, chunk.start_offset),
                                         chunk.start_offset)  # fmt: skip
    return floor


def chunks_up_to(chunks: Sequence[ChunkEntry], ends: Mapping[int, int]) -> list[ChunkEntry] | None:
    """The chunks ending at or before ``ends`` (partition -> offset): what lists those
    watermarks today, for the first of two steps (see the module doc); None when a chunk
    crosses one (the state cannot be recorded in two steps)."""
    if any(c.start_offset < ends[c.partition] < c.end_offset for c in chunks):
        return None
    return [c for c in chunks if c.end_offset <= ends[c.partition]]


def kafka_holds(snapshot: HistoricSnapshot, offsets: Mapping[int, PartitionOffsets]) -> bool:
    """Whether Kafka still holds every offset the hot files of ``snapshot`` read."""
    return all(
        p in offsets and offsets[p].log_start <= floor for p, floor in snapshot.hot_floor.items()
    )


@dataclass(frozen=True)
class SnapshotState:
    """A state a provider asks to serve: the plan of its metadata (no history fields yet) and
    what the history keeps of it."""

    plan: SnapshotPlan
    ends: Mapping[int, int]
    hot_floor: Mapping[int, int]
    cold_snapshot_id: int | None = None
    #: The hot chunks the plan's files were cut from, named as the index keeps them
    #: (``index_topic``): a shared log passes the new ones on to the other instances.
    chunks: Sequence[ChunkEntry] = ()
    index_topic: str = ""


#: The state at a parent's watermarks with the new files (the first of two steps), or None when
#: it cannot be built (then the new state is recorded in one step).
AtWatermarks = Callable[[HistoricSnapshot], Awaitable[SnapshotState | None]]
#: Builds a plan's metadata files (off the event loop).
Build = Callable[[SnapshotPlan], Awaitable[BuiltTable]]
#: Whether an older snapshot can still be served.
Servable = Callable[[HistoricSnapshot], bool]


def _files(plan: SnapshotPlan) -> dict[str, int]:
    """Every file the plan lists (data and delete files) with its record count."""
    return {f.file_path: f.record_count for g in plan.groups for f in g.files}


def _delete_files(plan: SnapshotPlan) -> set[str]:
    return {f.file_path for g in plan.groups if g.content != ManifestContent.DATA for f in g.files}


def _first_new_record_ms(
    plan: SnapshotPlan, origins: Mapping[str, tuple[int, int]], default: int
) -> int:
    """The lowest ``kafka_timestamp`` (ms) of the files ``plan`` adds (not in ``origins``), from
    their lower bounds; ``default`` if none has one."""
    lows = [
        from_bytes(TimestamptzType(), f.lower_bounds[TIMESTAMP_ID])
        for g in plan.groups
        for f in g.files
        if f.file_path not in origins and f.lower_bounds and TIMESTAMP_ID in f.lower_bounds
    ]
    return int(min(lows)) // 1000 if lows else default


def _operation(
    parent: HistoricSnapshot | None, files: Mapping[str, int], deletes: set[str] = frozenset()
) -> Operation:
    """What a snapshot listing ``files`` (of which ``deletes`` are delete files) did after
    ``parent``: a new delete file removes rows (an OVERWRITE, whatever else changed)."""
    if parent is not None and deletes - set(parent.files):
        return Operation.OVERWRITE
    if parent is None or set(parent.files) <= set(files):
        return Operation.APPEND
    added = set(files) - set(parent.files)
    total = sum(files.values())
    if total == parent.records:
        return Operation.REPLACE
    if not added and total < parent.records:
        return Operation.DELETE
    return Operation.OVERWRITE


def _new_chunks(
    state: SnapshotState, parent: HistoricSnapshot | None, operation: Operation, position: int
) -> list[ChunkEntry]:
    """The chunks a shared log entry at ``position`` passes on: those of the files the snapshot
    adds to an APPEND (past its parent's watermarks); all of them for any other operation, and
    at every checkpoint position (where an instance new to the table starts reading)."""
    if parent is None or operation != Operation.APPEND or position % CHECKPOINT_POSITIONS == 1:
        return list(state.chunks)
    return [c for c in state.chunks if c.start_offset >= parent.ends.get(c.partition, 0)]


class SnapshotHistories:
    """The histories of one ISK's synthesized tables, kept in its index backend, and with a
    shared log (:mod:`.shared_history`) in one order with every ISK instance sharing it."""

    def __init__(
        self,
        index: IndexBackend,
        settings: HistorySettings | None = None,
        clock: Callable[[], float] = time.time,
        kept: Callable[[str], Awaitable[bool]] | None = None,
        shared: SharedLog | None = None,
    ) -> None:
        self.index = index
        self.settings = settings or HistorySettings()
        #: The log shared with other instances (None: this instance's history is its own).
        self.shared = shared
        #: Per table, the newest position of the shared log adopted or written.
        self._positions: dict[str, int] = {}
        self._clock = clock
        #: Whether the file store still has a manifest list (by URI): checked for each older
        #: snapshot when a table's history is first read (after a restart), since a cache
        #: may have dropped it; a snapshot whose metadata is gone is dropped from the history.
        self._kept = kept
        self._locks: dict[str, asyncio.Lock] = {}
        self._loaded: dict[str, list[HistoricSnapshot]] = {}

    async def snapshots(self, name: str) -> list[HistoricSnapshot]:
        """The recorded history of table ``name``, oldest first."""
        if name not in self._loaded:
            records = await asyncio.to_thread(self.index.snapshots, name)
            found = [s for r in records if (s := HistoricSnapshot.from_record(r)) is not None]
            if self._kept is not None:
                kept = [s for s in found if await self._kept(s.manifest_list)]
                gone = [s.snapshot_id for s in found if s not in kept]
                if gone:
                    await asyncio.to_thread(self.index.drop_snapshots, name, gone)
                found = kept
            self._loaded[name] = found
        return list(self._loaded[name])

    def due(self, interval: float) -> list[tuple[str, str]]:
        """(namespace, table) of the tables served since start whose newest snapshot was
        recorded more than ``interval`` seconds ago."""
        oldest_ms = int((self._clock() - interval) * 1000)
        due = []
        for name, history in sorted(self._loaded.items()):
            if history and history[-1].recorded_ms < oldest_ms:
                namespace, _, rest = name.partition("/")
                due.append((namespace, rest.rpartition("#")[0]))
        return due

    async def serve(
        self,
        name: str,
        state: SnapshotState,
        build: Build,
        servable: Servable,
        at_watermarks: AtWatermarks | None = None,
    ) -> list[BuiltTable] | None:
        """The metadata of ``state`` as the newest snapshot of table ``name``'s history,
        recording it (and the step before it, see the module doc) if it is new; the older
        snapshots that are still ``servable`` and within the retention are listed before it.
        Returns every table built, the one to serve last; None if another instance sharing
        the log recorded a snapshot first (it is adopted: plan ``state`` again, from fresh
        offsets, after :meth:`sync`)."""
        async with self._lock(name):
            if self.shared is not None and name not in self._positions:
                await self._sync(name)
            history = await self._pruned(name, servable)
            if state.plan.snapshot_id is None:  # no rows: an empty table has no snapshot
                return [await build(state.plan)]
            head = history[-1] if history else None
            if head is not None and head.snapshot_id == state.plan.snapshot_id:
                return [await build(self._as_recorded(state.plan, head, history[:-1]))]
            steps = [state]
            if head is not None and at_watermarks is not None:
                removed = set(head.files) - set(_files(state.plan))
                grows = any(o > head.ends.get(p, 0) for p, o in state.ends.items())
                if removed and grows:
                    first = await at_watermarks(head)
                    if first is not None and first.plan.snapshot_id not in (
                        None,
                        head.snapshot_id,
                        state.plan.snapshot_id,
                    ):
                        steps.insert(0, first)
            # The retention counts the new snapshots too: the same state served again later
            # (or by another instance) lists the same ones.
            excess = len(history) + len(steps) - self.settings.max_count
            if excess > 0 and history:
                dropped = history[:excess]
                del history[: len(dropped)]
                await asyncio.to_thread(
                    self.index.drop_snapshots, name, [s.snapshot_id for s in dropped]
                )
                self._loaded[name] = list(history)
            built: list[BuiltTable] = []
            for step in steps:
                recorded = await self._record(name, step, history, build)
                if recorded is None:
                    return None
                table, head = recorded
                history.append(head)
                built.append(table)
            return built

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def sync(self, name: str) -> int:
        """Adopt the snapshots other ISK instances appended to table ``name``'s shared log
        since this one last looked, with the chunks of their files (a plan made after this
        cuts the log where they did); how many positions it moved on (an entry this version
        cannot read is passed over). Nothing without a shared log."""
        if self.shared is None:
            return 0
        async with self._lock(name):
            return await self._sync(name)

    async def _sync(self, name: str) -> int:
        shared = self.shared
        assert shared is not None
        history = await self.snapshots(name)
        position = self._positions.get(name)
        up_to = 0
        if position is None:
            position = max((s.position or 0 for s in history), default=0)
            if position == 0:  # new to the table: read the retained part, from a checkpoint
                up_to = await asyncio.to_thread(shared.head, name)
                first = max(up_to - self.settings.max_count, 1)
                position = (first - 1) // CHECKPOINT_POSITIONS * CHECKPOINT_POSITIONS
        entries, last = await asyncio.to_thread(shared.entries_after, name, position, up_to)
        for entry in entries:
            await self._adopt(name, entry)
        self._positions[name] = last
        return last - position

    async def _adopt(self, name: str, entry: SharedEntry) -> None:
        """Make a shared log entry the newest snapshot of the local history (and its chunks
        indexed), unless the history has it or a later one."""
        snapshot = HistoricSnapshot.from_record(entry.record)
        if snapshot is None:
            log.warning("isk: shared history entry %d of %s has another format; skipped",
                        entry.position, name)  # fmt: skip
            return
        snapshot = dataclasses.replace(snapshot, position=entry.position)
        history = self._loaded.setdefault(name, [])
        head = history[-1] if history else None
        if head is not None and snapshot.sequence_number <= head.sequence_number:
            return  # known, or older than what this instance serves (pruned since)
        if head is not None and snapshot.parent_id != head.snapshot_id:
            # Histories parted (a cache outage, or expired entries): follow the shared one from
            # its parent on; without the parent, keep the older snapshots before it.
            ids = [s.snapshot_id for s in history]
            keep = ids.index(snapshot.parent_id) + 1 if snapshot.parent_id in ids else len(ids)
            if keep < len(ids):
                log.warning(
                    "isk: %s: %d snapshots of this instance are not in the shared history; "
                    "dropped for the shared one", name, len(ids) - keep,
                )  # fmt: skip
                await asyncio.to_thread(self.index.drop_snapshots, name, ids[keep:])
                del history[keep:]
        if entry.chunks:
            await asyncio.to_thread(self.index.put_chunks, list(entry.chunks))
        await asyncio.to_thread(self.index.put_snapshot, name, snapshot.record())
        history.append(snapshot)

    async def _record(
        self,
        name: str,
        state: SnapshotState,
        history: list[HistoricSnapshot],
        build: Build,
    ) -> tuple[BuiltTable, HistoricSnapshot] | None:
        """Build ``state`` as the child of the newest snapshot of ``history`` and record it;
        None if another instance recorded the next position of the shared log first (its
        entries are adopted: plan again)."""
        parent = history[-1] if history else None
        files = _files(state.plan)
        origins = {path: parent.files[path] for path in files if parent and path in parent.files}
        # The time of the oldest record the snapshot adds: every record acked before it is in
        # this snapshot or an earlier one, so an engine that reads "the snapshot as of" a time
        # (DuckDB: its transaction's start) misses no record acked before that time. The same
        # for every ISK that serves this state first; after the parent's; never in the future.
        now_ms = int(self._clock() * 1000)
        timestamp_ms = min(
            _first_new_record_ms(state.plan, origins, state.plan.timestamp_ms), now_ms
        )
        if parent is not None:
            timestamp_ms = max(timestamp_ms, parent.timestamp_ms + 1)
        plan = dataclasses.replace(
            state.plan,
            timestamp_ms=timestamp_ms,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=parent.sequence_number + 1 if parent else SEQUENCE_NUMBER,
            operation=_operation(parent, files, _delete_files(state.plan)),
            origins=origins,
            history=[s.snapshot() for s in history],
        )
        table = await build(plan)
        assert plan.snapshot_id is not None
        current = table.metadata["snapshots"][-1]
        sequence = plan.sequence_number
        recorded = HistoricSnapshot(
            snapshot_id=plan.snapshot_id,
            parent_id=plan.parent_snapshot_id,
            sequence_number=sequence,
            timestamp_ms=plan.timestamp_ms,
            manifest_list=current["manifest-list"],
            summary=dict(current["summary"]),
            schema_id=plan.schema.schema_id,
            files={path: origins.get(path, (plan.snapshot_id, sequence)) for path in files},
            records=sum(files.values()),
            ends=dict(state.ends),
            hot_floor=dict(state.hot_floor),
            cold_snapshot_id=state.cold_snapshot_id,
            recorded_ms=now_ms,
        )
        if self.shared is not None:
            position = self._positions.get(name, 0) + 1
            recorded = dataclasses.replace(recorded, position=position)
            chunks = _new_chunks(state, parent, plan.operation, position)
            entry = SharedEntry(position, recorded.record(), state.index_topic, chunks)
            won = await asyncio.to_thread(self.shared.append, name, entry)
            if won is False:
                await self._sync(name)
                return None
            if won:
                self._positions[name] = position
            else:  # the cache cannot tell: recorded here only (see _adopt)
                recorded = dataclasses.replace(recorded, position=None)
        await asyncio.to_thread(self.index.put_snapshot, name, recorded.record())
        self._loaded.setdefault(name, []).append(recorded)
        return table, recorded

    @staticmethod
    def _as_recorded(
        plan: SnapshotPlan, head: HistoricSnapshot, older: Sequence[HistoricSnapshot]
    ) -> SnapshotPlan:
        """``plan`` as its snapshot was recorded (the same state gives the same bytes)."""
        return dataclasses.replace(
            plan,
            timestamp_ms=head.timestamp_ms,
            parent_snapshot_id=head.parent_id,
            sequence_number=head.sequence_number,
            operation=Operation(head.summary.get("operation", Operation.APPEND.value)),
            origins={p: o for p, o in head.files.items() if o[0] != head.snapshot_id},
            history=[s.snapshot() for s in older],
        )

    async def _pruned(self, name: str, servable: Servable) -> list[HistoricSnapshot]:
        """The history of ``name`` without the snapshots past the retention or no longer
        servable (dropped from the index too)."""
        history = await self.snapshots(name)
        now_ms = int(self._clock() * 1000)
        oldest_ms = now_ms - int(self.settings.max_age_seconds * 1000)
        keep_from = max(len(history) - self.settings.max_count, 0)
        kept: list[HistoricSnapshot] = []
        dropped: list[int] = []
        for position, snapshot in enumerate(history):
            newest = position == len(history) - 1
            retained = position >= keep_from and (newest or snapshot.recorded_ms >= oldest_ms)
            if retained and servable(snapshot):
                kept.append(snapshot)
            else:
                dropped.append(snapshot.snapshot_id)
        if dropped:
            await asyncio.to_thread(self.index.drop_snapshots, name, dropped)
            self._loaded[name] = list(kept)
        return kept
