"""KSI cold fetch of typed records (Avro, JSON Schema, Protobuf or plain JSON): a typed coldset
table (values as columns, re-encoded to the original bytes by KSI) against the same records in a
raw table, in one run.

Starts its own Kafka and Schema Registry (the local stack, under a temporary home), registers a
20-field record (about 300 bytes of data) in the ``--format`` chosen (default avro), produces
the same framed values to two topics, and writes both coldsets with PyIceberg the way the
pipeline does: ``raw`` with the row contract only, the typed one (named by the format: ``avro``,
``json_schema``, ``protobuf``, ``json``) with the typed layout (core's ``TypedRows``, the
format's codec; schemas kept in the table's properties; for ``json``, unframed plain JSON read by
the ``json`` codec: the layout folds the values' shapes, whose declarations the properties keep,
and the proxy's ``codecs:`` rule names ``json``). After DeleteRecords up to each partition's end,
confluent-kafka reads every record of each topic through ``bergstream run`` with the ksi filter,
a fresh proxy per read (so every read decodes its row groups: a cold cache; each proxy first
reads a small typed topic, so loading the codec's compiled schemas and kernels is not timed),
alternating topics, ``--rounds`` times; the best read of each counts. A checksum of the values
read proves both topics came back with the same bytes.

The record: for avro, an Avro record here (strings, longs, doubles, a timestamp-millis, a
decimal); for json-schema and protobuf, the record of ``format_records`` (strings, longs,
doubles, a timestamp, a decimal as a string, a nullable note), each value canonical.

Prints records/s (wall clock, from the first request to the last record) and records per CPU
second of the proxy process (the steadier figure on a shared machine), their ratios typed/raw
(goal >= 0.8), the in-process CPU time to decode every row group (Parquet to cached payload:
the part where the two differ), and KSI's whole serving work in-process (planner, cold store,
batches; no network, proxy or client) in wall and CPU seconds.

    .venv/bin/python bench/ksi_avro.py [--format avro|json-schema|protobuf|json] [--records 300000]
        [--partitions 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import stop_process
from format_records import FORMATS, plain_json_payloads, register_schema

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    SORT_ORDER,
    BergstreamConfig,
    LakeConfig,
    RegisteredSchema,
    ResolvedLake,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedRows,
    build_layout,
    build_layout_of_shapes,
    format_boundary,
    load_catalog,
    load_registry,
    resolve_lake,
)
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.devstack.stack.ports import free_port_block
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.planner import FetchAsk, plan_fetch
from bergstream.plugins.ksi_fetch_filter.segments import read_row_group_slices
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from bergstream.plugins.ksi_fetch_filter.typed import TypedTables
from bergstream.plugins.value_codecs.avro.codec import AvroCodec
from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Payment",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "account", "type": "string"},
        {"name": "merchant", "type": "string"},
        {"name": "currency", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "city", "type": "string"},
        {"name": "street", "type": "string"},
        {"name": "email", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "ip", "type": "string"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "fee", "type": "double"},
        {"name": "rate", "type": "double"},
        {"name": "score", "type": "double"},
        {"name": "lat", "type": "double"},
        {"name": "lon", "type": "double"},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "sequence", "type": "long"},
        {"name": "batch", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
_EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


def _value(rng: random.Random, index: int) -> dict[str, Any]:
    def words(count: int) -> str:
        return "-".join(rng.choice(_WORDS) for _ in range(count))

    return {
        "id": index,
        "account": f"acct-{rng.randrange(10**12):012d}-{words(2)}",
        "merchant": f"{words(3)} store {rng.randrange(10**4)}",
        "currency": rng.choice(["EUR", "USD", "JPY", "GBP"]),
        "country": rng.choice(["DE", "FR", "JP", "GB", "US"]),
        "city": words(2).title(),
        "street": f"{rng.randrange(1, 999)} {words(3)} street",
        "email": f"{words(2)}.{rng.randrange(10**5)}@example.com",
        "device": f"device-{rng.randrange(16**16):016x}",
        "ip": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
        "amount": Decimal(rng.randrange(1, 10**9)).scaleb(-2),
        "fee": rng.random() * 10,
        "rate": rng.random(),
        "score": rng.random() * 100,
        "lat": rng.uniform(-90, 90),
        "lon": rng.uniform(-180, 180),
        "created": _EPOCH + dt.timedelta(milliseconds=rng.randrange(10**10)),
        "sequence": rng.randrange(2**40),
        "batch": index // 1000,
        "note": None if rng.random() < 0.3 else words(6),
    }


def make_values(count: int, schema_id: int) -> list[bytes]:
    """``count`` framed Avro values (fastavro, canonical)."""
    parsed = fastavro.parse_schema(SCHEMA)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    rng = random.Random(13)
    out = []
    for index in range(count):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, _value(rng, index))
        out.append(header + buffer.getvalue())
    return out


def typed_values(
    fmt: str, registry_url: str, subject: str, count: int
) -> tuple[RegisteredSchema | None, SideCodecs, list[bytes]]:
    """Register the record's schema in format ``fmt`` under ``subject``: the schema as
    registered, the codecs of the values' side, and ``count`` framed values (``json``: no
    schema, unframed plain JSON)."""
    if fmt == "json":
        return None, SideCodecs({"JSON": PlainJsonCodec()}, subject), plain_json_payloads(count)
    if fmt == "avro":
        text = json.dumps(SCHEMA)
        schema_id = register_schema(registry_url, subject, text, "AVRO")
        schema = RegisteredSchema(schema_id, "AVRO", text, subject=subject, version=1)
        return schema, SideCodecs({"AVRO": AvroCodec()}, subject), make_values(count, schema_id)
    record = FORMATS[fmt]
    schema_id = register_schema(registry_url, subject, record.text, record.schema_type)
    schema = record.registered(schema_id, subject)
    side = SideCodecs({record.schema_type: record.codec()}, subject)
    return schema, side, record.payloads(schema, count)


def create_topic(kafka: str, topic: str, partitions: int) -> None:
    """A topic without retention."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka})
    new = NewTopic(topic, partitions, 1, config={"retention.ms": "-1"})
    admin.create_topics([new])[topic].result(timeout=60)


def produce(kafka: str, topic: str, values: list[bytes], partitions: int) -> None:
    """Value ``i`` to partition ``i % partitions`` (so it lands at offset ``i // partitions``)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": kafka,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1 << 20,
        }
    )
    for index, value in enumerate(values):
        while True:
            try:
                producer.produce(
                    topic, value=value, partition=index % partitions, timestamp=_ts(index)
                )
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def _ts(index: int) -> int:
    return 1_700_000_000_000 + index


def contract_rows(values: list[bytes], partitions: int) -> pa.Table:
    """Row-contract rows of the produced records."""
    count = len(values)
    return pa.Table.from_pydict(
        {
            "kafka_partition": [i % partitions for i in range(count)],
            "kafka_offset": [i // partitions for i in range(count)],
            "kafka_timestamp": [_ts(i) * 1000 for i in range(count)],
            "kafka_timestamp_type": [0] * count,
            "kafka_key": [None] * count,
            "kafka_headers": [[]] * count,
            "kafka_value": values,
        },
        schema=ROW_ARROW_SCHEMA,
    )


def write_table(
    lake: ResolvedLake,
    topic: str,
    rows: pa.Table,
    boundary: dict[int, int],
    typed: tuple[TopicCodecs, StoredSchemas] | None,
) -> None:
    """The topic's coldset: created from the contract, evolved to the typed layout when
    ``typed`` (schemas in its properties), rows appended with the boundary."""
    from pyiceberg.partitioning import PartitionSpec

    from bergstream.core.api import PARTITION_SPEC

    catalog = load_catalog(lake)
    catalog.create_namespace_if_not_exists(lake.namespace)
    spec = PartitionSpec(PARTITION_SPEC.fields[0], spec_id=0)  # PyIceberg writes identity only
    table = catalog.create_table(
        lake.table_identifier(topic), ROW_SCHEMA, partition_spec=spec, sort_order=SORT_ORDER
    )
    if typed is not None:
        codecs, source = typed
        base, last = table.schema(), table.metadata.last_column_id
        if codecs.value is not None and codecs.value.shape_codec is not None:
            values = rows.column("kafka_value").combine_chunks().cast(pa.large_binary())
            shaped = build_layout_of_shapes(base, last, codecs, source, values)
            layout = shaped.layout
            source.add(list(shaped.shapes.values()))
        else:
            layout = build_layout(base, last, codecs, source)
        with table.update_schema() as update:
            update.union_by_name(layout.schema)
        table = catalog.load_table(lake.table_identifier(topic))
        with table.transaction() as transaction:
            transaction.set_properties(layout.schema_properties())
        table = catalog.load_table(lake.table_identifier(topic))
        rows = TypedRows(layout, codecs, source).decode(rows).table
    table.append(rows, snapshot_properties={BOUNDARY_PROPERTY: format_boundary(boundary)})


def delete_all(kafka: str, topic: str, partitions: int, ends: dict[int, int]) -> None:
    """DeleteRecords up to each partition's end."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka})
    futures = admin.delete_records([TopicPartition(topic, p, ends[p]) for p in range(partitions)])
    for future in futures.values():
        future.result(timeout=120)


def decode_seconds(lake: ResolvedLake, topic: str, config: BergstreamConfig | None) -> float:
    """CPU seconds to decode every row group of the topic's table into cached payloads (what a
    cold fetch does before building batches); ``config``: the table is typed."""
    catalog = load_catalog(lake)
    table = catalog.load_table(lake.table_identifier(topic))
    encoder = None
    if config is not None:
        tables = TypedTables(config, load_registry())
        encoder = tables.encoder(topic, table)
        assert encoder is not None
    files = [task.file for task in table.scan().plan_files()]
    if encoder is not None:  # compile (or load) the codec's kernels before timing
        first = pq.ParquetFile(files[0].file_path.removeprefix("file://"))
        encoder(first.read_row_group(0).slice(0, 10))
    began = time.process_time()
    rows = 0
    for data in files:
        parquet = pq.ParquetFile(data.file_path.removeprefix("file://"))
        partition = int(data.partition[0])
        for group in range(parquet.metadata.num_row_groups):
            for piece in read_row_group_slices(parquet, group, partition, 4 << 20, encoder):
                rows += piece.payload.num_rows  # encoded now (a typed table)
    return time.process_time() - began


def serve_seconds(
    lake: ResolvedLake, topic: str, ends: dict[int, int], typed: TypedTables
) -> tuple[float, float]:
    """(wall, CPU) seconds KSI's own work takes to serve every record of ``topic`` in-process:
    the fetches a consumer makes (10 MiB per partition, 50 MiB per request), answered by the
    planner from a cold store (row groups decoded, payloads encoded, batches built), without
    the network, the proxy or a client. ``typed`` is shared by the runs (as by the proxy's
    connections), so its codecs are compiled once."""
    settings = KsiConfig(topics=[topic], cache_max_bytes=512 << 20)
    store = ColdStore(lake, settings, typed=typed)
    offsets = dict.fromkeys(ends, 0)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        while any(offsets[p] < ends[p] for p in ends):
            asks = [FetchAsk(topic, p, offsets[p], 10 << 20) for p in ends if offsets[p] < ends[p]]
            for (_, partition), answer in plan_fetch(store, asks, 50 << 20, 1 << 20).items():
                if answer.error is not None:
                    raise RuntimeError(answer.error)
                if answer.record_count:
                    assert answer.next_offset is not None
                    offsets[partition] = answer.next_offset
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        store.close()


def consume(bootstrap: str, topic: str, partitions: int, records: int) -> tuple[float, int]:
    """Seconds confluent-kafka takes to read ``records`` records of ``topic`` from offset 0
    (partitions assigned, no group: the clock runs from the first request), and the sum of the
    values' CRC-32s (order independent)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
        }
    )
    seen = 0
    checksum = 0
    started = time.monotonic()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    deadline = started + 1800
    try:
        while seen < records and time.monotonic() < deadline:
            batch = consumer.consume(10_000, 1.0)
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                checksum += zlib.crc32(message.value())
            seen += len(batch)
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    if seen < records:
        raise RuntimeError(f"read {seen} of {records} records of {topic}")
    return elapsed, checksum


class Proxy:
    """``bergstream run`` with the ksi filter on both topics."""

    def __init__(self, home: Path, kafka: str, lake_yaml: str, topics: list[str], cache_mb: int):
        self.port = free_port_block(4)
        self.config = home / "ksi.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""
                virtual_clusters:
                  - name: bench
                    target: {{bootstrap: "{kafka}"}}
                    gateway: {{host: 127.0.0.1, port: {self.port}, lowest_broker_id: 0,
                              broker_count: 3}}
                    filters:
                      - type: ksi
                        config: {{topics: [{", ".join(topics)}],
                                  cache_max_bytes: {cache_mb << 20}}}
                """
            )
            + lake_yaml
        )

        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Proxy:
        self.process = subprocess.Popen(
            [BERGSTREAM, "run", "-c", str(self.config)],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if "bergstream: ready" in line:
                break
        else:
            raise RuntimeError("the proxy did not start")
        return self

    @property
    def bootstrap(self) -> str:
        """Where clients connect."""
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system, all threads) the proxy process has used so far."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        stop_process(self.process)


def main() -> None:
    """Run the benchmark and print its JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["avro", *FORMATS, "json"], default="avro")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-mb", type=int, default=512, help="ksi cache_max_bytes in MiB")
    args = parser.parse_args()
    name = args.format.replace("-", "_")  # the typed topic, its table and its figures

    home = Path(tempfile.mkdtemp(prefix=f"ksi-{args.format}-bench-"))
    try:
        env = stack_up(home=home, components={"kafka", "schema-registry"}).as_dict()
        kafka = env["BERGSTREAM_KAFKA_BOOTSTRAP"]
        registry_url = env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
        subject = f"{name}-value"
        schema, side, values = typed_values(args.format, registry_url, subject, args.records)
        value_bytes = sum(len(v) for v in values)
        ends = {p: len(range(p, args.records, args.partitions)) for p in range(args.partitions)}
        lake_config = LakeConfig(
            kafka_bootstrap=kafka,
            catalog={"uri": f"sqlite:///{home}/lake/catalog.db", "warehouse": f"{home}/lake/wh"},  # type: ignore[arg-type]
        )
        lake = resolve_lake(lake_config, home=home)
        lake_yaml = "lake:\n  " + json.dumps(
            lake_config.model_dump(mode="json", exclude_defaults=True)
        )
        codecs_section: dict[str, Any] = {}
        if args.format == "json":  # no framing: only a rule says how values are read
            rules = [{"match": topic, "value": "json"} for topic in (name, "warm")]
            codecs_section = {"topics": rules}
            lake_yaml += "\ncodecs:\n  " + json.dumps(codecs_section) + "\n"
        config = BergstreamConfig.model_validate(
            {"lake": lake_config.model_dump(mode="json"), "codecs": codecs_section}
        )
        rows = contract_rows(values, args.partitions)
        codecs = TopicCodecs(name, side)
        warm = 3000  # a small typed topic each proxy reads first (codec kernels loaded)
        warm_ends = {p: len(range(p, warm, args.partitions)) for p in range(args.partitions)}
        for topic in ("raw", name, "warm"):
            count = warm if topic == "warm" else args.records
            create_topic(kafka, topic, args.partitions)
            produce(kafka, topic, values[:count], args.partitions)
            stored = StoredSchemas().add([schema] if schema is not None else [])
            typed = None if topic == "raw" else (codecs, stored)
            topic_rows = (
                rows if count == args.records else contract_rows(values[:count], args.partitions)
            )
            topic_ends = ends if count == args.records else warm_ends
            write_table(lake, topic, topic_rows, topic_ends, typed)
            delete_all(kafka, topic, args.partitions, topic_ends)
        decode = {
            topic: decode_seconds(lake, topic, config if topic == name else None)
            for topic in ("raw", name)
        }
        serve: dict[str, list[tuple[float, float]]] = {"raw": [], name: []}
        shared = TypedTables(config, load_registry())
        for round_ in range(args.rounds + 1):  # the first round warms up, it does not count
            for topic in ("raw", name) if round_ % 2 == 0 else (name, "raw"):
                timing = serve_seconds(lake, topic, ends, shared)
                if round_:
                    serve[topic].append(timing)
        reads: dict[str, list[float]] = {"raw": [], name: []}
        cpu: dict[str, list[float]] = {"raw": [], name: []}
        checksums: dict[str, set[int]] = {"raw": set(), name: set()}
        for round_ in range(args.rounds):
            order = ("raw", name) if round_ % 2 == 0 else (name, "raw")
            for topic in order:
                served = ["raw", name, "warm"]
                with Proxy(home, kafka, lake_yaml, served, args.cache_mb) as proxy:
                    consume(proxy.bootstrap, "warm", args.partitions, warm)
                    before = proxy.cpu_seconds()
                    seconds, checksum = consume(
                        proxy.bootstrap, topic, args.partitions, args.records
                    )
                    cpu[topic].append(proxy.cpu_seconds() - before)
                reads[topic].append(seconds)
                checksums[topic].add(checksum)
        if len(checksums["raw"] | checksums[name]) != 1:
            raise RuntimeError(f"the topics came back with different values: {checksums}")
        best = {topic: min(times) for topic, times in reads.items()}
        least_cpu = {topic: min(times) for topic, times in cpu.items()}

        def summary(topic: str) -> dict[str, Any]:
            return {
                "records_per_s": round(args.records / best[topic]),
                "mb_per_s": round(value_bytes / best[topic] / 1e6, 1),
                "records_per_proxy_cpu_s": round(args.records / least_cpu[topic]),
                "reads_s": [round(s, 2) for s in reads[topic]],
                "proxy_cpu_s": [round(s, 2) for s in cpu[topic]],
                "decode_cpu_s": round(decode[topic], 2),
                "in_process_serve_s": [
                    {"wall": round(w, 2), "cpu": round(c, 2)} for w, c in serve[topic]
                ],
            }

        result = {
            "records": args.records,
            "partitions": args.partitions,
            "mean_value_bytes": round(value_bytes / args.records, 1),
            "rounds": args.rounds,
            "raw": summary("raw"),
            name: summary(name),
            f"{name}_to_raw_ratio": round(best["raw"] / best[name], 3),
            f"{name}_to_raw_ratio_per_proxy_cpu": round(least_cpu["raw"] / least_cpu[name], 3),
            f"{name}_to_raw_ratio_in_process_cpu": round(
                min(c for _, c in serve["raw"]) / min(c for _, c in serve[name]), 3
            ),
            "goal": ">= 0.8",
            "same_bytes": True,
        }
        print(json.dumps(result, indent=2))
    finally:
        stack_down(home=home)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
