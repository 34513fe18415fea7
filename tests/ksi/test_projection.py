"""Rows of an older data file projected onto a table's current Arrow schema by field id."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from bergstream.core.api import arrow_type
from bergstream.plugins.ksi_fetch_filter.projection import conform, conform_array, field_id


def _field(name: str, type_: pa.DataType, ident: int) -> pa.Field:
    return pa.field(name, type_, metadata={b"PARQUET:field_id": str(ident).encode()})


def test_fields_match_by_id_and_missing_ones_read_null() -> None:
    old = StructType(NestedField(2, "country", StringType(), required=False))
    new = StructType(
        NestedField(2, "country", StringType(), required=False),
        NestedField(3, "city", StringType(), required=False),
    )
    file_type = pa.struct([_field("land", pa.string(), 2)])  # a name the table no longer uses
    rows = pa.table(
        {
            "origin": pa.array([{"land": "DE"}, None, {"land": None}], file_type),
            "gone": pa.array([1, 2, 3]),
        }
    )
    rows = rows.cast(pa.schema([_field("origin", file_type, 1), _field("gone", pa.int64(), 9)]))
    target = pa.schema(
        [
            _field("origin", arrow_type(new), 1),
            _field("qty", pa.int64(), 4),
        ]
    )
    out = conform(rows, target)
    assert out.schema == target
    assert out.column("origin").to_pylist() == [
        {"country": "DE", "city": None},
        None,
        {"country": None, "city": None},
    ]
    assert out.column("qty").to_pylist() == [None, None, None]
    assert arrow_type(old) != arrow_type(new)


def test_promotions_and_large_layouts_are_cast() -> None:
    target = pa.schema(
        [
            _field("qty", arrow_type(LongType()), 1),
            _field("amount", arrow_type(DecimalType(14, 2)), 2),
            _field("blob", arrow_type(BinaryType()), 3),
            _field("tags", arrow_type(ListType(5, StringType(), element_required=True)), 4),
            _field(
                "attrs",
                arrow_type(MapType(7, StringType(), 8, IntegerType(), value_required=True)),
                6,
            ),
        ]
    )
    from decimal import Decimal

    rows = pa.table(
        [
            pa.array([1, None], pa.int32()),
            pa.array([Decimal("1.25"), None], pa.decimal128(10, 2)),
            pa.array([b"x", None], pa.binary()),
            pa.array([["a", "b"], None], pa.list_(pa.string())),
            pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int32())),
        ],
        schema=pa.schema(
            [
                _field("qty", pa.int32(), 1),
                _field("amount", pa.decimal128(10, 2), 2),
                _field("blob", pa.binary(), 3),
                _field("tags", pa.list_(pa.string()), 4),
                _field("attrs", pa.map_(pa.string(), pa.int32()), 6),
            ]
        ),
    )
    out = conform(rows, target)
    assert out.schema.equals(target)
    assert out.to_pylist() == [
        {
            "qty": 1,
            "amount": Decimal("1.25"),
            "blob": b"x",
            "tags": ["a", "b"],
            "attrs": [("k", 1)],
        },
        dict.fromkeys(["qty", "amount", "blob", "tags", "attrs"]),
    ]


def test_sliced_nested_arrays_keep_their_rows() -> None:
    element = StructType(NestedField(3, "a", IntegerType(), required=False))
    wider = StructType(
        NestedField(3, "a", LongType(), required=False),
        NestedField(4, "b", StringType(), required=False),
    )
    source_type = pa.list_(pa.field("element", pa.struct([_field("a", pa.int32(), 3)])))
    array = pa.array([[{"a": 1}], [{"a": 2}, {"a": 3}], None, [{"a": 4}]], source_type).slice(1, 3)
    target = arrow_type(ListType(2, wider, element_required=False))
    out = conform_array(array, target)
    assert out.type == target
    assert out.to_pylist() == [
        [{"a": 2, "b": None}, {"a": 3, "b": None}],
        None,
        [{"a": 4, "b": None}],
    ]
    assert arrow_type(ListType(2, element, element_required=False)) != target


def test_field_ids_come_from_parquet_metadata() -> None:
    assert field_id(_field("x", pa.int32(), 42)) == 42
    assert field_id(pa.field("x", pa.int32())) is None


def test_a_file_without_field_ids_matches_by_name() -> None:
    rows = pa.table({"qty": pa.array([1, 2], pa.int32()), "note": ["a", None]})
    target = pa.schema([_field("note", pa.large_string(), 5), _field("qty", pa.int64(), 4)])
    assert conform(rows, target).to_pylist() == [
        {"note": "a", "qty": 1},
        {"note": None, "qty": 2},
    ]
