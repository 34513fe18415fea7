"""Conformance suite for cache and index backends, for built-in and third-party plugins alike.

A backend takes part through a *case*: how to open it on a location (a fresh, empty directory;
a backend that keeps no files there, such as a network cache, derives a key prefix from it) and,
for caches, how to corrupt a stored entry behind the backend's back. Every check opens the
backend itself, exercises one rule of the hook contract and closes it; a broken rule raises
:class:`ConformanceError` (an ``AssertionError``, so pytest reports it as a failed test).

From a third party's own pytest, either parametrise over the checks::

    import pytest
    from bergstream.core.testing.backends import CACHE_CHECKS, CacheCase, check_id

    CASE = CacheCase("mine", open=lambda location: MyCache(location), corrupt=my_corrupt)

    @pytest.mark.parametrize("check", CACHE_CHECKS, ids=check_id)
    def test_conformance(check, tmp_path):
        check(CASE, tmp_path / "cache")

or inherit the ready-made test class and provide the case as a fixture::

    from bergstream.core.testing.backends import CacheConformance

    class TestMyCache(CacheConformance):
        @pytest.fixture
        def cache_case(self):
            return CASE

or run everything at once with :func:`run_cache_conformance` / :func:`run_index_conformance`.
Importing this module does not import pytest.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bergstream.core.backends import (
    CacheBackend,
    ChunkEntry,
    ConditionalCacheBackend,
    IndexBackend,
    SnapshotRecord,
)

__all__ = [
    "CACHE_CHECKS",
    "INDEX_CHECKS",
    "CacheCase",
    "CacheCheck",
    "CacheConformance",
    "ConformanceError",
    "IndexCase",
    "IndexCheck",
    "IndexConformance",
    "check_id",
    "chunk",
    "run_cache_conformance",
    "run_index_conformance",
    "snapshot",
]


class ConformanceError(AssertionError):
    """A backend broke a rule of the hook contract; the message names the rule."""


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


def _show(value: bytes | None, limit: int = 40) -> str:
    if value is None:
        return "None"
    shown = repr(value[:limit])
    return f"{shown}{'...' if len(value) > limit else ''} ({len(value)} bytes)"


@dataclass(frozen=True)
class CacheCase:
    """How the suite opens a cache backend and corrupts one of its entries.

    ``open(location)`` returns a new backend instance on ``location``; two calls with the same
    location must reach the same stored entries (a restart, or a second gateway sharing the
    cache). ``corrupt(location, key)`` changes the stored bytes of ``key`` without going through
    the backend (flip a byte of the file, overwrite the object in S3, ...).
    """

    name: str
    open: Callable[[Path], CacheBackend]
    corrupt: Callable[[Path, str], None]


@dataclass(frozen=True)
class IndexCase:
    """How the suite opens an index backend: ``open(location)`` returns a new instance on the
    given directory; a second call after ``close`` must see what the first stored."""

    name: str
    open: Callable[[Path], IndexBackend]


#: A cache check: ``check(case, location)``.
CacheCheck = Callable[[CacheCase, Path], None]
#: An index check: ``check(case, location)``.
IndexCheck = Callable[[IndexCase, Path], None]


def check_id(check: Callable[..., Any]) -> str:
    """The name of a check, for ``pytest.mark.parametrize(..., ids=check_id)``."""
    return check.__name__


def _run_threads(targets: Sequence[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


# --------------------------------------------------------------------------- caches


def cache_round_trip(case: CacheCase, location: Path) -> None:
    """Stored bytes come back equal: empty, every byte value, 1 MiB, keys with many segments,
    and a memoryview put (ISK's synthesized files) comes back as its bytes."""
    cache = case.open(location)
    try:
        values = {
            "hotset/t/p0/0-100.parquet": b"PAR1 data",
            "empty": b"",
            "all/bytes": bytes(range(256)) * 4,
            "big/one": bytes(range(251)) * ((1 << 20) // 251 + 1),
            "a/b/c/d/e/f/metadata/00001-snap.metadata.json": b'{"format-version": 2}',
        }
        for key, value in values.items():
            cache.put(key, value)
        # ISK puts views of the buffers files were written into: bytes-like, not bytes.
        cache.put("view/of/buffer", memoryview(b"__PAR1 view__")[2:-2])
        values["view/of/buffer"] = b"PAR1 view"
        for key, value in values.items():
            got = cache.get(key)
            _expect(got == value, f"get({key!r}) returned {_show(got)}, put {_show(value)}")
    finally:
        cache.close()


def cache_missing_key(case: CacheCase, location: Path) -> None:
    """An absent key is a miss; deleting it is harmless; a deleted key is a miss."""
    cache = case.open(location)
    try:
        _expect(cache.get("never/stored") is None, "get of a key never stored is not None")
        cache.delete("never/stored")
        cache.put("a", b"1")
        _expect(cache.get("a/b") is None, "get('a/b') is not None after put('a') only")
        cache.delete("a")
        _expect(cache.get("a") is None, "get('a') is not None after delete('a')")
    finally:
        cache.close()


def cache_overwrite(case: CacheCase, location: Path) -> None:
    """A second put of a key replaces the first, longer or shorter."""
    cache = case.open(location)
    try:
        cache.put("k", b"first")
        cache.put("k", b"second, longer")
        got = cache.get("k")
        _expect(got == b"second, longer", f"after two puts get('k') returned {_show(got)}")
        cache.put("k", b"3")
        got = cache.get("k")
        _expect(got == b"3", f"after a shorter put get('k') returned {_show(got)}")
    finally:
        cache.close()


def cache_keys_are_distinct(case: CacheCase, location: Path) -> None:
    """Keys that share prefixes or differ only in case are separate entries."""
    cache = case.open(location)
    keys = ["p", "p/q", "p/q/r", "pq", "P", "p/Q", "p-q", "p.q"]
    try:
        for key in keys:
            cache.put(key, key.encode())
        for key in keys:
            got = cache.get(key)
            _expect(got == key.encode(), f"get({key!r}) returned {_show(got)}")
    finally:
        cache.close()


def cache_corruption_is_a_miss(case: CacheCase, location: Path) -> None:
    """A corrupt entry is never served: a miss, and it stays a miss until put again."""
    cache = case.open(location)
    try:
        cache.put("k", b"x" * 1000)
        cache.put("other", b"y" * 1000)
        case.corrupt(location, "k")
        got = cache.get("k")
        _expect(got is None, f"a corrupted entry was served: {_show(got)}")
        _expect(cache.get("k") is None, "a corrupted entry was served on the second get")
        got = cache.get("other")
        _expect(got == b"y" * 1000, f"an intact entry next to a corrupt one: {_show(got)}")
        cache.put("k", b"fresh")
        got = cache.get("k")
        _expect(got == b"fresh", f"put after corruption, then get returned {_show(got)}")
    finally:
        cache.close()


def cache_concurrent_writers(case: CacheCase, location: Path, threads: int = 8) -> None:
    """Writers of one key racing readers: every read is a miss or one writer's whole bytes."""
    cache = case.open(location)
    payloads = [bytes([i]) * (50_000 + i) for i in range(threads)]
    seen: list[bytes | None] = []

    def writer(payload: bytes) -> Callable[[], None]:
        def write() -> None:
            for _ in range(10):
                cache.put("same/key", payload)
                seen.append(cache.get("same/key"))

        return write

    try:
        errors = _run_threads([writer(p) for p in payloads])
        _expect(not errors, f"concurrent put/get raised: {errors!r}")
        torn = [value for value in seen if value is not None and value not in payloads]
        if torn:
            raise ConformanceError(
                f"{len(torn)} reads returned bytes no writer put, e.g. {_show(torn[0])}"
            )
        final = cache.get("same/key")
        _expect(final in payloads, f"after the race get returned {_show(final)}")
    finally:
        cache.close()


def cache_shared_between_instances(case: CacheCase, location: Path) -> None:
    """Two instances on one location (two gateways sharing a cache) see each other's entries
    and may write the same key at once."""
    first, second = case.open(location), case.open(location)
    try:
        first.put("shared/a", b"from the first")
        got = second.get("shared/a")
        _expect(got == b"from the first", f"the second instance read {_show(got)}")
        payloads = [b"1" * 30_000, b"2" * 40_000]

        def writer(instance: CacheBackend, payload: bytes) -> Callable[[], None]:
            def write() -> None:
                for _ in range(10):
                    instance.put("shared/b", payload)

            return write

        errors = _run_threads([writer(first, payloads[0]), writer(second, payloads[1])])
        _expect(not errors, f"two instances writing one key raised: {errors!r}")
        for instance in (first, second):
            got = instance.get("shared/b")
            _expect(got in payloads, f"after two instances raced, get returned {_show(got)}")
    finally:
        first.close()
        second.close()


def cache_survives_restart(case: CacheCase, location: Path) -> None:
    """Entries put before close are served by a new instance on the same location."""
    first = case.open(location)
    first.put("a/b", b"persisted")
    first.close()
    second = case.open(location)
    try:
        got = second.get("a/b")
        _expect(got == b"persisted", f"after a restart get('a/b') returned {_show(got)}")
    finally:
        second.close()


def _conditional_writer(
    cache: ConditionalCacheBackend, key: str, payload: bytes, won: list[bytes]
) -> Callable[[], None]:
    def write() -> None:
        if cache.put_if_absent(key, payload):
            won.append(payload)

    return write


def cache_put_if_absent(case: CacheCase, location: Path, rounds: int = 5) -> None:
    """For a backend with ``put_if_absent`` (:class:`ConditionalCacheBackend`): the first call
    on a key stores, later ones leave it; of writers racing on one key from two instances,
    exactly one wins and every reader sees its bytes. A backend without the method passes."""
    first, second = case.open(location), case.open(location)
    try:
        if not isinstance(first, ConditionalCacheBackend):
            return
        assert isinstance(second, ConditionalCacheBackend)
        _expect(first.put_if_absent("once/a", b"first") is True, "a new key was not stored")
        _expect(first.put_if_absent("once/a", b"second") is False, "an existing key was stored")
        _expect(second.put_if_absent("once/a", b"third") is False, "the other instance won too")
        got = second.get("once/a")
        _expect(got == b"first", f"after refused writes get returned {_show(got)}")
        for round_ in range(rounds):
            key = f"race/{round_}"
            won: list[bytes] = []

            payloads = [bytes([65 + i]) * (1000 + i) for i in range(8)]
            errors = _run_threads(
                [
                    _conditional_writer(first if i % 2 else second, key, payload, won)
                    for i, payload in enumerate(payloads)
                ]
            )
            _expect(not errors, f"racing put_if_absent raised: {errors!r}")
            _expect(len(won) == 1, f"{len(won)} of 8 racing writers of {key!r} won")
            for instance in (first, second):
                got = instance.get(key)
                _expect(got == won[0], f"the winner wrote {_show(won[0])}, get read {_show(got)}")
    finally:
        first.close()
        second.close()


#: Every cache check, in the order :func:`run_cache_conformance` runs them.
CACHE_CHECKS: tuple[CacheCheck, ...] = (
    cache_round_trip,
    cache_missing_key,
    cache_overwrite,
    cache_keys_are_distinct,
    cache_corruption_is_a_miss,
    cache_concurrent_writers,
    cache_shared_between_instances,
    cache_survives_restart,
    cache_put_if_absent,
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


def _starts(entries: Sequence[ChunkEntry]) -> list[int]:
    return [entry.start_offset for entry in entries]


def index_round_trip(case: IndexCase, location: Path) -> None:
    """Entries come back equal: ints, aware datetimes, bytes, strings, None and floats in
    bounds, offsets up to 2**62."""
    index = case.open(location)
    try:
        odd = ChunkEntry(
            topic="t",
            partition=0,
            start_offset=250,
            end_offset=2**62,
            row_count=7,
            size_bytes=0,
            bounds={
                "kafka_key": (b"", b"\xff\x00"),
                "name": ("a", None),
                "price": (-1.5, 2.25),
                "flag": (False, True),
            },
        )
        entries = [chunk(0, 100), chunk(100, 250), odd]
        index.put_chunks(entries)
        got = index.chunks("t", 0)
        _expect(got == entries, f"chunks('t', 0) returned {got!r}, put {entries!r}")
    finally:
        index.close()


def index_missing(case: IndexCase, location: Path) -> None:
    """Unknown topics and partitions have no chunks; an empty put is harmless."""
    index = case.open(location)
    try:
        _expect(index.chunks("t", 0) == [], "a new index has chunks")
        index.put_chunks([])
        index.put_chunks([chunk(0, 10)])
        _expect(index.chunks("other", 0) == [], "an unknown topic has chunks")
        _expect(index.chunks("t", 1) == [], "an unknown partition has chunks")
    finally:
        index.close()


def index_overwrite(case: IndexCase, location: Path) -> None:
    """A chunk with the same (topic, partition, start_offset) replaces the old one."""
    index = case.open(location)
    try:
        index.put_chunks([chunk(0, 10)])
        index.put_chunks([chunk(0, 20)])
        got = index.chunks("t", 0)
        _expect(got == [chunk(0, 20)], f"after replacing [0, 10) by [0, 20): {got!r}")
        index.put_chunks([chunk(0, 5), chunk(5, 20)])
        got = index.chunks("t", 0, 6, 7)
        _expect(_starts(got) == [5], f"after shrinking, chunks overlapping [6, 7): {got!r}")
    finally:
        index.close()


def index_range_queries(case: IndexCase, location: Path) -> None:
    """``chunks`` returns those overlapping ``[start, end)``, in offset order."""
    index = case.open(location)
    try:
        index.put_chunks([chunk(200, 300), chunk(0, 100), chunk(100, 200), chunk(0, 50, "u")])
        index.put_chunks([chunk(0, 100, partition=1)])
        cases: list[tuple[int, int | None, list[int]]] = [
            (0, None, [0, 100, 200]),
            (100, 200, [100]),
            (99, 101, [0, 100]),
            (150, None, [100, 200]),
            (300, None, []),
            (0, 0, []),
            (299, 1000, [200]),
            (0, 1, [0]),
        ]
        for start, end, expected in cases:
            got = _starts(index.chunks("t", 0, start, end))
            _expect(got == expected, f"chunks('t', 0, {start}, {end}) starts {got}, not {expected}")
        got_partitions = [e.partition for e in index.chunks("t", 1)]
        _expect(got_partitions == [1], f"partition 1 holds {got_partitions}")
        # A long chunk starting well before the range still overlaps it.
        index.put_chunks([chunk(1000, 5000), chunk(5000, 5001)])
        got = _starts(index.chunks("t", 0, 4000, 4001))
        _expect(got == [1000], f"a long chunk [1000, 5000) not found for [4000, 4001): {got}")
    finally:
        index.close()


def index_topics_are_distinct(case: IndexCase, location: Path) -> None:
    """Topics whose names are prefixes of each other, and many partitions, never mix."""
    index = case.open(location)
    topics = ["t", "t2", "t.2", "tt", "t-", "日本"]
    try:
        for n, topic in enumerate(topics):
            index.put_chunks([chunk(0, 10 + n, topic, p) for p in (0, 1, 255, 256, 70000)])
        for n, topic in enumerate(topics):
            for partition in (0, 1, 255, 256, 70000):
                got = index.chunks(topic, partition)
                expected = [chunk(0, 10 + n, topic, partition)]
                _expect(got == expected, f"chunks({topic!r}, {partition}) returned {got!r}")
        _expect(index.chunks("t", 2) == [], "partition 2 of 't' has chunks")
    finally:
        index.close()


def index_concurrent_writer_and_readers(case: IndexCase, location: Path) -> None:
    """One writer and several readers at once: readers see whole prefixes, never errors."""
    index = case.open(location)
    done = threading.Event()

    def write() -> None:
        try:
            for i in range(100):
                index.put_chunks([chunk(i * 20, i * 20 + 10), chunk(i * 20 + 10, i * 20 + 20)])
        finally:
            done.set()

    def read() -> None:
        while not done.is_set():
            found = _starts(index.chunks("t", 0))
            _expect(
                found == list(range(0, len(found) * 10, 10)) and len(found) % 2 == 0,
                f"a reader saw a partial or unordered state: {found}",
            )

    try:
        errors = _run_threads([write, read, read, read])
        _expect(not errors, f"concurrent put_chunks/chunks raised: {errors!r}")
        count = len(index.chunks("t", 0))
        _expect(count == 200, f"after the writer finished the index holds {count} chunks")
    finally:
        index.close()


def index_survives_restart(case: IndexCase, location: Path) -> None:
    """Chunks put before close are found by a new instance on the same location, which can
    add more."""
    first = case.open(location)
    first.put_chunks([chunk(0, 10), chunk(10, 20)])
    first.close()
    second = case.open(location)
    try:
        got = second.chunks("t", 0, 5, 15)
        _expect(got == [chunk(0, 10), chunk(10, 20)], f"after a restart: {got!r}")
        second.put_chunks([chunk(20, 30)])
    finally:
        second.close()
    third = case.open(location)
    try:
        got_starts = _starts(third.chunks("t", 0))
        _expect(got_starts == [0, 10, 20], f"after a second restart: {got_starts}")
    finally:
        third.close()


def snapshot(snapshot_id: int, sequence_number: int, table: str = "t") -> SnapshotRecord:
    """A snapshot record as ISK keeps them: its state is JSON naming the table and the snapshot."""
    state = {"table": table, "snapshot-id": snapshot_id, "files": [f"s{sequence_number}.avro"]}
    return SnapshotRecord(
        snapshot_id=snapshot_id,
        sequence_number=sequence_number,
        timestamp_ms=1_795_000_000_000 + sequence_number,
        state=json.dumps(state),
    )


def _brief(records: Sequence[SnapshotRecord]) -> str:
    """Records for a message: ids, sequence numbers, timestamps and the start of each state."""
    shown = [
        f"({r.snapshot_id}, seq {r.sequence_number}, ts {r.timestamp_ms}, "
        f"{_show(r.state.encode() if isinstance(r.state, str) else r.state)})"
        for r in records
    ]
    return "[" + ", ".join(shown) + "]"


def _sequences(records: Sequence[SnapshotRecord]) -> list[int]:
    return [record.sequence_number for record in records]


def index_snapshot_round_trip(case: IndexCase, location: Path) -> None:
    """Snapshot records come back equal: ids up to 2**63 - 1, timestamp 0, empty and large,
    non-ASCII states; a table without snapshots has an empty history."""
    index = case.open(location)
    try:
        _expect(index.snapshots("t") == [], "a new index has snapshots of table 't'")
        records = [
            snapshot(2**63 - 1, 1),
            SnapshotRecord(snapshot_id=1, sequence_number=2, timestamp_ms=0, state=""),
            SnapshotRecord(
                7, 3, 1_795_000_000_123, json.dumps({"name": "Zürich 日本", "pad": "x" * 60_000})
            ),
            snapshot(5_123_456_789_012_345_678, 2**62),
        ]
        for record in records:
            index.put_snapshot("t", record)
        got = index.snapshots("t")
        _expect(got == records, f"snapshots('t') returned {_brief(got)}, put {_brief(records)}")
        _expect(index.snapshots("u") == [], "a table never written has snapshots")
    finally:
        index.close()


def index_snapshot_order(case: IndexCase, location: Path) -> None:
    """A history comes back by ascending sequence number, whatever the order of the puts and
    of the snapshot ids (ids are random in Iceberg)."""
    index = case.open(location)
    try:
        ids = {1: 900, 2: 17, 3: 2**40, 4: 5, 5: 300, 10: 1, 256: 2**62, 257: 42}
        for sequence in (5, 1, 257, 3, 10, 2, 256, 4):
            index.put_snapshot("t", snapshot(ids[sequence], sequence))
        got = _sequences(index.snapshots("t"))
        _expect(got == sorted(ids), f"sequence numbers of the history: {got}, not {sorted(ids)}")
        got_ids = [record.snapshot_id for record in index.snapshots("t")]
        expected_ids = [ids[sequence] for sequence in sorted(ids)]
        _expect(got_ids == expected_ids, f"snapshot ids of the history: {got_ids}")
    finally:
        index.close()


def index_snapshot_replace(case: IndexCase, location: Path) -> None:
    """A put with the snapshot id of a held snapshot replaces it (state, timestamp, and its
    place when the sequence number changes); the history never holds an id twice."""
    index = case.open(location)
    try:
        for sequence, snapshot_id in ((1, 11), (2, 22), (3, 33)):
            index.put_snapshot("t", snapshot(snapshot_id, sequence))
        replaced = SnapshotRecord(22, 2, 99, '{"replaced": true}')
        index.put_snapshot("t", replaced)
        got = index.snapshots("t")
        expected = [snapshot(11, 1), replaced, snapshot(33, 3)]
        _expect(got == expected, f"after replacing snapshot 22 in place: {_brief(got)}")
        moved = SnapshotRecord(11, 4, 100, '{"moved": true}')
        index.put_snapshot("t", moved)
        got = index.snapshots("t")
        expected = [replaced, snapshot(33, 3), moved]
        _expect(got == expected, f"after moving snapshot 11 to sequence 4: {_brief(got)}")
        index.put_snapshot("t", moved)
        count = len(index.snapshots("t"))
        _expect(count == 3, f"putting the same record twice left {count} snapshots, not 3")
    finally:
        index.close()


def index_snapshot_drop(case: IndexCase, location: Path) -> None:
    """Dropped snapshots are gone, the rest keep their order; unknown ids, an empty list and
    dropping twice are harmless."""
    index = case.open(location)
    try:
        for sequence in range(1, 7):
            index.put_snapshot("t", snapshot(sequence * 10, sequence))
        index.drop_snapshots("t", [20, 50, 12345, 2**63 - 1])
        got = _sequences(index.snapshots("t"))
        _expect(got == [1, 3, 4, 6], f"after dropping snapshots 20 and 50: sequences {got}")
        index.drop_snapshots("t", [])
        index.drop_snapshots("t", [20])
        index.drop_snapshots("never-written", [10, 30])
        got = _sequences(index.snapshots("t"))
        _expect(got == [1, 3, 4, 6], f"after dropping nothing held: sequences {got}")
        index.put_snapshot("t", snapshot(20, 2))
        got = _sequences(index.snapshots("t"))
        _expect(got == [1, 2, 3, 4, 6], f"a dropped id put again: sequences {got}")
        index.drop_snapshots("t", [10, 20, 30, 40, 60])
        _expect(
            index.snapshots("t") == [], "after dropping every snapshot the history is not empty"
        )
    finally:
        index.close()


def index_snapshot_tables_are_distinct(case: IndexCase, location: Path) -> None:
    """Tables whose names are prefixes of each other keep their own histories, even with the
    same snapshot ids; a table's history and the chunks of a topic of the same name never mix."""
    index = case.open(location)
    tables = ["t", "t2", "t.2", "tt", "t-", "ns.t", "日本"]
    try:
        index.put_chunks([chunk(0, 10)])
        for n, table in enumerate(tables):
            for sequence in range(1, n + 2):
                index.put_snapshot(table, snapshot(sequence, sequence, table))
        index.drop_snapshots("t2", [1])
        for n, table in enumerate(tables):
            expected = [snapshot(s, s, table) for s in range(1, n + 2)]
            if table == "t2":
                expected = expected[1:]
            got = index.snapshots(table)
            _expect(got == expected, f"snapshots({table!r}) returned {_brief(got)}")
        got_chunks = index.chunks("t", 0)
        _expect(
            got_chunks == [chunk(0, 10)], f"snapshots of table 't' changed chunks: {got_chunks}"
        )
    finally:
        index.close()


def index_snapshot_concurrent_writers(case: IndexCase, location: Path) -> None:
    """Writers of several tables and readers at once: no errors, readers see ordered
    histories, and every put is kept."""
    index = case.open(location)
    done = threading.Event()

    def writer(table: str) -> Callable[[], None]:
        def write() -> None:
            for sequence in range(1, 41):
                index.put_snapshot(table, snapshot(1000 - sequence, sequence, table))
                if sequence % 10 == 0:
                    index.drop_snapshots(table, [1000 - sequence + 5])

        return write

    def read() -> None:
        while not done.is_set():
            for table in ("a", "b"):
                found = _sequences(index.snapshots(table))
                _expect(found == sorted(set(found)), f"a reader saw history {found} of {table}")

    def writers() -> None:
        try:
            errors = _run_threads([writer(table) for table in ("a", "b", "c")])
            _expect(not errors, f"concurrent put_snapshot/drop_snapshots raised: {errors!r}")
        finally:
            done.set()

    try:
        errors = _run_threads([writers, read, read])
        _expect(not errors, f"concurrent snapshot writers and readers: {errors!r}")
        expected = [s for s in range(1, 41) if s % 10 != 5]
        for table in ("a", "b", "c"):
            got = _sequences(index.snapshots(table))
            _expect(got == expected, f"after the writers finished, {table!r} holds {got}")
    finally:
        index.close()


def index_snapshots_survive_restart(case: IndexCase, location: Path) -> None:
    """Snapshots put before close are found by a new instance on the same location, which can
    replace, drop and add more."""
    first = case.open(location)
    for sequence in (1, 2, 3):
        first.put_snapshot("t", snapshot(sequence * 7, sequence))
    first.close()
    second = case.open(location)
    try:
        got = second.snapshots("t")
        expected = [snapshot(7, 1), snapshot(14, 2), snapshot(21, 3)]
        _expect(got == expected, f"after a restart: {_brief(got)}")
        second.drop_snapshots("t", [7])
        second.put_snapshot("t", SnapshotRecord(14, 2, 5, "{}"))
        second.put_snapshot("t", snapshot(28, 4))
    finally:
        second.close()
    third = case.open(location)
    try:
        got = third.snapshots("t")
        expected = [SnapshotRecord(14, 2, 5, "{}"), snapshot(21, 3), snapshot(28, 4)]
        _expect(got == expected, f"after a second restart: {_brief(got)}")
    finally:
        third.close()


#: Every index check, in the order :func:`run_index_conformance` runs them.
INDEX_CHECKS: tuple[IndexCheck, ...] = (
    index_round_trip,
    index_missing,
    index_overwrite,
    index_range_queries,
    index_topics_are_distinct,
    index_concurrent_writer_and_readers,
    index_survives_restart,
    index_snapshot_round_trip,
    index_snapshot_order,
    index_snapshot_replace,
    index_snapshot_drop,
    index_snapshot_tables_are_distinct,
    index_snapshot_concurrent_writers,
    index_snapshots_survive_restart,
)

# --------------------------------------------------------------------------- runners


def _run_all(checks: Sequence[Callable[[Any, Path], None]], case: Any, workdir: Path) -> None:
    failures = []
    for check in checks:
        location = Path(workdir) / check.__name__
        try:
            check(case, location)
        except Exception as error:
            failures.append(f"{check.__name__}: {type(error).__name__}: {error}")
    if failures:
        raise ConformanceError(
            f"backend {case.name!r} fails {len(failures)} of {len(checks)} checks:\n  "
            + "\n  ".join(failures)
        )


def run_cache_conformance(case: CacheCase, workdir: Path) -> None:
    """Run every cache check, each on its own location under ``workdir``; raise one
    :class:`ConformanceError` listing every failed check."""
    _run_all(CACHE_CHECKS, case, workdir)


def run_index_conformance(case: IndexCase, workdir: Path) -> None:
    """Run every index check, each on its own location under ``workdir``; raise one
    :class:`ConformanceError` listing every failed check."""
    _run_all(INDEX_CHECKS, case, workdir)


# --------------------------------------------------------------------------- pytest classes


def _cache_test(check: CacheCheck) -> Callable[[Any, CacheCase, Path], None]:
    def test(self: Any, cache_case: CacheCase, tmp_path: Path) -> None:
        check(cache_case, tmp_path / "cache")

    test.__name__ = f"test_{check.__name__}"
    test.__doc__ = check.__doc__
    return test


def _index_test(check: IndexCheck) -> Callable[[Any, IndexCase, Path], None]:
    def test(self: Any, index_case: IndexCase, tmp_path: Path) -> None:
        check(index_case, tmp_path / "index")

    test.__name__ = f"test_{check.__name__}"
    test.__doc__ = check.__doc__
    return test


#: Base class of a pytest test class running every cache check: subclass it (name it
#: ``Test...``) and define a ``cache_case`` fixture returning your :class:`CacheCase`.
CacheConformance: type = type(
    "CacheConformance",
    (),
    {
        "__doc__": "pytest mix-in: one test per cache check; needs a ``cache_case`` fixture.",
        "__module__": __name__,
        **{f"test_{check.__name__}": _cache_test(check) for check in CACHE_CHECKS},
    },
)

#: Base class of a pytest test class running every index check: subclass it (name it
#: ``Test...``) and define an ``index_case`` fixture returning your :class:`IndexCase`.
IndexConformance: type = type(
    "IndexConformance",
    (),
    {
        "__doc__": "pytest mix-in: one test per index check; needs an ``index_case`` fixture.",
        "__module__": __name__,
        **{f"test_{check.__name__}": _index_test(check) for check in INDEX_CHECKS},
    },
)
