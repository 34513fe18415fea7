"""The ``json-schema`` value codec: JSON values written with a registered JSON Schema.

Columns follow :mod:`.types`. A payload is UTF-8 JSON text (Confluent framing
stripped); each value is checked against the columns (a value that does not fit fails its row,
with the property path: ``field amount: expected number, got string``).

**Canonical form** (what :meth:`JsonSchemaCodec.encode` writes, and the only payloads that do
not keep their bytes): what confluent-kafka's ``JSONSerializer`` writes with the standard
library, ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)``, of a value whose
object keys are in schema ``properties`` order, with every property written (null as ``null``)
except a null in a property whose schema does not admit null, which is left out (the only way a
valid value can lack it). Numbers are written as Python writes them: a ``number`` holding ``1``
reads as ``1.0`` and re-encodes as ``1.0``, so the payload ``1`` keeps its bytes. A date-time is
written ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z`` in UTC (fraction only when not zero), a date
``YYYY-MM-DD``, a uuid in lower case with hyphens. A JSON-text column's text is spliced in as it
is. Everything else (other spacing or key order, escapes such as ``\\u00e9``, duplicate or
unknown properties, omitted nulls, other number or date-time spellings) keeps its bytes.

confluent-kafka switches to ``orjson.dumps`` when orjson is importable; its output is the same
except for floats below 1e-4 or from 1e16 up (``1e-05`` vs ``0.00001``), NaN and infinities,
so those rows keep their bytes. The check that a payload is canonical uses that fact: a row
whose values avoid those floats (and every other difference listed above) is canonical when
``orjson.dumps`` of what was parsed gives back the payload, which costs well under a
microsecond; other rows are checked by writing the canonical form in Python.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from pyiceberg.types import IcebergType

from bergstream.core.api import (
    DecodedValues,
    RegisteredSchema,
    arrow_type,
)
from bergstream.plugins.value_codecs.json_schema.encoder import JsonEncoder, compile_encoder
from bergstream.plugins.value_codecs.json_schema.program import JsonDecoder, compile_json
from bergstream.plugins.value_codecs.json_schema.types import (
    JsonNode,
    iceberg_type,
    parse_json_schema,
)
from bergstream.plugins.value_codecs.shared.schema_cache import Resolve, SchemaCache

__all__ = ["JsonSchemaCodec"]

# A converter turns a parsed JSON value into its column value; it clears state[0] when the
# orjson shortcut cannot prove the row canonical; state[1] says orjson parsed the row.
_Convert = Callable[[Any, list[bool]], Any]
_Write = Callable[[Any], str]

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_UTC = dt.UTC
_DATE_TIME = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:([Zz])|([+-])(\d\d):(\d\d))",
    re.ASCII,
)
# The canonical spelling, which fromisoformat reads quickly (other spellings take the long way).
_CANONICAL_DATE_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?Z", re.ASCII)
_DATE = re.compile(r"\d{4}-\d\d-\d\d", re.ASCII)
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}", re.ASCII)
_EXPECTED = {
    "long": "integer",
    "double": "number",
    "boolean": "boolean",
    "string": "string",
    "timestamptz": "date-time string",
    "date": "date string",
    "uuid": "uuid string",
    "struct": "object",
    "map": "object",
    "list": "array",
}
_JSON_NAMES = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}


class _Mismatch(Exception):
    """A value that does not fit its column; ``path`` is built innermost first."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.path: list[str] = []

    def describe(self) -> str:
        path = "".join(reversed(self.path)).lstrip(".")
        return f"field {path}: {self.cause}" if path else f"value: {self.cause}"


def _wrong(kind: str, value: Any) -> _Mismatch:
    got = _JSON_NAMES.get(type(value), type(value).__name__)
    return _Mismatch(f"expected {_EXPECTED[kind]}, got {got}")


def _timestamp_text(value: dt.datetime) -> str:
    """The canonical text of a date-time: UTC, ``Z``, microseconds only when not zero."""
    if value.tzinfo is not None:
        value = value.astimezone(_UTC).replace(tzinfo=None)
    return value.isoformat() + "Z"


# --- converters: parsed JSON -> column values (storage form: a uuid is its 16 bytes) ---


def _convert_long(value: Any, state: list[bool]) -> Any:
    if type(value) is int:
        if _LONG_MIN <= value <= _LONG_MAX:
            return value
        raise _Mismatch("integer out of the 64-bit range")
    if type(value) is float and value.is_integer():  # JSON Schema's integer admits 1.0
        state[0] = False
        if _LONG_MIN <= value <= _LONG_MAX:
            return int(value)
        raise _Mismatch("integer out of the 64-bit range")
    raise _wrong("long", value)


def _convert_double(value: Any, state: list[bool]) -> Any:
    if type(value) is float:
        # Where repr and orjson may write a float differently (and NaN, infinities).
        if value != 0.0 and not 1e-4 <= abs(value) < 1e16:
            state[0] = False
        return value
    if type(value) is int:
        state[0] = False
        try:
            return float(value)
        except OverflowError:
            raise _Mismatch("number out of the double range") from None
    raise _wrong("double", value)


def _convert_boolean(value: Any, state: list[bool]) -> Any:
    if type(value) is bool:
        return value
    raise _wrong("boolean", value)


def _convert_string(value: Any, state: list[bool]) -> Any:
    if type(value) is str:
        return value
    raise _wrong("string", value)


def _convert_timestamp(value: Any, state: list[bool]) -> Any:
    if type(value) is not str:
        raise _wrong("timestamptz", value)
    if _CANONICAL_DATE_TIME.fullmatch(value) is not None:
        try:
            parsed = dt.datetime.fromisoformat(value)  # reads "Z" as UTC
        except ValueError:
            raise _Mismatch(f"not a valid date-time: {value[:40]!r}") from None
        if value.endswith(".000000Z"):
            state[0] = False
        return parsed
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        raise _Mismatch(f"not an RFC 3339 date-time: {value[:40]!r}")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    micros = int((fraction + "00000")[:6]) if fraction else 0
    try:
        parsed = dt.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micros, _UTC
        )
        if not zulu:
            offset = dt.timedelta(hours=int(off_h), minutes=int(off_m))
            if offset >= dt.timedelta(days=1):
                raise ValueError("offset out of range")
            parsed = parsed - offset if sign == "+" else parsed + offset
    except (ValueError, OverflowError):
        raise _Mismatch(f"not a valid date-time: {value[:40]!r}") from None
    if state[0] and _timestamp_text(parsed) != value:
        state[0] = False
    return parsed


def _convert_date(value: Any, state: list[bool]) -> Any:
    if type(value) is not str:
        raise _wrong("date", value)
    if _DATE.fullmatch(value) is None:
        raise _Mismatch(f"not a date: {value[:40]!r}")
    try:
        return dt.date.fromisoformat(value)  # strict form: its isoformat is the same text
    except ValueError:
        raise _Mismatch(f"not a valid date: {value[:40]!r}") from None


def _convert_uuid(value: Any, state: list[bool]) -> Any:
    if type(value) is not str:
        raise _wrong("uuid", value)
    if _UUID.fullmatch(value) is None:
        raise _Mismatch(f"not a uuid: {value[:40]!r}")
    parsed = uuid.UUID(value)
    if state[0] and str(parsed) != value:
        state[0] = False
    return parsed.bytes


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class _Reparse(Exception):
    """orjson read a sub-value differently from the standard library: parse the row again."""


def _huge_float(value: Any) -> bool:
    """Whether ``value`` holds a float as large as an integer orjson reads as a float."""
    if type(value) is float:
        return abs(value) >= 2**63
    if type(value) is list:
        return any(_huge_float(item) for item in value)
    if type(value) is dict:
        return any(_huge_float(item) for item in value.values())
    return False


def _convert_json(value: Any, state: list[bool]) -> Any:
    if state[1] and _huge_float(value):
        # orjson reads an integer beyond 64 bits as a float, which would change the text.
        raise _Reparse
    state[0] = False
    return _json_text(value)


_LEAF_CONVERTERS: dict[str, _Convert] = {
    "long": _convert_long,
    "double": _convert_double,
    "boolean": _convert_boolean,
    "string": _convert_string,
    "timestamptz": _convert_timestamp,
    "date": _convert_date,
    "uuid": _convert_uuid,
    "json": _convert_json,
}


def _converter(node: JsonNode) -> _Convert:
    """The converter of ``node``'s values (JSON null handled here)."""
    inner = _inner_converter(node)
    if node.nullable:

        def nullable(value: Any, state: list[bool]) -> Any:
            return None if value is None else inner(value, state)

        return nullable
    return inner


def _inner_converter(node: JsonNode) -> _Convert:
    if node.kind in _LEAF_CONVERTERS:
        return _LEAF_CONVERTERS[node.kind]
    if node.kind == "list":
        assert node.items is not None
        return _list_converter(_converter(node.items))
    if node.kind == "map":
        assert node.items is not None
        return _map_converter(_converter(node.items))
    return _struct_converter(node)


def _list_converter(element: _Convert) -> _Convert:
    def convert(value: Any, state: list[bool]) -> Any:
        if type(value) is not list:
            raise _wrong("list", value)
        try:
            return [element(item, state) for item in value]
        except _Mismatch as error:
            for index, item in enumerate(value):  # find which one, now that speed is moot
                try:
                    element(item, [True, False])
                except _Mismatch:
                    error.path.append(f"[{index}]")
                    break
            raise

    return convert


def _map_converter(element: _Convert) -> _Convert:
    def convert(value: Any, state: list[bool]) -> Any:
        if type(value) is not dict:
            raise _wrong("map", value)
        try:
            return [(key, element(item, state)) for key, item in value.items()]
        except _Mismatch as error:
            for key, item in value.items():
                try:
                    element(item, [True, False])
                except _Mismatch:
                    error.path.append(f"[{json.dumps(key, ensure_ascii=False)}]")
                    break
            raise

    return convert


# Kinds whose values are the parsed values themselves, of one Python type.
_PLAIN: dict[str, type] = {"string": str, "boolean": bool}


def _struct_converter(node: JsonNode) -> _Convert:
    fields = [
        (f.name, _converter(f.node), f.listed_required, f.node.nullable, _PLAIN.get(f.node.kind))
        for f in node.fields
    ]
    names = tuple(f.name for f in node.fields)
    count = len(names)
    missing = object()

    def convert(value: Any, state: list[bool]) -> Any:
        if type(value) is not dict:
            raise _wrong("struct", value)
        out = {}
        for name, element, listed, _, plain in fields:
            item = value.get(name, missing)
            if type(item) is plain:  # a string or boolean: no call needed
                out[name] = item
                continue
            if item is missing:
                if listed:
                    error = _Mismatch("required property missing")
                    error.path.append(f".{name}")
                    raise error
                out[name] = None
                continue
            try:
                out[name] = element(item, state)
            except _Mismatch as error:
                error.path.append(f".{name}")
                raise
        if state[0] and (len(value) != count or tuple(value) != names):
            # Canonical keys: all but nulls of properties that do not admit null.
            written = tuple(
                name for name, _, _, nullable, _ in fields if nullable or out[name] is not None
            )
            if tuple(value) != written:
                state[0] = False
        return out

    return convert


# --- writers: column values -> canonical JSON text ---


def _write_double(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _write_uuid(value: Any) -> str:
    if not isinstance(value, uuid.UUID):
        value = uuid.UUID(bytes=bytes(value))
    return f'"{value}"'


_LEAF_WRITERS: dict[str, _Write] = {
    "long": int.__repr__,
    "double": _write_double,
    "boolean": lambda value: "true" if value else "false",
    "string": encode_basestring,
    "timestamptz": lambda value: f'"{_timestamp_text(value)}"',
    "date": lambda value: f'"{value.isoformat()}"',
    "uuid": _write_uuid,
    "json": str,
}


def _writer(node: JsonNode) -> _Write:
    """The writer of ``node``'s values; None is written ``null``."""
    inner = _inner_writer(node)

    def write(value: Any) -> str:
        return "null" if value is None else inner(value)

    return write


def _inner_writer(node: JsonNode) -> _Write:
    if node.kind in _LEAF_WRITERS:
        return _LEAF_WRITERS[node.kind]
    if node.kind == "list":
        assert node.items is not None
        element = _writer(node.items)
        return lambda value: "[" + ",".join([element(item) for item in value]) + "]"
    if node.kind == "map":
        assert node.items is not None
        entry = _writer(node.items)
        return lambda value: (
            "{" + ",".join([encode_basestring(k) + ":" + entry(v) for k, v in value]) + "}"
        )
    fields = [
        (f.name, encode_basestring(f.name) + ":", _writer(f.node), f.node.nullable)
        for f in node.fields
    ]

    def write_struct(value: Any) -> str:
        parts = []
        for name, prefix, write, nullable in fields:
            item = value.get(name)
            if item is not None or nullable:
                parts.append(prefix + write(item))
        return "{" + ",".join(parts) + "}"

    return write_struct


def _storage_type(type_: pa.DataType) -> pa.DataType:
    """``type_`` with extension types (uuid) replaced by their storage types."""
    if isinstance(type_, pa.BaseExtensionType):
        return type_.storage_type
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_storage_type(f.type)) for f in type_])
    if pa.types.is_map(type_):
        return pa.map_(type_.key_field, type_.item_field.with_type(_storage_type(type_.item_type)))
    if pa.types.is_large_list(type_):
        return pa.large_list(type_.value_field.with_type(_storage_type(type_.value_type)))
    return type_


def _payloads(values: pa.Array, skip: int) -> tuple[memoryview, np.ndarray]:
    """One view of the data bytes and the ``len + 1`` offsets of each payload's start (after
    ``skip`` header bytes) and end."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not pa.types.is_large_binary(values.type):
        values = values.cast(pa.large_binary())
    if values.null_count:
        raise ValueError("payloads must not be null (a tombstone has no payload to decode)")
    _, offsets_buffer, data_buffer = values.buffers()
    count = len(values)
    if offsets_buffer is None or count == 0:
        return memoryview(b""), np.zeros(count + 1, dtype=np.int64)
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[
        values.offset : values.offset + count + 1
    ]
    # Arrow's buffers are signed chars ("b"): as unsigned bytes, slices compare equal to bytes.
    data = memoryview(data_buffer).cast("B") if data_buffer is not None else memoryview(b"")
    return data, offsets


@dataclass(frozen=True)
class _Compiled:
    type: IcebergType
    arrow: pa.DataType
    storage: pa.DataType
    convert: _Convert
    write: _Write
    fast: JsonDecoder | None  # the compiled reader of canonical rows (None: JSON-text columns)
    encoder: JsonEncoder  # the compiled writer

    def decode(self, values: pa.Array, skip: int = 0) -> DecodedValues:
        """Canonical rows through the compiled reader, the others through
        :meth:`decode_python`, which gives the same for any row."""
        if self.fast is None:
            return self.decode_python(values, skip)
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        fast, fallback = self.fast.decode(values, skip)
        rows = len(fallback)
        keep = np.zeros(rows, dtype=bool)
        errors: list[str | None] = [None] * rows
        slow_rows = np.flatnonzero(fallback)
        if slow_rows.size == 0:
            return DecodedValues(values=fast, keep_bytes=keep, errors=errors)
        data, offsets = _payloads(values, skip)
        out, slow_keep, slow_errors = self._decode_rows(data, offsets, skip, slow_rows.tolist())
        slow = self._build(out, slow_errors, slow_keep)
        keep[slow_rows] = slow_keep
        for index, row in enumerate(slow_rows.tolist()):
            errors[row] = slow_errors[index]
        # Every row from the array that has it: fast rows first, then the slow ones.
        order = np.arange(rows, dtype=np.int64)
        order[slow_rows] = rows + np.arange(slow_rows.size, dtype=np.int64)
        merged = pa.concat_arrays([fast, slow]).take(pa.array(order))
        return DecodedValues(values=merged, keep_bytes=keep, errors=errors)

    def decode_python(self, values: pa.Array, skip: int = 0) -> DecodedValues:
        """Every row decoded by parsing it in Python (the reference for :meth:`decode`)."""
        data, offsets = _payloads(values, skip)
        out, keep, errors = self._decode_rows(data, offsets, skip, range(len(offsets) - 1))
        return DecodedValues(values=self._build(out, errors, keep), keep_bytes=keep, errors=errors)

    def _decode_rows(
        self, data: memoryview, offsets: np.ndarray, skip: int, which: Sequence[int]
    ) -> tuple[list[Any], np.ndarray, list[str | None]]:
        """Values, keep flags and errors of the rows ``which`` (in that order)."""
        rows = len(which)
        out: list[Any] = [None] * rows
        keep = np.ones(rows, dtype=bool)
        errors: list[str | None] = [None] * rows
        convert, write = self.convert, self.write
        bounds = offsets.tolist()
        for i, row in enumerate(which):
            payload = data[bounds[row] + skip : bounds[row + 1]]
            exact = True
            try:
                parsed = orjson.loads(payload)
            except orjson.JSONDecodeError:
                exact = False
                try:
                    parsed = json.loads(str(payload, "utf-8"))
                except UnicodeDecodeError as error:
                    errors[i] = f"corrupt payload: not UTF-8 ({error.reason} at byte {error.start})"
                    continue
                except json.JSONDecodeError as error:
                    errors[i] = _parse_error(error)
                    continue
                except (ValueError, RecursionError) as error:
                    errors[i] = f"corrupt payload: {error}"
                    continue
            state = [True, exact]
            try:
                try:
                    value = convert(parsed, state)
                except _Reparse:
                    exact, state = False, [False, False]
                    value = convert(json.loads(str(payload, "utf-8")), state)
            except _Mismatch as error:
                errors[i] = error.describe()
                continue
            except RecursionError:
                errors[i] = "corrupt payload: nested too deeply"
                continue
            if value is None:
                errors[i] = "value: the payload is JSON null"
                continue
            if exact and state[0]:
                keep[i] = orjson.dumps(parsed) != payload
            else:
                try:
                    keep[i] = write(value).encode("utf-8") != payload
                except UnicodeEncodeError:
                    errors[i] = "corrupt payload: a string holds a lone surrogate escape"
                    continue
            out[i] = value
        return out, keep, errors

    def _build(self, out: list[Any], errors: list[str | None], keep: np.ndarray) -> pa.Array:
        try:
            array = pa.array(out, self.storage)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            for i, value in enumerate(out):  # find the rows Arrow refuses
                if value is None:
                    continue
                try:
                    pa.array([value], self.storage)
                except (pa.ArrowException, ValueError, TypeError, OverflowError) as error:
                    out[i], keep[i] = None, True
                    errors[i] = f"value does not fit its columns: {error}"
            array = pa.array(out, self.storage)
        return array if self.storage == self.arrow else array.view(self.arrow)

    def encode(self, values: pa.Array) -> pa.Array:
        """The canonical payloads of ``values``: by the compiled writer when they have the
        type :meth:`decode` gives, else by :meth:`encode_python` (the same bytes)."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if not self.encoder.accepts(values):
            return self.encode_python(values)
        if values.null_count:
            raise ValueError("a null row has no payload to encode")
        return self.encoder.encode(values)

    def encode_python(self, values: pa.Array) -> pa.Array:
        """The canonical payloads of ``values``, written row by row in Python."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        write = self.write
        payloads = []
        for value in values.to_pylist():
            if value is None:
                raise ValueError("a null row has no payload to encode")
            payloads.append(write(value).encode("utf-8"))
        return pa.array(payloads, pa.large_binary())


def _parse_error(error: json.JSONDecodeError) -> str:
    if error.msg == "Extra data":
        return f"trailing bytes after the JSON value (at char {error.pos})"
    return f"corrupt payload: {error.msg} at char {error.pos}"


def _build(node: JsonNode) -> _Compiled:
    """The compiled form of a parsed JSON Schema."""
    type_ = iceberg_type(node)
    arrow = arrow_type(type_)
    program = compile_json(node)
    fast = JsonDecoder(program, arrow) if program is not None else None
    write = _writer(node)
    encoder = JsonEncoder(compile_encoder(node), arrow, write)
    return _Compiled(type_, arrow, _storage_type(arrow), _converter(node), write, fast, encoder)


class JsonSchemaCodec:
    """JSON values written with a registered JSON Schema (Confluent framing stripped)."""

    schema_types: tuple[str, ...] = ("JSON",)

    def __init__(self) -> None:
        self._schemas: SchemaCache[JsonNode, _Compiled] = SchemaCache(
            "JSON", "a JSON Schema", parse_json_schema, _build
        )

    def iceberg_type(self, schema: RegisteredSchema, resolve: Resolve) -> IcebergType:
        """The Iceberg type of values written with ``schema`` (placeholder field ids); raises
        :class:`SchemaNotExpressible`."""
        return self._schemas.get(schema, resolve).type

    def arrow_type(self, schema: RegisteredSchema) -> pa.DataType:
        """The Arrow type :meth:`decode` gives for ``schema``."""
        return self._schemas.get(schema, None).arrow

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """Decode ``payloads`` (``large_binary``, no nulls); a bad payload gives a null row,
        ``keep_bytes`` and its cause, never an exception."""
        return self._schemas.get(schema, None).decode(payloads)

    def decode_framed(
        self, schema: RegisteredSchema, values: pa.Array, header: int
    ) -> DecodedValues:
        """:meth:`decode` of the payloads of ``values``, each one after a ``header`` of that
        many bytes which every value has (the Confluent framing a caller checked)."""
        return self._schemas.get(schema, None).decode(values, skip=header)

    def encode(self, schema: RegisteredSchema, values: pa.Array) -> pa.Array:
        """The canonical payloads (``large_binary``) of ``values`` (the type :meth:`decode`
        gives, no null rows)."""
        return self._schemas.get(schema, None).encode(values)
