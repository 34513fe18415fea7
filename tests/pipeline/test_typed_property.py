"""Property: generated Avro schemas and values go Kafka → pipeline → Iceberg and back, on the
real stack (Kafka, the Apicurio Schema Registry) and one Spark session.

How many examples, in one Spark run: hypothesis draws ``BERGSTREAM_PROPERTY_EXAMPLES`` (60 by
default, at least 50) independent examples, each a schema of
:func:`tests.kits.avro_gen.avro_schemas` (every primitive and logical type, nested
records, arrays, maps, enums, fixed, nullable and general unions, defaults) with its own values,
plus one hand-made example with every feature (:data:`.property_kit.ALL_FEATURES`). Each example
is one field ``p<i>`` of one wrapping record schema (its named types renamed ``P<i>_...``), so
one topic, one subject and one pipeline run carry them all. Record ``r`` holds value ``r`` of
every example: the first ones produced with confluent-kafka's ``AvroSerializer``, the next ones
hand-written with the liberties Avro allows (non-canonical), then undecodable values (no framing,
empty, too short, unknown schema id, truncated, framing only, trailing bytes) and tombstones.
The draw is seeded by ``BERGSTREAM_PROPERTY_SEED`` (fixed by default, ``random`` for a new draw;
failures print it).

Then: PyIceberg and Spark read typed columns equal to fastavro's decoding of the canonical
bytes (PyIceberg 0.12 reads a null list of structs as ``[]`` and a null map of structs as
``{}``, apache/iceberg-python#3833: :func:`.property_kit.as_pyiceberg`; the data files, read
with pyarrow, are checked exactly); ``kafka_value`` is null exactly for canonical values and
tombstones; undecodable ones keep their bytes with their cause; ISK's ``hotset.<topic>`` data
files hold the coldset's rows, column by column; after DeleteRecords of everything, KSI serves
every record byte for byte (value, key, headers, timestamp) from the coldset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import (
    ROW_ARROW_SCHEMA,
    SCHEMA_PROPERTY_PREFIX,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
)
from bergstream.core.typed.row_contract import record_to_row
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import run_pipeline
from bergstream.plugins.value_codecs.avro.schema import AvroNode
from tests.kits.avro_gen import from_arrow
from tests.kits.ksi_stack import Seen
from tests.kits.lake import Produced, consume_all, produce
from tests.pipeline.property_kit import (
    ALL_FEATURES,
    Planned,
    as_pyiceberg,
    coldset_file_rows,
    delete_records_of,
    draw_examples,
    expected_values,
    from_spark,
    hotset_rows,
    kept_bytes,
    ksi_config,
    parse,
    plan_records,
    property_examples,
    property_seed,
    read_through_ksi,
    seen_of,
    spark_rows,
    wrapper_schema,
    wrapper_value,
)
from tests.pipeline.typed_kit import avro_serializer, coldset, sorted_rows, typing_for

pytestmark = pytest.mark.slow

PARTS = 2
EXAMPLES = property_examples()
SEED = property_seed()
CONTRACT = [name for name in ROW_ARROW_SCHEMA.names if name != "kafka_value"]


@dataclass
class World:
    """What went in and what came out, before DeleteRecords (which the fixture does last)."""

    topic: str
    schema_id: int
    fields: list[str]  # the wrapper's fields: one per example
    node: AvroNode  # the wrapper schema's tree
    planned: dict[tuple[int, int], Planned]  # by (partition, offset)
    expected: dict[int, dict[str, Any]]  # normalized decoded values, by record number
    truth: list[Seen]  # every record as Kafka held it
    contract: dict[tuple[int, int], dict[str, Any]]  # the row-contract row of each record
    table: Any  # the coldset table (PyIceberg)
    by_pyiceberg: list[dict[str, Any]]
    by_spark: list[dict[str, Any]]
    by_files: list[dict[str, Any]]  # the coldset's data files read with pyarrow
    hotset_schema: Any
    by_hotset: list[dict[str, Any]]  # ISK's hotset data files read with pyarrow
    ksi_config: str


def _quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module")
def world(
    spark: Any,
    lake: PipelineLake,
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> World:
    home = tmp_path_factory.mktemp("typed-property")
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    examples = draw_examples(EXAMPLES, SEED)
    assert len(examples) >= min(EXAMPLES, 50), f"hypothesis drew {len(examples)} examples"
    examples += draw_examples(1, SEED, start=len(examples), schema=ALL_FEATURES)

    topic = create_topic(PARTS, prefix="typed-prop")
    serializer = avro_serializer(registry_url, topic, wrapper_schema(examples))
    schema_id = int.from_bytes(serializer(wrapper_value(examples, 0))[1:5], "big")
    planned, schema = plan_records(examples, schema_id, serializer)
    node = parse(schema)
    expected = {}
    for record in planned:
        if record.payload is not None:
            expected[record.number] = expected_values(schema, node, record.payload)
        if record.kind == "canonical":  # the serializer wrote the canonical encoding
            assert record.value == b"\x00" + schema_id.to_bytes(4, "big") + record.payload
    produce(kafka_bootstrap, topic, [
        Produced(r.number % PARTS, r.key, r.value, r.headers, r.timestamp) for r in planned
    ])  # fmt: skip
    records = consume_all(kafka_bootstrap, topic, PARTS)
    placed = {
        (r.partition, r.record.offset): planned[int(r.record.headers[0][1] or b"")] for r in records
    }
    assert len(placed) == len(planned)

    typing = typing_for(home, registry_url, topic)
    result = run_pipeline(spark, lake, topic, once=True, report=_quiet, codecs=typing)
    assert result.records == len(planned)
    table = coldset(lake, topic)
    by_pyiceberg = sorted_rows(table.scan().to_arrow())
    by_spark = spark_rows(spark, lake.spark_table_name(topic))
    by_files = coldset_file_rows(table)
    hotset_schema, by_hotset = hotset_rows(home, kafka_bootstrap, registry_url, topic, lake)

    delete_records_of(kafka_bootstrap, topic, records)
    return World(
        topic=topic,
        schema_id=schema_id,
        fields=[e.field for e in examples],
        node=node,
        planned=placed,
        expected=expected,
        truth=sorted(seen_of(r) for r in records),
        contract={
            (r.partition, r.record.offset): record_to_row(r.partition, r.record, r.timestamp_type)
            for r in records
        },
        table=table,
        by_pyiceberg=by_pyiceberg,
        by_spark=by_spark,
        by_files=by_files,
        hotset_schema=hotset_schema,
        by_hotset=by_hotset,
        ksi_config=ksi_config(lake, registry_url, topic),
    )


def _record(world: World, row: dict[str, Any]) -> tuple[Planned, str]:
    """The planned record of a row, and where it is (for messages)."""
    record = world.planned[(row["kafka_partition"], row["kafka_offset"])]
    where = (
        f"record {record.number} ({record.kind}) at {row['kafka_partition']}:"
        f"{row['kafka_offset']}; reproduce with BERGSTREAM_PROPERTY_SEED={SEED}"
    )
    return record, where


def _same(node: AvroNode, value: Any) -> Any:
    return value


def _check_rows(
    world: World,
    rows: list[dict[str, Any]],
    normalize: Callable[[AvroNode, Any], Any],
    who: str,
    view: Callable[[AvroNode, Any], Any] = _same,
) -> None:
    """Each row's contract columns, kept bytes, schema id and cause, and its typed columns
    (``normalize``-d) equal to fastavro's decoding (as ``view`` says the reader shows it),
    null when nothing decoded."""
    assert len(rows) == len(world.planned), who
    children = dict(world.node.fields)
    for row in rows:
        record, where = _record(world, row)
        where = f"{who}: {where}"
        contract = world.contract[(row["kafka_partition"], row["kafka_offset"])]
        assert {c: row[c] for c in CONTRACT} == {c: contract[c] for c in CONTRACT}, where
        assert row["kafka_value"] == kept_bytes(record), where
        assert row[VALUE_SCHEMA_ID_COLUMN] == record.schema_id, where
        error = row[VALUE_ERROR_COLUMN]
        if record.cause is None:
            assert error is None, f"{where}: {error}"
        elif record.cause == "corrupt payload":
            assert error is not None and error.startswith("corrupt payload"), f"{where}: {error}"
        else:
            assert error == record.cause, where
        decoded = record.cause is None and record.number in world.expected
        expected = world.expected[record.number] if decoded else dict.fromkeys(world.fields)
        for name in world.fields:
            got = normalize(children[name], row[name])
            assert got == view(children[name], expected[name]), f"{where}, column {name}"


def test_pyiceberg_reads_the_decoded_values(world: World) -> None:
    schema = world.table.schema()
    for name in world.fields:  # every example is a column
        schema.find_field(name)
    assert f"{SCHEMA_PROPERTY_PREFIX}{world.schema_id}" in world.table.properties
    _check_rows(world, world.by_pyiceberg, from_arrow, "PyIceberg", as_pyiceberg)
    kept = {
        world.planned[(r["kafka_partition"], r["kafka_offset"])].kind
        for r in world.by_pyiceberg
        if r["kafka_value"] is not None
    }
    assert "liberal" in kept, "no liberal encoding was non-canonical: the property is moot"
    assert "canonical" not in kept


def test_spark_reads_the_decoded_values(world: World) -> None:
    _check_rows(world, world.by_spark, from_spark, "Spark")


def test_isk_hotset_rows_equal_the_coldset_rows(world: World) -> None:
    assert world.hotset_schema.as_struct() == world.table.schema().as_struct()
    _check_rows(world, world.by_files, from_arrow, "coldset files")
    _check_rows(world, world.by_hotset, from_arrow, "ISK hotset")
    assert len(world.by_hotset) == len(world.by_files)
    for hot, cold in zip(world.by_hotset, world.by_files, strict=True):
        _, where = _record(world, cold)
        assert hot.keys() == cold.keys(), where
        for column in cold:
            assert hot[column] == cold[column], f"ISK hotset: {where}, column {column}"


def test_ksi_serves_every_record_byte_for_byte(
    world: World, kafka_bootstrap: str, tmp_path: Path
) -> None:
    got, log = read_through_ksi(
        tmp_path, kafka_bootstrap, world.topic, world.ksi_config, PARTS, len(world.truth)
    )
    assert len(got) == len(world.truth), log[-3000:]
    for seen, truth in zip(got, world.truth, strict=True):
        record = world.planned[(truth[0], truth[1])]
        assert seen == truth, f"KSI: record {record.number} ({record.kind}), seed {SEED}"
    assert "coldset failed" not in log
