"""Typed rows of plain JSON values (the ``json`` codec, no framing): the layout of a batch's
shapes, decoding them into columns, and encoding every row back to its bytes."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.types import (
    DoubleType,
    IcebergType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from bergstream.core.api import (
    ROW_SCHEMA,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
    ShapesToFold,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedRows,
    build_layout_of_columns,
    build_layout_of_shapes,
)
from bergstream.core.typed.row_contract import version_fit
from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec
from tests.typed.value_rows import rows

LAST_ID = ROW_SCHEMA.highest_field_id


def codecs() -> TopicCodecs:
    return TopicCodecs("t", SideCodecs({"JSON": PlainJsonCodec()}, "t-value"))


FIRST = [
    b'{"id":1,"amount":5,"currency":"EUR"}',
    b'{"id":2,"amount":7.25,"currency":"USD"}',
    b'{"currency":"EUR","id":3,"amount":1.5}',  # another key order: another shape
    b'{"id": 4, "amount": 2.5, "currency": "EUR"}',  # spaced: decodes, keeps its bytes
    None,  # a tombstone
    b"[1,2]",
    b"{oops",
]


def decoded(values: list[bytes | None]) -> tuple[pa.Table, TypedRows]:
    batch = rows(values)
    shaped = build_layout_of_shapes(
        ROW_SCHEMA, LAST_ID, codecs(), StoredSchemas(), batch.column("kafka_value").combine_chunks()
    )
    typed = TypedRows(shaped.layout, codecs(), StoredSchemas().add(list(shaped.shapes.values())))
    return typed.decode(batch).table, typed


def test_a_batch_of_plain_json_becomes_columns_and_back() -> None:
    table, typed = decoded(FIRST)
    layout = typed.layout
    assert [f.name for f in layout.schema.fields][-3:] == ["id", "amount", "currency"]
    assert layout.schema.find_field("amount").field_type == DoubleType()  # 5 and 7.25 together
    assert layout.schema.find_field("id").field_type == LongType()
    assert layout.schema.find_field("currency").field_type == StringType()
    got = table.select(["id", "amount", "currency"]).to_pylist()
    assert got[:4] == [
        {"id": 1, "amount": 5.0, "currency": "EUR"},
        {"id": 2, "amount": 7.25, "currency": "USD"},
        {"id": 3, "amount": 1.5, "currency": "EUR"},
        {"id": 4, "amount": 2.5, "currency": "EUR"},
    ]
    kept = table.column("kafka_value").to_pylist()
    # "5" reads 5.0 (kept), the spaced text is kept; the canonical ones are not
    assert kept == [FIRST[0], None, None, FIRST[3], None, FIRST[5], FIRST[6]]
    ids = table.column(VALUE_SCHEMA_ID_COLUMN).to_pylist()
    assert ids[0] == ids[1] == ids[3] != ids[2] and ids[4:] == [None, None, None]
    errors = table.column(VALUE_ERROR_COLUMN).to_pylist()
    assert errors[:5] == [None] * 5
    assert errors[5] == "value: not a JSON object but an array"
    assert errors[6] is not None and errors[6].startswith("corrupt payload")
    _, again = typed.encode(table)
    assert again.to_pylist() == FIRST


def test_a_shape_the_layout_has_not_folded_stays_raw_with_its_cause() -> None:
    _, typed = decoded(FIRST)
    later = [b'{"id":9,"note":"new key"}', b'{"id":10,"amount":1.0,"currency":"EUR"}']
    table = typed.decode(rows(later)).table
    assert table.column("kafka_value").to_pylist()[0] == later[0]
    error = table.column(VALUE_ERROR_COLUMN).to_pylist()[0]
    assert error is not None and "has not folded yet" in error
    assert table.column("amount").to_pylist() == [None, 1.0]
    _, again = typed.encode(table)
    assert again.to_pylist() == later


def test_a_later_batch_adds_columns_and_a_type_the_table_cannot_take_stays_raw() -> None:
    _, typed = decoded([b'{"id":1,"n":2}'])
    base = typed.layout
    later = [b'{"id":2,"n":2.5}', b'{"id":3,"n":4,"tags":["a","b"]}']
    batch = rows(later)
    shaped = build_layout_of_shapes(
        base.schema,
        base.last_column_id,
        codecs(),
        StoredSchemas(),
        batch.column("kafka_value").combine_chunks(),
    )
    layout = shaped.layout
    assert layout.schema.find_field("n").field_type == LongType()  # no long -> double in place
    assert layout.value is not None and len(layout.value.rejected) == 1
    (why,) = layout.value.rejected.values()
    assert "long" in why and "double" in why
    assert layout.schema.find_field("tags").field_type.element_type == StringType()
    rows_again = TypedRows(layout, codecs(), StoredSchemas().add(list(shaped.shapes.values())))
    table = rows_again.decode(batch).table
    assert table.column("kafka_value").to_pylist() == [later[0], None]
    assert table.column("tags").to_pylist() == [None, ["a", "b"]]
    assert json.loads(later[0])["n"] == 2.5
    _, again = rows_again.encode(table)
    assert again.to_pylist() == later


def adopting(first: list[bytes | None]) -> tuple[TypedRows, TypedRows]:
    """A table folded from ``first``, and two decoders of a later batch: one adopting shapes
    with the table's columns as they are, one of the same layout without adoption."""
    shaped = build_layout_of_shapes(
        ROW_SCHEMA, LAST_ID, codecs(), StoredSchemas(), rows(first).column("kafka_value")
    )
    made = shaped.layout
    layout = build_layout_of_columns(made.schema, made.last_column_id, codecs(), StoredSchemas())
    assert layout is not None and layout.schema.as_struct() == made.schema.as_struct()
    assert layout.value is not None and not layout.value.schemas
    return (
        TypedRows(layout, codecs(), StoredSchemas(), adopt_shapes=True),
        TypedRows(layout, codecs(), StoredSchemas()),
    )


LATER = [
    b'{"id":5,"currency":"EUR"}',  # amount left out: fits
    b'{"amount":6,"id":6,"currency":"USD"}',  # another order, an integer for the double: fits
    b'{"id":"X-7","currency":"JPY"}',  # a string for the long column: rejected
    b'{"id": 8}',  # spaced: decodes, keeps its bytes
    None,
]


def test_a_later_batch_adopts_the_shapes_that_fit_as_a_fold_would() -> None:
    adopt, refuse = adopting(FIRST)
    got = adopt.decode(rows(LATER))
    # What the table folding the later batch's shapes first gives, row for row.
    made = adopt.layout
    shaped = build_layout_of_shapes(
        made.schema,
        made.last_column_id,
        codecs(),
        StoredSchemas(),
        rows(LATER).column("kafka_value"),
    )
    assert shaped.layout.schema.as_struct() == made.schema.as_struct()
    folded = TypedRows(shaped.layout, codecs(), StoredSchemas().add(list(shaped.shapes.values())))
    assert got.table.to_pylist() == folded.decode(rows(LATER)).table.to_pylist()
    table = got.table.to_pylist()
    assert table[0]["id"] == 5 and table[0]["amount"] is None and table[0]["kafka_value"] is None
    assert table[1]["amount"] == 6.0
    assert "does not fit the table" in table[2][VALUE_ERROR_COLUMN]
    assert table[3]["kafka_value"] == b'{"id": 8}' and table[3][VALUE_ERROR_COLUMN] is None
    ids = {r[VALUE_SCHEMA_ID_COLUMN] for r in table if r[VALUE_ERROR_COLUMN] is None}
    assert set(got.adopted) == ids - {None}  # reported for the table's properties
    assert all(s.schema_type == "JSON" for s in got.adopted.values())
    # Without adoption, the same rows keep their bytes: the table has not folded their shapes.
    plain = refuse.decode(rows(LATER)).table.to_pylist()
    assert all(r["kafka_value"] is not None for r in plain[:4])
    assert "has not folded yet" in plain[0][VALUE_ERROR_COLUMN]


def test_a_shape_needing_a_new_column_is_not_adopted() -> None:
    adopt, _ = adopting(FIRST)
    with pytest.raises(ShapesToFold) as raised:
        adopt.decode(rows([b'{"id":9,"note":"a new key"}']))
    assert len(raised.value.schema_ids) == 1


def test_version_fit_says_what_a_fold_would_do() -> None:
    shaped = build_layout_of_shapes(
        ROW_SCHEMA, LAST_ID, codecs(), StoredSchemas(), rows(FIRST).column("kafka_value")
    )
    layout = shaped.layout

    def fit(**fields: IcebergType) -> tuple[str, str | None]:
        struct = StructType(
            *(NestedField(i, n, t, required=False) for i, (n, t) in enumerate(fields.items(), 1))
        )
        return version_fit(layout, struct)

    assert fit(id=LongType()) == ("fits", None)
    assert fit(id=LongType(), note=StringType()) == ("grows", None)
    outcome, why = fit(id=StringType())
    assert outcome == "rejected" and why is not None and "id" in why


def test_a_batch_beyond_the_sample_it_was_folded_from_is_not_decoded() -> None:
    """Folded from a sample (its kinds ``within``), a batch whose values would have folded into
    other columns raises instead of decoding with the sample's columns."""
    sample = [b'{"id":1,"amount":5,"currency":"EUR"}']
    shaped = build_layout_of_shapes(
        ROW_SCHEMA, LAST_ID, codecs(), StoredSchemas(), rows(sample).column("kafka_value")
    )
    joined = PlainJsonCodec().joined_kinds(rows(sample).column("kafka_value").combine_chunks())
    typed = TypedRows(
        shaped.layout,
        codecs(),
        StoredSchemas().add(list(shaped.shapes.values())),
        adopt_shapes=True,
        within={"value": joined},
    )
    fits = typed.decode(rows([b'{"id":2,"amount":6,"currency":"USD"}', b'{"id":3}']))
    assert fits.table.column("amount").to_pylist() == [6, None]
    with pytest.raises(ShapesToFold):  # 7.5 would have made amount a double
        typed.decode(rows([b'{"id":2,"amount":7.5,"currency":"USD"}']))
