"""The Avro -> Iceberg mapping of the design, schema parsing (names, namespaces, references)
and what is not expressible."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from bergstream.core.api import RegisteredSchema, SchemaNotExpressible, SchemaReference
from bergstream.plugins.value_codecs.avro.schema import parse_avro
from bergstream.plugins.value_codecs.avro.types import iceberg_type


def _shape(type_: IcebergType) -> Any:
    """A type without field ids: (name, shape, required) per field, nested."""
    if isinstance(type_, StructType):
        return [(f.name, _shape(f.field_type), f.required) for f in type_.fields]
    if isinstance(type_, ListType):
        return ("list", _shape(type_.element_type), type_.element_required)
    if isinstance(type_, MapType):
        return ("map", _shape(type_.key_type), _shape(type_.value_type), type_.value_required)
    return str(type_)


def _type(schema: Any, references: tuple[SchemaReference, ...] = (), resolve: Any = None) -> Any:
    registered = RegisteredSchema(1, "AVRO", json.dumps(schema), references)
    return iceberg_type(parse_avro(registered, resolve))


def _ids(type_: IcebergType) -> list[int]:
    out: list[int] = []
    if isinstance(type_, StructType):
        for f in type_.fields:
            out += [f.field_id, *_ids(f.field_type)]
    elif isinstance(type_, ListType):
        out += [type_.element_id, *_ids(type_.element_type)]
    elif isinstance(type_, MapType):
        out += [type_.key_id, type_.value_id, *_ids(type_.value_type)]
    return out


EVERYTHING = {
    "type": "record",
    "name": "Everything",
    "namespace": "com.example",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "by", "type": "bytes"},
        {"name": "s", "type": "string"},
        {"name": "nothing", "type": "null"},
        {"name": "only_null", "type": ["null"]},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "a", "type": {"type": "array", "items": ["null", "int"]}},
        {"name": "m", "type": {"type": "map", "values": "Four"}},
        {"name": "opt", "type": ["null", "string"], "default": None},
        {"name": "opt2", "type": ["long", "null"]},
        {
            "name": "u",
            "type": [
                "null",
                "int",
                "string",
                "Color",
                {
                    "type": "record",
                    "name": "Inner",
                    "namespace": "other",
                    "fields": [{"name": "x", "type": "int"}],
                },
            ],
        },
        {"name": "u2", "type": ["int", "long"]},
        {
            "name": "dec",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {
            "name": "decf",
            "type": {
                "type": "fixed",
                "name": "D",
                "size": 16,
                "logicalType": "decimal",
                "precision": 38,
                "scale": 0,
            },
        },
        {"name": "date", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tmil", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tmic", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ltm", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "ltu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "uuid", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "uuidf",
            "type": {"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"},
        },
        {"name": "unknown", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {"name": "bad_logical", "type": {"type": "string", "logicalType": "date"}},
        {
            "name": "bad_decimal",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 3},
        },
        {"name": "again", "type": "com.example.Color"},
        {"name": "inner", "type": "other.Inner"},
    ],
}


def test_the_design_mapping() -> None:
    type_ = _type(EVERYTHING)
    assert _shape(type_) == [
        ("b", "boolean", True),
        ("i", "int", True),
        ("l", "long", True),
        ("f", "float", True),
        ("d", "double", True),
        ("by", "binary", True),
        ("s", "string", True),
        ("e", "string", True),
        ("fx", "fixed[4]", True),
        ("a", ("list", "int", False), True),
        ("m", ("map", "string", "fixed[4]", True), True),
        ("opt", "string", False),
        ("opt2", "long", False),
        (
            "u",
            [
                ("int", "int", False),
                ("string", "string", False),
                ("Color", "string", False),
                ("Inner", [("x", "int", True)], False),
            ],
            False,
        ),
        ("u2", [("int", "int", False), ("long", "long", False)], True),
        ("dec", "decimal(10, 2)", True),
        ("decf", "decimal(38, 0)", True),
        ("date", "date", True),
        ("tmil", "long", True),
        ("tmic", "long", True),
        ("tsm", "timestamptz", True),
        ("tsu", "timestamptz", True),
        ("ltm", "timestamp", True),
        ("ltu", "timestamp", True),
        ("uuid", "uuid", True),
        ("uuidf", "uuid", True),
        ("unknown", "long", True),
        ("bad_logical", "string", True),
        ("bad_decimal", "binary", True),
        ("again", "string", True),
        ("inner", [("x", "int", True)], True),
    ]
    ids = _ids(type_)
    assert len(ids) == len(set(ids))


def test_non_record_values() -> None:
    assert _shape(_type("string")) == "string"
    assert _shape(_type(["null", "long"])) == "long"
    assert _shape(_type({"type": "array", "items": "int"})) == ("list", "int", True)
    assert _shape(_type(["int", "string"])) == [("int", "int", False), ("string", "string", False)]


def test_clashing_branch_names_use_full_names() -> None:
    union = [
        {"type": "record", "name": "a.R", "fields": [{"name": "x", "type": "int"}]},
        {"type": "record", "name": "b.R", "fields": [{"name": "y", "type": "int"}]},
    ]
    assert [name for name, _, _ in _shape(_type(union))] == ["a_R", "b_R"]


NOT_EXPRESSIBLE = [
    pytest.param(
        {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
        "recursive type Node",
        id="recursive",
    ),
    pytest.param(
        {
            "type": "record",
            "name": "A",
            "fields": [
                {
                    "name": "b",
                    "type": {"type": "record", "name": "B", "fields": [{"name": "a", "type": "A"}]},
                }
            ],
        },
        "recursive type A",
        id="mutually recursive",
    ),
    pytest.param(
        {"type": "bytes", "logicalType": "decimal", "precision": 39},
        "wider than Iceberg's 38 digits",
        id="decimal 39",
    ),
    pytest.param("null", "schema is null", id="null value"),
    pytest.param({"type": "array", "items": "null"}, "list or map of nulls", id="array of null"),
    pytest.param(
        {
            "type": "record",
            "name": "O",
            "fields": [
                {
                    "name": "e",
                    "type": {
                        "type": "record",
                        "name": "E",
                        "fields": [{"name": "n", "type": "null"}],
                    },
                }
            ],
        },
        "record E has no field",
        id="empty nested record",
    ),
    pytest.param({"type": "fixed", "name": "Z", "size": 0}, "size 0", id="fixed of size 0"),
    pytest.param(
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nope"}]},
        "unknown Avro type Nope",
        id="unknown name",
    ),
    pytest.param(
        {
            "type": "record",
            "name": "R",
            "fields": [{"name": "x", "type": "int"}, {"name": "x", "type": "int"}],
        },
        "two fields named x",
        id="duplicate field",
    ),
]


@pytest.mark.parametrize(("schema", "why"), NOT_EXPRESSIBLE)
def test_not_expressible(schema: Any, why: str) -> None:
    with pytest.raises(SchemaNotExpressible, match=why):
        _type(schema)


def test_invalid_json_is_not_expressible() -> None:
    with pytest.raises(SchemaNotExpressible, match="not JSON"):
        parse_avro(RegisteredSchema(1, "AVRO", "{nope"))
    assert _shape(iceberg_type(parse_avro(RegisteredSchema(1, "AVRO", "long")))) == "long"


def test_references_are_resolved() -> None:
    money = {
        "type": "record",
        "name": "Money",
        "namespace": "com.shop",
        "fields": [
            {
                "name": "amount",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            },
            {"name": "currency", "type": "com.shop.Currency"},
        ],
    }
    currency = {
        "type": "enum",
        "name": "Currency",
        "namespace": "com.shop",
        "symbols": ["EUR", "USD"],
    }
    registry = {
        ("currency", 1): RegisteredSchema(3, "AVRO", json.dumps(currency)),
        ("money", 2): RegisteredSchema(
            4, "AVRO", json.dumps(money), (SchemaReference("com.shop.Currency", "currency", 1),)
        ),
    }
    asked: list[SchemaReference] = []

    def resolve(ref: SchemaReference) -> RegisteredSchema:
        asked.append(ref)
        return registry[(ref.subject, ref.version)]

    payment = {
        "type": "record",
        "name": "Payment",
        "namespace": "com.shop",
        "fields": [{"name": "total", "type": "Money"}, {"name": "c", "type": "Currency"}],
    }
    refs = (SchemaReference("com.shop.Money", "money", 2),)
    shape = _shape(_type(payment, refs, resolve))
    assert shape == [
        ("total", [("amount", "decimal(9, 2)", True), ("currency", "string", True)], True),
        ("c", "string", True),
    ]
    assert [r.subject for r in asked] == ["money", "currency"]
    with pytest.raises(SchemaNotExpressible, match="no resolver"):
        _type(payment, refs)
    registry[("money", 2)] = RegisteredSchema(4, "JSON", "{}")
    with pytest.raises(SchemaNotExpressible, match="is JSON, not Avro"):
        _type(payment, refs, resolve)


def test_fastavro_parses_against_the_specification_where_this_parser_follows_it() -> None:
    """Why the codec parses schemas itself (plugins/value_codecs/avro/schema.py): fastavro
    refuses an invalid decimal the specification says to ignore, and accepts what Iceberg
    cannot hold. When this fails, fastavro changed: reconsider using it."""
    from fastavro.schema import SchemaParseException, parse_schema

    bad_decimal = {
        "type": "record",
        "name": "r",
        "fields": [
            {
                "name": "a",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 5},
            }
        ],
    }
    with pytest.raises(SchemaParseException):
        parse_schema(bad_decimal)
    assert _shape(_type(bad_decimal)) == [("a", "binary", True)]  # ignored, as the spec says
    twice = {"type": "record", "name": "r", "fields": [{"name": "x", "type": "int"}] * 2}
    recursive = {"type": "record", "name": "r", "fields": [{"name": "n", "type": ["null", "r"]}]}
    for schema in (twice, recursive):
        parse_schema(schema)
        with pytest.raises(SchemaNotExpressible):
            _type(schema)
