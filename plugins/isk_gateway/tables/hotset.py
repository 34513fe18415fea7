"""The ``hotset`` namespace: one table per Kafka topic, synthesized from the log on demand.

``load_table`` first brings the chunk index up to date for each partition (new chunks of up to
``chunk_records`` offsets are read from Kafka read_committed, synthesized once, indexed with
their exact Parquet size and bounds, and cached), then builds the metadata
(:mod:`.metadata`). A chunk holds rows of one day only (a day change in offset order cuts it), so
each data file has one partition value. The tail, from the last sealed chunk up to the last
stable offset at load time, is synthesized too but not indexed: the next load re-chunks it.

Files are served by key (:mod:`.paths`): data files are rebuilt from Kafka from the key alone;
metadata files are kept from the load that built them (in memory and in the cache backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from bergstream.core.backends import CacheBackend, ChunkEntry, FileSynthesizer, IndexBackend
from bergstream.core.metrics import (
    INDEX_LAG,
    ISK_KAFKA_READ_BYTES,
    ISK_LOAD_TABLES,
    ISK_SYNTHESIZED_BYTES,
)
from bergstream.plugins.isk_gateway.provider import (
    LoadedTable,
    NoSuchFile,
    NoSuchNamespace,
    NoSuchTable,
)
from bergstream.plugins.isk_gateway.synthesis import (
    records_to_table,
)
from bergstream.plugins.isk_gateway.tables.data_synthesizer import (
    HotsetDataSynthesizer,
    layout_name,
    parquet_layout,
    time_buckets,
)
from bergstream.plugins.isk_gateway.tables.files import FileStore
from bergstream.plugins.isk_gateway.tables.kafka_reader import FetchedRange, PartitionOffsets
from bergstream.plugins.isk_gateway.tables.metadata import (
    BuiltTable,
    build_table,
    chunk_bounds,
    chunk_bucket,
)
from bergstream.plugins.isk_gateway.tables.paths import (
    DAY,
    HOTSET,
    HOUR,
    UNIT_MICROS,
    DataKey,
    ParsedKey,
    parse_key,
)

__all__ = ["HotsetProvider", "IndexStep", "KafkaSource", "metadata_kind", "record_built"]

log = logging.getLogger("bergstream.isk.index")

#: Seconds between two progress lines of a long index build.
_PROGRESS_SECONDS = 5.0


def metadata_kind(key: str) -> str:
    """The kind of a metadata key for the synthesized-bytes metric."""
    if key.endswith(".metadata.json"):
        return "metadata"
    return "manifest_list" if "/metadata/snap-" in key else "manifest"


def record_built(cluster: str, built: BuiltTable) -> None:
    """Count the bytes of a table's freshly built metadata files."""
    for key, data in built.files.items():
        ISK_SYNTHESIZED_BYTES.labels(cluster, metadata_kind(key)).inc(len(data))


@dataclass
class IndexStep:
    """What one background indexing step of a topic found and did, in offsets."""

    missing: int = 0  # not in the index before the step (up to the last stable offset)
    indexed: int = 0  # indexed by the step
    behind: int = 0  # sealed offsets still to index after it (the unsealed tail left out)


class KafkaSource(Protocol):
    """What the hotset reads from Kafka (:class:`.kafka_reader.KafkaReader` implements it)."""

    async def topics(self) -> list[str]:
        """Topic names, internal topics left out."""
        ...

    async def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        """End offsets per partition; :class:`NoSuchTable` if the topic does not exist."""
        ...

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        """Record batches covering ``[start, end)``, read_committed, with aborted transactions."""
        ...


class HotsetProvider:
    """Serves the ``hotset`` namespace (a :class:`~..provider.TableProvider` for it)."""

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
    ) -> None:
        if chunk_records <= 0:
            raise ValueError(f"chunk_records must be > 0, got {chunk_records}")
        self.source = source
        self.index = index
        self.cache = cache
        self.bucket = bucket
        self.cluster = cluster
        self.chunk_records = chunk_records
        if unit not in UNIT_MICROS:
            raise ValueError(f"unit must be {DAY} or {HOUR}, got {unit!r}")
        self.unit = unit
        self.compression = compression
        self.layout = layout_name(unit, compression)
        self._parallel = asyncio.Semaphore(max(parallel_partitions, 1))
        self._building: dict[str, asyncio.Future[bytes]] = {}
        # Read-ahead of sequential cold scans: the next data file of a partition, per topic.
        self._successors: dict[str, dict[str, str]] = {}
        self._last_cold: dict[tuple[str, int], str] = {}
        self._read_ahead: set[str] = set()
        self._read_ahead_tasks: set[asyncio.Task[None]] = set()
        self._read_ahead_slots = asyncio.Semaphore(1)
        #: Who builds a missing file, first match wins (default: ``hotset-parquet`` on source).
        self.synthesizers: list[FileSynthesizer] = list(
            synthesizers or [HotsetDataSynthesizer(source, cluster, unit, compression)]
        )
        self.store = store if store is not None else FileStore(cache, cache_prefix=self.layout)
        self._memory_files = memory_files
        self._locks: dict[str, asyncio.Lock] = {}
        self._recent_chunks: OrderedDict[tuple[str, int, int, int], ChunkEntry] = OrderedDict()

    # ------------------------------------------------------------------ catalog

    async def list_namespaces(self) -> list[str]:
        return [HOTSET]

    async def list_tables(self, namespace: str) -> list[str]:
        self._check_namespace(namespace)
        return await self.source.topics()

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        self._check_namespace(namespace)
        if table.startswith("__"):
            raise NoSuchTable(f"{table!r} is an internal topic, not served as a table")
        offsets = await self.source.offsets(table)
        chunks = await self.live_chunks(table, offsets)
        end_offsets = {p: o.last_stable for p, o in offsets.items()}
        built = await asyncio.to_thread(
            build_table, self.bucket, self.cluster, table, chunks, end_offsets, self.unit
        )
        await self.keep_built(HOTSET, table, built, chunks)
        ISK_LOAD_TABLES.labels(self.cluster, HOTSET).inc()
        return LoadedTable(built.metadata_location, built.metadata)

    async def keep_built(
        self,
        namespace: str,
        table: str,
        built: BuiltTable,
        chunks: list[ChunkEntry],
        more_sizes: Mapping[str, int] | None = None,
    ) -> None:
        """Keep a freshly built table's metadata files and list them with its data files."""
        record_built(self.cluster, built)
        for key, data in built.files.items():
            await self.store.keep(key, data)
        listing = {key: len(data) for key, data in built.files.items()}
        successors: dict[str, str] = {}
        previous: DataKey | None = None
        for chunk in sorted(chunks, key=lambda c: (c.partition, c.start_offset)):
            if chunk.row_count:
                hot_key = self._data_key(chunk)
                key = dataclasses.replace(hot_key, namespace=namespace)
                listing[key.key] = chunk.size_bytes
                if previous is not None and previous.partition == hot_key.partition:
                    successors[previous.key] = hot_key.key
                previous = hot_key
        self._successors[table] = successors
        listing.update(more_sizes or {})
        self.store.set_listing(namespace, table, listing)

    async def live_chunks(
        self,
        topic: str,
        offsets: Mapping[int, PartitionOffsets],
        floors: Mapping[int, int] | None = None,
    ) -> list[ChunkEntry]:
        """The chunks covering each partition from ``max(log start, floors[p])`` up to its last
        stable offset, indexing the new sealed ones on the way."""
        lock = self._locks.setdefault(topic, asyncio.Lock())
        async with lock:
            found = await asyncio.gather(
                *(
                    self._refresh_limited(topic, offsets[p], (floors or {}).get(p, 0))
                    for p in sorted(offsets)
                )
            )
        return [chunk for chunks in found for chunk in chunks]

    async def _refresh_limited(
        self, topic: str, offsets: PartitionOffsets, floor: int
    ) -> list[ChunkEntry]:
        """:meth:`_refresh`, with at most ``parallel_partitions`` partitions at once."""
        async with self._parallel:
            return await self._refresh(topic, offsets, floor)

    async def index_topic(self, topic: str, max_chunks: int = 8) -> IndexStep:
        """One step of the background indexer for ``topic``: index up to ``max_chunks`` new
        sealed chunks per partition (so a large backlog does not hold up other topics)."""
        offsets = await self.source.offsets(topic)
        step = IndexStep()
        lock = self._locks.setdefault(topic, asyncio.Lock())
        async with lock:
            for partition, part in sorted(offsets.items()):
                end = part.last_stable
                indexed = await self._indexed(topic, partition, part.log_start)
                position = max([c.end_offset for c in indexed] + [part.log_start])
                if position >= end:
                    continue
                step.missing += end - position
                step_end = min(end, position + max_chunks * self.chunk_records)
                await self._chunks(topic, partition, position, step_end, index=True)
                now = await self._indexed(topic, partition, position)
                reached = max([c.end_offset for c in now] + [position])
                step.indexed += reached - position
                if step_end < end:  # more sealed chunks to come; the tail never is
                    step.behind += end - reached
                INDEX_LAG.labels(self.cluster, topic, str(partition)).set(end - reached)
        return step

    @staticmethod
    def _check_namespace(namespace: str) -> None:
        if namespace != HOTSET:
            raise NoSuchNamespace(f"no namespace {namespace!r} (this provider serves {HOTSET!r})")

    # ------------------------------------------------------------------ the index

    def _data_key(self, chunk: ChunkEntry) -> DataKey:
        return DataKey(
            self.cluster,
            chunk.topic,
            chunk.partition,
            chunk_bucket(chunk, self.unit),
            chunk.start_offset,
            chunk.end_offset,
            HOTSET,
            self.unit,
        )

    def _index_topic(self, topic: str) -> str:
        """The name a topic's chunks are indexed under, with the layout: chunks cut by hours
        are other chunks than those cut by days, and a file's size depends on its codec ('#' is
        not allowed in Kafka topic names, so none collides)."""
        return f"{topic}#{self.layout}"

    async def _indexed(self, topic: str, partition: int, start: int) -> list[ChunkEntry]:
        """Indexed chunks of a partition overlapping ``[start, ...)``, in offset order."""
        found = await asyncio.to_thread(
            self.index.chunks, self._index_topic(topic), partition, start
        )
        return [dataclasses.replace(chunk, topic=topic) for chunk in found]

    async def _refresh(
        self, topic: str, offsets: PartitionOffsets, floor: int = 0
    ) -> list[ChunkEntry]:
        """Index new sealed chunks of one partition from ``max(log start, floor)``; return its
        live chunks from there, tail included."""
        partition, end = offsets.partition, offsets.last_stable
        start = min(max(offsets.log_start, floor), end)
        indexed = await self._indexed(topic, partition, start)
        chunks: list[ChunkEntry] = []
        position = start
        for chunk in indexed:
            # Cut by retention or the floor, overlapping, or past the end: not served as is.
            if chunk.start_offset < position or chunk.end_offset > end:
                continue
            if chunk.start_offset > position:  # a range the index does not cover: serve it
                chunks += await self._chunks(
                    topic, partition, position, chunk.start_offset, index=False
                )
            chunks.append(chunk)
            position = chunk.end_offset
        tail = await self._chunks(topic, partition, position, end, index=True)
        sealed_end = max([c.end_offset for c in tail if c.end_offset < end] + [position])
        INDEX_LAG.labels(self.cluster, topic, str(partition)).set(max(end - sealed_end, 0))
        return chunks + tail

    async def _chunks(
        self, topic: str, partition: int, start: int, end: int, index: bool
    ) -> list[ChunkEntry]:
        """Synthesize and cache the chunks of ``[start, end)``; index the sealed ones (a chunk
        ending before ``end``, or holding ``chunk_records`` offsets) if ``index``. The next
        chunk's records are fetched from Kafka while this one is built."""
        chunks: list[ChunkEntry] = []
        position = start
        last_report = time.monotonic()
        prefetch: tuple[tuple[int, int], asyncio.Task[FetchedRange]] | None = None
        try:
            while position < end:
                if index and time.monotonic() - last_report > _PROGRESS_SECONDS:
                    last_report = time.monotonic()
                    log.info(
                        "isk: indexing %s[%d]: offset %d of %d (%.0f%%)",
                        topic, partition, position, end, 100 * (position - start) / (end - start),
                    )  # fmt: skip
                memo_key = (topic, partition, position, end)
                known = self._recent_chunks.get(memo_key)
                if known is not None:  # the same unsealed chunk as a recent load: nothing to read
                    chunks.append(known)
                    position = known.end_offset
                    continue
                high = min(position + self.chunk_records, end)
                if prefetch is not None and prefetch[0] == (position, high):
                    fetched = await prefetch[1]
                else:
                    if prefetch is not None:
                        prefetch[1].cancel()
                    fetched = await self._fetch(topic, partition, position, high)
                prefetch = None
                if high < end:  # the next chunk starts at ``high`` unless a time cut ends this one
                    following = (high, min(high + self.chunk_records, end))
                    task = asyncio.create_task(self._fetch(topic, partition, *following))
                    prefetch = (following, task)
                # Decoding and Parquet writing are CPU work: keep them off the event loop.
                chunk, data = await asyncio.to_thread(
                    self._build_chunk, topic, partition, position, high, fetched
                )
                sealed = chunk.end_offset < end or chunk.end_offset - position == self.chunk_records
                if chunk.row_count:
                    ISK_SYNTHESIZED_BYTES.labels(self.cluster, "data").inc(len(data))
                    await self.store.keep(self._data_key(chunk).key, data)
                if sealed and index:
                    stored = dataclasses.replace(chunk, topic=self._index_topic(topic))
                    await asyncio.to_thread(self.index.put_chunks, [stored])
                else:
                    self._recent_chunks[memo_key] = chunk
                    while len(self._recent_chunks) > self._memory_files:
                        self._recent_chunks.popitem(last=False)
                chunks.append(chunk)
                position = chunk.end_offset
        finally:
            if prefetch is not None:
                prefetch[1].cancel()
                with contextlib.suppress(BaseException):
                    await prefetch[1]
        return chunks

    async def _fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        """Records of ``[start, end)`` from Kafka, counted as read for indexing."""
        fetched = await self.source.fetch(topic, partition, start, end)
        ISK_KAFKA_READ_BYTES.labels(self.cluster, "index").inc(len(fetched.records))
        return fetched

    def _build_chunk(
        self, topic: str, partition: int, start: int, high: int, fetched: FetchedRange
    ) -> tuple[ChunkEntry, bytes]:
        table = records_to_table(fetched.records, partition, start, high, fetched.aborted)
        if not table.num_rows:
            return ChunkEntry(topic, partition, start, high, 0, 0, {}), b""
        buckets = time_buckets(table, self.unit)
        other = pc.not_equal(buckets, buckets[0])
        chunk_end = high
        rows = table
        if pc.any(other).as_py():
            cut = pc.index(other, True).as_py()
            chunk_end = table.column("kafka_offset")[cut].as_py()
            rows = table.slice(0, cut)  # rows are in offset order
        parquet = parquet_layout(rows, self.compression)
        low_ts, high_ts = pc.min_max(rows.column("kafka_timestamp").cast(pa.int64())).values()
        offsets = rows.column("kafka_offset")
        entry = ChunkEntry(
            topic=topic,
            partition=partition,
            start_offset=start,
            end_offset=chunk_end,
            row_count=rows.num_rows,
            size_bytes=len(parquet),
            bounds=chunk_bounds(
                partition,
                (offsets[0].as_py(), offsets[-1].as_py()),
                (low_ts.as_py(), high_ts.as_py()),
            ),
        )
        return entry, parquet

    # ------------------------------------------------------------------ files

    async def file_size(self, key: str) -> int:
        size = self.store.size(key)
        return size if size is not None else len(await self.read_file(key))

    async def read_file(self, key: str) -> bytes:
        return await self._read(key, ahead=False)

    async def _read(self, key: str, ahead: bool) -> bytes:
        """The file at ``key``: held, cached or built (once for concurrent readers). ``ahead``:
        a read-ahead build, which neither counts as a client's read nor reads further ahead."""
        parsed = parse_key(key)
        if parsed.cluster != self.cluster:
            raise NoSuchFile(f"no such key {key!r} (cluster {self.cluster!r} is served here)")
        while True:
            # No await from here until a lookup is registered in ``_building``: a reader finds
            # the file held, joins the one lookup (and build) in flight, or starts it. A build
            # keeps its file in the store before it leaves ``_building``, so a reader coming
            # after it finds the file instead of building it again.
            data = self.store.held(key)
            in_flight = self._building.get(key) if data is None else None
            if data is None and in_flight is None:
                return await self._look_up_or_build(key, parsed, ahead)
            if not ahead and key in self._read_ahead:  # a read-ahead was used: keep one ahead
                self._read_ahead.discard(key)
                self._read_ahead_after(parsed)
            if in_flight is None:
                return data
            try:  # concurrent GETs of one missing file: build it once
                return await asyncio.shield(in_flight)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not in_flight.cancelled() or (task is not None and task.cancelling()):
                    raise
                # The reader that started the lookup was cancelled, not this one: look again.

    async def _look_up_or_build(self, key: str, parsed: ParsedKey, ahead: bool) -> bytes:
        """The file at ``key`` from the cache backend, or built if it is a data key the cache
        does not have; registered in ``_building`` until done, so concurrent readers wait for
        this one instead of looking up or building it again."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._building[key] = future
        try:
            data = await self.store.get(key)
            if data is not None:
                if not ahead and key in self._read_ahead:
                    self._read_ahead.discard(key)
                    self._read_ahead_after(parsed)
            elif not isinstance(parsed, DataKey):
                raise NoSuchFile(f"no such key {key!r} (not built by this gateway, or expired)")
            else:
                if not ahead:
                    self._note_cold_read(parsed)
                data = await self._synthesize(key)
                ISK_SYNTHESIZED_BYTES.labels(self.cluster, "data").inc(len(data))
                await self.store.keep(key, data, write_behind=True)
            future.set_result(data)
            return data
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved here, so a lookup nobody waited for logs nothing
            raise
        finally:
            del self._building[key]

    def _successor(self, key: DataKey) -> str | None:
        return self._successors.get(key.topic, {}).get(key.key)

    def _note_cold_read(self, key: DataKey) -> None:
        """A cold read right after the cold read of the file before it is a sequential scan:
        start building the file after it in the background."""
        previous = self._last_cold.get((key.topic, key.partition))
        self._last_cold[(key.topic, key.partition)] = key.key
        if previous is not None and self._successors.get(key.topic, {}).get(previous) == key.key:
            self._read_ahead_after(key)

    def _read_ahead_after(self, key: DataKey) -> None:
        """Build the file after ``key`` in its partition in the background, unless it is held
        or being built already (one read-ahead build at a time)."""
        following = self._successor(key)
        if following is None or following in self._building or self.store.holds(following):
            return
        self._read_ahead.add(following)
        task = asyncio.create_task(self._build_ahead(following))
        self._read_ahead_tasks.add(task)
        task.add_done_callback(self._read_ahead_tasks.discard)

    async def _build_ahead(self, key: str) -> None:
        async with self._read_ahead_slots:
            if key not in self._read_ahead or self.store.holds(key):
                return
            try:
                await self._read(key, ahead=True)
            except Exception as error:  # a read-ahead is a guess: the real read reports errors
                self._read_ahead.discard(key)
                log.debug("isk: read-ahead of %s failed: %s", key, error)

    async def _synthesize(self, key: str) -> bytes:
        """The file at ``key`` from the first synthesizer that handles it."""
        for synthesizer in self.synthesizers:
            if synthesizer.handles(key):
                return await synthesizer.synthesize(key)
        raise NoSuchFile(f"no such key {key!r} (no file synthesizer handles it)")

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the file at ``key`` (synthesized whole, then sliced without
        a copy: ranged GETs of large files are the hot path of a scan)."""
        return memoryview(await self.read_file(key))[start:end]

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys of the tables loaded so far (their current snapshot's files) under ``prefix``."""
        return self.store.list_keys(prefix, limit)
