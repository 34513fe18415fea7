"""Property: generated JSON Schemas and values go Kafka → pipeline → Iceberg and back, on the
real stack (Kafka, the Apicurio registry) and one Spark session.

Hypothesis draws ``BERGSTREAM_PROPERTY_EXAMPLES`` (60 by default, at least 50) examples, each a
schema of :func:`tests.kits.json_gen.object_schemas` (every type the codec maps, JSON
text for the rest, nullable and required properties, local ``$ref``s) with its own values. Each
example is one property ``p<i>`` of one wrapping object schema (its definitions moved to the
wrapper's ``$defs``), so one topic, one subject and one pipeline run carry them all. Record
``r`` holds value ``r`` of every example: the first ones produced with confluent-kafka's
``JSONSerializer``, the next ones written with the liberties JSON allows (spacing, key order,
escapes, number and date-time spellings, duplicate and unknown properties), then undecodable
ones. The draw is seeded by ``BERGSTREAM_PROPERTY_SEED`` (fixed by default, ``random`` for a
new draw; failures print it).

Then: every column PyIceberg reads equals what the JSON values mean (an oracle independent of
the codec: :func:`tests.kits.json_gen.expected`) and what core's decoder makes of the
records; Spark reads the same; a row keeps its bytes exactly when they are not the canonical
text, and undecodable ones keep theirs with a cause; ISK's hotset files hold the coldset's
rows; after DeleteRecords of everything, KSI serves every record byte for byte.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from bergstream.core.api import VALUE_ERROR_COLUMN, RegisteredSchema
from bergstream.pipeline.settings import PipelineLake
from bergstream.plugins.value_codecs.json_schema.types import JsonNode, parse_json_schema
from tests.kits.json_gen import LiberalWriter, expected, object_schemas, values_of
from tests.pipeline.property_kit import (
    assert_hotset_is_coldset,
    generation_only,
    ksi_after_delete,
    produce_and_run,
    property_examples,
    property_seed,
    spark_rows,
)

pytestmark = pytest.mark.slow

PARTS = 2
EXAMPLES = property_examples(50)
SEED = property_seed()
CANONICAL = 3  # values per example produced by JSONSerializer
LIBERAL = 2  # values per example written liberally
_REF = re.compile(r"^#/(definitions|\$defs)/(.+)$")


@dataclass
class Example:
    field: str
    schema: dict[str, Any]  # with its $refs pointing into the wrapper's $defs
    defs: dict[str, Any]  # its definitions, renamed for the wrapper
    values: list[Any]  # CANONICAL + LIBERAL values
    liberal: list[str]  # the LIBERAL values' texts


def _hoisted(schema: Any, prefix: str) -> Any:
    """``schema`` with local ``$ref``s renamed to ``#/$defs/<prefix><name>``."""
    if isinstance(schema, list):
        return [_hoisted(item, prefix) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        found = _REF.match(value) if key == "$ref" and isinstance(value, str) else None
        out[key] = f"#/$defs/{prefix}{found.group(2)}" if found else _hoisted(value, prefix)
    return out


def _node(schema: dict[str, Any]) -> JsonNode:
    return parse_json_schema(RegisteredSchema(0, "JSON", json.dumps(schema)), None)


def _fits_orjson(value: Any) -> bool:
    """Whether orjson (which JSONSerializer uses when it is installed) can write ``value``."""
    if type(value) is int:
        return -(2**63) <= value < 2**64
    if isinstance(value, list):
        return all(_fits_orjson(v) for v in value)
    if isinstance(value, dict):
        return all(_fits_orjson(v) for v in value.values())
    return True


def draw_examples(count: int, seed: int) -> list[Example]:
    """``count`` examples drawn by hypothesis (generation only; the checks run later)."""
    drawn: list[Example] = []

    @generation_only(count, seed)
    def collect(data: st.DataObject) -> None:
        schema = data.draw(object_schemas(), label="schema")
        node = _node(schema)
        # JSONSerializer writes with orjson, which refuses integers beyond 64 bits: those go
        # only into the liberal texts
        serializable = values_of(node).filter(_fits_orjson)
        values = data.draw(st.lists(serializable, min_size=CANONICAL, max_size=CANONICAL))
        values += data.draw(st.lists(values_of(node), min_size=LIBERAL, max_size=LIBERAL))
        liberal = [LiberalWriter(data.draw).write(node, v) for v in values[CANONICAL:]]
        index = len(drawn)
        prefix = f"e{index}_"
        defs = {
            prefix + name: _hoisted(body, prefix)
            for keyword in ("definitions", "$defs")
            for name, body in schema.get(keyword, {}).items()
        }
        body = {k: v for k, v in schema.items() if k not in ("definitions", "$defs", "$schema")}
        drawn.append(Example(f"p{index}", _hoisted(body, prefix), defs, values, liberal))

    collect()
    return drawn


def wrapper_schema(examples: list[Example]) -> dict[str, Any]:
    """The topic's value schema: one required property per example."""
    defs: dict[str, Any] = {}
    for example in examples:
        defs.update(example.defs)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {e.field: e.schema for e in examples},
        "required": [e.field for e in examples],
        "$defs": defs,
    }


@dataclass
class Planned:
    number: int
    kind: str  # canonical, liberal, undecodable
    value: bytes
    meaning: dict[str, Any] | None  # the JSON value (None: does not decode)


def plan_records(examples: list[Example], registry_url: str, topic: str) -> list[Planned]:
    """The records: JSONSerializer's, liberal texts, then undecodable ones."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    # the generator's enum values are any strings (the codec reads enums as strings), which
    # the serializer's own validation would refuse
    serializer = JSONSerializer(
        json.dumps(wrapper_schema(examples)), client, conf={"validate": False}
    )
    context = SerializationContext(topic, MessageField.VALUE)
    planned: list[Planned] = []
    for r in range(CANONICAL):
        meaning = {e.field: e.values[r] for e in examples}
        data = bytes(serializer(meaning, context) or b"")
        planned.append(Planned(len(planned), "canonical", data, meaning))
    header = planned[0].value[:5]
    for k in range(LIBERAL):
        text = "{" + ",".join(f"{json.dumps(e.field)}:{e.liberal[k]}" for e in examples) + "}"
        meaning = {e.field: e.values[CANONICAL + k] for e in examples}
        planned.append(Planned(len(planned), "liberal", header + text.encode(), meaning))
    first = planned[0].value
    for odd in (b"not framed", header + b'{"p0":', first + b" x", b"\x00\x00\x0f\x42\x3f{}"):
        planned.append(Planned(len(planned), "undecodable", odd, None))
    return planned


def _read_as(node: JsonNode, read: Any, value: Any) -> bool:
    """Whether PyIceberg's ``read`` of a column is ``value``. PyIceberg 0.12 may read a null
    list of structs, or a null map with struct values, as ``[]``: whether its Arrow projection
    keeps their validity depends on what else the file holds (apache/iceberg-python#3833; the
    files are right, Spark reads the nulls), so both readings pass there and nowhere else."""
    if value is None:
        quirk = node.kind in ("list", "map") and node.items is not None
        return read is None or (quirk and node.items.kind == "struct" and read == [])
    if read is None:
        return False
    if node.kind == "struct":
        return isinstance(read, dict) and all(
            _read_as(f.node, read.get(f.name), value[f.name]) for f in node.fields
        )
    if node.kind == "list" and node.items is not None:
        items = node.items
        return len(read) == len(value) and all(
            _read_as(items, r, v) for r, v in zip(read, value, strict=True)
        )
    if node.kind == "map" and node.items is not None:
        items = node.items
        return len(read) == len(value) and all(
            rk == vk and _read_as(items, rv, vv)
            for (rk, rv), (vk, vv) in zip(read, value, strict=True)
        )
    return bool(read == value)


def _plain(value: Any) -> Any:
    """A value with uuids as their text (Spark shows Iceberg uuids as strings)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def test_generated_json_schemas_round_trip(
    spark: Any,
    lake: PipelineLake,
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    examples = draw_examples(EXAMPLES, SEED)
    assert len(examples) >= 50, f"hypothesis drew {len(examples)} examples"
    topic = create_topic(PARTS, prefix="typed-json-prop")
    planned = plan_records(examples, registry_url, topic)
    run = produce_and_run(
        spark, lake, kafka_bootstrap, registry_url, topic, tmp_path,
        [p.value for p in planned], PARTS,
    )  # fmt: skip
    by_pyiceberg, by_decoder = run.by_pyiceberg, run.by_decoder
    nodes = {f.name: f.node for f in _node(wrapper_schema(examples)).fields}
    for got, want in zip(by_pyiceberg, by_decoder, strict=True):
        differ = [
            c for c, v in want.items()
            if not (_read_as(nodes[c], got[c], v) if c in nodes else got[c] == v)
        ]  # fmt: skip
        assert not differ, (
            f"seed {SEED}: partition {got['kafka_partition']} offset {got['kafka_offset']}: "
            + "; ".join(f"{c}: read {got[c]!r}, decoded {want[c]!r}" for c in differ[:3])
        )
    for row in by_pyiceberg:
        record = planned[int(row["kafka_headers"][0]["value"])]
        where = f"record {record.number} ({record.kind}); seed {SEED}"
        if record.meaning is None:
            assert row[VALUE_ERROR_COLUMN] is not None and row["kafka_value"] == record.value
            continue
        assert row[VALUE_ERROR_COLUMN] is None, f"{where}: {row[VALUE_ERROR_COLUMN]}"
        assert row["kafka_value"] in (None, record.value), where
        if record.kind == "liberal" and row["kafka_value"] is None:
            payload = record.value[5:]
            assert (
                payload
                == json.dumps(record.meaning, separators=(",", ":"), ensure_ascii=False).encode()
            ), where  # a liberal text is canonical only when it happens to be
        for example in examples:
            node = nodes[example.field]
            want = expected(node, record.meaning[example.field])
            assert _read_as(node, row[example.field], want), (
                f"{where}, column {example.field}: read {row[example.field]!r}, meant {want!r}"
            )

    by_spark = spark_rows(spark, lake.spark_table_name(topic))
    assert [_plain(r) for r in by_spark] == [_plain(r) for r in by_decoder], f"seed {SEED}"

    assert_hotset_is_coldset(
        tmp_path, kafka_bootstrap, registry_url, topic, lake, run.table, f"seed {SEED}"
    )

    got, seen, log = ksi_after_delete(tmp_path, kafka_bootstrap, lake, registry_url, topic, PARTS)
    assert got == seen, f"seed {SEED}\n{log[-3000:]}"
