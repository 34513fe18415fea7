"""The coldset store of one virtual cluster: the catalog, the reader threads, the Parquet
footers and the decoded row-group slices every :class:`~.coldset.ColdTable` shares.

Row groups are read whole (Spark writes them up to 128 MB) and cached as slices of about
``_SLICE_BYTES`` decoded bytes of one Kafka partition, each with its own buffers, within
``cache_max_bytes``; a row group is read once for all the partitions a Fetch (or a turn of
read-ahead) needs of it, and split into each one's slices. Slices a sequential reader has
passed are the first evicted; read-ahead loads the next row groups only into room that unread
slices leave, one turn of read-ahead at a time on the reader threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from bisect import bisect_left
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchNamespaceError

from bergstream.core.api import BergstreamConfig, ResolvedLake, load_catalog
from bergstream.plugins.ksi_fetch_filter.ahead import BuiltAhead
from bergstream.plugins.ksi_fetch_filter.cache import ByteBoundedCache
from bergstream.plugins.ksi_fetch_filter.coldset import ColdRead, ColdsetError, ColdTable, FileRef
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.segments import (
    PayloadEncoder,
    Segment,
    SegmentRef,
    concat_segments,
    read_row_group_partitions,
    row_group_offset_range,
)
from bergstream.plugins.ksi_fetch_filter.typed import TypedTables

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

T = TypeVar("T")

#: Decoded size of one cached slice of a row group.
_SLICE_BYTES = 4 * 1024 * 1024
#: Partitions one turn of read-ahead handles before the reader thread takes other work.
_AHEAD_CHUNK = 64


def _is_local(path: str) -> bool:
    """Whether a data file's location is on the local file system."""
    return path.startswith(("file:", "/"))


class ColdStore:
    """Catalog, reader threads and caches shared by the tables of one virtual cluster."""

    def __init__(
        self,
        lake: ResolvedLake,
        config: KsiConfig,
        catalog_factory: Callable[[ResolvedLake], Catalog] = load_catalog,
        typed: TypedTables | None = None,
    ) -> None:
        self.lake = lake
        self.config = config
        self.typed = typed or TypedTables(BergstreamConfig(lake=lake.config))
        self._catalog_factory = catalog_factory
        self._catalog: Catalog | None = None
        self._catalog_lock = threading.Lock()
        self.executor = ThreadPoolExecutor(config.reader_threads, thread_name_prefix="ksi-cold")
        self.segments: ByteBoundedCache[Segment] = ByteBoundedCache(config.cache_max_bytes)
        #: Answers a sequential consumer fetches next, encoded while it reads the last ones:
        #: up to a quarter of the cache's bound in fetch budgets.
        self.ahead = BuiltAhead(self.executor, config.cache_max_bytes // 4)
        self._footers: ByteBoundedCache[list[SegmentRef]] = ByteBoundedCache(64 * 1024 * 1024)
        self._loading: dict[tuple[str, int, int], Future[list[Segment]]] = {}
        self._slice_index: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
        self._row_group_bytes = 0
        self._loading_lock = threading.Lock()
        #: Read-ahead waiting for a reader thread: (topic, partition) -> (table, partition,
        #: offset), in the order asked; one turn of it at a time is on the reader threads.
        self._ahead_queue: dict[tuple[str, int], tuple[ColdTable, int, int]] = {}
        self._ahead_draining = False
        self._ahead_lock = threading.Lock()
        self.tables: dict[str, ColdTable] = {}
        for topic, table in config.table_of().items():
            self.open_table(topic, table)

    def catalog(self) -> Catalog:
        """The lake's catalog, opened on first use."""
        with self._catalog_lock:
            if self._catalog is None:
                try:
                    self._catalog = self._catalog_factory(self.lake)
                except Exception as error:
                    raise ColdsetError(f"cannot open the lake catalog: {error}") from error
            return self._catalog

    def encoder_for(self, topic: str, table: Table) -> PayloadEncoder | None:
        """The payload encoder of ``topic``'s table as loaded (None for a raw table)."""
        return self.typed.encoder(topic, table)

    def table(self, topic: str) -> ColdTable | None:
        """The cold table of ``topic``, or None if KSI does not serve it."""
        return self.tables.get(topic)

    def open_table(self, topic: str, table: str) -> ColdTable:
        """Serve ``topic`` from ``table`` of the lake's namespace from now on (the table is
        loaded on its first read)."""
        cold = self.tables.get(topic)
        if cold is None:
            cold = ColdTable(self, topic, self.lake.table_identifier(table))
            # A new dict, not an insert: reader threads iterate the tables meanwhile.
            self.tables = {**self.tables, topic: cold}
        return cold

    def table_names(self) -> set[str]:
        """The names of the tables in the lake's namespace (none when it does not exist)."""
        catalog = self.catalog()
        try:
            identifiers = catalog.list_tables(self.lake.namespace)
        except NoSuchNamespaceError:
            return set()
        except Exception as error:
            raise ColdsetError(
                f"cannot list the tables of namespace {self.lake.namespace}: {error}"
            ) from error
        return {identifier[-1] for identifier in identifiers}

    def cached_row_groups(self, file: FileRef) -> list[SegmentRef] | None:
        """The row groups of a data file if its footer is cached, else None (no read)."""
        return self._footers.get(file.path)

    def row_groups(self, file: FileRef) -> list[SegmentRef]:
        """The row groups of a data file with their offset ranges (footer read once)."""
        cached = self.cached_row_groups(file)
        if cached is not None:
            return cached
        table = self._any_table()
        try:
            with table.io.new_input(file.path).open() as stream:
                metadata = pq.ParquetFile(stream).metadata
        except Exception as error:
            raise ColdsetError(f"cannot read the footer of {file.path}: {error}") from error
        column = next(
            (
                i
                for i in range(metadata.num_columns)
                if metadata.schema.column(i).path == "kafka_offset"
            ),
            None,
        )
        if column is None:
            raise ColdsetError(f"{file.path} has no kafka_offset column")
        refs = []
        for index in range(metadata.num_row_groups):
            bounds = row_group_offset_range(metadata, index, column)
            low, high = bounds if bounds is not None else (file.low, file.high)
            refs.append(SegmentRef(file.path, index, low, high))
        self._footers.put(file.path, refs, 200 * len(refs) + len(file.path))
        return refs

    def _any_table(self) -> Table:
        for cold in self.tables.values():
            snap = cold._snapshot
            if snap is not None and snap.table is not None:
                return snap.table
        raise ColdsetError("no coldset table is loaded")

    def segment(
        self, ref: SegmentRef, partition: int, encode: PayloadEncoder | None = None
    ) -> Segment:
        """Every decoded row of ``partition`` in one row group (its slices joined);
        ``encode`` is the table's payload encoder (typed tables)."""
        return concat_segments(self._slices(ref, partition, encode=encode))

    def slices_from(
        self,
        ref: SegmentRef,
        partition: int,
        offset: int,
        want_bytes: int,
        encode: PayloadEncoder | None = None,
        also: Collection[int] = (),
    ) -> list[tuple[tuple[str, int, int, int], Segment]]:
        """Cached slices of a row group: the one holding the first row of ``partition`` at
        or after ``offset``, then the next ones while fewer than ``want_bytes`` are gathered
        (the row group is read again when a needed slice is not cached). A row group read now
        is split for the partitions ``also`` too (see :meth:`load`)."""
        base = (ref.path, ref.row_group, partition)
        index = self._slice_index.get(base)
        if index is None:
            self._slices(ref, partition, force=True, encode=encode, also=also)
            index = self._slice_index.get(base, [])
        number = bisect_left(index, offset, key=lambda bounds: bounds[1])
        out: list[tuple[tuple[str, int, int, int], Segment]] = []
        gathered = 0
        while number < len(index) and (not out or gathered < want_bytes):
            key = (*base, number)
            piece = self.segments.get(key)
            if piece is None:
                pieces = self._slices(ref, partition, force=True, encode=encode, also=also)
                if number >= len(pieces):
                    break
                piece = pieces[number]
            out.append((key, piece))
            gathered += piece.nbytes
            number += 1
        return out

    def done_with(self, read: ColdRead, next_offset: int) -> None:
        """A sequential reader has passed the slices ``read`` came from: evict them first."""
        for key, last in read.slices:
            if next_offset > last:
                self.segments.demote(key)

    def start_read(
        self, cold: ColdTable, partition: int, offset: int, siblings: Mapping[int, int]
    ) -> None:
        """Read, on a reader thread, what a read of ``partition`` from ``offset`` needs (its
        footer and row group, split for ``siblings`` as :meth:`.ColdTable.read` does), leaving
        it cached for the Fetch that asked. Errors are left to that Fetch, which reads again."""

        def read() -> None:
            with contextlib.suppress(Exception):  # the fetch's own read reports it
                cold.read(partition, offset, 0, siblings)

        with contextlib.suppress(RuntimeError):  # closed
            self.executor.submit(read)

    def has_cached(self, ref: SegmentRef, partition: int) -> bool:
        """Whether every slice of row group ``ref`` of ``partition`` is cached."""
        index = self._slice_index.get((ref.path, ref.row_group, partition))
        return index is not None and all(
            (ref.path, ref.row_group, partition, n) in self.segments for n in range(len(index))
        )

    def load(
        self,
        ref: SegmentRef,
        partitions: Collection[int],
        encode: PayloadEncoder | None = None,
    ) -> None:
        """Make the slices of row group ``ref`` of each of ``partitions`` cached: the row group
        is read once for all those not cached yet, and only into room that unread slices leave
        (what a reader still needs is never evicted for what it may need later)."""
        missing = [p for p in partitions if not self.has_cached(ref, p)]
        if missing and self._has_room(self._row_group_bytes):
            self._slices(ref, missing[0], encode=encode, also=missing[1:])

    def _has_room(self, size: int) -> bool:
        """Whether ``size`` more bytes fit in the cache without evicting unread slices."""
        return self.segments.live_size + size <= self.segments.max_bytes

    def _slices(
        self,
        ref: SegmentRef,
        partition: int,
        force: bool = False,
        encode: PayloadEncoder | None = None,
        also: Collection[int] = (),
    ) -> list[Segment]:
        """The slices of a row group, from the cache or read now (once, however many threads
        ask at the same time). A data file is immutable and its rows' bytes do not depend on
        the table's later schemas, so slices stay valid across snapshots. A read is split for
        the partitions ``also`` too: those not cached nor being loaded get their slices cached
        (within the room unread slices leave)."""
        base = (ref.path, ref.row_group, partition)
        if not force:
            cached = self._cached_slices(base)
            if cached is not None:
                return cached
        others: dict[int, Future[list[Segment]]] = {}
        with self._loading_lock:
            future = self._loading.get(base)
            owner = future is None
            if future is None:
                # A load that finished since the check above left its slices in the cache
                # before it left ``_loading``: use them rather than read the row group again.
                cached = self._cached_slices(base)
                if cached is not None:
                    return cached
                future = Future()
                self._loading[base] = future
                others = self._claim(ref, partition, also)
        if not owner:
            return future.result()
        try:
            read = self._read_slices(ref, [partition, *others], encode)
        except BaseException as error:
            for waited in (future, *others.values()):
                waited.set_exception(error)
            raise
        else:
            slices = read[partition]
            future.set_result(slices)
            self._keep(base, slices)
            self._row_group_bytes = sum(p.nbytes for p in slices)
            for other, waited in others.items():
                pieces = read[other]
                waited.set_result(pieces)
                if (
                    self.segments.live_size + sum(p.nbytes for p in pieces)
                    <= self.segments.max_bytes
                ):
                    self._keep((ref.path, ref.row_group, other), pieces)
            return slices
        finally:
            with self._loading_lock:
                for other in (partition, *others):
                    self._loading.pop((ref.path, ref.row_group, other), None)

    def _claim(
        self, ref: SegmentRef, partition: int, also: Collection[int]
    ) -> dict[int, Future[list[Segment]]]:
        """Mark row group ``ref`` of each partition of ``also`` neither cached nor being loaded
        as being loaded by the caller (``_loading_lock`` held): their loads wait for its read."""
        claimed: dict[int, Future[list[Segment]]] = {}
        for other in also:
            key = (ref.path, ref.row_group, other)
            if other == partition or key in self._loading or self._cached_slices(key) is not None:
                continue
            claimed[other] = self._loading[key] = Future()
        return claimed

    def _keep(self, base: tuple[str, int, int], slices: list[Segment]) -> None:
        """Cache the slices of row group ``base`` (path, row group, partition) and index them."""
        for number, piece in enumerate(slices):
            self.segments.put((*base, number), piece, piece.nbytes)
        self._slice_index[base] = [(int(p.offsets[0]), int(p.offsets[-1])) for p in slices]

    def _cached_slices(self, base: tuple[str, int, int]) -> list[Segment] | None:
        """Every slice of row group ``base`` (path, row group, partition) if all are cached."""
        index = self._slice_index.get(base)
        if index is None:
            return None
        pieces = [self.segments.get((*base, n)) for n in range(len(index))]
        if any(piece is None for piece in pieces):
            return None
        return pieces  # type: ignore[return-value]

    def _read_slices(
        self, ref: SegmentRef, partitions: list[int], encode: PayloadEncoder | None
    ) -> dict[int, list[Segment]]:
        table = self._any_table()
        try:
            with table.io.new_input(ref.path).open() as stream:
                # Pre-buffering coalesces an object store's ranged reads; on a local disk it
                # only adds a hop through Arrow's I/O threads.
                parquet = pq.ParquetFile(stream, pre_buffer=not _is_local(ref.path))
                return read_row_group_partitions(
                    parquet, ref.row_group, partitions, _SLICE_BYTES, encode
                )
        except ColdsetError:
            raise
        except Exception as error:
            raise ColdsetError(
                f"cannot read row group {ref.row_group} of {ref.path}: {error}"
            ) from error

    def prefetch(self, cold: ColdTable, partition: int, offset: int) -> None:
        """Load the row groups after ``offset`` in the background, and encode the payloads
        of a typed table's slices from ``offset`` on (errors are ignored: the fetch that needs
        them reads them again and reports the failure)."""
        self.prefetch_many(cold, {partition: offset})

    def prefetch_many(self, cold: ColdTable, offsets: Mapping[int, int]) -> None:
        """:meth:`prefetch` for each partition of ``offsets`` (partition -> offset). Read-ahead
        is queued (a newer offset of a queued partition replaces the older) and worked off by
        one reader thread at a time, ``_AHEAD_CHUNK`` partitions per turn, so read-ahead of
        thousands of partitions never holds every reader thread, nor queues work a Fetch
        would wait behind for more than a turn; a row group several queued partitions need is
        read once for them all."""
        if self.config.read_ahead_segments <= 0 or not offsets:
            return
        with self._ahead_lock:
            for partition, offset in offsets.items():
                key = (cold.topic, partition)
                self._ahead_queue.pop(key, None)
                self._ahead_queue[key] = (cold, partition, offset)
            if self._ahead_draining:
                return
            self._ahead_draining = True
        self._next_ahead_turn()

    def _next_ahead_turn(self) -> None:
        try:
            self.executor.submit(self._ahead_turn)
        except RuntimeError:  # closed
            with self._ahead_lock:
                self._ahead_draining = False

    def _ahead_turn(self) -> None:
        with self._ahead_lock:
            taken = [
                self._ahead_queue.pop(next(iter(self._ahead_queue)))
                for _ in range(min(_AHEAD_CHUNK, len(self._ahead_queue)))
            ]
        try:
            by_table: dict[ColdTable, dict[int, int]] = {}
            for cold, partition, offset in taken:
                by_table.setdefault(cold, {})[partition] = offset
            for cold, offsets in by_table.items():
                self._read_ahead(cold, offsets)
        finally:
            with self._ahead_lock:
                more = bool(self._ahead_queue)
                self._ahead_draining = more
            if more:
                self._next_ahead_turn()

    def _read_ahead(self, cold: ColdTable, offsets: dict[int, int]) -> None:
        """Load the next ``read_ahead_segments`` row groups of each partition after its offset
        (each row group once for all the partitions needing it) and encode a typed table's
        payloads from there. Best effort: errors are left to the fetches that need the rows."""
        try:
            encode = cold.encoder()
        except Exception:
            return
        needs: dict[tuple[str, int], tuple[SegmentRef, dict[int, int]]] = {}
        for partition, offset in offsets.items():
            try:
                refs = cold.next_refs(partition, offset, self.config.read_ahead_segments)
            except Exception:
                continue
            for ref in refs:
                needs.setdefault((ref.path, ref.row_group), (ref, {}))[1][partition] = offset
        for ref, wanted in needs.values():
            try:
                self.load(ref, list(wanted), encode)
                if encode is not None:
                    for partition, offset in wanted.items():
                        self._encode_ahead(ref, partition, offset)
            except Exception:
                continue

    def _encode_ahead(self, ref: SegmentRef, partition: int, offset: int) -> None:
        """Make the payloads of the cached slices of a row group holding offsets from
        ``offset`` on, so the fetches reaching them find their bytes ready."""
        base = (ref.path, ref.row_group, partition)
        for number, (_, last) in enumerate(self._slice_index.get(base, [])):
            if last < offset:
                continue
            piece = self.segments.get((*base, number))
            if piece is not None and not piece.source.ready:
                piece.source.get()

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """Run a blocking coldset call on the reader threads, within ``read_timeout_seconds``;
        any failure becomes :class:`ColdsetError`."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self.executor, function, *args),
                self.config.read_timeout_seconds,
            )
        except ColdsetError:
            raise
        except TimeoutError:
            raise ColdsetError(
                f"a coldset read took over {self.config.read_timeout_seconds} s"
            ) from None
        except Exception as error:
            raise ColdsetError(f"{type(error).__name__}: {error}") from error

    def close(self) -> None:
        """Stop the reader threads and drop the caches."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        with self._ahead_lock:
            self._ahead_queue.clear()
        self.ahead.clear()
        self.segments.clear()
        self._footers.clear()
        self._slice_index.clear()
