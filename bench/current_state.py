"""Upsert topics: what keeping a current state costs, against the same work on the log, in one
run on one machine.

Starts its own Kafka (the local stack, under a temporary home) and fills one topic with
``--keys`` keyed records (``k0000000``, ..., values of ``--value-size`` bytes), then
``--batches`` batches of changes, each updating ``--updates`` and deleting (a tombstone)
``--deletes`` of the keys. Then it measures, in one Spark session:

1. **pipeline** (issue 30's goal: upsert >= 0.5x append): the topic copied by
   ``run_pipeline(once=True)`` (what ``bergstream pipeline run --once`` runs) into a lake as an
   ``append`` topic, and into another lake as an ``upsert`` topic (the log table and its state
   table, with position deletes), micro-batches of one change batch each
   (``max_offsets_per_trigger``); ``pipeline_ratio`` = upsert records/s over append records/s;
2. **the state table**: per snapshot, the delete files and deleted positions it added; the read
   of the whole state table (PyIceberg, and DuckDB's ``iceberg_scan``) before and after
   ``bergstream pipeline maintain`` folds the deletes into rewritten files;
3. **queries through ISK** (goal: cold <= 2x, warm <= 1.2x the same query on ``merged``):
   ``--hot`` more changes are produced (only in Kafka), ISK is started on the upsert lake, and
   DuckDB runs ``SELECT count(*), sum(octet_length(kafka_value)) ...`` on ``current.<topic>``
   and on ``merged.<topic>``: cold = the first query after a restart with an empty cache (ISK
   builds every file), warm = the median of ``--runs`` more.

    .venv/bin/python bench/current_state.py [--keys 1000000] [--batches 3] [--hot 100000]

The last line is a JSON summary with ``pipeline_ratio``, ``cold_ratio`` and ``warm_ratio``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import create_topic, remove_workdir
from isk_query import Isk

from bergstream.core.lake import LakeCatalogConfig, LakeConfig, load_catalog
from bergstream.core.table_modes import TableModeRule
from bergstream.devstack.quickstart.clients import SqlSession, offline_duckdb
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.pipeline.settings import resolve_pipeline_lake

TOPIC = "current_state_bench"
QUERY = "SELECT count(*), sum(octet_length(kafka_value)) FROM {table}"
PIPELINE_GOAL, COLD_GOAL, WARM_GOAL = 0.5, 2.0, 1.2


def produce_changes(kafka: str, keys: range, changes: list[tuple[int, bool]], size: int) -> None:
    """Produce ``keys`` once each, or ``changes`` ((key, delete?)), values of ``size`` bytes."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": kafka, "linger.ms": 20, "batch.size": 1 << 20,
         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000}
    )  # fmt: skip
    filler = b"x" * size
    items = [(k, False) for k in keys] if keys else changes
    for number, (key, delete) in enumerate(items):
        value = None if delete else (b"%d-" % number + filler)[:size]
        while True:
            try:
                producer.produce(TOPIC, key=b"k%07d" % key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
        if number % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def lake_for(workdir: Path, kafka: str, name: str, batch: int) -> Any:
    """A lake under ``workdir/name`` with its own Spark catalog name and micro-batch size."""
    home = workdir / name
    config = LakeConfig(
        kafka_bootstrap=kafka,
        catalog=LakeCatalogConfig(
            name=name,
            uri=f"sqlite:///{home}/catalog.db",
            warehouse=str(home / "warehouse"),
        ),
        pipeline={
            "checkpoint_dir": str(home / "checkpoints"),
            "max_offsets_per_trigger": batch,
        },
    )
    return resolve_pipeline_lake(config, home=home)


def timed_pipeline(spark: Any, lake: Any, mode: TableModeRule | None) -> tuple[float, int]:
    from bergstream.pipeline.session import attach_catalog
    from bergstream.pipeline.stream import run_pipeline

    attach_catalog(spark, lake)
    began = time.perf_counter()
    result = run_pipeline(spark, lake, TOPIC, once=True, report=lambda _: None, mode=mode)
    return time.perf_counter() - began, result.records


def delete_history(lake: Any) -> list[dict[str, Any]]:
    """What each snapshot of the state table added: data and delete files, deleted rows."""
    table = load_catalog(lake).load_table((lake.current_namespace, TOPIC))
    out = []
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        out.append(
            {
                "operation": str(snapshot.summary.operation.value) if snapshot.summary else "",
                "added_data_files": int(summary.get("added-data-files", 0)),
                "added_delete_files": int(summary.get("added-delete-files", 0)),
                "added_position_deletes": int(summary.get("added-position-deletes", 0)),
                "total_delete_files": int(summary.get("total-delete-files", 0)),
            }
        )
    return out


def read_cost(lake: Any, runs: int) -> dict[str, Any]:
    """Seconds of a whole read of the state table: PyIceberg and DuckDB (median of ``runs``)."""
    table = load_catalog(lake).load_table((lake.current_namespace, TOPIC))
    pyiceberg: list[float] = []
    rows = 0
    for _ in range(runs):
        began = time.perf_counter()
        rows = table.scan().to_arrow().num_rows
        pyiceberg.append(time.perf_counter() - began)
    metadata = table.metadata_location.removeprefix("file://")
    duck: list[float] = []
    for _ in range(runs):
        connection = offline_duckdb()
        began = time.perf_counter()
        found = connection.execute(QUERY.format(table=f"iceberg_scan('{metadata}')")).fetchone()
        duck.append(time.perf_counter() - began)
        connection.close()
        assert found is not None and found[0] == rows, (found, rows)
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    return {
        "rows": rows,
        "data_files": int(summary.get("total-data-files", 0)),
        "delete_files": int(summary.get("total-delete-files", 0)),
        "position_deletes": int(summary.get("total-position-deletes", 0)),
        "pyiceberg_s": round(statistics.median(pyiceberg), 3),
        "duckdb_s": round(statistics.median(duck), 3),
    }


def duckdb_query(catalog_url: str, table: str) -> tuple[float, tuple[int, ...]]:
    connection = offline_duckdb()
    try:
        connection.execute("SET enable_external_file_cache = false")
        began = time.perf_counter()
        connection.execute(SqlSession.attach_sql(catalog_url))
        row = connection.execute(QUERY.format(table=table)).fetchone()
        seconds = time.perf_counter() - began
    finally:
        connection.close()
    assert row is not None
    return seconds, tuple(int(v) for v in row)


def query_ratios(isk: Isk, runs: int, cold_runs: int) -> dict[str, Any]:
    """Cold and warm DuckDB queries of ``current`` and ``merged`` through ISK."""
    out: dict[str, Any] = {}
    for namespace in ("merged", "current"):
        table = f'isk.{namespace}."{TOPIC}"'
        colds, results = [], set()
        for _ in range(cold_runs):
            isk.start()  # an empty cache
            seconds, result = duckdb_query(isk.catalog_url, table)
            colds.append(seconds)
            results.add(result)
        warms = []
        for _ in range(runs):
            seconds, result = duckdb_query(isk.catalog_url, table)
            warms.append(seconds)
            results.add(result)
        if len(results) != 1:
            raise RuntimeError(f"{namespace}: the queries disagree: {results}")
        out[namespace] = {
            "result": list(results.pop()),
            "cold_s": round(statistics.median(colds), 3),
            "warm_s": round(statistics.median(warms), 3),
        }
        print(f"{namespace}: {out[namespace]}", flush=True)
    out["cold_ratio"] = round(out["current"]["cold_s"] / out["merged"]["cold_s"], 3)
    out["warm_ratio"] = round(out["current"]["warm_s"] / out["merged"]["warm_s"], 3)
    return out


def main() -> None:
    """Run the bench; print progress, then the JSON summary as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--updates", type=float, default=0.10)
    parser.add_argument("--deletes", type=float, default=0.01)
    parser.add_argument("--hot", type=int, default=100_000, help="changes only in Kafka")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold-runs", type=int, default=2)
    parser.add_argument("--chunk-records", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="smoke run: 50k keys, 10k hot")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    if args.quick:
        args.keys, args.hot, args.chunk_records = 50_000, 10_000, 10_000
    rng = random.Random(30)
    workdir = Path(tempfile.mkdtemp(prefix="bench-current-"))
    home = workdir / "home"
    summary: dict[str, Any] = {"keys": args.keys, "batches": args.batches,
                               "updates": args.updates, "deletes": args.deletes,
                               "hot": args.hot, "value_size": args.value_size}  # fmt: skip
    spark = None
    isk = None
    try:
        env = stack_up(home=home, components={"kafka"}).as_dict()
        kafka = env["BERGSTREAM_KAFKA_BOOTSTRAP"]
        create_topic(kafka, TOPIC, args.partitions)
        began = time.perf_counter()
        produce_changes(kafka, range(args.keys), [], args.value_size)
        batch = int(args.keys * (args.updates + args.deletes))
        for _ in range(args.batches):
            changes = [
                (rng.randrange(args.keys), False) for _ in range(int(args.keys * args.updates))
            ]
            changes += [
                (rng.randrange(args.keys), True) for _ in range(int(args.keys * args.deletes))
            ]
            rng.shuffle(changes)
            produce_changes(kafka, range(0), changes, args.value_size)
        records = args.keys + args.batches * batch
        print(f"produced {records:,} records in {time.perf_counter() - began:.1f} s", flush=True)

        from bergstream.pipeline.session import build_session

        spark = build_session({"spark.driver.memory": "2g"})
        append_lake = lake_for(workdir, kafka, "append_lake", batch)
        upsert_lake = lake_for(workdir, kafka, "upsert_lake", batch)
        upsert = TableModeRule(match="*", mode="upsert")
        timed_pipeline(spark, lake_for(workdir, kafka, "warmup_lake", batch), None)  # JVM, jars
        append_s, append_n = timed_pipeline(spark, append_lake, None)
        upsert_s, upsert_n = timed_pipeline(spark, upsert_lake, upsert)
        assert append_n == upsert_n == records, (append_n, upsert_n, records)
        summary["pipeline"] = {
            "records": records,
            "append_s": round(append_s, 2),
            "upsert_s": round(upsert_s, 2),
            "append_records_s": round(records / append_s),
            "upsert_records_s": round(records / upsert_s),
        }
        summary["pipeline_ratio"] = round(append_s / upsert_s, 3)
        print(f"pipeline: {summary['pipeline']}, ratio {summary['pipeline_ratio']}", flush=True)

        summary["state_snapshots"] = delete_history(upsert_lake)
        summary["read_before_maintain"] = read_cost(upsert_lake, args.runs)
        from bergstream.pipeline.maintain import maintain_table

        began = time.perf_counter()
        maintain_table(spark, upsert_lake, TOPIC, report=lambda _: None)
        summary["maintain_s"] = round(time.perf_counter() - began, 2)
        summary["read_after_maintain"] = read_cost(upsert_lake, args.runs)
        print(f"read before maintain {summary['read_before_maintain']}, after "
              f"{summary['read_after_maintain']}", flush=True)  # fmt: skip
        spark.stop()
        spark = None

        share = args.deletes / (args.updates + args.deletes)
        hot = [(rng.randrange(args.keys), rng.random() < share)
               for _ in range(args.hot)]  # fmt: skip
        produce_changes(kafka, range(0), hot, args.value_size)
        catalog = upsert_lake.config.catalog
        isk = Isk(
            workdir,
            kafka,
            args.chunk_records,
            extra_yaml=f"""
            lake:
              kafka_bootstrap: "{kafka}"
              catalog: {{name: {catalog.name}, uri: "{catalog.uri}",
                        warehouse: "{catalog.warehouse}"}}
            tables:
              topics: [{{match: "*", mode: upsert}}]
            """,
        )
        summary["queries"] = query_ratios(isk, args.runs, args.cold_runs)
        summary["cold_ratio"] = summary["queries"]["cold_ratio"]
        summary["warm_ratio"] = summary["queries"]["warm_ratio"]
        summary["goals"] = {
            "pipeline": summary["pipeline_ratio"] >= PIPELINE_GOAL,
            "cold": summary["cold_ratio"] <= COLD_GOAL,
            "warm": summary["warm_ratio"] <= WARM_GOAL,
        }
        isk.stop()
        isk = None
        print(json.dumps(summary))
    finally:
        if spark is not None:
            spark.stop()
        if isk is not None:
            try:
                isk.stop()
            except RuntimeError as error:
                print(error, file=sys.stderr)
        stack_down(home=home)
        remove_workdir(workdir, args.keep)


if __name__ == "__main__":
    main()
