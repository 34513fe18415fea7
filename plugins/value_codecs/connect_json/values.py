"""Payloads of Kafka Connect JSON envelopes -> Arrow values of their schema's Iceberg type.

A :class:`PayloadReader` is compiled once per Connect schema (see :mod:`.types`):
one converter per schema node turns the parsed payload (``orjson``'s Python values) into the
value Arrow builds the column from (its storage form: a uuid is its 16 bytes, a timestamp its
microseconds since the epoch). It reads what ``JsonConverter`` writes:

- integers as JSON integers (in the range of their type), floats as numbers (or the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` Jackson writes for those), booleans, strings, bytes
  as base64 text;
- a Decimal as the base64 text of its unscaled value (big-endian two's complement), or as a
  JSON number (``decimal.format=NUMERIC``), read exactly; a value with more digits than the
  column's precision, or more decimal places than its scale, fails its row;
- Date/Time/Timestamp as integers in their unit (µs and ns truncated to microseconds, toward
  the past), ZonedTimestamp as ISO-8601 text with an offset;
- an array as a JSON array; a map with string keys as a JSON object, any other map as an array
  of ``[key, value]`` pairs; a struct as an object (keys the schema lacks are ignored, a field
  the object lacks is null);
- null (or an absent field): null where the schema is optional; else the schema's ``default``
  when it has one (as ``JsonConverter`` reads it), else the row fails.

A payload that does not fit its schema fails its row, with the path of the value that did not
fit (``field after.amount: expected a Decimal (base64 text or number), got boolean``).
"""

from __future__ import annotations

import binascii
import datetime as dt
import decimal
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from bergstream.core.api import arrow_type
from bergstream.plugins.value_codecs.connect_json.types import (
    ConnectSchema,
    iceberg_type,
)

__all__ = ["Mismatch", "PayloadReader", "Reparse", "decimal_text"]

Convert = Callable[[Any], Any]

_CONTEXT = decimal.Context(prec=200, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)
_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_LONG_MIN, _LONG_MAX = _RANGES["int64"]
_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_JSON_NAMES = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    decimal.Decimal: "number",
    str: "string",
    list: "array",
    dict: "object",
}


class Mismatch(Exception):
    """A payload value that does not fit its schema; ``path`` is built innermost first."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.path: list[str] = []

    def describe(self) -> str:
        """The cause, with the path of the value that did not fit."""
        path = "".join(reversed(self.path)).lstrip(".")
        return f"field {path}: {self.cause}" if path else f"payload: {self.cause}"


class Reparse(Exception):
    """A number where a decimal is read, parsed as a float: parse the payload again exactly
    (floats as :class:`decimal.Decimal`)."""


def _wrong(expected: str, value: Any) -> Mismatch:
    got = _JSON_NAMES.get(type(value), type(value).__name__)
    return Mismatch(f"expected {expected}, got {got}")


def _unbase64(value: Any, what: str) -> bytes:
    if type(value) is not str:
        raise _wrong(what, value)
    try:
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        raise Mismatch(f"not base64 text: {value[:40]!r}") from None


def decimal_text(unscaled: int, scale: int) -> str:
    """The exact decimal text of ``unscaled * 10**-scale``, in plain notation (no exponent):
    ``decimal_text(-5, 3) == "-0.005"``, ``decimal_text(12, -2) == "1200"``."""
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled))
    if scale <= 0:
        return sign + digits + "0" * -scale if unscaled else "0"
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


# --- leaf converters: a non-null JSON value -> its Arrow storage value ---


def _integer(kind: str) -> Convert:
    low, high = _RANGES[kind]
    expected = f"an {kind} (integer)"

    def convert(value: Any) -> Any:
        if type(value) is int:
            if low <= value <= high:
                return value
            raise Mismatch(f"{value} is out of the {kind} range")
        raise _wrong(expected, value)

    return convert


def _floating(value: Any) -> Any:
    if type(value) is float:
        return value
    if type(value) is int or type(value) is decimal.Decimal:
        try:
            return float(value)
        except OverflowError:
            raise Mismatch("number out of the double range") from None
    if type(value) is str and value in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[value]
    raise _wrong("a number", value)


def _boolean(value: Any) -> Any:
    if type(value) is bool:
        return value
    raise _wrong("a boolean", value)


def _string(value: Any) -> Any:
    if type(value) is str:
        return value
    raise _wrong("a string", value)


def _bytes(value: Any) -> Any:
    return _unbase64(value, "bytes (base64 text)")


def _decimal(precision: int, scale: int) -> Convert:
    bound = 10**precision
    what = f"decimal({precision}, {scale})"

    def checked(unscaled: int) -> decimal.Decimal:
        if not -bound < unscaled < bound:
            raise Mismatch(f"{decimal_text(unscaled, scale)} has more digits than {what}")
        return decimal.Decimal(unscaled).scaleb(-scale, _CONTEXT)

    def convert(value: Any) -> Any:
        if type(value) is str:
            raw = _unbase64(value, "a Decimal (base64 text or number)")
            if not raw:
                raise Mismatch("a Decimal's bytes are empty")
            return checked(int.from_bytes(raw, "big", signed=True))
        if type(value) is int:
            return checked(value * 10**scale)
        if type(value) is float:
            raise Reparse  # orjson read the number as a float: read it again exactly
        if type(value) is decimal.Decimal:
            if not value.is_finite():
                raise Mismatch(f"{value} is not a decimal number")
            shifted = value.scaleb(scale, _CONTEXT)
            if shifted != shifted.to_integral_value(context=_CONTEXT):
                raise Mismatch(f"{value} has more decimal places than {what}")
            return checked(int(shifted))
        raise _wrong("a Decimal (base64 text or number)", value)

    return convert


def _long_in(kind: str, factor: int, divisor: int) -> Convert:
    """An integer of ``kind`` times ``factor``, floor-divided by ``divisor`` (a time or
    timestamp unit to microseconds), which must fit a long."""
    read = _integer(kind)

    def convert(value: Any) -> Any:
        micros = read(value) * factor // divisor
        if not _LONG_MIN <= micros <= _LONG_MAX:
            raise Mismatch(f"{value} is out of range in microseconds")
        return micros

    return convert


def _zoned_timestamp(value: Any) -> Any:
    if type(value) is not str:
        raise _wrong("an ISO-8601 timestamp with an offset", value)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise Mismatch(f"not an ISO-8601 timestamp: {value[:40]!r}") from None
    if parsed.tzinfo is None:
        raise Mismatch(f"an ISO-8601 timestamp without an offset: {value[:40]!r}")
    return (parsed - _EPOCH) // _MICROSECOND


def _uuid(value: Any) -> Any:
    if type(value) is not str:
        raise _wrong("a uuid string", value)
    if len(value) == 36 and value[8] == value[13] == value[18] == value[23] == "-":
        try:  # the canonical form, read fast (a space would make fewer than 16 bytes)
            raw = bytes.fromhex(value.replace("-", ""))
        except ValueError:
            raw = b""
        if len(raw) == 16:
            return raw
    try:
        return uuid.UUID(value).bytes
    except ValueError:
        raise Mismatch(f"not a uuid: {value[:40]!r}") from None


def _variable_decimal(value: Any) -> Any:
    if type(value) is not dict:
        raise _wrong("a VariableScaleDecimal object (scale, value)", value)
    scale = value.get("scale")
    if type(scale) is not int:
        raise _wrong("an integer scale", scale)
    raw = _unbase64(value.get("value"), "a base64 value")
    if not raw:
        raise Mismatch("a VariableScaleDecimal's bytes are empty")
    return decimal_text(int.from_bytes(raw, "big", signed=True), scale)


def _leaf(schema: ConnectSchema) -> Convert | None:
    """The converter of a leaf kind; None for arrays, maps and structs."""
    kind = schema.kind
    if kind in _RANGES:
        return _integer(kind)
    simple: dict[str, Convert] = {
        "float32": _floating,
        "float64": _floating,
        "boolean": _boolean,
        "string": _string,
        "bytes": _bytes,
        "zoned_timestamp": _zoned_timestamp,
        "uuid": _uuid,
        "variable_decimal": _variable_decimal,
    }
    if kind in simple:
        return simple[kind]
    if kind == "decimal":
        return _decimal(schema.precision, schema.scale)
    units = {
        "date": ("int32", 1, 1),
        "time_millis": ("int32", 1000, 1),
        "time_micros": ("int64", 1, 1),
        "time_nanos": ("int64", 1, 1000),
        "timestamptz_millis": ("int64", 1000, 1),
        "timestamp_millis": ("int64", 1000, 1),
        "timestamp_micros": ("int64", 1, 1),
        "timestamp_nanos": ("int64", 1, 1000),
    }
    if kind in units:
        return _long_in(*units[kind])
    return None


# --- composite converters ---


def _converter(schema: ConnectSchema) -> Convert:
    """The converter of ``schema``'s values, null included (see the module docstring)."""
    inner = _inner(schema)
    if schema.optional:

        def optional(value: Any) -> Any:
            return None if value is None else inner(value)

        return optional
    fallback = _default(schema, inner)

    def required(value: Any) -> Any:
        if value is None:
            if fallback is None:
                raise Mismatch("null where the schema requires a value")
            return fallback
        return inner(value)

    return required


def _default(schema: ConnectSchema, inner: Convert) -> Any:
    """The converted default of a schema (None: it has none, or one that does not fit)."""
    if schema.default is None:
        return None
    try:
        return inner(schema.default)
    except (Mismatch, Reparse):
        return None


def _inner(schema: ConnectSchema) -> Convert:
    leaf = _leaf(schema)
    if leaf is not None:
        return leaf
    if schema.kind == "array":
        assert schema.items is not None
        return _array(_converter(schema.items))
    if schema.kind == "map":
        assert schema.keys is not None and schema.values is not None
        return _map(schema.keys, _converter(schema.values))
    return _struct(schema)


def _array(element: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not list:
            raise _wrong("an array", value)
        out = []
        for index, item in enumerate(value):
            try:
                out.append(element(item))
            except Mismatch as error:
                error.path.append(f"[{index}]")
                raise
        return out

    return convert


def _map(keys: ConnectSchema, value_converter: Convert) -> Convert:
    key_converter = _inner(keys)

    def entry(key: Any, item: Any) -> tuple[Any, Any]:
        try:
            if key is None:
                raise Mismatch("a map key is null")
            return key_converter(key), value_converter(item)
        except Mismatch as error:
            error.path.append(f"[{key!r}]")
            raise

    if keys.type == "string":

        def from_object(value: Any) -> Any:
            if type(value) is not dict:
                raise _wrong("an object (a map with string keys)", value)
            return [entry(key, item) for key, item in value.items()]

        return from_object

    def from_pairs(value: Any) -> Any:
        if type(value) is not list:
            raise _wrong("an array of [key, value] pairs", value)
        out = []
        for pair in value:
            if type(pair) is not list or len(pair) != 2:
                raise _wrong("a [key, value] pair", pair)
            out.append(entry(pair[0], pair[1]))
        return out

    return from_pairs


# Kinds whose non-null values are the parsed values themselves, of one Python type.
_PLAIN: dict[str, type] = {"string": str, "boolean": bool}


def _struct(schema: ConnectSchema) -> Convert:
    """A struct's converter: its field values as a tuple in field order (what Arrow builds a
    struct from). The common cases (null in an optional field, a string, a boolean, an integer
    in range) are read inline, without a call."""
    fields = [
        (
            f.name,
            _inner(f.schema),
            _converter(f.schema),
            f.schema.optional,
            _PLAIN.get(f.schema.kind),
            _RANGES.get(f.schema.kind),
        )
        for f in schema.fields
    ]

    def convert(value: Any) -> Any:
        if type(value) is not dict:
            raise _wrong("an object (a struct)", value)
        out = []
        append = out.append
        get = value.get
        for name, inner, full, optional, plain, bounds in fields:
            item = get(name)
            try:
                if item is None:
                    append(None if optional else full(None))
                elif type(item) is plain or (
                    bounds is not None and type(item) is int and bounds[0] <= item <= bounds[1]
                ):
                    append(item)
                else:
                    append(inner(item))
            except Mismatch as error:
                error.path.append(f".{name}")
                raise
        return tuple(out)

    return convert


# --- Arrow ---


def _storage_type(type_: pa.DataType) -> pa.DataType:
    """``type_`` with extension types (uuid) replaced by their storage types, names, nullability
    and metadata kept."""
    if isinstance(type_, pa.BaseExtensionType):
        return type_.storage_type
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_storage_type(f.type)) for f in type_])
    if pa.types.is_map(type_):
        return pa.map_(type_.key_field.with_type(_storage_type(type_.key_type)),
                       type_.item_field.with_type(_storage_type(type_.item_type)))  # fmt: skip
    if pa.types.is_large_list(type_):
        return pa.large_list(type_.value_field.with_type(_storage_type(type_.value_type)))
    return type_


_ARROW_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


@dataclass
class PayloadReader:
    """Reads the payloads of one Connect schema into Arrow (see the module docstring)."""

    schema: ConnectSchema

    def __post_init__(self) -> None:
        self.type = iceberg_type(self.schema)
        self.arrow = arrow_type(self.type)
        self.storage = _storage_type(self.arrow)
        self.columns = self.schema.kind == "struct"  # values built column by column
        self.convert = _inner(self.schema)

    def read(self, payload: Any) -> Any:
        """The storage value of one non-null payload (a tuple of column values for a struct);
        raises :class:`Mismatch` or :class:`Reparse`."""
        return self.convert(payload)

    def build(self, values: list[Any], errors: list[str | None]) -> pa.Array:
        """The Arrow array (the schema's Arrow type) of ``values`` (from :meth:`read`; None: a
        null row). A value Arrow refuses becomes a null row, with its cause in ``errors``."""
        try:
            return self._build(values)
        except _ARROW_ERRORS:
            pass
        for row, value in enumerate(values):  # find the rows Arrow refuses
            if value is None:
                continue
            try:
                self._build([value])
            except _ARROW_ERRORS as error:
                values[row] = None
                errors[row] = f"value does not fit its columns: {error}"
        return self._build(values)

    def _build(self, values: list[Any]) -> pa.Array:
        if not self.columns:
            array = pa.array(values, self.storage)
            return array if self.storage == self.arrow else array.view(self.arrow)
        count = len(values)
        nulls = np.fromiter((value is None for value in values), dtype=bool, count=count)
        if nulls.any():
            blank = (None,) * self.storage.num_fields
            values = [blank if value is None else value for value in values]
        if not count:
            return pa.nulls(0, self.arrow)
        children = []
        for index, column in enumerate(zip(*values, strict=True)):
            storage = self.storage.field(index).type
            child = pa.array(column, storage)
            target = self.arrow.field(index).type
            children.append(child if storage == target else child.view(target))
        mask = pa.array(nulls) if nulls.any() else None
        return pa.StructArray.from_arrays(children, fields=list(self.arrow), mask=mask)
