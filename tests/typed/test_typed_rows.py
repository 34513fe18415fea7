"""Typed rows: the layout fold and TypedRows' decode/encode, with a small codec of the test's own
(8-byte big-endian signed ints as a record ``{n: long}``; a 9th byte is trailing garbage; a
leading 0xFF byte is a "non-canonical" form of the same value)."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.types import LongType, NestedField, StringType, StructType

from bergstream.core.api import (
    ROW_SCHEMA,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
    DecodedValues,
    RegisteredSchema,
    SchemaNotExpressible,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedRows,
    build_layout,
    check_schema,
    frame_payloads,
    split_framing,
)
from tests.typed.value_rows import rows


class LongCodec:
    """Values of schema type LONGS: 8 bytes big-endian; schema text 'bad' is not expressible,
    'str' maps n to a string (an incompatible change)."""

    schema_types = ("LONGS",)

    def iceberg_type(self, schema, resolve):
        if schema.schema == "bad":
            raise SchemaNotExpressible("bad schema")
        kind = StringType() if schema.schema == "str" else LongType()
        return StructType(NestedField(1, "n", kind, required=True))

    def decode(self, schema, payloads):
        values, keep, errors = [], [], []
        for payload in payloads.to_pylist():
            canonical = payload
            if len(payload) == 9 and payload[0] == 0xFF:
                canonical = payload[1:]
            if len(canonical) != 8:
                values.append(None)
                keep.append(True)
                errors.append("corrupt payload: not 8 bytes")
                continue
            values.append({"n": int.from_bytes(canonical, "big", signed=True)})
            keep.append(canonical != payload)
            errors.append(None)
        type_ = pa.struct([pa.field("n", pa.int64(), nullable=False)])
        return DecodedValues(pa.array(values, type_), np.array(keep, bool), errors)

    def encode(self, schema, values):
        return pa.array(
            [v["n"].to_bytes(8, "big", signed=True) for v in values.to_pylist()], pa.large_binary()
        )


def schema(schema_id: int, version: int, text: str = "long") -> RegisteredSchema:
    return RegisteredSchema(schema_id, "LONGS", text, subject="t-value", version=version)


def codecs() -> TopicCodecs:
    return TopicCodecs("t", SideCodecs({"LONGS": LongCodec()}, "t-value"))


def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def test_a_subject_without_versions_keeps_the_plain_contract() -> None:
    layout = build_layout(ROW_SCHEMA, 10, codecs(), StoredSchemas())
    assert not layout.typed and layout.schema == ROW_SCHEMA


def test_values_decode_into_columns_and_come_back_byte_for_byte() -> None:
    source = StoredSchemas().add([schema(3, 1)])
    layout = build_layout(ROW_SCHEMA, 10, codecs(), source)
    check_schema(layout.schema)
    assert layout.schema.find_field("n").field_id == 13
    values = [
        framed(3, (7).to_bytes(8, "big")),
        None,  # tombstone
        b"plain",  # no framing
        framed(3, b"\xff" + (-2).to_bytes(8, "big", signed=True)),  # non-canonical
        framed(3, b"123"),  # corrupt
        framed(99, (1).to_bytes(8, "big")),  # unknown id
    ]
    typed = TypedRows(layout, codecs(), source)
    out = typed.decode(rows(values))
    table = out.table
    assert table.schema == layout.arrow_schema
    assert table.column("n").to_pylist() == [7, None, None, -2, None, None]
    assert table.column("kafka_value").to_pylist() == [None, None, *values[2:]]
    assert table.column(VALUE_SCHEMA_ID_COLUMN).to_pylist() == [3, None, None, 3, 3, 99]
    assert table.column(VALUE_ERROR_COLUMN).to_pylist() == [
        None,
        None,
        "no Confluent framing",
        None,
        "corrupt payload: not 8 bytes",
        "unknown schema id 99",
    ]
    assert out.causes[("value", "unknown schema id 99")] == 1
    key, value = pickle.loads(pickle.dumps(typed)).encode(table)
    assert value.to_pylist() == values
    assert key.to_pylist() == [None] * len(values)


def test_evolution_keeps_ids_and_rejects_what_iceberg_cannot_express() -> None:
    source = StoredSchemas().add([schema(1, 1), schema(2, 2, "str"), schema(4, 3, "bad")])
    layout = build_layout(ROW_SCHEMA, 10, codecs(), source)
    assert layout.value is not None
    assert set(layout.value.schemas) == {1}
    assert "long cannot become string" in layout.value.rejected[2]
    assert "bad schema" in layout.value.rejected[4]
    out = TypedRows(layout, codecs(), source).decode(rows([framed(2, (5).to_bytes(8, "big"))]))
    assert out.table.column("n").to_pylist() == [None]
    assert "does not fit the table" in out.table.column(VALUE_ERROR_COLUMN)[0].as_py()


def test_framing_split_and_rebuilt() -> None:
    array = pa.array([framed(258, b"ab"), b"\x01xxxx", None, b"\x00ab"], pa.large_binary())
    has, ids = split_framing(array)
    assert has.tolist() == [True, False, False, False] and ids[0] == 258
    assert frame_payloads(258, pa.array([b"ab", b""], pa.large_binary())).to_pylist() == [
        framed(258, b"ab"),
        framed(258, b""),
    ]


def test_a_value_field_named_like_a_contract_column_is_refused_naming_both() -> None:
    class Colliding(LongCodec):
        def iceberg_type(self, schema, resolve):
            return StructType(NestedField(1, "kafka_offset", LongType(), required=True))

    topic = TopicCodecs("t", SideCodecs({"LONGS": Colliding()}, "t-value"))
    layout = build_layout(ROW_SCHEMA, 10, topic, StoredSchemas().add([schema(1, 1)]))
    assert layout.value is not None
    cause = layout.value.rejected[1]
    assert "kafka_offset" in cause and "row contract" in cause


@pytest.mark.parametrize("count", [1, 1000])
def test_a_layout_is_deterministic(count: int) -> None:
    source = StoredSchemas().add([schema(1, 1)])
    one = build_layout(ROW_SCHEMA, 10, codecs(), source)
    two = build_layout(ROW_SCHEMA, 10, codecs(), source)
    assert one.fingerprint == two.fingerprint
    values = [framed(1, i.to_bytes(8, "big")) for i in range(count)]
    table_one = TypedRows(one, codecs(), source).decode(rows(values)).table
    table_two = TypedRows(two, codecs(), source).decode(rows(values)).table
    assert table_one.equals(table_two)


def test_a_schema_id_the_cached_subject_does_not_know_refreshes_the_layout_once() -> None:
    from bergstream.core.typed.typed_rows import build_layout_seeing

    class CachedSubject(StoredSchemas):
        """Serves the subject's versions as first seen until forget_subject is called."""

        def __init__(self) -> None:
            super().__init__()
            self.cached: list[RegisteredSchema] | None = None
            self.forgotten = 0

        def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
            if self.cached is None:
                self.cached = super().subject_schemas(subject)
            return list(self.cached)

        def forget_subject(self, subject: str) -> None:
            self.cached = None
            self.forgotten += 1

    source = CachedSubject().add([schema(1, 1)])
    assert build_layout(ROW_SCHEMA, 10, codecs(), source).value.schemas.keys() == {1}
    source.add([schema(2, 2)])  # registered after the cache was filled
    stale = build_layout(ROW_SCHEMA, 10, codecs(), source)
    assert stale.value.schemas.keys() == {1}
    fresh = build_layout_seeing(ROW_SCHEMA, 10, codecs(), source, value_ids=[1, 2])
    assert fresh.value.schemas.keys() == {1, 2} and source.forgotten == 1
    build_layout_seeing(ROW_SCHEMA, 10, codecs(), source, value_ids=[1, 2])
    assert source.forgotten == 1  # nothing unknown: no refresh
