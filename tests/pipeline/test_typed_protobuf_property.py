"""Property: generated Protobuf schemas and messages go Kafka → pipeline → Iceberg and back, on
the real stack (Kafka, the Apicurio registry) and one Spark session.

Hypothesis draws ``BERGSTREAM_PROPERTY_EXAMPLES`` (60 by default, at least 50) examples, each a
message type of :func:`tests.kits.protobuf_gen.message_schemas` (every scalar, enums,
proto3 ``optional``, oneofs, repeated fields packed or not, maps, nested messages, Timestamp,
Duration, the wrappers and Empty; a quarter of them proto2, with required fields, defaults,
closed enums and groups) with its own values. Each example is one field ``p<i>`` of one wrapper
message, the first message of one generated proto3 file (the proto2 examples live in a second
file it imports, which the serializer registers as a reference), so one topic, one subject and
one pipeline run carry them all. Record ``r`` holds value ``r`` of every example: the first ones
produced with confluent-kafka's ``ProtobufSerializer`` (the message class compiled at run time
with grpcio-tools' protoc; it writes map entries in hash order, so such records may keep their
bytes), the same values serialized deterministically (canonical), the next ones written by hand
with the liberties the wire format allows (:class:`tests.kits.protobuf_gen.LiberalWriter`:
fields in any order, unpacked and split packed fields, explicit defaults, overridden fields,
unknown fields, non-minimal varints, map entries in any order; the wrapper's fields shuffled, the
long index form
``02 00``), then undecodable ones and a tombstone. The draw is seeded by
``BERGSTREAM_PROPERTY_SEED`` (fixed by default, ``random`` for a new draw; failures print it).

Then: every column PyIceberg reads equals what the messages mean (an oracle independent of the
codec: :func:`tests.kits.protobuf_gen.expected`) and what core's decoder makes of the
records; Spark reads the same; a row keeps its bytes exactly when they are not the canonical
encoding (index ``00``, deterministic serialization), and undecodable ones keep theirs with a
cause; ISK's hotset files hold the coldset's rows; after DeleteRecords of everything, KSI serves
every record byte for byte.
"""

from __future__ import annotations

import dataclasses
import random
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from bergstream.core.api import VALUE_ERROR_COLUMN
from bergstream.core.typed.typed_rows import NO_FRAMING
from bergstream.pipeline.settings import PipelineLake
from tests.kits.protobuf_gen import (
    GenField,
    GenMessage,
    LiberalWriter,
    compile_files,
    expected,
    message_schemas,
    messages,
    proto_file,
    standalone_class,
    varint,
)
from tests.pipeline.property_kit import (
    UNKNOWN_ID,
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
CANONICAL = 3  # values per example produced by ProtobufSerializer
LIBERAL = 3  # values per example written liberally
WRAPPER = "PropertyValue"
_LEN = 2  # the wire type of length-delimited fields


@dataclass
class Example:
    field: str  # the wrapper's field
    number: int  # its field number
    syntax: str
    schema: GenMessage  # named E<i>
    values: list[Message]  # CANONICAL + LIBERAL messages (of the example's standalone class)
    liberal: list[bytes]  # the LIBERAL values' liberal encodings


def draw_examples(count: int, seed: int) -> list[Example]:
    """``count`` examples drawn by hypothesis (generation only; the checks run later)."""
    drawn: list[Example] = []
    kept: set[str] = set()
    classes: dict[str, type[Message]] = {}

    # hypothesis draws many near copies of a schema; only distinct ones are kept
    @generation_only(count * 3, seed)
    def collect(data: st.DataObject) -> None:
        # The draws depend on nothing but hypothesis' choices (whether the example is kept
        # must not change them): a schema's class is compiled once, under a fixed name.
        syntax = data.draw(st.sampled_from(["proto3", "proto3", "proto3", "proto2"]))
        schema = data.draw(message_schemas("E", syntax), label="schema")
        text = syntax + schema.body("")
        message_class = classes.get(text)
        if message_class is None:
            with tempfile.TemporaryDirectory() as workdir:
                message_class = classes[text] = standalone_class(schema, syntax, workdir)
        total = CANONICAL + LIBERAL
        values = [data.draw(messages(message_class)) for _ in range(total)]
        rng = data.draw(st.randoms(use_true_random=True))
        liberal = [LiberalWriter(rng).write(v) for v in values[CANONICAL:]]
        for value, written in zip(values[CANONICAL:], liberal, strict=True):
            back = message_class.FromString(written)
            back.DiscardUnknownFields()
            assert back == value, f"the liberal writer is wrong: {written.hex()} for {value}"
        index = len(drawn)
        if index < count and text not in kept:
            kept.add(text)
            named = dataclasses.replace(schema, name=f"E{index}")
            drawn.append(Example(f"p{index}", index + 1, syntax, named, values, liberal))

    collect()
    return drawn


def proto_files(examples: list[Example], tag: str) -> dict[str, str]:
    """The topic's .proto files (import path -> text), the root last: a proto2 file of the
    proto2 examples, if any, and the root, whose first message is the wrapper."""
    package = f"prop.{tag}"
    files: dict[str, str] = {}
    legacy = [e for e in examples if e.syntax == "proto2"]
    imports: list[str] = []
    if legacy:
        path = f"{tag}_v2.proto"
        needs = sorted({p for e in legacy for p in e.schema.imports()})
        files[path] = proto_file("proto2", package, [e.schema for e in legacy], needs)
        imports.append(path)
    modern = [e for e in examples if e.syntax == "proto3"]
    imports += sorted({p for e in modern for p in e.schema.imports()})
    fields = tuple(GenField("", e.schema.name, e.field, e.number) for e in examples)
    wrapper = GenMessage(WRAPPER, fields)
    files[f"{tag}.proto"] = proto_file("proto3", package, [wrapper, *(e.schema for e in modern)],
                                       imports)  # fmt: skip
    return files


def wrapper_message(wrapper: type[Message], examples: list[Example], r: int) -> Message:
    """Value ``r`` of every example, as one wrapper message."""
    message = wrapper()
    for example in examples:
        part = getattr(message, example.field)
        part.SetInParent()
        part.MergeFromString(example.values[r].SerializePartialToString())
    return message


@dataclass
class Planned:
    number: int
    kind: str  # canonical, deterministic, liberal, long index, tombstone or undecodable kinds
    value: bytes | None
    values: int | None = None  # which value of every example the record holds
    canonical: bytes | None = None  # the canonical encoding of those values, framed
    cause: str | None = None  # the start of its kafka_value_error


def _framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def _bad_string(examples: list[Example], syntax: str) -> tuple[Example, str, bytes] | None:
    """A wrapper payload whose first example of ``syntax`` with a top-level string field holds
    bytes that are not UTF-8 there (with that field's column path)."""
    for example in examples:
        if example.syntax != syntax:
            continue
        for field in example.values[0].DESCRIPTOR.fields:
            if field.type == FieldDescriptor.TYPE_STRING and not field.is_repeated:
                inner = varint(field.number << 3 | _LEN) + b"\x02\xff\xfe"
                outer = varint(example.number << 3 | _LEN) + varint(len(inner)) + inner
                return example, f"{example.field}.{field.name}", b"\x00" + outer
    return None


def plan_records(
    examples: list[Example], wrapper: type[Message], registry_url: str, topic: str
) -> list[Planned]:
    """The records: ProtobufSerializer's, the same values serialized deterministically, liberal
    encodings, the long index form, undecodable ones and a tombstone."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    serializer = ProtobufSerializer(wrapper, client, {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    planned: list[Planned] = []

    def add(kind: str, value: bytes | None, **fields: Any) -> None:
        planned.append(Planned(len(planned), kind, value, **fields))

    canonical = [
        wrapper_message(wrapper, examples, r).SerializeToString(deterministic=True)
        for r in range(CANONICAL + LIBERAL)
    ]
    for r in range(CANONICAL):
        data = bytes(serializer(wrapper_message(wrapper, examples, r), context) or b"")
        schema_id = int.from_bytes(data[1:5], "big")
        add("canonical", data, values=r, canonical=_framed(schema_id, b"\x00" + canonical[r]))
    schema_id = int.from_bytes(planned[0].value[1:5], "big")  # type: ignore[index]
    for r in range(CANONICAL):
        # the serializer writes map entries in hash order; these have them sorted
        body = _framed(schema_id, b"\x00" + canonical[r])
        add("deterministic", body, values=r, canonical=body)
    for k in range(LIBERAL):
        r = CANONICAL + k
        rng = random.Random(SEED * 10 + k)
        chunks = [
            varint(e.number << 3 | _LEN) + varint(len(e.liberal[k])) + e.liberal[k]
            for e in examples
        ]
        if k == 2:
            chunks.append(varint((len(examples) + 100) << 3) + varint(rng.randrange(2**64)))
        rng.shuffle(chunks)
        index = b"\x02\x00" if k == 1 else b"\x00"
        add("liberal", _framed(schema_id, index + b"".join(chunks)), values=r,
            canonical=_framed(schema_id, b"\x00" + canonical[r]))  # fmt: skip
    add("long index", _framed(schema_id, b"\x02\x00" + canonical[0]), values=0,
        canonical=_framed(schema_id, b"\x00" + canonical[0]))  # fmt: skip
    body = canonical[0]
    add("tombstone", None)
    add("unframed", b"plain text, no framing", cause=NO_FRAMING)
    add("unknown id", _framed(UNKNOWN_ID, b"\x00" + body), cause=f"unknown schema id {UNKNOWN_ID}")
    add("framing only", _framed(schema_id, b""), cause="truncated message-index list")
    add("truncated", _framed(schema_id, b"\x00" + body[:-1]), cause="corrupt payload")
    add("trailing", _framed(schema_id, b"\x00" + body + b"\x07"), cause="corrupt payload")
    add("other message", _framed(schema_id, b"\x02\x02" + body), cause="message indexes [1]")
    add("no message", _framed(schema_id, b"\x02\x7e" + body), cause="message indexes [63]")
    proto3_string = _bad_string(examples, "proto3")
    if proto3_string is not None:
        add("bad utf-8 (proto3)", _framed(schema_id, proto3_string[2]), cause="corrupt payload")
    proto2_string = _bad_string(examples, "proto2")
    if proto2_string is not None:
        _, path, payload = proto2_string
        add("bad utf-8 (proto2)", _framed(schema_id, payload),
            cause=f"string field {path} is not UTF-8")  # fmt: skip
    return planned


def _first_difference(got: Any, want: Any, path: str) -> str:
    """Where two column values first differ, and how."""
    if isinstance(got, dict) and isinstance(want, dict) and got.keys() == want.keys():
        for key in want:
            if got[key] != want[key]:
                return _first_difference(got[key], want[key], f"{path}.{key}")
    if isinstance(got, list | tuple) and isinstance(want, list | tuple) and len(got) == len(want):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path}: read {got!r}, expected {want!r}"


def test_generated_protobuf_schemas_round_trip(
    spark: Any,
    lake: PipelineLake,
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    from google.protobuf import descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    examples = draw_examples(EXAMPLES, SEED)
    assert len(examples) >= 50, f"hypothesis drew {len(examples)} examples"
    topic = create_topic(PARTS, prefix="typed-proto-prop")
    tag = re.sub(r"\W", "_", topic)
    workdir = tmp_path / "proto"
    workdir.mkdir()
    files = proto_files(examples, tag)
    # the default pool, where the serializer finds the well-known files the schema imports
    compile_files(files, descriptor_pool.Default(), str(workdir))
    wrapper = GetMessageClass(
        descriptor_pool.Default().FindMessageTypeByName(f"prop.{tag}.{WRAPPER}")
    )
    planned = plan_records(examples, wrapper, registry_url, topic)
    run = produce_and_run(
        spark, lake, kafka_bootstrap, registry_url, topic, tmp_path,
        [p.value for p in planned], PARTS, f"seed {SEED}",
    )  # fmt: skip
    by_pyiceberg, by_decoder = run.by_pyiceberg, run.by_decoder
    assert len(by_pyiceberg) == len(by_decoder) == len(planned), f"seed {SEED}"
    for got, want in zip(by_pyiceberg, by_decoder, strict=True):
        number = int(got["kafka_headers"][0]["value"])
        differ = [c for c in want if got[c] != want[c]]
        assert not differ, f"seed {SEED}: record {number} ({planned[number].kind}): " + "; ".join(
            _first_difference(got[c], want[c], c).replace("expected", "core decoded")
            for c in differ[:3]
        )
    for row in by_pyiceberg:
        record = planned[int(row["kafka_headers"][0]["value"])]
        where = f"seed {SEED}: record {record.number} ({record.kind})"
        if record.values is None:
            assert row["kafka_value"] == record.value, where
            error = row[VALUE_ERROR_COLUMN]
            if record.cause is None:
                assert error is None, f"{where}: {error}"
            else:
                assert error is not None and error.startswith(record.cause), (
                    f"{where}: cause {error!r}, expected one starting {record.cause!r}"
                )
            assert all(row[e.field] is None for e in examples), where
            continue
        assert row[VALUE_ERROR_COLUMN] is None, f"{where}: {row[VALUE_ERROR_COLUMN]}"
        kept = None if record.value == record.canonical else record.value
        assert row["kafka_value"] == kept, (
            f"{where}: kafka_value {row['kafka_value']!r}, expected {kept!r} (canonical: "
            f"{record.canonical!r})"
        )
        for example in examples:
            want = expected(example.values[record.values])
            assert row[example.field] == want, (
                f"{where}: column {_first_difference(row[example.field], want, example.field)}"
                f"\n{proto_file(example.syntax, 'x', [example.schema], example.schema.imports())}"
            )

    by_spark = spark_rows(spark, lake.spark_table_name(topic))
    for got, want in zip(by_spark, by_decoder, strict=True):
        differ = [c for c in want if got[c] != want[c]]
        assert not differ, f"seed {SEED}: Spark, offset {got['kafka_offset']}: " + "; ".join(
            _first_difference(got[c], want[c], c) for c in differ[:3]
        )

    assert_hotset_is_coldset(
        tmp_path, kafka_bootstrap, registry_url, topic, lake, run.table, f"seed {SEED}"
    )

    got, seen, log = ksi_after_delete(tmp_path, kafka_bootstrap, lake, registry_url, topic, PARTS)
    assert len(got) == len(seen), (
        f"seed {SEED}: KSI served {len(got)} of {len(seen)} records\n{log[-3000:]}"
    )
    for a, b in zip(got, seen, strict=True):
        assert a == b, f"seed {SEED}: KSI served {a!r}, Kafka held {b!r}\n{log[-3000:]}"
