"""The ``merged`` namespace: a topic's coldset rows plus its Kafka records beyond the boundary.

LoadTable reads the coldset's current snapshot (its files and its boundary, the next offset per
partition the pipeline copied), then the hotset chunks of every partition from
``max(boundary, log start)`` up to the last stable offset. Offsets below the boundary that Kafka
still holds are skipped (the cold copy wins), so no record appears twice; a record acked before
LoadTable is in the snapshot. One snapshot lists the coldset's data files (gateway keys proxied
from the lake) and the hotset's (synthesized from Kafka); its id hashes both states.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pyiceberg.partitioning import PartitionSpec

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    SORT_ORDER,
    ChunkEntry,
    RowContractError,
    check_schema,
    format_boundary,
)
from bergstream.plugins.isk_gateway.files.data_files import (
    chunks_timestamp_ms,
    hotset_groups,
    spec_for,
    spec_unit,
)
from bergstream.plugins.isk_gateway.files.manifests import ManifestGroup
from bergstream.plugins.isk_gateway.files.table_metadata import (
    HOTSET_OFFSETS_PROPERTY,
    SnapshotPlan,
    snapshot_id_of,
)
from bergstream.plugins.isk_gateway.kafka.reader import PartitionOffsets
from bergstream.plugins.isk_gateway.metrics import ISK_LOAD_TABLES, PIPELINE_LAG
from bergstream.plugins.isk_gateway.tables.coldset import ColdsetProvider, ColdSnapshot
from bergstream.plugins.isk_gateway.tables.history import (
    PLAN_ATTEMPTS,
    HistoricSnapshot,
    SnapshotState,
    chunks_up_to,
    history_contended,
    history_table_name,
    hot_floor,
    kafka_holds,
)
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.lake_schemas import CONTRACT_BASE, BaseSchema
from bergstream.plugins.isk_gateway.tables.paths import DAY, HOUR, MERGED
from bergstream.plugins.isk_gateway.tables.provider import (
    LoadedTable,
    NoSuchNamespace,
    NoSuchTable,
    ProviderUnavailable,
    TableNotServable,
)

if TYPE_CHECKING:
    from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic

__all__ = ["MergedProvider"]


class MergedProvider:
    """Serves the ``merged`` namespace over a hotset and a coldset provider."""

    def __init__(self, hotset: HotsetProvider, coldset: ColdsetProvider) -> None:
        self.hotset = hotset
        self.coldset = coldset
        self.cluster = hotset.cluster
        self.bucket = hotset.bucket

    async def list_tables(self, namespace: str) -> list[str]:
        """Topics in Kafka or in the coldset."""
        self._check_namespace(namespace)
        hot, cold = await asyncio.gather(self.hotset.source.topics(), self.coldset.topics())
        return sorted(set(hot) | set(cold))

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        """The merged table of topic ``table`` as of now."""
        self._check_namespace(namespace)
        if table.startswith("__"):
            raise NoSuchTable(f"{table!r} is an internal topic, not served as a table")
        for attempt in range(PLAN_ATTEMPTS):
            loaded = await self._load(table, synced=attempt > 0)
            if loaded is not None:
                ISK_LOAD_TABLES.labels(self.cluster, MERGED).inc()
                return loaded
        raise ProviderUnavailable(history_contended(MERGED, table))

    async def _load(self, table: str, synced: bool) -> LoadedTable | None:
        """One plan of the merged table, served; None if another instance recorded a snapshot
        of its shared history first (plan again). ``synced``: the shared log was just read."""
        cold = await self.coldset.snapshot(table)
        if cold is not None:
            try:
                check_schema(cold.schema)
            except RowContractError as error:
                raise TableNotServable(
                    f"merged.{table}: the coldset table's schema is not the row contract, "
                    f"optionally with typed columns ({error}); query coldset.{table} and "
                    f"hotset.{table} separately"
                ) from error
        try:
            offsets = await self.hotset.source.offsets(table)
        except NoSuchTable:
            if cold is None:
                raise
            offsets = {}
        boundary = cold.boundary if cold is not None else {}
        base = cold.base if cold is not None else CONTRACT_BASE
        typed = None
        layouts = self.hotset.layouts
        if layouts is not None:
            layouts.remember_base(table, cold.base if cold is not None else None)
            typed = await layouts.resolve(table, base)
        digest = typed.digest if typed is not None else None
        index_topic = self.hotset.indexer.index_name(table, typed)
        name = history_table_name(MERGED, table, digest)
        if not synced and await self.hotset.histories.sync(name):
            # Snapshots other instances recorded: the coldset and offsets read before them may
            # be older than theirs, and their watermarks cut this plan's chunks.
            return await self._load(table, synced=True)
        chunks = await self.hotset.indexer.live_chunks(table, offsets, boundary, typed)
        self._record_lag(table, offsets, boundary)
        hot_spec = self._hot_spec(table, cold)
        unit = self.hotset.unit
        hot_groups = hotset_groups(
            self.bucket, self.cluster, chunks, MERGED, unit, hot_spec, layout=digest
        )
        end_offsets = {p: o.last_stable for p, o in offsets.items()}
        plan = self._plan(table, cold, boundary, base, typed, chunks, hot_groups, end_offsets)

        async def at_watermarks(head: HistoricSnapshot) -> SnapshotState | None:
            """The new coldset snapshot with the hot records up to ``head``'s watermarks."""
            ends = {
                p: min(o, max(head.ends.get(p, 0), boundary.get(p, 0)))
                for p, o in end_offsets.items()
            }
            older = chunks_up_to(chunks, ends)
            if older is None:  # not cut at the head's watermarks: one step
                return None
            groups = hotset_groups(
                self.bucket, self.cluster, older, MERGED, unit, hot_spec, layout=digest
            )
            first = self._plan(table, cold, boundary, base, typed, older, groups, ends, "\x00at")
            return SnapshotState(
                first, ends, hot_floor(older), cold_id, chunks=older, index_topic=index_topic
            )

        cold_id = cold.snapshot_id if cold is not None else None
        live_cold = cold.snapshot_ids if cold is not None else frozenset()
        built = await self.hotset.histories.serve(
            name,
            SnapshotState(plan, end_offsets, hot_floor(chunks), cold_id, chunks, index_topic),
            self.hotset.build,
            servable=lambda snapshot: (
                kafka_holds(snapshot, offsets)
                and (snapshot.cold_snapshot_id is None or snapshot.cold_snapshot_id in live_cold)
            ),
            at_watermarks=at_watermarks,
        )
        if built is None:
            return None
        for older_table in built[:-1]:
            await self.hotset.keep_metadata(older_table)
        cold_sizes = cold.sizes[MERGED] if cold else None
        await self.hotset.keep_built(MERGED, table, built[-1], chunks, cold_sizes, digest)
        return LoadedTable(built[-1].metadata_location, built[-1].metadata)

    def _plan(
        self,
        table: str,
        cold: ColdSnapshot | None,
        boundary: Mapping[int, int],
        base: BaseSchema,
        typed: TypedTopic | None,
        chunks: Sequence[ChunkEntry],
        hot_groups: list[ManifestGroup],
        end_offsets: Mapping[int, int],
        step: str = "",
    ) -> SnapshotPlan:
        """The merged table's plan: the coldset's files, then the hot chunks up to
        ``end_offsets`` (``step`` tells apart the id of a first step, see :mod:`.history`)."""
        digest = typed.digest if typed is not None else None
        hot_spec = self._hot_spec(table, cold)
        groups = (cold.groups[MERGED] if cold else []) + hot_groups
        has_rows = any(group.files for group in groups)
        state_topic = f"{table}\x00{cold.snapshot_id if cold else 0}\x00{format_boundary(boundary)}"
        if digest is not None:
            state_topic += f"\x00{digest}"
        state_topic += step
        summary = {HOTSET_OFFSETS_PROPERTY: format_boundary(end_offsets)}
        if boundary:
            summary[BOUNDARY_PROPERTY] = format_boundary(boundary)
        return SnapshotPlan(
            namespace=MERGED,
            topic=table,
            snapshot_id=snapshot_id_of(state_topic, chunks, end_offsets) if has_rows else None,
            timestamp_ms=max(chunks_timestamp_ms(chunks), cold.timestamp_ms if cold else 0),
            groups=groups,
            summary=summary,
            schema=typed.schema if typed is not None else base.schema,
            specs=cold.specs if cold else [hot_spec],
            default_spec_id=cold.default_spec_id if cold else hot_spec.spec_id,
            sort_order=cold.sort_order if cold else SORT_ORDER,
            properties={**base.properties, **(typed.properties if typed is not None else {})},
            last_column_id=typed.last_column_id if typed is not None else base.last_column_id,
        )

    def _hot_spec(self, table: str, cold: ColdSnapshot | None) -> PartitionSpec:
        """The partition spec the hotset's files take in the merged table: the coldset's spec
        that partitions by ``kafka_partition`` and the hotset's time unit or a coarser one (a
        chunk cut by hours lies within one day), so both share one spec."""
        if cold is None:
            return spec_for(self.hotset.unit)
        fits = (DAY,) if self.hotset.unit == DAY else (DAY, HOUR)
        for spec in cold.specs:
            if spec_unit(spec) in fits:
                return spec
        raise TableNotServable(
            f"merged.{table}: no partition spec of the coldset table is (kafka_partition, "
            f"{' or '.join(fits)}(kafka_timestamp)), which the hotset's files need (the hotset "
            f"is cut by {self.hotset.unit}); query coldset and hotset separately"
        )

    async def update_pipeline_lag(self, topic: str) -> None:
        """Set ``bergstream_pipeline_lag_offsets`` of ``topic`` from its coldset boundary and
        Kafka's high watermarks, if the lake has a table for it (the background indexer calls
        it for every topic)."""
        cold = await self.coldset.snapshot(topic)
        if cold is None:  # not copied by the pipeline: no lag to speak of
            return
        offsets = await self.hotset.source.offsets(topic)
        self._record_lag(topic, offsets, cold.boundary)

    def _record_lag(
        self, table: str, offsets: dict[int, PartitionOffsets], boundary: dict[int, int]
    ) -> None:
        for partition, part in offsets.items():
            lag = part.high_watermark - boundary.get(partition, 0)
            PIPELINE_LAG.labels(self.cluster, table, str(partition)).set(max(lag, 0))

    # Merged tables have metadata files only (their data files are hotset and coldset keys);
    # those are kept in the store the hotset provider serves from.

    async def file_size(self, key: str) -> int:
        """Size of a merged metadata file."""
        return await self.hotset.file_size(key)

    async def read_file(self, key: str) -> bytes:
        """A merged metadata file."""
        return await self.hotset.read_file(key)

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of a merged metadata file."""
        return await self.hotset.read_range(key, start, end)

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys of loaded tables under ``prefix``."""
        return await self.hotset.list_keys(prefix, limit)

    @staticmethod
    def _check_namespace(namespace: str) -> None:
        if namespace != MERGED:
            raise NoSuchNamespace(f"no namespace {namespace!r} (this provider serves {MERGED!r})")
