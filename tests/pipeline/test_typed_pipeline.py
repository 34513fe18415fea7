"""Typed tables through the lake pipeline, on the real broker, the stack's Schema Registry
(Apicurio) and one Spark session: Avro values produced with confluent-kafka's ``AvroSerializer``
become columns Spark and PyIceberg read, equal row for row to what core's decoder (the one ISK
and KSI use) makes of the same records; records that do not decode or re-encode differently
keep their bytes; a new schema version evolves the table with stable field ids; a registry
outage writes nothing and the run carries on by itself once the registry is back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

from bergstream.core.api import (
    KEY_ERROR_COLUMN,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    SCHEMA_PROPERTY_PREFIX,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
)
from bergstream.core.config import load_config
from bergstream.devstack.stack.ports import free_ports
from bergstream.pipeline.settings import PipelineLake, pipeline_lake
from bergstream.pipeline.stream import PipelineError, run_pipeline, worker_fetch_settings
from tests.kits.avro_wire import KEY_SCHEMA, PAYMENT_V1, canonical, framed, key_bytes, payment
from tests.kits.avro_wire import payment_v2 as make_payment_v2
from tests.kits.lake import Produced, produce, s3_settings, table_rows_spark
from tests.pipeline.typed_kit import (
    FIRST_MS,
    Forwarder,
    avro_serializer,
    coldset,
    decoder_of,
    mixed_records,
    register,
    sorted_rows,
    truth_table,
    typing_for,
)

pytestmark = pytest.mark.slow

PARTS = 2
#: A record schema of another subject whose fields are a subset of PAYMENT_V1's: its records
#: fit the table without new columns.
SUBSET: dict[str, Any] = {
    "type": "record",
    "name": "PaymentLite",
    "namespace": "pipeline.test",
    "fields": [{"name": "id", "type": "long"}, {"name": "currency", "type": {
        "type": "enum", "name": "Currency", "namespace": "ksi.test",
        "symbols": ["EUR", "USD", "JPY"]}}],
}  # fmt: skip


@pytest.fixture(scope="module")
def registry_url(stack_env: dict[str, str]) -> str:
    """The stack's Schema Registry (Confluent API base URL)."""
    return stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]


def _quiet(line: str) -> None:
    pass


def _spark_view(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The columns compared between Spark and PyIceberg (types both show alike)."""
    return [
        (
            r["kafka_partition"],
            r["kafka_offset"],
            r["kafka_key"],
            r["kafka_value"],
            r[VALUE_SCHEMA_ID_COLUMN],
            r[VALUE_ERROR_COLUMN],
            r["id"],
            r["currency"],
            r["amount"],
            r["qty"],
            r["tags"],
            r["digest"],
            None if r["origin"] is None else r["origin"]["country"],
            r["choice"],
        )
        for r in rows
    ]


@pytest.mark.parametrize("reader", ["workers", "spark-source"])
def test_avro_values_become_the_columns_core_decodes(
    reader: str,
    spark: Any,
    make_lake: Callable[..., PipelineLake],
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    # The workers read the batch from Kafka themselves unless the pipeline has Java client
    # settings (kafka_options); then they get its rows from Spark's Kafka source.
    options = {"client.id": "bergstream-typed-test"} if reader == "spark-source" else {}
    lake = make_lake(pipeline={"kafka_options": options})
    assert (worker_fetch_settings(lake, "t") is None) == bool(options)
    topic = create_topic(PARTS, prefix="typed")
    value_id = register(registry_url, f"{topic}-value", PAYMENT_V1)
    key_id = register(registry_url, f"{topic}-key", KEY_SCHEMA)
    subset_id = register(registry_url, f"other-{topic}-value", SUBSET)
    records = mixed_records(
        range(48), value_id, 1, avro_serializer(registry_url, topic, PAYMENT_V1), PARTS
    )
    records = [
        Produced(r.partition, key_bytes(i, key_id), r.value, r.headers, r.timestamp)
        for i, r in enumerate(records)
    ]
    for i in range(48, 52):  # values of a schema id that is no version of the subject
        value = {"id": i, "currency": "JPY"}
        records.append(Produced(i % PARTS, None, framed(subset_id, canonical(SUBSET, value)),
                                (("h", b"v"),), FIRST_MS + i))  # fmt: skip
    produce(kafka_bootstrap, topic, records)
    typing = typing_for(tmp_path, registry_url, topic, key=True)

    result = run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing)
    assert result.records == len(records)

    truth = truth_table(kafka_bootstrap, topic, PARTS)
    decoder = decoder_of(typing)
    expected = decoder.decode(truth).table
    table = coldset(lake, topic)
    # The table's schema is the layout's, field ids included; its schemas are in properties.
    assert table.schema().as_struct() == decoder.layout.schema.as_struct()
    assert table.metadata.last_column_id == decoder.layout.last_column_id
    assert (
        table.schema().find_field("key").field_type
        == decoder.layout.schema.find_field("key").field_type
    )
    for schema_id in (value_id, key_id, subset_id):
        assert f"{SCHEMA_PROPERTY_PREFIX}{schema_id}" in table.properties

    # The workers wrote the data files (one per Kafka partition and day), committed with
    # Iceberg's metrics from their footers: counts and bounds of typed columns prune scans.
    amount_id = table.schema().find_field("amount").field_id
    tasks = list(table.scan().plan_files())
    assert sorted(t.file.partition[0] for t in tasks) == list(range(PARTS))
    for task in tasks:
        assert "/bergstream-" in task.file.file_path, task.file.file_path
        assert task.file.value_counts[amount_id] == task.file.record_count
        assert amount_id in task.file.lower_bounds and amount_id in task.file.upper_bounds
    assert not list(table.scan(row_filter="amount > 10000000000").plan_files())

    # PyIceberg reads exactly the rows core's decoder makes of the same records.
    by_pyiceberg = sorted_rows(table.scan().to_arrow())
    assert by_pyiceberg == sorted_rows(expected)
    # ... and Spark the same values.
    by_spark = table_rows_spark(spark, lake, topic)
    assert _spark_view(by_spark) == _spark_view(by_pyiceberg)

    # Canonical values keep no bytes; odd ones keep exactly theirs, with a cause when they did
    # not decode; the subset schema's records decoded into the columns they have.
    originals = {(r["kafka_partition"], r["kafka_offset"]): r for r in sorted_rows(truth)}
    causes = {r[VALUE_ERROR_COLUMN] for r in by_pyiceberg} - {None}
    assert "no Confluent framing" in causes and "unknown schema id 999999" in causes
    assert "trailing bytes after the record" in causes
    assert any(c.startswith("corrupt payload") for c in causes)
    kinds = {"canonical": 0, "kept": 0, "failed": 0, "tombstone": 0}
    for row in by_pyiceberg:
        original = originals[(row["kafka_partition"], row["kafka_offset"])]
        if original["kafka_value"] is None:
            kinds["tombstone"] += 1
            assert row["kafka_value"] is None and row[VALUE_SCHEMA_ID_COLUMN] is None
        elif row[VALUE_ERROR_COLUMN] is not None:
            kinds["failed"] += 1
            assert row["kafka_value"] == original["kafka_value"] and row["id"] is None
        elif row["kafka_value"] is not None:
            kinds["kept"] += 1  # non-canonical: decoded, and the bytes kept
            assert row["kafka_value"] == original["kafka_value"] and row["id"] is not None
        else:
            kinds["canonical"] += 1
            assert row["id"] is not None
    assert kinds["kept"] >= 4 and kinds["failed"] >= 6 and kinds["tombstone"] >= 2
    subset_rows = [r for r in by_pyiceberg if r[VALUE_SCHEMA_ID_COLUMN] == subset_id]
    assert [(r["id"], r["currency"], r["amount"]) for r in subset_rows] == [
        (i, "JPY", None) for i in sorted(range(48, 52), key=lambda i: (i % PARTS, i))
    ]
    assert {r[KEY_ERROR_COLUMN] for r in by_pyiceberg} >= {None, "no Confluent framing"}

    # The typed rows give back every key and value byte for byte.
    keys, values = decoder.encode(table.scan().to_arrow().sort_by(
        [("kafka_partition", "ascending"), ("kafka_offset", "ascending")]))  # fmt: skip
    assert keys.to_pylist() == truth.column("kafka_key").to_pylist()
    assert values.to_pylist() == truth.column("kafka_value").to_pylist()


def test_a_new_schema_version_evolves_the_table_with_stable_ids(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = create_topic(PARTS, prefix="typed-evo")
    v1 = register(registry_url, f"{topic}-value", PAYMENT_V1)
    produce(kafka_bootstrap, topic, mixed_records(
        range(20), v1, 1, avro_serializer(registry_url, topic, PAYMENT_V1), PARTS))  # fmt: skip
    typing = typing_for(tmp_path, registry_url, topic)
    run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing)
    first = coldset(lake, topic).schema()

    payment_v2 = make_payment_v2()
    v2 = register(registry_url, f"{topic}-value", payment_v2)
    assert v2 != v1
    produce(kafka_bootstrap, topic, mixed_records(
        range(20, 40), v2, 2, avro_serializer(registry_url, topic, payment_v2), PARTS))  # fmt: skip
    lines: list[str] = []
    result = run_pipeline(spark, lake, topic, once=True, report=lines.append, codecs=typing)
    assert result.records == 20
    assert any("new column(s) channel" in line for line in lines), lines

    table = coldset(lake, topic)
    second = table.schema()
    for field in first.fields:  # every column keeps its id; qty is promoted int -> long
        assert second.find_field(field.name).field_id == field.field_id
    assert str(second.find_field("qty").field_type) == "long"
    assert second.find_field("channel").field_id > first.highest_field_id
    assert second.find_field("origin.city").field_id > first.highest_field_id
    decoder = decoder_of(typing)
    assert second.as_struct() == decoder.layout.schema.as_struct()

    by_pyiceberg = sorted_rows(table.scan().to_arrow())
    truth = truth_table(kafka_bootstrap, topic, PARTS)
    assert by_pyiceberg == sorted_rows(decoder.decode(truth).table)
    decoded = [r for r in by_pyiceberg if r[VALUE_ERROR_COLUMN] is None]
    old = [r for r in decoded if r[VALUE_SCHEMA_ID_COLUMN] == v1]
    new = [r for r in decoded if r[VALUE_SCHEMA_ID_COLUMN] == v2]
    assert old and new
    assert all(r["channel"] is None and r["origin"]["city"] is None for r in old)
    assert any(r["channel"] is not None for r in new)
    channels = spark.table(lake.spark_table_name(topic)).where("channel is not null").count()
    assert channels == sum(1 for r in new if r["channel"] is not None)


def test_a_registry_outage_writes_nothing_and_the_run_resumes_when_it_is_back(
    spark: Any,
    make_lake: Callable[..., PipelineLake],
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    lake = make_lake(namespace="typed_outage", pipeline={"trigger_interval_seconds": 1})
    from bergstream.pipeline.session import attach_catalog

    attach_catalog(spark, lake)
    topic = create_topic(PARTS, prefix="typed-down")
    schema_id = register(registry_url, f"{topic}-value", PAYMENT_V1)
    serialize = avro_serializer(registry_url, topic, PAYMENT_V1)
    produce(kafka_bootstrap, topic, [
        Produced(i % PARTS, None, serialize(payment(i)), (), FIRST_MS + i) for i in range(12)
    ])  # fmt: skip
    target = urlsplit(registry_url)
    assert target.hostname is not None and target.port is not None
    (port,) = free_ports(1)
    down_url = f"http://127.0.0.1:{port}{target.path}"
    typing = typing_for(tmp_path, down_url, topic)

    # A --once run gives up after registry_wait_seconds with a retriable error, writing nothing.
    with pytest.raises(PipelineError, match="Schema Registry did not answer"):
        run_pipeline(
            spark, lake, topic, once=True, report=_quiet, codecs=typing, registry_wait_seconds=1
        )
    assert coldset(lake, topic).current_snapshot() is None

    # A continuous run waits, and goes on by itself once the registry answers again.
    lines: list[str] = []
    stop = threading.Event()
    runner = threading.Thread(
        target=run_pipeline,
        args=(spark, lake, topic),
        kwargs={"once": False, "report": lines.append, "stop": stop, "codecs": typing},
        daemon=True,
    )
    runner.start()
    forwarder = Forwarder(port, (target.hostname, target.port))
    try:
        deadline = time.monotonic() + 180
        while not any("cannot be reached" in line for line in lines):
            assert time.monotonic() < deadline, lines
            time.sleep(0.5)
        assert coldset(lake, topic).current_snapshot() is None
        forwarder.start()
        while not any("+12 records" in line for line in lines):
            assert time.monotonic() < deadline and runner.is_alive(), lines
            time.sleep(0.5)
    finally:
        stop.set()
        runner.join(timeout=180)
        forwarder.stop()
    assert not runner.is_alive()
    rows = sorted_rows(coldset(lake, topic).scan().to_arrow())
    assert [r["id"] for r in rows] == [payment(i)["id"] for i in sorted(
        range(12), key=lambda i: (i % PARTS, i))]  # fmt: skip
    assert {r[VALUE_SCHEMA_ID_COLUMN] for r in rows} == {schema_id}
    assert all(r["kafka_value"] is None for r in rows)


def test_a_topic_without_registered_versions_stays_raw(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = create_topic(PARTS, prefix="typed-raw")
    records = [Produced(i % PARTS, b"k", b"plain %d" % i, (), FIRST_MS + i) for i in range(6)]
    produce(kafka_bootstrap, topic, records)
    typing = typing_for(tmp_path, registry_url, topic)
    run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing)
    table = coldset(lake, topic)
    assert table.schema().as_struct() == ROW_SCHEMA.as_struct()
    rows = table.scan().to_arrow()
    assert rows.schema.names == ROW_ARROW_SCHEMA.names
    assert sorted(rows.column("kafka_value").to_pylist()) == sorted(r.value for r in records)
    assert pa.compute.sum(pa.compute.is_null(rows.column("kafka_value"))).as_py() == 0


def test_a_typed_table_whose_rule_is_gone_gets_raw_rows(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = create_topic(PARTS, prefix="typed-gone")
    register(registry_url, f"{topic}-value", PAYMENT_V1)
    serialize = avro_serializer(registry_url, topic, PAYMENT_V1)
    produce(kafka_bootstrap, topic, [
        Produced(i % PARTS, None, serialize(payment(i)), (), FIRST_MS + i) for i in range(4)
    ])  # fmt: skip
    typing = typing_for(tmp_path, registry_url, topic)
    run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing)
    later = [
        Produced(i % PARTS, None, serialize(payment(i)), (), FIRST_MS + i) for i in range(4, 7)
    ]
    produce(kafka_bootstrap, topic, later)
    lines: list[str] = []
    result = run_pipeline(spark, lake, topic, once=True, report=lines.append)
    assert result.records == 3
    assert any("has typed columns but no codecs: rule" in line for line in lines), lines
    rows = sorted_rows(coldset(lake, topic).scan().to_arrow())
    typed = [r for r in rows if r["id"] is not None]
    raw = [r for r in rows if r["id"] is None]
    assert sorted(r["id"] for r in typed) == sorted(payment(i)["id"] for i in range(4))
    assert sorted(r["kafka_value"] for r in raw) == sorted(r.value for r in later)
    assert all(r["kafka_value"] is None for r in typed)


def test_the_typed_example_runs_from_the_command_line(
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "typed.yaml"
    env = {
        **os.environ,
        "BERGSTREAM_HOME": str(tmp_path),
        "BERGSTREAM_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "BERGSTREAM_SCHEMA_REGISTRY_URL": registry_url,
    }
    topic = create_topic(PARTS, prefix="typed-cli")
    register(registry_url, f"{topic}-value", PAYMENT_V1)
    serialize = avro_serializer(registry_url, topic, PAYMENT_V1)
    produce(kafka_bootstrap, topic, [
        Produced(i % PARTS, None, serialize(payment(i)), (), FIRST_MS + i) for i in range(30)
    ])  # fmt: skip

    def bergstream(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(Path(sys.executable).parent / "bergstream"), *args, "-c", str(example)]
        return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)

    run = bergstream("pipeline", "run", "--topic", topic, "--once")
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["records"] == 30
    maintained = bergstream("pipeline", "maintain", "--topic", topic)
    assert maintained.returncode == 0, maintained.stderr[-3000:]

    config = load_config(example, env=env)
    table = coldset(pipeline_lake(config, home=tmp_path), topic)
    amounts = table.scan(selected_fields=("amount",)).to_arrow().column("amount").to_pylist()
    assert sum(amounts) == sum(payment(i)["amount"] for i in range(30))


def test_workers_write_typed_files_into_an_s3_warehouse(
    spark: Any,
    make_lake: Callable[..., PipelineLake],
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    from bergstream.pipeline.session import attach_catalog

    lake = make_lake(
        catalog={
            "name": "typed_s3",
            "uri": f"sqlite:///{tmp_path}/typed-s3-catalog.db",
            "warehouse": "s3://typed-lake/warehouse",
        },
        s3=s3_settings(stack_env),
    )
    attach_catalog(spark, lake)
    topic = create_topic(PARTS, prefix="typed-s3")
    schema_id = register(registry_url, f"{topic}-value", PAYMENT_V1)
    records = mixed_records(
        range(40), schema_id, 1, avro_serializer(registry_url, topic, PAYMENT_V1), PARTS
    )
    produce(kafka_bootstrap, topic, records)
    typing = typing_for(tmp_path, registry_url, topic)
    assert run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing).records == 40

    table = coldset(lake, topic)
    paths = [task.file.file_path for task in table.scan().plan_files()]
    assert paths and all(p.startswith("s3://typed-lake/warehouse/") for p in paths)
    assert all("/bergstream-" in p for p in paths)
    by_pyiceberg = sorted_rows(table.scan().to_arrow())
    truth = truth_table(kafka_bootstrap, topic, PARTS)
    assert by_pyiceberg == sorted_rows(decoder_of(typing).decode(truth).table)
    by_spark = table_rows_spark(spark, lake, topic)
    assert _spark_view(by_spark) == _spark_view(by_pyiceberg)


def test_a_table_the_workers_cannot_write_goes_through_sparks_writer(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    registry_url: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = create_topic(PARTS, prefix="typed-spark-writer")
    schema_id = register(registry_url, f"{topic}-value", PAYMENT_V1)
    serialize = avro_serializer(registry_url, topic, PAYMENT_V1)
    produce(kafka_bootstrap, topic, mixed_records(range(20), schema_id, 1, serialize, PARTS))
    typing = typing_for(tmp_path, registry_url, topic)
    run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing)
    table = coldset(lake, topic)
    first = {task.file.file_path for task in table.scan().plan_files()}
    assert all("/bergstream-" in path for path in first)

    # Iceberg's object-storage layout hashes file paths: only Spark's writer does it.
    with table.transaction() as transaction:
        transaction.set_properties({"write.object-storage.enabled": "true"})
    produce(kafka_bootstrap, topic, mixed_records(range(20, 40), schema_id, 1, serialize, PARTS))
    assert run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing).records == 20
    table = coldset(lake, topic)
    second = {task.file.file_path for task in table.scan().plan_files()} - first
    assert second and not any("/bergstream-" in path for path in second)
    truth = truth_table(kafka_bootstrap, topic, PARTS)
    by_pyiceberg = sorted_rows(table.scan().to_arrow())
    assert by_pyiceberg == sorted_rows(decoder_of(typing).decode(truth).table)
