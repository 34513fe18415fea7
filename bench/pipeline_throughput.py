"""Pipeline throughput: a topic into Iceberg with the lake pipeline, against a plain Spark
Kafka-to-Parquet copy of the same data, in the same run and the same Spark session.

Starts its own Kafka (the local stack, under a temporary home), fills a topic with Kafka's
ProducerPerformance (default 1M records of 1 KB over 6 partitions), then times:

- **pipeline**: ``run_pipeline(..., once=True)``, exactly as ``bergstream pipeline run --once``
  (Structured Streaming, foreachBatch, Iceberg commits with the boundary);
- **baseline**: a Spark batch read of the same topic written as plain Parquet, the same columns.

MB/s counts the Kafka record values (records x record size). Both read read_committed; the two
alternate ``--rounds`` times (each pipeline round into a fresh table) and the best of each counts,
since the machine is shared.

    .venv/bin/python bench/pipeline_throughput.py [--records 1000000] [--max-offsets-per-trigger N]

"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchkit import create_topic, perf_produce

from bergstream.core.lake import LakeConfig
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.pipeline.session import attach_catalog, build_session
from bergstream.pipeline.settings import LakePipelineConfig, resolve_pipeline_lake
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
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    home = workdir / "home"
    env = stack_up(home=home, components={"kafka"}).as_dict()
    kafka = env["BERGSTREAM_KAFKA_BOOTSTRAP"]
    spark = None
    try:
        topic = "bench-pipeline"
        create_topic(kafka, topic, args.partitions)
        began = time.monotonic()
        perf_produce(kafka, topic, args.records, args.record_size)
        print(f"produced {args.records:,} records in {time.monotonic() - began:.1f} s", flush=True)
        megabytes = args.records * args.record_size / 1e6

        spark = build_session({"spark.driver.memory": args.driver_memory})
        pipeline_runs: list[float] = []
        baseline_runs: list[float] = []
        batches = 0
        for round_ in range(args.rounds):
            # Alternate which goes first, so JVM warm-up and caches favour neither.
            order = ("baseline", "pipeline") if round_ % 2 == 0 else ("pipeline", "baseline")
            for which in order:
                began = time.monotonic()
                if which == "baseline":
                    target = workdir / f"baseline-{round_}"
                    rows = baseline(spark, kafka, topic, target)
                    assert rows == args.records, f"baseline copied {rows:,} records"
                    baseline_runs.append(time.monotonic() - began)
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    lake = resolve_pipeline_lake(
                        LakeConfig(kafka_bootstrap=kafka, namespace=f"bench_{round_}"),
                        home=home,
                        pipeline=LakePipelineConfig(
                            max_offsets_per_trigger=args.max_offsets_per_trigger
                        ),
                    )
                    attach_catalog(spark, lake)
                    result = run_pipeline(spark, lake, topic, once=True, report=print)
                    assert result.records == args.records, f"copied {result.records:,}"
                    pipeline_runs.append(time.monotonic() - began)
                    batches = result.batches
                print(f"round {round_}: {which} {time.monotonic() - began:.1f} s", flush=True)
    finally:
        if spark is not None:
            spark.stop()
        stack_down(home=home)

    pipeline_s, baseline_s = min(pipeline_runs), min(baseline_runs)
    summary = {
        "records": args.records,
        "record_bytes": args.record_size,
        "partitions": args.partitions,
        "pipeline_seconds": round(pipeline_s, 2),
        "pipeline_records_s": round(args.records / pipeline_s),
        "pipeline_mb_s": round(megabytes / pipeline_s, 1),
        "pipeline_batches": batches,
        "baseline_seconds": round(baseline_s, 2),
        "baseline_records_s": round(args.records / baseline_s),
        "baseline_mb_s": round(megabytes / baseline_s, 1),
        "ratio": round(baseline_s / pipeline_s, 3),
    }
    print(
        f"pipeline: {summary['pipeline_records_s']:,} records/s, {summary['pipeline_mb_s']} MB/s "
        f"({pipeline_s:.1f} s, {batches} commit(s), best of {args.rounds})"
    )
    print(
        f"baseline: {summary['baseline_records_s']:,} records/s, {summary['baseline_mb_s']} MB/s "
        f"({baseline_s:.1f} s, Spark Kafka -> Parquet, best of {args.rounds})"
    )
    print(f"ratio pipeline/baseline: {summary['ratio']:.3f}")
    print(json.dumps(summary))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
