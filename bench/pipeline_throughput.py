"""Pipeline throughput: a topic into Iceberg with the lake pipeline, against a plain Spark
Kafka-to-Parquet copy of the same data, in the same run and the same Spark session.

Starts its own Kafka (the local stack, under a temporary home), fills a topic with Kafka's
ProducerPerformance (default 1M records of 1 KB over 6 partitions), then times:

- **pipeline**: ``run_pipeline(..., once=True)``, exactly as ``bergstream pipeline run --once``
  (Structured Streaming, foreachBatch, Iceberg commits with the boundary);
- **baseline**: a Spark batch read of the same topic written as plain Parquet, the same columns.

Each copy runs on two topics, alternating ``--rounds`` times (each pipeline run into a fresh
table; the best of each counts, since the machine is shared):

- a small topic (100 records per partition): its copy time is the copy's **fixed cost** (table
  creation, query planning and start, the first batch, the commit);
- the whole topic: its copy time less the fixed cost is the **steady state**, printed as
  records/s and MB/s of Kafka record values (records x record size).

``ratio`` (the last key of the JSON summary on the last line) is the pipeline's steady-state
records/s over the baseline's; ``once_ratio`` is the same for the whole runs, the time
``bergstream pipeline run --once`` takes against the plain copy. Beside them: the Spark
session's start (paid once, by neither copy) and the pipeline's micro-batch phases from Spark's
own StreamingQueryProgress (``durationMs``: ``addBatch`` holds the Iceberg write and commit,
``walCommit`` and ``commitOffsets`` the checkpoint), for the small run and the whole one.

    .venv/bin/python bench/pipeline_throughput.py [--records 1000000] [--rounds 2] \
        [--max-offsets-per-trigger N]

**On a Spark standalone cluster** (``--master spark://HOST:PORT``) the bench takes the master URL
of a *running* cluster with at least two workers of ``--worker-cores`` cores each (it starts and
stops no workers) and measures both copies twice: on one worker and on two. The application's
executors are confined by ``spark.executor.cores`` = ``--worker-cores`` and ``spark.cores.max`` =
workers x ``--worker-cores``, so each executor fills one worker; each configuration is its own
application, measured once its executors have registered and fetched the jars. Its Kafka is the
bench's own, on 127.0.0.1, so the workers must run on this machine. A cluster of two one-core
workers from the installed PySpark (``SPARK_HOME=$(python -c 'from pyspark.find_spark_home
import _find_spark_home as h; print(h())')``)::

    $SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port 7077 &
    $SPARK_HOME/bin/spark-class org.apache.spark.deploy.worker.Worker --host 127.0.0.1 \
        --cores 1 --memory 1536m spark://127.0.0.1:7077 &          # twice: two workers
    .venv/bin/python bench/pipeline_throughput.py --master spark://127.0.0.1:7077 --records 300000

The JSON summary then adds ``workers``: records/s and MB/s of both copies per worker count, and
``scaling``: the pipeline's records/s on two workers over one; its ``pipeline_*``, ``baseline_*``
and ``ratio`` are those on two workers.

"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import create_topic, perf_produce

from bergstream.core.lake import LakeConfig
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.pipeline.session import attach_catalog, build_session
from bergstream.pipeline.settings import (
    LakePipelineConfig,
    check_master,
    is_local_master,
    resolve_pipeline_lake,
)
from bergstream.pipeline.stream import kafka_rows, run_pipeline


def baseline(spark: object, kafka: str, topic: str, target: Path) -> int:
    """Plain Spark: read the whole topic in one batch and write it as Parquet; rows written."""
    source = (
        spark.read.format("kafka")  # type: ignore[attr-defined]
        .option("kafka.bootstrap.servers", kafka)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .load()
    )
    frame = kafka_rows(source)
    frame.write.option("compression", "zstd").parquet(str(target))
    return spark.read.parquet(str(target)).count()  # type: ignore[attr-defined]


#: Records of the small topic whose copy times each copy's fixed costs.
FIXED_RECORDS_PER_PARTITION = 100


class BatchProgress:
    """The progress of every micro-batch of the streaming queries of one Spark application
    (Spark's own StreamingQueryProgress: rows and the ``durationMs`` phases)."""

    def __init__(self, spark: Any):
        from pyspark.sql.streaming import StreamingQueryListener

        batches: list[dict[str, Any]] = []
        self.batches = batches

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                progress = event.progress
                if progress.numInputRows:
                    batches.append({"rows": progress.numInputRows, "ms": dict(progress.durationMs)})

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        spark.streams.addListener(Listener())

    def take(self, expected: int, wait: float = 10.0) -> list[dict[str, Any]]:
        """The batches reported since the last call, once ``expected`` have arrived (events
        reach the listener asynchronously) or ``wait`` seconds have passed."""
        deadline = time.monotonic() + wait
        while len(self.batches) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        taken = list(self.batches)
        self.batches.clear()
        return taken


@dataclass
class Copy:
    """Wall seconds of every round of one copy: of the small topic and of the whole one."""

    fixed: list[float] = field(default_factory=list)
    full: list[float] = field(default_factory=list)

    def steady_seconds(self) -> float:
        """The best whole copy less the best small one: the time the records themselves take."""
        return max(min(self.full) - min(self.fixed), 1e-3)


@dataclass
class Timings:
    """Both copies' rounds on one Spark application, and the pipeline's micro-batch phases."""

    pipeline: Copy = field(default_factory=Copy)
    baseline: Copy = field(default_factory=Copy)
    batches: int = 0
    #: durationMs phases (summed over its batches) of the pipeline's best small and full run.
    fixed_phases: dict[str, int] = field(default_factory=dict)
    full_phases: dict[str, int] = field(default_factory=dict)

    def figures(self, records: int, megabytes: float) -> dict[str, Any]:
        """Fixed costs, steady-state and whole-run figures of both copies, and the ratios."""
        pipeline_s, baseline_s = min(self.pipeline.full), min(self.baseline.full)
        pipeline_steady = self.pipeline.steady_seconds()
        baseline_steady = self.baseline.steady_seconds()
        return {
            "pipeline_fixed_seconds": round(min(self.pipeline.fixed), 2),
            "pipeline_fixed_phases_ms": self.fixed_phases,
            "pipeline_steady_records_s": round(records / pipeline_steady),
            "pipeline_steady_mb_s": round(megabytes / pipeline_steady, 1),
            "pipeline_seconds": round(pipeline_s, 2),
            "pipeline_records_s": round(records / pipeline_s),
            "pipeline_mb_s": round(megabytes / pipeline_s, 1),
            "pipeline_batches": self.batches,
            "pipeline_phases_ms": self.full_phases,
            "baseline_fixed_seconds": round(min(self.baseline.fixed), 2),
            "baseline_steady_records_s": round(records / baseline_steady),
            "baseline_steady_mb_s": round(megabytes / baseline_steady, 1),
            "baseline_seconds": round(baseline_s, 2),
            "baseline_records_s": round(records / baseline_s),
            "baseline_mb_s": round(megabytes / baseline_s, 1),
            "once_ratio": round(baseline_s / pipeline_s, 3),
            "ratio": round(baseline_steady / pipeline_steady, 3),
        }


def summed_phases(batches: list[dict[str, Any]]) -> dict[str, int]:
    """The ``durationMs`` phases of ``batches`` added up, largest first."""
    total: dict[str, int] = {}
    for batch in batches:
        for phase, ms in batch["ms"].items():
            total[phase] = total.get(phase, 0) + int(ms)
    return dict(sorted(total.items(), key=lambda item: -item[1]))


def copy_pipeline(
    spark: Any, args: argparse.Namespace, kafka: str, topic: str, home: Path, namespace: str
) -> tuple[float, int, int]:
    """``bergstream pipeline run --once`` of ``topic`` into a fresh table: (wall seconds,
    records copied, micro-batches)."""
    began = time.monotonic()
    lake = resolve_pipeline_lake(
        LakeConfig(kafka_bootstrap=kafka, namespace=namespace),
        home=home,
        pipeline=LakePipelineConfig(max_offsets_per_trigger=args.max_offsets_per_trigger),
    )
    attach_catalog(spark, lake)
    result = run_pipeline(spark, lake, topic, once=True, report=lambda line: None)
    return time.monotonic() - began, result.records, result.batches


def measure(
    spark: Any,
    args: argparse.Namespace,
    kafka: str,
    topics: tuple[str, str],
    home: Path,
    workdir: Path,
    label: str,
) -> Timings:
    """Both copies of the small topic and of the whole one, ``args.rounds`` times each,
    alternating, on ``spark``; every pipeline copy into a fresh table."""
    small, whole = topics
    expected = {small: FIXED_RECORDS_PER_PARTITION * args.partitions, whole: args.records}
    progress = BatchProgress(spark)
    timings = Timings()
    for round_ in range(args.rounds):
        # Alternate which goes first, so JVM warm-up and caches favour neither.
        order = ("baseline", "pipeline") if round_ % 2 == 0 else ("pipeline", "baseline")
        for which in order:
            for topic in (small, whole):
                part = "fixed" if topic == small else "full"
                if which == "baseline":
                    target = workdir / f"baseline-{label}-{part}-{round_}"
                    began = time.monotonic()
                    rows = baseline(spark, kafka, topic, target)
                    seconds = time.monotonic() - began
                    shutil.rmtree(target, ignore_errors=True)
                    batches = 1
                else:
                    namespace = f"bench_{label}_{part}_{round_}"
                    seconds, rows, batches = copy_pipeline(
                        spark, args, kafka, topic, home, namespace
                    )
                    phases = summed_phases(progress.take(batches))
                    runs = getattr(timings.pipeline, part)
                    if not runs or seconds < min(runs):
                        setattr(timings, f"{part}_phases", phases)
                        if part == "full":
                            timings.batches = batches
                assert rows == expected[topic], f"{which} copied {rows:,} of {topic}"
                getattr(getattr(timings, which), part).append(seconds)
                print(
                    f"{label} round {round_}: {which} {part} {seconds:.1f} s ({rows:,} records"
                    f"{f', {batches} batch(es)' if which == 'pipeline' else ''})",
                    flush=True,
                )
    return timings


def executors(spark: Any) -> int:
    """Executors registered with the application now (the driver not counted)."""
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


def cluster_session(args: argparse.Namespace, workers: int) -> Any:
    """An application on ``args.master`` whose executors fill ``workers`` workers, once they
    have all registered."""
    cores = args.worker_cores
    spark = build_session(
        {
            "spark.driver.memory": args.driver_memory,
            "spark.executor.memory": args.executor_memory,
            "spark.executor.cores": str(cores),
            "spark.cores.max": str(cores * workers),
            "spark.app.name": f"bergstream-bench-{workers}-workers",
            # The bench's Kafka and the workers are on this machine: so is the driver.
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
        args.master,
    )
    deadline = time.monotonic() + 120
    while executors(spark) < workers:
        if time.monotonic() > deadline:
            spark.stop()
            raise SystemExit(
                f"{args.master}: {executors(spark)} of {workers} executor(s) registered in "
                f"120 s; the cluster needs {workers} alive workers with {cores} free core(s) and "
                f"{args.executor_memory} each (--worker-cores, --executor-memory)"
            )
        time.sleep(0.5)
    # One task per core before the clock starts: each executor fetches the jars from the
    # driver at its first task (some 180 MB), which no round should pay for.
    spark.range(0, 1000, 1, cores * workers * 2).count()
    return spark


def print_figures(figures: dict[str, Any], rounds: int, where: str) -> None:
    """The human-readable lines of one configuration."""
    for copy, what in (("pipeline", "the lake pipeline"), ("baseline", "Spark Kafka -> Parquet")):
        mine = {key[len(copy) + 1 :]: v for key, v in figures.items() if key.startswith(copy)}
        print(
            f"{copy}{where}: steady {mine['steady_records_s']:,} records/s, "
            f"{mine['steady_mb_s']} MB/s; fixed {mine['fixed_seconds']:.1f} s; "
            f"whole run {mine['records_s']:,} records/s "
            f"({mine['seconds']:.1f} s; {what}, best of {rounds})"
        )
    print(f"pipeline fixed-cost phases{where} (ms): {figures['pipeline_fixed_phases_ms']}")
    print(
        f"pipeline phases{where} (ms, {figures['pipeline_batches']} batch(es)): "
        f"{figures['pipeline_phases_ms']}"
    )
    print(
        f"ratio pipeline/baseline{where}: steady {figures['ratio']:.3f}, "
        f"whole run (--once) {figures['once_ratio']:.3f}"
    )


def main() -> None:
    """Run the benchmark; print both figures and the ratio (JSON on the last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=None,
        help="cap on records per micro-batch of the pipeline (default: none, one batch)",
    )
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument("--rounds", type=int, default=2, help="best of this many runs each")
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master: local[N] (default local[2]) or spark://HOST:PORT of a running "
        "standalone cluster with two workers on this machine (measured on one, then two)",
    )
    parser.add_argument(
        "--worker-cores", type=int, default=1, help="cores of each worker (spark:// only)"
    )
    parser.add_argument(
        "--executor-memory", default="1g", help="memory of each executor (spark:// only)"
    )
    args = parser.parse_args()
    try:
        check_master(args.master)
    except ValueError as error:
        parser.error(str(error))
    on_cluster = not is_local_master(args.master)
    if on_cluster and not args.master.startswith("spark://"):
        parser.error("--master takes local[N] or spark://HOST:PORT (a standalone cluster)")

    workdir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    home = workdir / "home"
    env = stack_up(home=home, components={"kafka"}).as_dict()
    kafka = env["BERGSTREAM_KAFKA_BOOTSTRAP"]
    spark = None
    per_workers: dict[int, Timings] = {}
    session_start: dict[str, float] = {}
    try:
        topics = ("bench-pipeline-fixed", "bench-pipeline")
        for topic in topics:
            create_topic(kafka, topic, args.partitions)
        perf_produce(
            kafka, topics[0], FIXED_RECORDS_PER_PARTITION * args.partitions, args.record_size
        )
        began = time.monotonic()
        perf_produce(kafka, topics[1], args.records, args.record_size)
        print(f"produced {args.records:,} records in {time.monotonic() - began:.1f} s", flush=True)

        if not on_cluster:
            began = time.monotonic()
            spark = build_session({"spark.driver.memory": args.driver_memory}, args.master)
            session_start["0"] = round(time.monotonic() - began, 2)
            per_workers[0] = measure(spark, args, kafka, topics, home, workdir, "local")
        else:
            for workers in (1, 2):
                began = time.monotonic()
                spark = cluster_session(args, workers)
                session_start[str(workers)] = round(time.monotonic() - began, 2)
                print(f"{args.master}: {executors(spark)} executor(s) registered", flush=True)
                label = f"w{workers}"
                per_workers[workers] = measure(spark, args, kafka, topics, home, workdir, label)
                spark.stop()
                spark = None
    finally:
        if spark is not None:
            spark.stop()
        stack_down(home=home)

    megabytes = args.records * args.record_size / 1e6
    summary: dict[str, Any] = {
        "records": args.records,
        "record_bytes": args.record_size,
        "partitions": args.partitions,
        "master": args.master,
        "fixed_records": FIXED_RECORDS_PER_PARTITION * args.partitions,
        "session_start_seconds": session_start.get("0", session_start.get("2")),
    }
    if not on_cluster:
        figures = per_workers[0].figures(args.records, megabytes)
        print_figures(figures, args.rounds, "")
    else:
        by_count = {n: t.figures(args.records, megabytes) for n, t in per_workers.items()}
        for workers, figures in by_count.items():
            print_figures(figures, args.rounds, f" on {workers} worker(s)")
        figures = by_count[2]
        summary["workers"] = {
            str(n): {key: value for key, value in f.items() if key != "ratio"}
            for n, f in by_count.items()
        }
        summary["scaling"] = round(
            by_count[2]["pipeline_steady_records_s"] / by_count[1]["pipeline_steady_records_s"], 3
        )
        print(f"pipeline on 2 workers / on 1: {summary['scaling']:.3f}")
    summary.update(figures)
    print(f"Spark session start: {summary['session_start_seconds']} s (not in either copy)")
    # "ratio" last of all keys, as before: scripts read it from the last line.
    summary["ratio"] = summary.pop("ratio")
    print(json.dumps(summary))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
