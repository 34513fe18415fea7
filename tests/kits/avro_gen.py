"""Hypothesis strategies for Avro schemas and values, and the normalization that compares
fastavro's decoding with the codec's Arrow values.

Generated schemas use every primitive, every logical type the design maps, nested records
(some in namespaces, some referenced again by name), arrays, maps, enums, fixed, nullable and
general unions and field defaults. General unions never hold both ``int`` and ``long`` (nor
``float`` and ``double``): fastavro decodes those to the same Python type, so its output cannot
say which branch was written (the codec can; a hand-made test covers it). Values are written
with fastavro's tuple notation for general unions, so the branch is the one drawn.

Normalization (both sides to plain Python): records are dicts of their non-null fields; general
unions are dicts with one key per non-null branch (the written one set, others None); maps are
dicts; enums are strings; fixed and bytes are bytes; uuids are ``uuid.UUID``; decimals are
``Decimal``; dates are ``date``; time-millis / time-micros are microseconds (int); timestamps
are datetimes (aware for timestamp-*, naive for local-timestamp-*).
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import uuid
from typing import Any

from hypothesis import strategies as st

from bergstream.plugins.value_codecs.avro.schema import AvroNode
from bergstream.plugins.value_codecs.avro.types import branch_names, is_null, union_parts

_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
_SYMBOLS = st.lists(
    st.from_regex(r"[A-Z][A-Z0-9_]{0,4}", fullmatch=True), min_size=1, max_size=5, unique=True
)

PRIMITIVES = ["boolean", "int", "long", "float", "double", "bytes", "string"]
LOGICAL = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
]

_WIDE = decimal.Context(prec=80)
_MIN_MS = -62135596800000  # 0001-01-01
_MAX_MS = 253402300799999  # 9999-12-31 23:59:59.999
_MIN_DAYS = -719162
_MAX_DAYS = 2932896


class _Names:
    """Unique names of the named types of one schema, and the definitions seen so far."""

    def __init__(self) -> None:
        self.counter = itertools.count()
        self.defined: list[dict[str, Any]] = []

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self.counter)}"


@st.composite
def avro_schemas(draw: st.DrawFn) -> Any:
    """A value schema (JSON-ready), mostly a record, with nested types up to three levels
    deep."""
    names = _Names()
    if draw(st.integers(0, 3)) == 0:
        return _any_item(draw, names, 2)
    return _record(draw, names, 2, namespace=draw(st.sampled_from([None, "com.example"])))


def _record(draw: st.DrawFn, names: _Names, depth: int, namespace: str | None = None) -> dict:
    field_names = draw(st.lists(_NAMES, min_size=1, max_size=6, unique=True))
    fields = []
    for field_name in field_names:
        type_ = _any(draw, names, depth)
        field: dict[str, Any] = {"name": field_name, "type": type_}
        default = _default(type_)
        if default is not _NO_DEFAULT and draw(st.booleans()):
            field["default"] = default
        fields.append(field)
    if all(field["type"] in ("null", ["null"]) for field in fields):
        fields[0] = {"name": fields[0]["name"], "type": "int"}  # Iceberg has no empty struct
    schema: dict[str, Any] = {"type": "record", "name": names.fresh("Rec"), "fields": fields}
    if namespace:
        schema["namespace"] = namespace
    names.defined.append(schema)
    return schema


_NO_DEFAULT = object()


def _default(type_: Any) -> Any:
    if isinstance(type_, list) and type_ and type_[0] == "null":
        return None
    return {"int": 0, "long": 7, "string": "x", "boolean": True, "double": 1.5}.get(
        type_ if isinstance(type_, str) else "", _NO_DEFAULT
    )


def _any(draw: st.DrawFn, names: _Names, depth: int) -> Any:
    kinds = ["primitive", "logical", "decimal", "enum", "fixed", "null", "nullable", "union"]
    if depth > 0:
        kinds += ["record", "array", "map", "reuse"]
    kind = draw(st.sampled_from(kinds))
    if kind == "nullable":
        inner = _plain(draw, names, depth)
        return ["null", inner] if draw(st.booleans()) else [inner, "null"]
    if kind == "union":
        return _union(draw, names, depth)
    if kind == "null":
        return "null"
    return _plain(draw, names, depth, kind)


def _plain(draw: st.DrawFn, names: _Names, depth: int, kind: str | None = None) -> Any:
    """A schema that is not a union (nor null)."""
    if kind is None:
        options = ["primitive", "logical", "decimal", "enum", "fixed"]
        kind = draw(st.sampled_from(options + (["record", "array", "map"] if depth else [])))
    if kind == "primitive":
        return draw(st.sampled_from(PRIMITIVES))
    if kind == "logical":
        return dict(draw(st.sampled_from(LOGICAL)))
    if kind == "decimal":
        precision = draw(st.integers(1, 38))
        scale = draw(st.integers(0, precision))
        if draw(st.booleans()):
            return {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": precision,
                "scale": scale,
            }
        size = draw(st.integers(_bytes_for(precision), 18))
        return {
            "type": "fixed",
            "name": names.fresh("Dec"),
            "size": size,
            "logicalType": "decimal",
            "precision": precision,
            "scale": scale,
        }
    if kind == "enum":
        return {"type": "enum", "name": names.fresh("Enum"), "symbols": draw(_SYMBOLS)}
    if kind == "fixed":
        return {"type": "fixed", "name": names.fresh("Fix"), "size": draw(st.integers(1, 6))}
    if kind == "record":
        return _record(draw, names, depth - 1)
    if kind == "array":
        return {"type": "array", "items": _any_item(draw, names, depth - 1)}
    if kind == "map":
        return {"type": "map", "values": _any_item(draw, names, depth - 1)}
    if kind == "reuse" and names.defined:
        return draw(st.sampled_from([_fullname(s) for s in names.defined]))
    return draw(st.sampled_from(PRIMITIVES))


def _any_item(draw: st.DrawFn, names: _Names, depth: int) -> Any:
    """An array item or map value: anything but null."""
    while True:
        schema = _any(draw, names, depth)
        if schema != "null":
            return schema


def _union(draw: st.DrawFn, names: _Names, depth: int) -> list[Any]:
    """A general union: 2-3 branches of distinct Avro types, maybe with null."""
    base_kinds = [
        "boolean",
        "int",
        "float",
        "bytes",
        "string",
        "record",
        "enum",
        "fixed",
        "array",
        "map",
        "date",
    ]
    if not depth:
        base_kinds = [k for k in base_kinds if k not in ("record", "array", "map")]
    chosen = draw(st.lists(st.sampled_from(base_kinds), min_size=2, max_size=3, unique=True))
    branches: list[Any] = []
    for kind in chosen:
        if kind == "int":
            branches.append(draw(st.sampled_from(["int", "long"])))
        elif kind == "float":
            branches.append(draw(st.sampled_from(["float", "double"])))
        elif kind == "date":
            if "int" in chosen:
                continue
            branches.append({"type": "int", "logicalType": "date"})
        elif kind in ("record", "enum", "fixed", "array", "map"):
            branches.append(_plain(draw, names, depth, kind))
        else:
            branches.append(kind)
    if draw(st.booleans()):
        branches.insert(draw(st.integers(0, len(branches))), "null")
    return branches


def _bytes_for(precision: int) -> int:
    size = 1
    while 10**precision > 2 ** (8 * size - 1) - 1:
        size += 1
    return size


def _fullname(schema: dict[str, Any]) -> str:
    return f"{schema['namespace']}.{schema['name']}" if schema.get("namespace") else schema["name"]


# -- values ---------------------------------------------------------------------------------


def values_of(node: AvroNode) -> st.SearchStrategy[Any]:
    """Values fastavro's writer accepts for ``node`` (general unions in tuple notation)."""
    if node.kind == "union":
        options = []
        for branch in node.branches:
            if branch.kind == "null":
                options.append(st.none())
            else:
                tag = branch.name or branch.kind
                options.append(values_of(branch).map(lambda v, tag=tag: (tag, v)))
        return st.one_of(options)
    logical = node.logical
    if logical == "decimal":
        bound = 10**node.precision - 1
        return st.integers(-bound, bound).map(
            lambda n, s=node.scale: decimal.Decimal(n).scaleb(-s, _WIDE)
        )
    if logical == "uuid":
        return st.uuids().map(lambda u, k=node.kind: u if k == "string" else u.bytes)
    if logical == "date":
        return st.integers(_MIN_DAYS, _MAX_DAYS)
    if logical == "time-millis":
        return st.integers(0, 86_399_999)
    if logical == "time-micros":
        return st.integers(0, 86_399_999_999)
    if logical in ("timestamp-millis", "local-timestamp-millis"):
        return st.integers(_MIN_MS, _MAX_MS)
    if logical in ("timestamp-micros", "local-timestamp-micros"):
        return st.integers(_MIN_MS * 1000, _MAX_MS * 1000 + 999)
    simple = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(width=32, allow_nan=False),
        "double": st.floats(allow_nan=False),
        "bytes": st.binary(max_size=12),
        "string": st.text(max_size=12),
    }
    if node.kind in simple:
        return simple[node.kind]
    if node.kind == "enum":
        return st.sampled_from(node.symbols)
    if node.kind == "fixed":
        return st.binary(min_size=node.size, max_size=node.size)
    if node.kind == "array":
        return st.lists(values_of(node.items), max_size=4)
    if node.kind == "map":
        return st.dictionaries(st.text(max_size=4), values_of(node.items), max_size=4)
    return st.fixed_dictionaries({name: values_of(child) for name, child in node.fields})


# -- normalization --------------------------------------------------------------------------


def from_fastavro(node: AvroNode, value: Any) -> Any:
    """fastavro's decoding (``return_named_type=True``) in the normalized form."""
    if node.kind == "union":
        branches, _ = union_parts(node)
        if value is None or not branches:
            return None
        if len(branches) == 1:
            return from_fastavro(branches[0], value[1] if isinstance(value, tuple) else value)
        index, value = _which(branches, value)
        names = branch_names(branches)
        return {
            name: from_fastavro(branches[i], value) if i == index else None
            for i, name in enumerate(names)
        }
    logical = node.logical
    if logical == "uuid":
        return value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=value)
    if logical in ("time-millis", "time-micros"):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + (
            value.microsecond
        )
    if node.kind == "record":
        return {
            name: from_fastavro(child, value[name])
            for name, child in node.fields
            if not is_null(child)
        }
    if node.kind == "array":
        return [from_fastavro(node.items, v) for v in value]
    if node.kind == "map":
        return {k: from_fastavro(node.items, v) for k, v in value.items()}
    return value


def _which(branches: list[AvroNode], value: Any) -> tuple[int, Any]:
    """Which non-null branch a fastavro value came from (by name or Python type)."""
    if isinstance(value, tuple):
        name, inner = value
        for i, branch in enumerate(branches):
            if branch.name == name:
                return i, inner
    python = {
        "boolean": bool,
        "int": int,
        "long": int,
        "float": float,
        "double": float,
        "bytes": bytes,
        "string": str,
        "array": list,
        "map": dict,
        "record": dict,
        "enum": str,
        "fixed": bytes,
    }
    for i, branch in enumerate(branches):
        if branch.name is not None:  # fastavro tags values of named types
            continue
        if branch.logical == "date":
            if type(value) is datetime.date:
                return i, value
            continue
        if branch.logical is None and type(value) is python[branch.kind]:
            return i, value
    raise AssertionError(f"no branch for {value!r}")


def from_arrow(node: AvroNode, value: Any) -> Any:
    """The codec's ``to_pylist()`` value in the normalized form (maps to dicts)."""
    if value is None:
        return None
    if node.kind == "union":
        branches, _ = union_parts(node)
        if len(branches) == 1:
            return from_arrow(branches[0], value)
        names = branch_names(branches)
        return {name: from_arrow(b, value[name]) for name, b in zip(names, branches, strict=True)}
    if node.kind == "record":
        return {
            name: from_arrow(child, value[name])
            for name, child in node.fields
            if not is_null(child)
        }
    if node.kind == "array":
        return [from_arrow(node.items, v) for v in value]
    if node.kind == "map":
        return {k: from_arrow(node.items, v) for k, v in value}
    return value
