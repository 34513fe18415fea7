"""KSI's first Fetch of a replay on an object store: the data files one Fetch needs read one
after the other (``parallel_reads: false``, the baseline) against all at once
(``parallel_reads: true``), in one run, on the stack's S3 (SeaweedFS).

Starts the stack's S3 under a temporary home (or uses ``BERGSTREAM_S3_*`` of a running stack),
writes a coldset table on it (PyIceberg, SQL catalog, warehouse on S3) of ``--partitions``
Kafka partitions, identity-partitioned so each partition is its own data file, of
``--records`` records of ``--record-size`` bytes each. Then, ``--rounds`` times and each mode
in turn on a new coldset store (nothing cached; the table loaded and planned before the clock
starts, so only the Fetch's file reads are timed), one Fetch naming every partition from
offset 0 with a consumer's default limits (1 MiB a partition, 50 MiB in all). Read-ahead and
answers built ahead are off: what is timed is the Fetch's own reads.

Prints, per mode (and per ``--threads`` value), the median and each round's latency in ms;
the answers of every mode are checked byte for byte against the baseline's. The last line's
``ratio`` is the baseline's median over ``parallel_reads`` at the default ``reader_threads``
(above 1: the Fetch is faster).

    .venv/bin/python bench/ksi_parallel_reads.py [--partitions 16] [--records 400]
        [--record-size 1024] [--rounds 5] [--threads 2 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchkit import machine_facts

from bergstream.core.lake import LakeCatalogConfig, LakeConfig, resolve_lake
from bergstream.core.records import Record
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.plugins.cache_backends.s3_cache import minio_client
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.planner import FetchAsk, plan_fetch
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from tests.kits.coldset_tables import write_cold

TOPIC = "replayed"
PARTITION_MAX_BYTES = 1_048_576
FETCH_MAX_BYTES = 52_428_800
T0 = 1_700_000_000_000


def s3_settings(stack: ExitStack) -> tuple[str, str, str, str]:
    """(endpoint, access key, secret key, region) of the running stack's S3, else our own."""
    env = os.environ
    if "BERGSTREAM_S3_ENDPOINT" in env:
        return (
            env["BERGSTREAM_S3_ENDPOINT"],
            env["BERGSTREAM_S3_ACCESS_KEY"],
            env["BERGSTREAM_S3_SECRET_KEY"],
            env.get("BERGSTREAM_S3_REGION", "us-east-1"),
        )
    home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ksi-parallel-")))
    started = stack_up(home=home, components={"s3"})
    stack.callback(stack_down, home)
    assert started.s3_endpoint
    return (
        started.s3_endpoint,
        started.s3_access_key or "",
        started.s3_secret_key or "",
        started.s3_region,
    )


def make_lake(workdir: Path, s3: tuple[str, str, str, str]) -> Any:
    """A lake: SQL catalog under ``workdir``, warehouse in a new bucket of ``s3``."""
    endpoint, access_key, secret_key, region = s3
    bucket = f"ksi-bench-{uuid.uuid4().hex[:12]}"
    minio_client(endpoint, access_key, secret_key, region).make_bucket(bucket)
    catalog = LakeCatalogConfig(
        uri=f"sqlite:///{workdir / 'catalog.db'}",
        warehouse=f"s3://{bucket}/warehouse",
        properties={
            "s3.endpoint": endpoint,
            "s3.access-key-id": access_key,
            "s3.secret-access-key": secret_key,
            "s3.region": region,
        },
    )
    return resolve_lake(LakeConfig(kafka_bootstrap="127.0.0.1:9", catalog=catalog), home=workdir)


def write_table(lake: Any, partitions: int, records: int, size: int) -> int:
    """``records`` records of ``size`` bytes in each of ``partitions`` partitions, one data
    file per partition; returns the bytes of values written."""
    rows = [
        (p, 0, Record(o, T0 + o, b"k%d" % o, os.urandom(size), ()))
        for p in range(partitions)
        for o in range(records)
    ]
    write_cold(lake, TOPIC, rows, dict.fromkeys(range(partitions), records), rows_per_file=records)
    return partitions * records * size


def one_fetch(lake: Any, partitions: int, parallel: bool, threads: int) -> tuple[float, dict]:
    """Seconds of one Fetch of every partition from 0 on a new store, and its answers."""
    config = KsiConfig(
        topics=[TOPIC], parallel_reads=parallel, reader_threads=threads, read_ahead_segments=0
    )
    store = ColdStore(lake, config)
    store.ahead.max_bytes = 0
    try:
        cold = store.table(TOPIC)
        assert cold is not None
        for partition in range(partitions):  # load and plan the table: not timed
            assert cold.first_offset(partition) == 0
        asks = [FetchAsk(TOPIC, p, 0, PARTITION_MAX_BYTES) for p in range(partitions)]
        # The fetch runs on a reader thread, as the filter runs it.
        started = time.perf_counter()
        answers = store.executor.submit(
            plan_fetch, store, asks, FETCH_MAX_BYTES, config.batch_max_bytes
        ).result()
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    for key, answer in answers.items():
        if answer.error is not None or not answer.records:
            raise RuntimeError(f"{key}: {answer.error or 'no records'}")
    return elapsed, {k: (a.records, a.next_offset) for k, a in answers.items()}


def main() -> None:
    """Run the bench and print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 8])
    args = parser.parse_args()
    default_threads = KsiConfig().reader_threads
    threads = sorted({default_threads, *args.threads})
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="ksi-parallel-lake-") as work:
        lake = make_lake(Path(work), s3_settings(stack))
        written = write_table(lake, args.partitions, args.records, args.record_size)
        modes = [("one_by_one", False, default_threads)] + [
            (f"parallel_{n}_threads", True, n) for n in threads
        ]
        one_fetch(lake, args.partitions, False, default_threads)  # untimed: imports, JIT
        times: dict[str, list[float]] = {name: [] for name, _, _ in modes}
        baseline_answers: dict | None = None
        for _ in range(args.rounds):
            for name, parallel, count in modes:
                elapsed, answers = one_fetch(lake, args.partitions, parallel, count)
                if baseline_answers is None:
                    baseline_answers = answers
                elif answers != baseline_answers:
                    raise RuntimeError(f"{name}: answers differ from the baseline's")
                times[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = medians["one_by_one"]
    result = {
        "machine": machine_facts(),
        "partitions": args.partitions,
        "bytes_per_partition_file": written // args.partitions,
        "default_reader_threads": default_threads,
        "modes": {
            name: {
                "median_ms": round(medians[name] * 1000, 1),
                "rounds_ms": [round(t * 1000, 1) for t in times[name]],
                "speedup": round(baseline / medians[name], 2),
            }
            for name in times
        },
        "ratio": round(baseline / medians[f"parallel_{default_threads}_threads"], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
