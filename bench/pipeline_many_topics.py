"""One pipeline for many topics: records/s of one Spark application copying 50 topics of 20k
records (``pipeline run --topics``) against the same application copying one topic of 1M
records (``pipeline run --topic``), in the same run and session; and the driver's memory per
topic of a continuous run.

Starts its own Kafka (the local stack, under a temporary home) and fills the topics with Kafka's
ProducerPerformance (``--records`` in all, ``--record-size`` bytes each; the many topics share
the same total). Then, ``--rounds`` times, alternating which goes first, each into fresh tables:

- **one**: ``run_pipeline(..., once=True)`` of the big topic, as ``pipeline run --topic T --once``;
- **many**: ``run_topics(..., once=True)`` of the ``--topics`` small ones, as ``pipeline run
  --topics REGEX --once`` (raw topics: one streaming query for all, ``group_topics``);
- with ``--per-topic-queries``, the same with ``group_topics: false`` (one query per topic),
  printed as ``per_topic_queries_ratio``.

``ratio`` (last key of the JSON on the last line) is many's records/s over one's (best round
each; goal >= 0.8). Memory: a continuous run of every small topic, once each table has caught up,
against a continuous run of one topic: the driver JVM's used heap after a full GC and the Python
process's resident set, the difference divided by the extra topics (``heap_mb_per_topic``,
``python_rss_mb_per_topic``).

    .venv/bin/python bench/pipeline_many_topics.py [--records 1000000] [--topics 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchkit import create_topic, perf_produce

from bergstream.core.lake import LakeConfig
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.pipeline.session import attach_catalog, build_session
from bergstream.pipeline.settings import LakePipelineConfig, PipelineLake, resolve_pipeline_lake
from bergstream.pipeline.stream import run_pipeline
from bergstream.pipeline.tables import load_table
from bergstream.pipeline.topic_runs import run_topics
from bergstream.pipeline.topics import TopicSelection


def _lake(
    kafka: str, home: Path, namespace: str, trigger: float = 10.0, group: bool = True
) -> PipelineLake:
    return resolve_pipeline_lake(
        LakeConfig(kafka_bootstrap=kafka, namespace=namespace),
        home=home,
        pipeline=LakePipelineConfig(trigger_interval_seconds=trigger, group_topics=group),
    )


def copy_one(spark: Any, kafka: str, home: Path, topic: str, namespace: str) -> tuple[float, int]:
    """``pipeline run --topic topic --once`` into fresh tables: (seconds, records)."""
    lake = _lake(kafka, home, namespace)
    attach_catalog(spark, lake)
    began = time.monotonic()
    result = run_pipeline(spark, lake, topic, once=True, report=_progress(began))
    return time.monotonic() - began, result.records


#: --verbose: print the runs' progress lines (stderr), with the seconds since the run began.
VERBOSE = False


def _progress(began: float) -> Callable[[str], None]:
    def report(line: str) -> None:
        if VERBOSE:
            print(f"{time.monotonic() - began:7.1f} s {line}", file=sys.stderr, flush=True)

    return report


def copy_many(
    spark: Any, kafka: str, home: Path, topics: list[str], namespace: str, group: bool = True
) -> tuple[float, int]:
    """``pipeline run --topics ... --once`` of ``topics`` into fresh tables: (seconds, records);
    ``group``: ``lake.pipeline.group_topics`` (one query for all, else one per topic)."""
    lake = _lake(kafka, home, namespace, group=group)
    attach_catalog(spark, lake)
    began = time.monotonic()
    result = run_topics(
        spark,
        lake,
        TopicSelection.of(topics, None),
        once=True,
        typing_for=lambda topic: None,
        mode_for=lambda topic: None,
        report=_progress(began),
    )
    seconds = time.monotonic() - began
    assert not result.failures, result.summary()["failed"]
    return seconds, sum(r.records for r in result.results.values())


def _used_heap_mb(spark: Any) -> float:
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
    spark.sparkContext._jvm.java.lang.System.gc()
    time.sleep(0.5)
    return (runtime.totalMemory() - runtime.freeMemory()) / 2**20


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def continuous_memory(
    spark: Any, kafka: str, home: Path, topics: list[str], namespace: str, expected: int
) -> tuple[float, float]:
    """Driver heap (after GC) and Python RSS, in MB, while a continuous run of ``topics`` is
    running with every table caught up (``expected`` records in all)."""
    lake = _lake(kafka, home, namespace, trigger=1.0)
    attach_catalog(spark, lake)
    stop = threading.Event()
    runner = threading.Thread(
        target=run_topics,
        args=(spark, lake, TopicSelection.of(topics, None)),
        kwargs={
            "once": False,
            "typing_for": lambda topic: None,
            "mode_for": lambda topic: None,
            "report": lambda line: None,
            "stop": stop,
        },
    )
    runner.start()
    try:
        deadline = time.monotonic() + 900
        while True:
            copied = 0
            for topic in topics:
                table = load_table(spark, lake, namespace, topic)
                copied += sum(table.boundary().values()) if table is not None else 0
            if copied >= expected:
                break
            assert time.monotonic() < deadline, f"{copied:,} of {expected:,} in 900 s"
            time.sleep(2)
        return _used_heap_mb(spark), _rss_mb()
    finally:
        stop.set()
        runner.join()


def main() -> None:
    """Run the benchmark; print the figures and the ratio (JSON on the last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records in all")
    parser.add_argument("--topics", type=int, default=50, help="how many small topics")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=2, help="of each small topic")
    parser.add_argument("--big-partitions", type=int, default=6, help="of the big topic")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument("--rounds", type=int, default=2, help="best of this many runs each")
    parser.add_argument("--verbose", action="store_true", help="print the runs' progress")
    parser.add_argument(
        "--per-topic-queries",
        action="store_true",
        help="also copy the small topics with group_topics: false (one query per topic)",
    )
    parser.add_argument(
        "--skip-memory", action="store_true", help="no continuous runs (memory not measured)"
    )
    args = parser.parse_args()
    global VERBOSE
    VERBOSE = args.verbose

    workdir = Path(tempfile.mkdtemp(prefix="bench-many-topics-"))
    home = workdir / "home"
    env = stack_up(home=home, components={"kafka"}).as_dict()
    kafka = env["BERGSTREAM_KAFKA_BOOTSTRAP"]
    big = "bench-one"
    small = [f"bench-many-{i:04d}" for i in range(args.topics)]
    per_topic = args.records // args.topics
    spark = None
    one: list[float] = []
    many: list[float] = []
    per_topic_queries: list[float] = []
    try:
        create_topic(kafka, big, args.big_partitions)
        perf_produce(kafka, big, args.records, args.record_size)
        for topic in small:
            create_topic(kafka, topic, args.partitions)
            perf_produce(kafka, topic, per_topic, args.record_size)
        print(
            f"produced {args.records:,} records into 1 topic and {args.topics} topics", flush=True
        )
        spark = build_session({"spark.driver.memory": args.driver_memory})
        for round_ in range(args.rounds):
            order = ("one", "many") if round_ % 2 == 0 else ("many", "one")
            if args.per_topic_queries:
                order = (*order, "per_topic_queries")
            for which in order:
                namespace = f"bench_{which}_{round_}"
                if which == "one":
                    seconds, records = copy_one(spark, kafka, home, big, namespace)
                    assert records == args.records, f"one copied {records:,}"
                    one.append(seconds)
                else:
                    group = which == "many"
                    seconds, records = copy_many(spark, kafka, home, small, namespace, group)
                    assert records == per_topic * args.topics, f"{which} copied {records:,}"
                    (many if group else per_topic_queries).append(seconds)
                print(
                    f"round {round_}: {which} {seconds:.1f} s, {records / seconds:,.0f} records/s",
                    flush=True,
                )
        heap_one = heap_many = rss_one = rss_many = 0.0
        if not args.skip_memory:
            heap_one, rss_one = continuous_memory(
                spark, kafka, home, [big], "mem_one", args.records
            )
            heap_many, rss_many = continuous_memory(
                spark, kafka, home, small, "mem_many", per_topic * args.topics
            )
    finally:
        if spark is not None:
            spark.stop()
        stack_down(home=home)
    extra = max(args.topics - 1, 1)
    summary = {
        "records": args.records,
        "topics": args.topics,
        "record_bytes": args.record_size,
        "one_records_s": round(args.records / min(one)),
        "many_records_s": round(per_topic * args.topics / min(many)),
        "one_seconds": round(min(one), 2),
        "many_seconds": round(min(many), 2),
        "heap_mb_one_topic": round(heap_one, 1),
        "heap_mb_many_topics": round(heap_many, 1),
        "heap_mb_per_topic": round((heap_many - heap_one) / extra, 2),
        "python_rss_mb_per_topic": round((rss_many - rss_one) / extra, 2),
        "per_topic_queries_ratio": (
            round((per_topic * args.topics / min(per_topic_queries)) / (args.records / min(one)), 3)
            if per_topic_queries
            else None
        ),
        "ratio": round((per_topic * args.topics / min(many)) / (args.records / min(one)), 3),
    }
    print(
        f"one topic: {summary['one_records_s']:,} records/s; {args.topics} topics: "
        f"{summary['many_records_s']:,} records/s (best of {args.rounds}); ratio "
        f"{summary['ratio']:.3f} (goal >= 0.8)"
    )
    print(
        f"driver memory per extra topic of a continuous run: {summary['heap_mb_per_topic']} MB "
        f"of JVM heap, {summary['python_rss_mb_per_topic']} MB of Python RSS"
    )
    print(json.dumps(summary))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
