"""The ``hotset`` namespace: one table per Kafka topic, synthesized from the log on demand.

:class:`HotsetProvider` is the namespace's ``TableProvider``, made of two parts:

- its indexer (:mod:`.hotset_index`): LoadTable first brings the chunk index up to date for each
  partition, and lists every live chunk, the unsealed tail included;
- its file serving (:mod:`.hotset_files`): every file by key, data files rebuilt from Kafka from
  the key alone, read ahead during sequential scans.

Between the two, this module builds the table's metadata from the chunks
(:func:`..files.table_metadata.plan_table`, as the newest snapshot of its history:
:mod:`.history`) and keeps it: metadata files in the file store
(memory and the cache backend), listed with the data files' sizes for HEAD and ListObjectsV2.
A topic a codec rule types is served in its typed layout (:mod:`.layouts`): LoadTable resolves
it first, and its chunks, keys, schema and properties all follow it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from bergstream.core.api import CacheBackend, ChunkEntry, FileSynthesizer, IndexBackend
from bergstream.plugins.isk_gateway.files.data_files import chunk_key
from bergstream.plugins.isk_gateway.files.hotset_layout import layout_name
from bergstream.plugins.isk_gateway.files.hotset_parquet import HotsetDataSynthesizer
from bergstream.plugins.isk_gateway.files.table_metadata import (
    BuiltTable,
    SnapshotPlan,
    build_metadata,
    plan_table,
)
from bergstream.plugins.isk_gateway.metrics import ISK_LOAD_TABLES, ISK_SYNTHESIZED_BYTES
from bergstream.plugins.isk_gateway.tables.history import (
    PLAN_ATTEMPTS,
    HistoricSnapshot,
    HistorySettings,
    SnapshotHistories,
    SnapshotState,
    chunks_up_to,
    history_contended,
    history_table_name,
    hot_floor,
    kafka_holds,
)
from bergstream.plugins.isk_gateway.tables.hotset_files import HotsetFiles
from bergstream.plugins.isk_gateway.tables.hotset_index import HotsetIndexer, KafkaSource
from bergstream.plugins.isk_gateway.tables.paths import DAY, HOTSET, DataKey, key_from_uri
from bergstream.plugins.isk_gateway.tables.provider import (
    LoadedTable,
    NoSuchNamespace,
    NoSuchTable,
    ProviderUnavailable,
)
from bergstream.plugins.isk_gateway.tables.shared_history import SharedLog
from bergstream.plugins.isk_gateway.tables.store import FileStore

if TYPE_CHECKING:
    from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic
    from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts

__all__ = ["HotsetProvider", "metadata_kind", "record_built"]


def metadata_kind(key: str) -> str:
    """The kind of a metadata key for the synthesized-bytes metric."""
    if key.endswith(".metadata.json"):
        return "metadata"
    return "manifest_list" if "/metadata/snap-" in key else "manifest"


def record_built(cluster: str, built: BuiltTable) -> None:
    """Count the bytes of a table's freshly built metadata files."""
    for key, data in built.files.items():
        ISK_SYNTHESIZED_BYTES.labels(cluster, metadata_kind(key)).inc(len(data))


class HotsetProvider:
    """Serves the ``hotset`` namespace (a :class:`~.provider.TableProvider` for it)."""

    def __init__(
        self,
        source: KafkaSource,
        index: IndexBackend,
        cache: CacheBackend,
        bucket: str,
        cluster: str,
        chunk_records: int = 100_000,
        memory_files: int = 4096,
        store: FileStore | None = None,
        unit: str = DAY,
        parallel_partitions: int = 2,
        synthesizers: Sequence[FileSynthesizer] | None = None,
        compression: str = "snappy",
        layouts: TopicLayouts | None = None,
        history: HistorySettings | None = None,
        coalesce_files: int = 4,
    ) -> None:
        self.source = source
        self.cache = cache
        self.bucket = bucket
        self.cluster = cluster
        self.unit = unit
        #: Typed layouts of the topics a codec rule types (None: every topic is raw).
        self.layouts = layouts
        if layouts is not None:  # topics of plain values are read from it for their layout
            layouts.source = source
        layout = layout_name(unit, compression)
        self.store = store if store is not None else FileStore(cache, cache_prefix=layout)
        self.indexer = HotsetIndexer(
            source,
            index,
            self.store,
            cluster,
            chunk_records=chunk_records,
            unit=unit,
            compression=compression,
            parallel_partitions=parallel_partitions,
            memory_files=memory_files,
            layouts=layouts,
            coalesce_files=coalesce_files,
        )
        #: Each table's snapshots, kept in the index (time travel, incremental reads), and in
        #: the cache if it can be shared (a backend with ``put_if_absent``).
        shared = (
            SharedLog(self.store.cache, self.store.cache_key(""))
            if SharedLog.can_share(self.store.cache)
            else None
        )
        self.histories = SnapshotHistories(index, history, kept=self._kept, shared=shared)
        #: Who builds a missing file, first match wins (default: ``hotset-parquet`` on source).
        self.files = HotsetFiles(
            self.store,
            cluster,
            synthesizers or [HotsetDataSynthesizer(source, cluster, unit, compression, layouts)],
        )

    @property
    def index(self) -> IndexBackend:
        """The chunk index the indexer keeps."""
        return self.indexer.index

    @property
    def layout(self) -> str:
        """The layout name (time unit, codec, version) index and cache entries are kept under."""
        return self.indexer.layout

    # ------------------------------------------------------------------ catalog

    async def list_namespaces(self) -> list[str]:
        """``hotset``."""
        return [HOTSET]

    async def list_tables(self, namespace: str) -> list[str]:
        """Topics of the Kafka cluster."""
        self._check_namespace(namespace)
        return await self.source.topics()

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        """The hotset table of topic ``table`` as of now: its index brought up to date, its
        metadata built and kept."""
        self._check_namespace(namespace)
        if table.startswith("__"):
            raise NoSuchTable(f"{table!r} is an internal topic, not served as a table")
        offsets = await self.source.offsets(table)
        typed = await self.layouts.resolve(table) if self.layouts is not None else None
        layout = typed.digest if typed else None
        name = history_table_name(HOTSET, table, layout)
        index_topic = self.indexer.index_name(table, typed)
        for attempt in range(PLAN_ATTEMPTS):
            # Snapshots other instances recorded first: their watermarks cut this plan's chunks;
            # offsets read before them may be older than theirs.
            if await self.histories.sync(name) or attempt:
                offsets = await self.source.offsets(table)
            chunks = await self.indexer.live_chunks(table, offsets, typed=typed)
            end_offsets = {p: o.last_stable for p, o in offsets.items()}
            plan = plan_table(
                self.bucket, self.cluster, table, chunks, end_offsets, self.unit, typed
            )
            state = SnapshotState(
                plan, end_offsets, hot_floor(chunks),
                chunks=chunks, index_topic=index_topic,
            )  # fmt: skip
            built = await self.histories.serve(
                name,
                state,
                self.build,
                servable=lambda snapshot, offsets=offsets: kafka_holds(snapshot, offsets),
                at_watermarks=partial(
                    self._at_watermarks, table, chunks, end_offsets, typed, index_topic
                ),
            )
            if built is not None:
                break
        else:
            raise ProviderUnavailable(history_contended(HOTSET, table))
        for older in built[:-1]:
            await self.keep_metadata(older)
        await self.keep_built(HOTSET, table, built[-1], chunks, layout=layout)
        ISK_LOAD_TABLES.labels(self.cluster, HOTSET).inc()
        return LoadedTable(built[-1].metadata_location, built[-1].metadata)

    async def _at_watermarks(
        self,
        table: str,
        chunks: list[ChunkEntry],
        end_offsets: Mapping[int, int],
        typed: TypedTopic | None,
        index_topic: str,
        head: HistoricSnapshot,
    ) -> SnapshotState | None:
        """``head``'s watermarks listed with today's ``chunks`` (small files rebuilt as one
        since): the first of two steps, a REPLACE before the APPEND of the new records; None
        when a chunk crosses a watermark of ``head`` (then one step)."""
        ends = {p: min(o, head.ends.get(p, 0)) for p, o in end_offsets.items()}
        older = chunks_up_to(chunks, ends)
        if older is None:
            return None
        plan = plan_table(self.bucket, self.cluster, table, older, ends, self.unit, typed)
        return SnapshotState(plan, ends, hot_floor(older), chunks=older, index_topic=index_topic)

    async def _kept(self, location: str) -> bool:
        """Whether the file store still has the file at ``location`` (an s3:// URI)."""
        return await self.store.get(key_from_uri(self.bucket, location)) is not None

    async def build(self, plan: SnapshotPlan) -> BuiltTable:
        """The metadata files of ``plan``, built off the event loop."""
        return await asyncio.to_thread(build_metadata, self.bucket, self.cluster, plan)

    async def keep_metadata(self, built: BuiltTable) -> None:
        """Keep the metadata files of a snapshot that is not the one served (the first of two
        steps recorded at once), so clients of its history can read them."""
        record_built(self.cluster, built)
        for key, data in built.files.items():
            await self.store.keep(key, data)

    async def keep_built(
        self,
        namespace: str,
        table: str,
        built: BuiltTable,
        chunks: list[ChunkEntry],
        more_sizes: Mapping[str, int] | None = None,
        layout: str | None = None,
    ) -> None:
        """Keep a freshly built table's metadata files and list them with its data files (in
        the typed layout with digest ``layout``; None: raw)."""
        record_built(self.cluster, built)
        for key, data in built.files.items():
            await self.store.keep(key, data)
        listing = {key: len(data) for key, data in built.files.items()}
        successors: dict[str, str] = {}
        previous: DataKey | None = None
        for chunk in sorted(chunks, key=lambda c: (c.partition, c.start_offset)):
            if chunk.row_count:
                hot_key = chunk_key(self.cluster, chunk, self.unit, layout=layout)
                key = dataclasses.replace(hot_key, namespace=namespace)
                listing[key.key] = chunk.size_bytes
                if previous is not None:
                    successors[previous.key] = hot_key.key
                previous = hot_key
        self.files.set_successors(table, successors)
        listing.update(more_sizes or {})
        self.store.set_listing(namespace, table, listing)

    @staticmethod
    def _check_namespace(namespace: str) -> None:
        if namespace != HOTSET:
            raise NoSuchNamespace(f"no namespace {namespace!r} (this provider serves {HOTSET!r})")

    # ------------------------------------------------------------------ files

    async def file_size(self, key: str) -> int:
        """Size of the file at ``key`` (may build it)."""
        return await self.files.file_size(key)

    async def read_file(self, key: str) -> bytes:
        """The file at ``key``."""
        return await self.files.read_file(key)

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the file at ``key``."""
        return await self.files.read_range(key, start, end)

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys of the tables loaded so far (their current snapshot's files) under ``prefix``."""
        return await self.files.list_keys(prefix, limit)
