"""Kafka Connect schemas, as ``JsonConverter`` writes them into its envelopes, -> a tree of
:class:`ConnectSchema` -> an Iceberg type.

A Connect schema in JSON is an object with ``type`` (``int8``, ``int16``, ``int32``,
``int64``, ``float``, ``double``, ``boolean``, ``string``, ``bytes``, ``array``, ``map``,
``struct``; ``float32``/``float64`` are read too), ``optional`` (absent: required), and
maybe ``name`` (a logical or semantic type), ``parameters`` (strings), ``default``,
``version`` and ``doc``; a struct has ``fields`` (each a schema with its ``field`` name), an
array ``items``, a map ``keys`` and ``values``.

The mapping (the *kind* of each schema says how its values are read):

- int8, int16, int32 -> int; int64 -> long; float -> float; double -> double; boolean;
  string; bytes -> binary; array -> list; map -> map (keys must be primitive); struct ->
  struct (a struct without fields is refused: it has no columns).
- By ``name``, when the base type is the one the name is defined on:

  - ``org.apache.kafka.connect.data.Decimal`` (bytes) -> decimal(P, S): S from
    ``parameters.scale``, P from ``parameters."connect.decimal.precision"``, else 38;
  - ``org.apache.kafka.connect.data.Date`` and ``io.debezium.time.Date`` (int32 days) -> date;
  - ``org.apache.kafka.connect.data.Time`` and ``io.debezium.time.Time`` (int32 ms),
    ``io.debezium.time.MicroTime`` (int64 µs), ``io.debezium.time.NanoTime`` (int64 ns) ->
    long microseconds since midnight (Spark cannot read Iceberg ``time`` columns);
  - ``org.apache.kafka.connect.data.Timestamp`` (int64 ms since the epoch, UTC) ->
    timestamptz; ``io.debezium.time.ZonedTimestamp`` (ISO-8601 text with an offset) ->
    timestamptz;
  - ``io.debezium.time.Timestamp`` (ms), ``MicroTimestamp`` (µs), ``NanoTimestamp`` (ns):
    local date-times without a zone (Debezium writes a column's wall-clock time as if it were
    UTC) -> timestamp;
  - ``io.debezium.data.Uuid`` (string) -> uuid; ``io.debezium.data.Json`` (string) -> string;
  - ``io.debezium.data.VariableScaleDecimal`` (struct of ``scale`` int32 and ``value`` bytes):
    a decimal column has one scale, so -> string holding the exact decimal text.

  Any other name (or a name on another base type) reads as its base type.

Field ids are placeholders, unique within the type, assigned in pre-order (a struct numbers its
fields, then the fields' own types; a list its element; a map its key and value).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from bergstream.core.api import SchemaNotExpressible

__all__ = [
    "DECIMAL",
    "MAX_DEPTH",
    "MAX_PRECISION",
    "ConnectField",
    "ConnectSchema",
    "iceberg_type",
    "parse_connect_schema",
]

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
#: The widest decimal Iceberg holds.
MAX_PRECISION = 38
#: The deepest nesting of arrays, maps and structs a schema may have.
MAX_DEPTH = 64
_PRECISION_PARAMETER = "connect.decimal.precision"

# Connect's base types by the names JsonConverter writes (and the enum's own names).
_BASE_TYPES = {
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "float": "float32",
    "float32": "float32",
    "double": "float64",
    "float64": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
    "array": "array",
    "map": "map",
    "struct": "struct",
}

# (logical name, base type) -> kind; see the module docstring.
_LOGICAL = {
    (DECIMAL, "bytes"): "decimal",
    ("org.apache.kafka.connect.data.Date", "int32"): "date",
    ("org.apache.kafka.connect.data.Time", "int32"): "time_millis",
    ("org.apache.kafka.connect.data.Timestamp", "int64"): "timestamptz_millis",
    ("io.debezium.time.Date", "int32"): "date",
    ("io.debezium.time.Time", "int32"): "time_millis",
    ("io.debezium.time.MicroTime", "int64"): "time_micros",
    ("io.debezium.time.NanoTime", "int64"): "time_nanos",
    ("io.debezium.time.Timestamp", "int64"): "timestamp_millis",
    ("io.debezium.time.MicroTimestamp", "int64"): "timestamp_micros",
    ("io.debezium.time.NanoTimestamp", "int64"): "timestamp_nanos",
    ("io.debezium.time.ZonedTimestamp", "string"): "zoned_timestamp",
    ("io.debezium.data.Uuid", "string"): "uuid",
    ("io.debezium.data.Json", "string"): "string",
    (VARIABLE_SCALE_DECIMAL, "struct"): "variable_decimal",
}

_LEAF_TYPES: dict[str, IcebergType] = {
    "int8": IntegerType(),
    "int16": IntegerType(),
    "int32": IntegerType(),
    "int64": LongType(),
    "float32": FloatType(),
    "float64": DoubleType(),
    "boolean": BooleanType(),
    "string": StringType(),
    "bytes": BinaryType(),
    "date": DateType(),
    "time_millis": LongType(),
    "time_micros": LongType(),
    "time_nanos": LongType(),
    "timestamptz_millis": TimestamptzType(),
    "zoned_timestamp": TimestamptzType(),
    "timestamp_millis": TimestampType(),
    "timestamp_micros": TimestampType(),
    "timestamp_nanos": TimestampType(),
    "uuid": UUIDType(),
    "variable_decimal": StringType(),
}

_PRIMITIVE_BASES = frozenset(_BASE_TYPES.values()) - {"array", "map", "struct"}


@dataclass(frozen=True, eq=False)
class ConnectSchema:
    """One Connect schema (see the module docstring); ``kind`` is how its values are read:
    its base type, or the logical kind its ``name`` gives."""

    type: str  # the base type: int8 ... float32, float64, ..., array, map, struct
    kind: str  # the base type, or decimal, date, time_millis, ..., uuid, variable_decimal
    optional: bool = False
    name: str | None = None
    parameters: Mapping[str, str] = field(default_factory=dict)
    #: the ``default`` as JsonConverter writes it (JSON, like a payload); None: no default
    default: Any = None
    fields: tuple[ConnectField, ...] = ()
    items: ConnectSchema | None = None  # array
    keys: ConnectSchema | None = None  # map
    values: ConnectSchema | None = None  # map
    precision: int = 0  # decimal
    scale: int = 0  # decimal


@dataclass(frozen=True, eq=False)
class ConnectField:
    """One field of a struct schema."""

    name: str
    schema: ConnectSchema


def _where(path: str) -> str:
    return f"at {path}" if path else "at the top"


def _decimal_bounds(parameters: Mapping[str, str], path: str) -> tuple[int, int]:
    """The precision and scale of a Connect decimal."""
    try:
        scale = int(parameters["scale"])
    except (KeyError, ValueError):
        raise SchemaNotExpressible(
            f"a Decimal {_where(path)} has no integer parameter 'scale'"
        ) from None
    precision_text = parameters.get(_PRECISION_PARAMETER)
    try:
        precision = MAX_PRECISION if precision_text is None else int(precision_text)
    except ValueError:
        raise SchemaNotExpressible(
            f"a Decimal {_where(path)} has a precision that is not an integer: {precision_text!r}"
        ) from None
    if precision > MAX_PRECISION:
        raise SchemaNotExpressible(
            f"a Decimal {_where(path)} of precision {precision} is wider than Iceberg's 38 digits"
        )
    if not 0 <= scale <= precision or precision < 1:
        raise SchemaNotExpressible(
            f"a Decimal {_where(path)} with precision {precision} and scale {scale} is not an "
            "Iceberg decimal (it needs 0 <= scale <= precision)"
        )
    return precision, scale


def parse_connect_schema(node: Any, path: str = "", depth: int = 0) -> ConnectSchema:
    """The :class:`ConnectSchema` of a parsed Connect schema (``path`` names where it sits, for
    messages; ``depth`` how deep); raises :class:`SchemaNotExpressible` for one that is not a
    Connect schema, that Iceberg cannot hold, or nested more than :data:`MAX_DEPTH` deep."""
    if depth > MAX_DEPTH:
        raise SchemaNotExpressible(
            f"the schema is nested more than {MAX_DEPTH} deep {_where(path)}"
        )
    if type(node) is not dict:
        raise SchemaNotExpressible(f"the schema {_where(path)} is not a JSON object")
    type_name = node.get("type")
    base = _BASE_TYPES.get(type_name) if type(type_name) is str else None
    if base is None:
        raise SchemaNotExpressible(f"the schema {_where(path)} has no Connect type: {type_name!r}")
    name = node.get("name")
    name = name if type(name) is str else None
    parameters_node = node.get("parameters")
    parameters = (
        {str(k): str(v) for k, v in parameters_node.items()}
        if type(parameters_node) is dict
        else {}
    )
    kind = _LOGICAL.get((name, base), base) if name is not None else base
    common: dict[str, Any] = {
        "type": base,
        "optional": node.get("optional") is True,
        "name": name,
        "parameters": parameters,
        "default": node.get("default"),
    }
    if kind == "decimal":
        precision, scale = _decimal_bounds(parameters, path)
        return ConnectSchema(kind=kind, precision=precision, scale=scale, **common)
    if base == "array":
        items = parse_connect_schema(node.get("items"), f"{path}[]", depth + 1)
        return ConnectSchema(kind=kind, items=items, **common)
    if base == "map":
        keys = parse_connect_schema(node.get("keys"), f"{path}.key", depth + 1)
        if keys.type not in _PRIMITIVE_BASES:
            raise SchemaNotExpressible(
                f"the map {_where(path)} has {keys.type} keys: only primitive keys are read"
            )
        values = parse_connect_schema(node.get("values"), f"{path}.value", depth + 1)
        return ConnectSchema(kind=kind, keys=keys, values=values, **common)
    if base == "struct":
        fields = _fields(node.get("fields"), path, depth)
        if kind == "variable_decimal" and not _is_variable_decimal(fields):
            kind = base  # not Debezium's {scale, value}: read it as the struct it is
        return ConnectSchema(kind=kind, fields=fields, **common)
    return ConnectSchema(kind=kind, **common)


def _fields(nodes: Any, path: str, depth: int) -> tuple[ConnectField, ...]:
    if type(nodes) is not list:
        raise SchemaNotExpressible(f"the struct {_where(path)} has no list of fields")
    if not nodes:
        raise SchemaNotExpressible(f"the struct {_where(path)} has no fields (no columns)")
    out: list[ConnectField] = []
    seen: set[str] = set()
    for node in nodes:
        name = node.get("field") if type(node) is dict else None
        if type(name) is not str:
            raise SchemaNotExpressible(f"a field of the struct {_where(path)} has no name")
        if name in seen:
            raise SchemaNotExpressible(f"the struct {_where(path)} has two fields {name!r}")
        seen.add(name)
        child = f"{path}.{name}" if path else name
        out.append(ConnectField(name, parse_connect_schema(node, child, depth + 1)))
    return tuple(out)


def _is_variable_decimal(fields: tuple[ConnectField, ...]) -> bool:
    by_name = {f.name: f.schema for f in fields}
    scale, value = by_name.get("scale"), by_name.get("value")
    return (
        len(by_name) == 2
        and scale is not None
        and value is not None
        and scale.type == "int32"
        and value.type == "bytes"
    )


def iceberg_type(schema: ConnectSchema) -> IcebergType:
    """The Iceberg type of values of ``schema`` (placeholder field ids; see the module
    docstring). A struct's fields, list elements and map values are required where the
    schema says they are not optional (the table layout makes columns optional anyway)."""
    return _Ids().type_of(schema)


class _Ids:
    def __init__(self) -> None:
        self.ids = itertools.count(1)

    def type_of(self, schema: ConnectSchema) -> IcebergType:
        if schema.kind == "decimal":
            return DecimalType(schema.precision, schema.scale)
        leaf = _LEAF_TYPES.get(schema.kind)
        if leaf is not None:
            return leaf
        if schema.kind == "array":
            assert schema.items is not None
            element_id = next(self.ids)
            element = self.type_of(schema.items)
            return ListType(element_id, element, element_required=not schema.items.optional)
        if schema.kind == "map":
            assert schema.keys is not None and schema.values is not None
            key_id, value_id = next(self.ids), next(self.ids)
            key = self.type_of(schema.keys)
            value = self.type_of(schema.values)
            return MapType(key_id, key, value_id, value, value_required=not schema.values.optional)
        ids = [next(self.ids) for _ in schema.fields]
        return StructType(
            *(
                NestedField(
                    field_id, f.name, self.type_of(f.schema), required=not f.schema.optional
                )
                for field_id, f in zip(ids, schema.fields, strict=True)
            )
        )
