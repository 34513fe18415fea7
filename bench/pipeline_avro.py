"""Pipeline with typed decoding (Avro, JSON Schema, Protobuf, or plain JSON) against the raw
pipeline, on the same topic, in the same run and the same Spark session.

Starts its own Kafka and Schema Registry (the local stack, under a temporary home), registers a
20-field record (about 300 bytes of data; the value's size in each format is printed) in the
``--format`` chosen (default avro), fills a topic with values in Confluent framing (default
300k records over 6 partitions: a pool of distinct values, repeated), then times
``run_pipeline(..., once=True)`` into a fresh table:

- **raw**: no ``codecs:`` rule, one ``kafka_value`` column (today's pipeline);
- **typed** (named by the format): a rule decoding values by the registry (``--format json``:
  unframed plain JSON read by the ``json`` codec, columns inferred; typed columns,
  decoded by core's TypedRows in Spark's Python workers through ``mapInArrow``, which read the
  batch's offsets from Kafka themselves (librdkafka, one task per core) and write the Parquet
  data files themselves; the driver commits them with the boundary).

The record: for avro, an Avro record here (strings, longs, doubles, a timestamp-millis, a
decimal); for json-schema and protobuf, the record of ``format_records`` (strings, longs,
doubles, a timestamp, a decimal as a string, a nullable note), each value canonical.

``--batch first`` (the default) times a table's first batch, ``--batch later`` a later one:
each round then fills a fresh topic with ``--seed`` records, copies them untimed into both
tables (the ``json`` codec folds its columns from them), then fills ``--records`` more and
times copying those (for ``json``, a later batch whose keys all have columns is read in one
pass; a first batch takes one more, to fold its shapes).

The two alternate ``--rounds`` times and the best of each counts (the machine is shared); CPU
seconds of the whole process tree (driver, JVM, Python workers) are printed beside, being less
sensitive to other load than wall time. Needs pandas (Spark's mapInArrow).

    .venv/bin/python bench/pipeline_avro.py [--format avro|json-schema|protobuf|json]
        [--records 300000] [--rounds 3] [--batch first|later] [--seed 6000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import string
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from benchkit import create_topic
from format_records import FORMATS, plain_json_payloads, register_schema

from bergstream.core.api import BergstreamConfig, ServiceContext, load_registry
from bergstream.core.lake import LakeConfig
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.pipeline.session import attach_catalog, build_session
from bergstream.pipeline.settings import LakePipelineConfig, resolve_pipeline_lake
from bergstream.pipeline.stream import run_pipeline
from bergstream.pipeline.typed import topic_typing

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Payment",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "account", "type": "string"},
        {"name": "currency", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 18,
                                    "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "merchant", "type": "string"},
        {"name": "city", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "lat", "type": "double"},
        {"name": "lon", "type": "double"},
        {"name": "fee", "type": "double"},
        {"name": "score", "type": "double"},
        {"name": "status", "type": "string"},
        {"name": "channel", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "ip", "type": "string"},
        {"name": "customer_id", "type": "long"},
        {"name": "order_id", "type": "long"},
        {"name": "items", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}  # fmt: skip
#: Distinct values produced (then repeated): encoding them is the slow part of the set-up.
POOL = 20_000


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size))


def payment(rng: random.Random, i: int) -> dict[str, Any]:
    """One value of :data:`SCHEMA` (fastavro's Python form)."""
    return {
        "id": i,
        "account": _text(rng, 36),
        "currency": rng.choice(["EUR", "USD", "GBP", "JPY"]),
        "amount": Decimal(rng.randint(-(10**9), 10**9)).scaleb(-2),
        "at": 1_700_000_000_000 + i * 7,
        "merchant": _text(rng, 40),
        "city": _text(rng, 12),
        "country": rng.choice(["DE", "FR", "US", "GB"]),
        "lat": rng.uniform(-90, 90),
        "lon": rng.uniform(-180, 180),
        "fee": rng.random(),
        "score": rng.random(),
        "status": rng.choice(["authorized", "settled", "refunded"]),
        "channel": rng.choice(["web", "mobile", "pos"]),
        "device": _text(rng, 36),
        "ip": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
        "customer_id": rng.randrange(10**9),
        "order_id": rng.randrange(10**12),
        "items": rng.randrange(1, 20),
        "note": None if rng.random() < 0.2 else _text(rng, 70),
    }


def avro_pool(schema_id: int) -> list[bytes]:
    """:data:`POOL` distinct framed Avro values of :data:`SCHEMA`."""
    import fastavro

    parsed = fastavro.parse_schema(SCHEMA)
    rng = random.Random(1)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    pool = []
    for i in range(POOL):
        out = io.BytesIO(header)
        out.seek(5)
        fastavro.schemaless_writer(out, parsed, payment(rng, i))
        pool.append(out.getvalue())
    return pool


def register_and_pool(registry_url: str, subject: str, fmt: str) -> list[bytes]:
    """Register the record's schema in format ``fmt`` under ``subject``; :data:`POOL` distinct
    framed values of it."""
    if fmt == "avro":
        return avro_pool(register_schema(registry_url, subject, json.dumps(SCHEMA), "AVRO"))
    if fmt == "json":
        return plain_json_payloads(POOL)  # plain JSON: nothing to register
    record = FORMATS[fmt]
    schema_id = register_schema(registry_url, subject, record.text, record.schema_type)
    return record.payloads(record.registered(schema_id, subject), POOL)


def fill(bootstrap: str, topic: str, pool: list[bytes], records: int, partitions: int) -> float:
    """Produce ``records`` values from ``pool`` (repeated); the average value size in bytes."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 524288, "acks": 1}
    )
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=pool[i % len(pool)], key=b"%d" % i,
                                 partition=i % partitions)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    return sum(map(len, pool)) / len(pool)


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and every live descendant (the JVM, Python workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[tuple[int, float]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        children.setdefault(int(fields[1]), []).append((int(entry), cpu))
    total, todo = 0.0, [os.getpid()]
    while todo:
        for pid, cpu in children.get(todo.pop(), []):
            total += cpu
            todo.append(pid)
    own = os.times()
    return total + own.user + own.system


def main() -> None:
    """Run the benchmark; print both figures and the ratios (JSON on the last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["avro", *FORMATS, "json"], default="avro")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs each")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument(
        "--batch",
        choices=["first", "later"],
        default="first",
        help="time a table's first batch, or a later one (see the docstring)",
    )
    parser.add_argument(
        "--seed", type=int, default=6000, help="records of the untimed first batch (--batch later)"
    )
    args = parser.parse_args()
    typed = args.format.replace("-", "_")  # names the typed runs (and their table namespaces)

    workdir = Path(tempfile.mkdtemp(prefix=f"bench-pipeline-{args.format}-"))
    home = workdir / "home"
    env = stack_up(home=home, components={"kafka", "schema-registry"}).as_dict()
    kafka, registry_url = env["BERGSTREAM_KAFKA_BOOTSTRAP"], env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    spark = None
    try:
        later = args.batch == "later"
        base_topic = f"bench-{args.format}"
        subject = f"{base_topic}-value"
        pool = register_and_pool(registry_url, subject, args.format)

        def filled(topic: str, records: int) -> float:
            began = time.monotonic()
            size = fill(kafka, topic, pool, records, args.partitions)
            print(f"produced {records:,} values of {size:.0f} B on average in "
                  f"{time.monotonic() - began:.1f} s", flush=True)  # fmt: skip
            return size

        def typing_of(topic: str) -> Any:
            value = "json" if args.format == "json" else "registry"
            config = BergstreamConfig.model_validate(
                {"codecs": {"schema_registry": {"url": registry_url},
                            "topics": [{"match": topic, "value": value,
                                        "value_subject": subject}]}}
            )  # fmt: skip
            found = topic_typing(ServiceContext(config, load_registry(), home), topic)
            assert found is not None
            return found

        if not later:
            create_topic(kafka, base_topic, args.partitions)
            size = filled(base_topic, args.records)

        spark = build_session({"spark.driver.memory": args.driver_memory})
        runs: dict[str, list[tuple[float, float]]] = {"raw": [], typed: []}
        for round_ in range(args.rounds):
            # Alternate which goes first, so JVM warm-up and caches favour neither.
            order = ("raw", typed) if round_ % 2 == 0 else (typed, "raw")
            topic = f"{base_topic}-{round_}" if later else base_topic
            codecs = typing_of(topic)
            lakes = {}
            for which in order:
                lakes[which] = resolve_pipeline_lake(
                    LakeConfig(kafka_bootstrap=kafka, namespace=f"bench_{which}_{round_}"),
                    home=home,
                    pipeline=LakePipelineConfig(),
                )
                attach_catalog(spark, lakes[which])
            if later:
                create_topic(kafka, topic, args.partitions)
                filled(topic, args.seed)
                for which in order:
                    run_pipeline(spark, lakes[which], topic, once=True, report=lambda line: None,
                                 codecs=codecs if which == typed else None)  # fmt: skip
                size = filled(topic, args.records)
            for which in order:
                lake = lakes[which]
                cpu, began = tree_cpu_seconds(), time.monotonic()
                result = run_pipeline(
                    spark, lake, topic, once=True, report=print,
                    codecs=codecs if which == typed else None,
                )  # fmt: skip
                seconds, cpu = time.monotonic() - began, tree_cpu_seconds() - cpu
                assert result.records == args.records, f"copied {result.records:,}"
                runs[which].append((seconds, cpu))
                print(f"round {round_}: {which} {seconds:.1f} s, {cpu:.1f} CPU s, "
                      f"{args.records / seconds:,.0f} records/s", flush=True)  # fmt: skip
    finally:
        if spark is not None:
            spark.stop()
        stack_down(home=home)

    best = {name: min(s for s, _ in found) for name, found in runs.items()}
    best_cpu = {name: min(c for _, c in found) for name, found in runs.items()}
    summary = {
        "batch": args.batch,
        "records": args.records,
        "value_bytes": round(size),
        "partitions": args.partitions,
        "raw_records_s": round(args.records / best["raw"]),
        f"{typed}_records_s": round(args.records / best[typed]),
        "ratio": round(best["raw"] / best[typed], 3),
        "raw_cpu_s": round(best_cpu["raw"], 1),
        f"{typed}_cpu_s": round(best_cpu[typed], 1),
        "cpu_ratio": round(best_cpu["raw"] / best_cpu[typed], 3),
    }
    width = len(typed) + 2
    for name in ("raw", typed):
        label, rate = f"{name}:", summary[f"{name}_records_s"]
        print(f"{label:<{width}}{rate:,} records/s ({best[name]:.1f} s, "
              f"{best_cpu[name]:.1f} CPU s, best of {args.rounds})")  # fmt: skip
    print(f"ratio {typed}/raw: {summary['ratio']:.3f} records/s, "
          f"{summary['cpu_ratio']:.3f} by CPU")  # fmt: skip
    print(json.dumps(summary))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
