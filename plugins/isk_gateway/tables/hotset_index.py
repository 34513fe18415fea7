"""The hotset's indexer: brings a topic's chunk index up to date and plans its chunks.

A partition's log, from its log start (or a floor: the coldset's boundary) up to its last stable
offset, is cut into chunks at every multiple of ``chunk_records`` (so chunks hold up to that
many offsets, and instances cut a log alike whatever offset each started from), each cut again
where the time bucket of its rows changes (:func:`..files.hotset_layout.build_chunk`). A
*sealed* chunk (one that ends before the last stable offset, or at a multiple of
``chunk_records``) never changes: it is read from Kafka read_committed once, synthesized, kept
in the file store and indexed with its exact Parquet size and bounds. The tail a LoadTable
serves is sealed too (``seal_tail``): a served watermark is a snapshot of the table's history,
so later snapshots cut their chunks at it and only add files (:mod:`.history`). The background
indexer leaves the tail unsealed; it is remembered in memory so the next load with the same end
reads nothing.

Small files, rebuilt as one: a table loaded often while records arrive gets a chunk per served
watermark, so its newest chunk window can hold hundreds of small files, and every scan then pays
for each (measured with ``bench/isk_load.py``: after 16 clients loaded four tables for a minute,
one client's queries cost ISK 4x the CPU and the client 3.5x what they cost before). When a
LoadTable lists ``coalesce_files`` or more consecutive sealed chunks of the tail's window that
each hold under ``chunk_records / coalesce_files`` offsets, or two or more chunks of a window
the tail has left (never across a time bucket), their offsets are read and indexed again as one
chunk in the background; the index entry of the first is replaced (entries are keyed by their
first offset), so the next LoadTable lists the one file: its snapshot is a REPLACE of the small
files (the same rows), then the APPEND of new records (:mod:`.history`). The small files stay
buildable from their keys for older snapshots. A chunk rebuilt so grows with each rebuild and
stops being small, and a window becomes one file once the tail has left it, so each offset is
rebuilt a few times at most and a partition lists one file per full window and at most about
``2 x coalesce_files`` in its last. Measured with ``bench/isk_load.py`` (four tables of 3
partitions, a minute of 16 clients while records arrive): the tables listed 204 files after it
with only the first rule at 8 (each full window kept up to 16), 151 with both rules at 8,
103-105 at 4 (the default); the slowest queries were PyIceberg's late in the phase, one read per
file after another, and the 16 clients' p99 went from 18.9x one client's p50 to 17.6x and
15.4-15.6x.

Two callers: :meth:`HotsetIndexer.live_chunks` (LoadTable: every chunk a snapshot lists, indexing
new sealed ones on the way) and :meth:`HotsetIndexer.index_topic` (one bounded step of the
background indexer, :mod:`.background_index`). A long build logs a progress line every few
seconds. Index entries are kept under the topic and the layout name (:func:`index_topic_name`);
a typed topic's layout name ends with its typed layout's digest (:mod:`.layouts`), so chunks of
one layout are never listed under another (a new layout indexes the topic again).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bergstream.core.api import ChunkEntry, IndexBackend
from bergstream.plugins.isk_gateway.files.data_files import chunk_bucket, chunk_key
from bergstream.plugins.isk_gateway.files.hotset_layout import build_chunk, layout_name
from bergstream.plugins.isk_gateway.kafka.reader import FetchedRange, PartitionOffsets
from bergstream.plugins.isk_gateway.metrics import (
    COALESCED_FILES,
    INDEX_LAG,
    ISK_KAFKA_READ_BYTES,
    ISK_SYNTHESIZED_BYTES,
)
from bergstream.plugins.isk_gateway.tables.paths import DAY, HOUR, UNIT_MICROS
from bergstream.plugins.isk_gateway.tables.store import FileStore

if TYPE_CHECKING:
    from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic
    from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts

__all__ = ["HotsetIndexer", "IndexStep", "KafkaSource", "index_topic_name"]

log = logging.getLogger("bergstream.isk.index")

#: Seconds between two progress lines of a long index build.
_PROGRESS_SECONDS = 5.0


@dataclass
class IndexStep:
    """What one background indexing step of a topic found and did, in offsets."""

    missing: int = 0  # not in the index before the step (up to the last stable offset)
    indexed: int = 0  # indexed by the step
    behind: int = 0  # sealed offsets still to index after it (the unsealed tail left out)


class KafkaSource(Protocol):
    """What the hotset reads from Kafka (:class:`~..kafka.reader.KafkaReader` has it)."""

    async def topics(self) -> list[str]:
        """Topic names, internal topics left out."""
        ...

    async def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        """End offsets per partition; :class:`NoSuchTable` if the topic does not exist."""
        ...

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        """Record batches covering ``[start, end)``, read_committed, with aborted transactions."""
        ...


def index_topic_name(topic: str, layout: str) -> str:
    """The name a topic's chunks are indexed under, with the layout: chunks cut by hours are
    other chunks than those cut by days, and a file's size depends on its codec ('#' is not
    allowed in Kafka topic names, so none collides)."""
    return f"{topic}#{layout}"


class HotsetIndexer:
    """Keeps the chunk index of one cluster's topics up to date and lists their live chunks."""

    def __init__(
        self,
        source: KafkaSource,
        index: IndexBackend,
        store: FileStore,
        cluster: str,
        chunk_records: int = 100_000,
        unit: str = DAY,
        compression: str = "snappy",
        parallel_partitions: int = 2,
        memory_files: int = 4096,
        layouts: TopicLayouts | None = None,
        coalesce_files: int = 4,
    ) -> None:
        if chunk_records <= 0:
            raise ValueError(f"chunk_records must be > 0, got {chunk_records}")
        if unit not in UNIT_MICROS:
            raise ValueError(f"unit must be {DAY} or {HOUR}, got {unit!r}")
        self.source = source
        self.index = index
        self.store = store
        self.cluster = cluster
        self.chunk_records = chunk_records
        self.unit = unit
        self.compression = compression
        self.layout = layout_name(unit, compression)
        #: Typed layouts of the topics a codec rule types (None: every topic is raw).
        self.layouts = layouts
        self._parallel = asyncio.Semaphore(max(parallel_partitions, 1))
        self._memory_files = memory_files
        self._locks: dict[str, asyncio.Lock] = {}
        self._recent_chunks: OrderedDict[tuple[str, str, int, int, int], ChunkEntry] = OrderedDict()
        #: Runs of this many small chunks (and full windows) are rebuilt as one (0 or 1:
        #: never).
        self.coalesce_files = coalesce_files
        #: Topics whose small chunks are being rebuilt, and the task doing it.
        self._coalescing: dict[str, asyncio.Task[None]] = {}
        #: (index name, partition, start, end) of runs rebuilt already: a run the rebuild could
        #: not join (every chunk in a time bucket of its own) is not tried again.
        self._coalesced: OrderedDict[tuple[str, int, int, int], None] = OrderedDict()

    def index_name(self, topic: str, typed: TypedTopic | None) -> str:
        """The name ``topic``'s chunks are indexed under: the layout name, and for a typed
        topic its typed layout's digest."""
        layout = self.layout if typed is None else f"{self.layout}.{typed.digest}"
        return index_topic_name(topic, layout)

    async def live_chunks(
        self,
        topic: str,
        offsets: Mapping[int, PartitionOffsets],
        floors: Mapping[int, int] | None = None,
        typed: TypedTopic | None = None,
        seal_tail: bool = True,
    ) -> list[ChunkEntry]:
        """The chunks covering each partition from ``max(log start, floors[p])`` up to its last
        stable offset, indexing the new sealed ones on the way (``seal_tail``: the chunk ending
        at the last stable offset too); their files are decoded into ``typed``'s layout (None:
        raw)."""
        lock = self._locks.setdefault(topic, asyncio.Lock())
        async with lock:
            found = await asyncio.gather(
                *(
                    self._refresh_limited(
                        topic, offsets[p], (floors or {}).get(p, 0), typed, seal_tail
                    )
                    for p in sorted(offsets)
                )
            )
        self._coalesce_later(topic, found, typed)
        return [chunk for chunks in found for chunk in chunks]

    def small_runs(self, chunks: list[ChunkEntry]) -> list[tuple[int, int]]:
        """``[start, end)`` of each run of one partition's live ``chunks`` (in offset order) to
        rebuild as one chunk: every window of ``chunk_records`` offsets that the tail has left
        (its chunks, two or more, consecutive), and in the tail's window each run of at least
        ``coalesce_files`` consecutive chunks that each hold fewer than ``chunk_records /
        coalesce_files`` offsets. The last chunk (the tail, which the next load may extend)
        is left out, and a run never spans two time buckets (a rebuild would cut it there
        again: without this, every such window would be read again after each restart)."""
        if self.coalesce_files <= 1 or not chunks:
            return []
        tail_window = chunks[-1].start_offset // self.chunk_records
        small = self.chunk_records // self.coalesce_files
        runs: list[tuple[int, int]] = []
        run: list[ChunkEntry] = []
        run_window = -1
        run_bucket: int | None = None  # of the run's rows (chunks without rows join any)

        def close_run() -> None:
            if len(run) >= (2 if run_window < tail_window else self.coalesce_files):
                runs.append((run[0].start_offset, run[-1].end_offset))

        for chunk in chunks[:-1]:
            window = chunk.start_offset // self.chunk_records
            bucket = chunk_bucket(chunk, self.unit)
            # In a window the tail has left, every chunk joins; in the tail's, small ones only.
            eligible = window < tail_window or chunk.end_offset - chunk.start_offset < small
            joins = (
                bool(run)
                and run[-1].end_offset == chunk.start_offset
                and run_window == window
                and (bucket is None or run_bucket is None or bucket == run_bucket)
            )
            if eligible and joins:
                run.append(chunk)
                run_bucket = run_bucket if bucket is None else bucket
                continue
            close_run()
            run = [chunk] if eligible else []
            run_window, run_bucket = window, bucket
        close_run()
        return runs

    def _coalesce_later(
        self, topic: str, found: list[list[ChunkEntry]], typed: TypedTopic | None
    ) -> None:
        """Start rebuilding the runs of :meth:`small_runs` in ``found`` (per partition) as one chunk
        each, in the background, unless that runs for ``topic`` already."""
        if topic in self._coalescing:
            return
        name = self.index_name(topic, typed)
        runs = [
            (chunks[0].partition, start, end)
            for chunks in found
            if chunks
            for start, end in self.small_runs(chunks)
            if (name, chunks[0].partition, start, end) not in self._coalesced
        ]
        if runs:
            task = asyncio.create_task(self._coalesce(topic, runs, typed))
            self._coalescing[topic] = task
            task.add_done_callback(lambda _: self._coalescing.pop(topic, None))

    async def _coalesce(
        self, topic: str, runs: list[tuple[int, int, int]], typed: TypedTopic | None
    ) -> None:
        """Read and index each run ``(partition, start, end)`` of ``topic`` again as one chunk
        (cut where the time bucket changes). A failure leaves the small chunks, which serve."""
        name = self.index_name(topic, typed)
        for partition, start, end in runs:
            self._coalesced[(name, partition, start, end)] = None
            while len(self._coalesced) > self._memory_files:
                self._coalesced.popitem(last=False)
            try:
                rebuilt = await self._chunks(topic, partition, start, end, True, typed, True)
            except Exception as error:
                log.warning("isk: rebuilding small files of %s[%d] %d-%d failed: %s",
                            topic, partition, start, end, error)  # fmt: skip
                continue
            COALESCED_FILES.labels(self.cluster, topic).inc()
            log.info("isk: %s[%d]: offsets %d-%d rebuilt as %d file(s)",
                     topic, partition, start, end, len(rebuilt))  # fmt: skip

    async def settle(self) -> None:
        """Wait until no small chunks are being rebuilt."""
        while self._coalescing:
            await asyncio.gather(*self._coalescing.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop rebuilding small chunks (what was rebuilt stays indexed)."""
        tasks = list(self._coalescing.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def index_topic(self, topic: str, max_chunks: int = 8) -> IndexStep:
        """One step of the background indexer for ``topic``: index up to ``max_chunks`` new
        sealed chunks per partition (so a large backlog does not hold up other topics)."""
        offsets = await self.source.offsets(topic)
        typed = await self.layouts.resolve(topic) if self.layouts is not None else None
        step = IndexStep()
        lock = self._locks.setdefault(topic, asyncio.Lock())
        async with lock:
            for partition, part in sorted(offsets.items()):
                end = part.last_stable
                indexed = await self._indexed(topic, partition, part.log_start, typed)
                position = max([c.end_offset for c in indexed] + [part.log_start])
                if position >= end:
                    continue
                step.missing += end - position
                step_end = min(end, self._boundary(position, max_chunks))
                await self._chunks(topic, partition, position, step_end, True, typed)
                now = await self._indexed(topic, partition, position, typed)
                reached = max([c.end_offset for c in now] + [position])
                step.indexed += reached - position
                if step_end < end:  # more sealed chunks to come; the tail never is
                    step.behind += end - reached
                INDEX_LAG.labels(self.cluster, topic, str(partition)).set(end - reached)
        return step

    async def _refresh_limited(
        self,
        topic: str,
        offsets: PartitionOffsets,
        floor: int,
        typed: TypedTopic | None,
        seal_tail: bool,
    ) -> list[ChunkEntry]:
        """:meth:`_refresh`, with at most ``parallel_partitions`` partitions at once."""
        async with self._parallel:
            return await self._refresh(topic, offsets, floor, typed, seal_tail)

    async def _indexed(
        self, topic: str, partition: int, start: int, typed: TypedTopic | None = None
    ) -> list[ChunkEntry]:
        """Indexed chunks of a partition overlapping ``[start, ...)``, in offset order."""
        found = await asyncio.to_thread(
            self.index.chunks, self.index_name(topic, typed), partition, start
        )
        return [dataclasses.replace(chunk, topic=topic) for chunk in found]

    async def _refresh(
        self,
        topic: str,
        offsets: PartitionOffsets,
        floor: int = 0,
        typed: TypedTopic | None = None,
        seal_tail: bool = False,
    ) -> list[ChunkEntry]:
        """Index new sealed chunks of one partition from ``max(log start, floor)`` (the tail too
        if ``seal_tail``); return its live chunks from there, tail included."""
        partition, end = offsets.partition, offsets.last_stable
        start = min(max(offsets.log_start, floor), end)
        indexed = await self._indexed(topic, partition, start, typed)
        chunks: list[ChunkEntry] = []
        position = start
        for chunk in indexed:
            # Cut by retention or the floor, overlapping, or past the end: not served as is.
            if chunk.start_offset < position or chunk.end_offset > end:
                continue
            if chunk.start_offset > position:  # a range the index does not cover: serve it
                chunks += await self._chunks(
                    topic, partition, position, chunk.start_offset, False, typed
                )
            chunks.append(chunk)
            position = chunk.end_offset
        tail = await self._chunks(topic, partition, position, end, True, typed, seal_tail)
        sealed_end = max([c.end_offset for c in tail if c.end_offset < end] + [position])
        INDEX_LAG.labels(self.cluster, topic, str(partition)).set(max(end - sealed_end, 0))
        return chunks + tail

    async def _chunks(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        index: bool,
        typed: TypedTopic | None = None,
        seal_tail: bool = False,
    ) -> list[ChunkEntry]:
        """Synthesize (in ``typed``'s layout, None: raw) and cache the chunks of
        ``[start, end)``; index the sealed ones (a chunk ending before ``end``, or holding
        ``chunk_records`` offsets, or any if ``seal_tail``) if ``index``. The next chunk's
        records are fetched from Kafka while this one is built."""
        digest = typed.digest if typed is not None else ""
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
                memo_key = (topic, digest, partition, position, end)
                known = self._recent_chunks.get(memo_key)
                if known is not None:  # the same unsealed chunk as a recent load: nothing to read
                    if seal_tail and index:
                        del self._recent_chunks[memo_key]
                        stored = dataclasses.replace(known, topic=self.index_name(topic, typed))
                        await asyncio.to_thread(self.index.put_chunks, [stored])
                    chunks.append(known)
                    position = known.end_offset
                    continue
                high = min(self._boundary(position), end)
                if prefetch is not None and prefetch[0] == (position, high):
                    fetched = await prefetch[1]
                else:
                    if prefetch is not None:
                        prefetch[1].cancel()
                    fetched = await self._fetch(topic, partition, position, high)
                prefetch = None
                if high < end:  # the next chunk starts at ``high`` unless a time cut ends this one
                    following = (high, min(self._boundary(high), end))
                    task = asyncio.create_task(self._fetch(topic, partition, *following))
                    prefetch = (following, task)
                # Decoding and Parquet writing are CPU work: keep them off the event loop.
                chunk, data = await asyncio.to_thread(
                    build_chunk,
                    topic, partition, position, high, fetched, self.unit, self.compression, typed,
                    release=True,
                )  # fmt: skip
                complete = chunk.end_offset % self.chunk_records == 0
                sealed = seal_tail or chunk.end_offset < end or complete
                if chunk.row_count:
                    ISK_SYNTHESIZED_BYTES.labels(self.cluster, "data").inc(len(data))
                    key = chunk_key(self.cluster, chunk, self.unit, layout=digest or None)
                    await self.store.keep(key.key, data)
                if sealed and index:
                    stored = dataclasses.replace(chunk, topic=self.index_name(topic, typed))
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

    def _boundary(self, position: int, chunks: int = 1) -> int:
        """The ``chunks``-th multiple of ``chunk_records`` after ``position``: where a chunk
        from ``position`` ends at the latest (the first) or a bounded step stops."""
        return (position // self.chunk_records + chunks) * self.chunk_records

    async def _fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        """Records of ``[start, end)`` from Kafka, counted as read for indexing."""
        fetched = await self.source.fetch(topic, partition, start, end)
        ISK_KAFKA_READ_BYTES.labels(self.cluster, "index").inc(len(fetched.records))
        return fetched
