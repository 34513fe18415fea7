"""Cache and index backends side by side, in one run.

Caches (``local``, ``s3``, ``redis``): ``--ops`` puts then ``--ops`` gets of distinct keys, one
thread, for a small entry (metadata, ``--small`` bytes) and a large one (a data file,
``--large`` bytes): latency p50/p99 and throughput (MB/s, ops/s). Each row's ``x local`` is its
get ops/s divided by the ``local`` cache's at the same size (the baseline).

Shared snapshot history (ISK replicas sharing a cache, :mod:`...tables.shared_history`), per
cache: the read each LoadTable makes when no other replica recorded a snapshot (``sync``: one
missing entry) and the writes of a new snapshot (``append``: a put-if-absent and the head hint),
p50/p99; ``x get`` is the sync's p50 against the same cache's small-entry get p50.

Indexes (``sqlite``, ``rocksdb``): ``--chunks`` chunks put in batches of 1 000 (chunks/s), then
``--lookups`` random range queries of one partition (``chunks(topic, p, start, start + 3 *
chunk)``: 3 to 4 chunks each) - lookups/s and p50/p99; ``x sqlite`` is lookups/s against
``sqlite``.

The S3 server and Redis are the ones in ``BERGSTREAM_S3_*`` / ``BERGSTREAM_REDIS_URL`` (eval
``bergstream stack env``) or, when those are not set, a SeaweedFS and a Redis this script starts
in a temporary stack home and stops at the end.

    .venv/bin/python bench/backends.py [--ops 300] [--chunks 100000] [--lookups 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bergstream.core.backends import CacheBackend, ChunkEntry, IndexBackend, SnapshotRecord
from bergstream.core.testing.backends import chunk
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.cache_backends.redis_cache import RedisCache
from bergstream.plugins.cache_backends.s3_cache import S3Cache, minio_client
from bergstream.plugins.index_backends.rocksdb_index import RocksIndex
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.tables.shared_history import SharedEntry, SharedLog


@dataclass(frozen=True)
class Servers:
    """Where the network caches live."""

    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_region: str
    redis_url: str


@contextlib.contextmanager
def servers() -> Iterator[Servers]:
    """The running stack's S3 and Redis from the environment, else our own, stopped after."""
    env = os.environ
    if "BERGSTREAM_S3_ENDPOINT" in env and "BERGSTREAM_REDIS_URL" in env:
        yield Servers(
            env["BERGSTREAM_S3_ENDPOINT"],
            env["BERGSTREAM_S3_ACCESS_KEY"],
            env["BERGSTREAM_S3_SECRET_KEY"],
            env.get("BERGSTREAM_S3_REGION", "us-east-1"),
            env["BERGSTREAM_REDIS_URL"],
        )
        return
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as home:
        try:
            stack = stack_up(home=Path(home), components={"s3", "redis"})
            assert stack.s3_endpoint and stack.redis_url
            yield Servers(
                stack.s3_endpoint,
                stack.s3_access_key or "",
                stack.s3_secret_key or "",
                stack.s3_region,
                stack.redis_url,
            )
        finally:
            stack_down(home=Path(home))


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@dataclass(frozen=True)
class Timing:
    """Latencies (seconds) of a series of calls and its wall time."""

    samples: list[float]
    wall: float

    @property
    def ops_per_s(self) -> float:
        """Calls per second over the wall time."""
        return len(self.samples) / self.wall

    def ms(self, fraction: float) -> float:
        """A latency percentile in milliseconds."""
        return _percentile(self.samples, fraction) * 1000


def timed(calls: list[Callable[[], object]]) -> Timing:
    """Run ``calls`` one after the other, timing each."""
    samples = []
    start = time.perf_counter()
    for call in calls:
        begin = time.perf_counter()
        call()
        samples.append(time.perf_counter() - begin)
    return Timing(samples, time.perf_counter() - start)


def bench_cache(cache: CacheBackend, size: int, ops: int) -> tuple[Timing, Timing]:
    """Put then get ``ops`` distinct entries of ``size`` bytes; check every get."""
    payload = os.urandom(size)
    run = uuid.uuid4().hex[:8]
    keys = [f"bench/{run}/{size}/{i}.parquet" for i in range(ops)]
    puts = timed([lambda k=key: cache.put(k, payload) for key in keys])

    def get(key: str) -> None:
        if cache.get(key) != payload:
            raise RuntimeError(f"{key}: cache returned other bytes")

    gets = timed([lambda k=key: get(k) for key in keys])
    for key in keys:
        cache.delete(key)
    return puts, gets


def bench_shared_log(cache: CacheBackend, ops: int) -> tuple[Timing, Timing]:
    """``ops`` syncs of a table's shared log with nothing new, then ``ops`` appends of entries
    of one new file each; check every append won."""
    log = SharedLog(cache, f"bench-{uuid.uuid4().hex[:8]}/")
    one = chunk(0, 1000, "bench#day", 0)

    def entry(position: int) -> SharedEntry:
        record = SnapshotRecord(position, position, 1_700_000_000_000, '{"format":1}')
        return SharedEntry(position, record, "bench#day", [one])

    def append(position: int) -> None:
        if not log.append("hotset/bench#raw", entry(position)):
            raise RuntimeError(f"append at {position} lost on a log nobody else writes")

    append(1)
    syncs = timed([lambda: log.entries_after("hotset/bench#raw", 1) for _ in range(ops)])
    appends = timed([lambda p=position: append(p) for position in range(2, ops + 2)])
    return syncs, appends


def bench_index(index: IndexBackend, chunks: int, lookups: int) -> tuple[float, Timing]:
    """Put ``chunks`` chunks (4 partitions, 1 000 offsets each) in batches, then time random
    range queries; return (chunks/s put, lookups)."""
    span = 1000
    entries: list[ChunkEntry] = [
        chunk((i // 4) * span, (i // 4 + 1) * span, "bench", i % 4) for i in range(chunks)
    ]
    start = time.perf_counter()
    for offset in range(0, len(entries), 1000):
        index.put_chunks(entries[offset : offset + 1000])
    put_rate = chunks / (time.perf_counter() - start)
    top = (chunks // 4) * span
    rng = random.Random(7)
    queries = [(rng.randrange(4), rng.randrange(0, top - 3 * span)) for _ in range(lookups)]

    def lookup(partition: int, first: int) -> None:
        found = index.chunks("bench", partition, first, first + 3 * span)
        if not 3 <= len(found) <= 4:
            raise RuntimeError(f"range query found {len(found)} chunks")

    return put_rate, timed([lambda q=query: lookup(*q) for query in queries])


def main() -> None:
    """Run every backend and print the two tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="puts and gets per cache and size")
    parser.add_argument("--small", type=int, default=4096, help="small entry bytes")
    parser.add_argument("--large", type=int, default=1 << 20, help="large entry bytes")
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=20_000)
    args = parser.parse_args()

    with servers() as where, tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        work = Path(scratch)
        s3 = minio_client(
            where.s3_endpoint, where.s3_access_key, where.s3_secret_key, where.s3_region
        )
        caches: dict[str, CacheBackend] = {
            "local": LocalDiskCache(work / "cache", max_bytes=8 << 30),
            "s3": S3Cache(s3, "bergstream-bench", prefix=f"{uuid.uuid4().hex}/"),
            "redis": RedisCache.from_url(where.redis_url, prefix=f"bench:{uuid.uuid4().hex}:"),
        }
        cache_rows = []
        for size in (args.small, args.large):
            for name, cache in caches.items():
                puts, gets = bench_cache(cache, size, args.ops)
                cache_rows.append((name, size, puts, gets))
        log_rows = [(name, *bench_shared_log(cache, args.ops)) for name, cache in caches.items()]
        for cache in caches.values():
            cache.close()

        indexes: dict[str, Callable[[], IndexBackend]] = {
            "sqlite": lambda: SqliteIndex(work / "index.sqlite"),
            "rocksdb": lambda: RocksIndex(work / "index.rocksdb"),
        }
        index_rows = []
        for name, factory in indexes.items():
            index = factory()
            try:
                put_rate, lookups = bench_index(index, args.chunks, args.lookups)
            finally:
                index.close()
            index_rows.append((name, put_rate, lookups))

    baseline = {size: gets.ops_per_s for name, size, _p, gets in cache_rows if name == "local"}
    _table(
        f"Cache backends ({args.ops} puts + {args.ops} gets per row, one thread)",
        f"{'backend':<8} {'entry':>9} {'put p50':>9} {'put p99':>9} {'put MB/s':>9} "
        f"{'get p50':>9} {'get p99':>9} {'get MB/s':>9} {'get op/s':>9} {'x local':>8}",
        [
            f"{name:<8} {_size(size):>9} {puts.ms(0.5):>7.2f}ms {puts.ms(0.99):>7.2f}ms "
            f"{puts.ops_per_s * size / 1e6:>9.1f} {gets.ms(0.5):>7.2f}ms {gets.ms(0.99):>7.2f}ms "
            f"{gets.ops_per_s * size / 1e6:>9.1f} {gets.ops_per_s:>9.0f} "
            f"{gets.ops_per_s / baseline[size]:>8.2f}"
            for name, size, puts, gets in cache_rows
        ],
    )
    small_get = {name: gets.ms(0.5) for name, size, _p, gets in cache_rows if size == args.small}
    _table(
        f"Shared snapshot history ({args.ops} syncs with nothing new + {args.ops} appends)",
        f"{'backend':<8} {'sync p50':>9} {'sync p99':>9} {'append p50':>11} {'append p99':>11} "
        f"{'x get':>7}",
        [
            f"{name:<8} {syncs.ms(0.5):>7.2f}ms {syncs.ms(0.99):>7.2f}ms "
            f"{appends.ms(0.5):>9.2f}ms {appends.ms(0.99):>9.2f}ms "
            f"{syncs.ms(0.5) / small_get[name]:>7.2f}"
            for name, syncs, appends in log_rows
        ],
    )
    base = next(lookups.ops_per_s for name, _r, lookups in index_rows if name == "sqlite")
    _table(
        f"Index backends ({args.chunks} chunks in 4 partitions, {args.lookups} random range "
        "queries of 3-4 chunks)",
        f"{'backend':<8} {'put chunks/s':>13} {'lookups/s':>10} {'p50':>9} {'p99':>9} "
        f"{'x sqlite':>9}",
        [
            f"{name:<8} {put_rate:>13.0f} {lookups.ops_per_s:>10.0f} "
            f"{lookups.ms(0.5) * 1000:>7.1f}us {lookups.ms(0.99) * 1000:>7.1f}us "
            f"{lookups.ops_per_s / base:>9.2f}"
            for name, put_rate, lookups in index_rows
        ],
    )


def _table(title: str, header: str, rows: list[str]) -> None:
    """Print a titled table: the header, a rule, the rows, then a blank line."""
    print(title)
    print(header)
    print("-" * len(header))
    for row in rows:
        print(row)
    print()


def _size(size: int) -> str:
    if size >= 1 << 20:
        return f"{size / (1 << 20):g} MiB"
    if size >= 1 << 10:
        return f"{size / (1 << 10):g} KiB"
    return f"{size} B"


if __name__ == "__main__":
    main()
