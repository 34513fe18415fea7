"""Contract tests every CacheBackend and IndexBackend must pass, independent of the backend.

A backend takes part through a *case*: how to open it on a location (twice, for restarts) and,
for caches, how to corrupt a stored entry behind its back. Test modules parametrise over cases
and call these functions, so the suite can move into a shared conformance package unchanged.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bergstream.core.backends import CacheBackend, ChunkEntry, IndexBackend


@dataclass(frozen=True)
class CacheCase:
    """How the contract opens a cache backend and corrupts one of its entries."""

    name: str
    open: Callable[[Path], CacheBackend]
    corrupt: Callable[[Path, str], None]


@dataclass(frozen=True)
class IndexCase:
    """How the contract opens an index backend."""

    name: str
    open: Callable[[Path], IndexBackend]


# --------------------------------------------------------------------------- caches


def cache_round_trip(case: CacheCase, location: Path) -> None:
    """Stored bytes come back equal, empty bytes included."""
    cache = case.open(location)
    try:
        cache.put("hotset/t/p0/0-100.parquet", b"PAR1 data")
        cache.put("empty", b"")
        assert cache.get("hotset/t/p0/0-100.parquet") == b"PAR1 data"
        assert cache.get("empty") == b""
    finally:
        cache.close()


def cache_missing_key(case: CacheCase, location: Path) -> None:
    """An absent key is a miss; deleting it is harmless."""
    cache = case.open(location)
    try:
        assert cache.get("never/stored") is None
        cache.delete("never/stored")
        cache.put("a", b"1")
        cache.delete("a")
        assert cache.get("a") is None
    finally:
        cache.close()


def cache_overwrite(case: CacheCase, location: Path) -> None:
    """A second put of a key replaces the first."""
    cache = case.open(location)
    try:
        cache.put("k", b"first")
        cache.put("k", b"second, longer")
        assert cache.get("k") == b"second, longer"
    finally:
        cache.close()


def cache_corruption_is_a_miss(case: CacheCase, location: Path) -> None:
    """A corrupt entry is never served: a miss, and it stays a miss until put again."""
    cache = case.open(location)
    try:
        cache.put("k", b"x" * 1000)
        case.corrupt(location, "k")
        assert cache.get("k") is None
        assert cache.get("k") is None
        cache.put("k", b"fresh")
        assert cache.get("k") == b"fresh"
    finally:
        cache.close()


def cache_concurrent_writers(case: CacheCase, location: Path, threads: int = 8) -> None:
    """Writers of one key racing readers: every read is a miss or one writer's whole bytes."""
    cache = case.open(location)
    payloads = [bytes([i]) * (50_000 + i) for i in range(threads)]
    seen: list[bytes | None] = []
    errors: list[BaseException] = []

    def write(payload: bytes) -> None:
        try:
            for _ in range(10):
                cache.put("same/key", payload)
                seen.append(cache.get("same/key"))
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=write, args=(p,)) for p in payloads]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert not errors, errors
        assert all(value is None or value in payloads for value in seen)
        assert cache.get("same/key") in payloads
    finally:
        cache.close()


def cache_survives_restart(case: CacheCase, location: Path) -> None:
    """Entries put before close are served by a new instance on the same location."""
    first = case.open(location)
    first.put("a/b", b"persisted")
    first.close()
    second = case.open(location)
    try:
        assert second.get("a/b") == b"persisted"
    finally:
        second.close()


CACHE_CONTRACT = (
    cache_round_trip,
    cache_missing_key,
    cache_overwrite,
    cache_corruption_is_a_miss,
    cache_concurrent_writers,
    cache_survives_restart,
)

# --------------------------------------------------------------------------- indexes

T0 = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)


def chunk(start: int, end: int, topic: str = "t", partition: int = 0) -> ChunkEntry:
    """A chunk with offset and timestamp bounds, as ISK indexes them."""
    return ChunkEntry(
        topic=topic,
        partition=partition,
        start_offset=start,
        end_offset=end,
        row_count=end - start,
        size_bytes=100 * (end - start),
        bounds={
            "kafka_offset": (start, end - 1),
            "kafka_timestamp": (T0 + dt.timedelta(seconds=start), T0 + dt.timedelta(seconds=end)),
        },
    )


def index_round_trip(case: IndexCase, location: Path) -> None:
    """Entries come back equal, bounds (ints and aware datetimes) included."""
    index = case.open(location)
    try:
        entries = [chunk(0, 100), chunk(100, 250)]
        index.put_chunks(entries)
        assert index.chunks("t", 0) == entries
    finally:
        index.close()


def index_missing(case: IndexCase, location: Path) -> None:
    """Unknown topics and partitions have no chunks; an empty put is harmless."""
    index = case.open(location)
    try:
        index.put_chunks([])
        index.put_chunks([chunk(0, 10)])
        assert index.chunks("other", 0) == []
        assert index.chunks("t", 1) == []
    finally:
        index.close()


def index_overwrite(case: IndexCase, location: Path) -> None:
    """A chunk with the same (topic, partition, start_offset) replaces the old one."""
    index = case.open(location)
    try:
        index.put_chunks([chunk(0, 10)])
        index.put_chunks([chunk(0, 20)])
        assert index.chunks("t", 0) == [chunk(0, 20)]
    finally:
        index.close()


def index_range_queries(case: IndexCase, location: Path) -> None:
    """``chunks`` returns those overlapping ``[start, end)``, in offset order."""
    index = case.open(location)
    try:
        index.put_chunks([chunk(200, 300), chunk(0, 100), chunk(100, 200), chunk(0, 50, "u")])
        index.put_chunks([chunk(0, 100, partition=1)])

        def starts(start: int, end: int | None) -> list[int]:
            return [entry.start_offset for entry in index.chunks("t", 0, start, end)]

        assert starts(0, None) == [0, 100, 200]
        assert starts(100, 200) == [100]
        assert starts(99, 101) == [0, 100]
        assert starts(150, None) == [100, 200]
        assert starts(300, None) == []
        assert starts(0, 0) == []
        assert starts(299, 1000) == [200]
        assert [e.partition for e in index.chunks("t", 1)] == [1]
    finally:
        index.close()


def index_concurrent_writer_and_readers(case: IndexCase, location: Path) -> None:
    """One writer and several readers at once: readers see whole prefixes, never errors."""
    index = case.open(location)
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for i in range(100):
                index.put_chunks([chunk(i * 10, i * 10 + 10)])
        except BaseException as error:
            errors.append(error)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                found = [e.start_offset for e in index.chunks("t", 0)]
                assert found == list(range(0, len(found) * 10, 10)), found
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert not errors, errors
        assert len(index.chunks("t", 0)) == 100
    finally:
        index.close()


def index_survives_restart(case: IndexCase, location: Path) -> None:
    """Chunks put before close are found by a new instance on the same location."""
    first = case.open(location)
    first.put_chunks([chunk(0, 10), chunk(10, 20)])
    first.close()
    second = case.open(location)
    try:
        assert second.chunks("t", 0, 5, 15) == [chunk(0, 10), chunk(10, 20)]
    finally:
        second.close()


INDEX_CONTRACT = (
    index_round_trip,
    index_missing,
    index_overwrite,
    index_range_queries,
    index_concurrent_writer_and_readers,
    index_survives_restart,
)
