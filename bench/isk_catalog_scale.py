"""ISK's catalog at many topics: LoadTable latency at 10,000 tables against 10, ListTables, the
memory an idle topic costs and the index size per partition, through the log seam the table
tests use (``tests/kits/fake_log.py``: real v2 record batches served as a read_committed Fetch
serves them), so 10,000 topics of 10 partitions (100,000 partitions) fit on this machine.

For each ``--topics`` count (default 10, 1,000 and 10,000), in one process, with one
``HotsetProvider`` on a SQLite index and a local cache each:

- ``list_ms``: one ListTables of the hotset namespace (every topic, as the REST catalog pages it);
- ``load_first_ms`` / ``load_again_ms``: the median LoadTable of ``--sample`` topics spread over
  the catalog, first (the topic indexed on the request: ISK's cost of a topic nobody asked for
  yet) and again with no new records;
- ``idle_topic_kb``: Python memory (tracemalloc) the provider holds per topic it loaded once and
  then left idle, the log's own memory excluded;
- ``index_bytes_per_partition``: the SQLite index's size over the partitions it indexed.

``ratio`` (last key of the JSON on the last line) is ``load_first_ms`` at the largest count over
the smallest (goal <= 1.5: nothing on LoadTable's path walks every topic).

With ``--kafka`` the topics are real, on a broker of the local stack (its own, under a temporary
home), read by ISK's Kafka reader: e.g. 2,000 topics of 5 partitions (10,000 partitions).

    .venv/bin/python bench/isk_catalog_scale.py [--topics 10 1000 10000] [--partitions 10]
    .venv/bin/python bench/isk_catalog_scale.py --kafka --topics 10 2000 --partitions 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from tests.kits.fake_log import FakeLog

T0 = 1_700_000_000_000


def build_log(topics: int, partitions: int, records: int) -> tuple[FakeLog, list[str]]:
    """A fake log of ``topics`` topics of ``partitions`` partitions, ``records`` each."""
    log = FakeLog()
    names = [f"topic-{i:05d}" for i in range(topics)]
    for name in names:
        log.create(name, partitions)
        for partition in range(partitions):
            log.produce(name, partition, records, lambda i: T0 + i, per_batch=records)
    return log, names


class RealTopics:
    """Topics on a real Kafka (the stack's broker, ``--kafka``), created as the counts grow."""

    def __init__(self, bootstrap: str, partitions: int, records: int) -> None:
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.records = records
        self.names: list[str] = []

    def grow(self, count: int) -> list[str]:
        """Create topics (and their records) until there are ``count``; their names."""
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = [f"topic-{i:05d}" for i in range(len(self.names), count)]
        for first in range(0, len(new), 200):
            chunk = new[first : first + 200]
            futures = admin.create_topics(
                [NewTopic(name, self.partitions, 1) for name in chunk], operation_timeout=120
            )
            for future in futures.values():
                future.result(timeout=300)
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 50})
        for name in new:
            for partition in range(self.partitions):
                for i in range(self.records):
                    producer.produce(name, b"value-%d" % i, partition=partition)
            producer.poll(0)
        producer.flush(300)
        self.names.extend(new)
        return list(self.names)


async def measure(
    count: int, args: argparse.Namespace, workdir: Path, real: RealTopics | None = None
) -> dict[str, Any]:
    """The figures at ``count`` topics (on the fake log, or on ``real`` Kafka topics)."""
    source: Any
    if real is None:
        source, names = build_log(count, args.partitions, args.records)
    else:
        from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader

        names = real.grow(count)
        source = KafkaReader(real.bootstrap)
        await source.start()
    index_path = workdir / f"index-{count}.db"
    provider = HotsetProvider(
        source,
        SqliteIndex(index_path),
        LocalDiskCache(workdir / f"cache-{count}", 1 << 30),
        bucket="bench",
        cluster="scale",
        chunk_records=100_000,
    )
    deadline = time.monotonic() + 120
    while True:  # new topics reach every broker's metadata a moment after their creation
        began = time.perf_counter()
        listed = await provider.list_tables("hotset")
        list_ms = (time.perf_counter() - began) * 1000
        if set(names) <= set(listed):
            break
        assert time.monotonic() < deadline, f"{len(set(names) - set(listed))} topics unlisted"
        await asyncio.sleep(1)
    step = max(count // (2 * args.sample), 1)
    spread = names[::step]
    timed, weighed = spread[0::2][: args.sample], spread[1::2][: args.sample]
    first: list[float] = []
    for name in timed:
        began = time.perf_counter()
        await provider.load_table("hotset", name)
        first.append((time.perf_counter() - began) * 1000)
    again: list[float] = []
    for name in timed:
        began = time.perf_counter()
        await provider.load_table("hotset", name)
        again.append((time.perf_counter() - began) * 1000)
    # Memory on other topics than the timed ones (tracemalloc slows Python down).
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for name in weighed:
        await provider.load_table("hotset", name)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    sample = timed + weighed
    if real is not None:
        await source.close()
    partitions = len(sample) * args.partitions
    return {
        "topics": count,
        "partitions": count * args.partitions,
        "list_ms": round(list_ms, 1),
        "load_first_ms": round(statistics.median(first), 2),
        "load_again_ms": round(statistics.median(again), 2),
        "idle_topic_kb": round(held / max(len(weighed), 1) / 1024, 1),
        "index_bytes_per_partition": round(index_path.stat().st_size / partitions),
    }


def main() -> None:
    """Run the benchmark; print a line per topic count and the JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, nargs="+", default=[10, 1_000, 10_000])
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--records", type=int, default=5, help="per partition")
    parser.add_argument("--sample", type=int, default=10, help="topics loaded at each count")
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="real topics on the stack's broker (its own, under a temporary home) instead of "
        "the fake log, e.g. --kafka --topics 10 2000 --partitions 5",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-catalog-scale-"))
    real = None
    if args.kafka:
        from bergstream.devstack.stack import stack_up

        env = stack_up(home=workdir / "home", components={"kafka"}).as_dict()
        real = RealTopics(env["BERGSTREAM_KAFKA_BOOTSTRAP"], args.partitions, args.records)
    try:
        # Numba's kernels, imports and first allocations, paid before any count is timed.
        asyncio.run(measure(3, argparse.Namespace(**{**vars(args), "sample": 2}), workdir))
        rows = []
        for count in sorted(args.topics):
            row = asyncio.run(measure(count, args, workdir, real))
            rows.append(row)
            print(
                f"{row['topics']:>6,} topics ({row['partitions']:,} partitions): ListTables "
                f"{row['list_ms']} ms, LoadTable first {row['load_first_ms']} ms, again "
                f"{row['load_again_ms']} ms, {row['idle_topic_kb']} KB per idle topic, "
                f"{row['index_bytes_per_partition']} index bytes per partition",
                flush=True,
            )
    finally:
        if real is not None:
            from bergstream.devstack.stack import stack_down

            stack_down(home=workdir / "home")
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = rows[-1]["load_first_ms"] / rows[0]["load_first_ms"]
    print(
        f"LoadTable at {rows[-1]['topics']:,} topics / at {rows[0]['topics']:,}: {ratio:.2f} "
        "(goal <= 1.5)"
    )
    print(
        json.dumps({"log": "kafka" if real else "fake", "counts": rows, "ratio": round(ratio, 3)})
    )


if __name__ == "__main__":
    main()
