"""Schemaless JSON: the shapes of plain JSON values, declared as JSON Schemas that the
``json-schema`` codec reads, so a topic of plain JSON objects gets columns, evolution and the
raw-bytes rule exactly as a topic written with registered JSON Schemas does.

**Kinds.** Every value has a kind: ``null``, ``boolean``, ``integer`` (fits 64 bits),
``number``, ``string``, ``object`` (its fields' kinds) or ``array`` (its elements' kind). Kinds
join: null joins anything into a nullable kind, ``integer`` and ``number`` into ``number``,
objects field by field, arrays element-wise; anything else conflicts (``mixed``).

**Shapes.** A row's shape is its keys in the order its text has them and each value's kind, at
every level (an array's kind is the join of its elements' kinds): nothing but the row itself.
Each shape is declared as a JSON Schema: the key order, and per key a type that fits the key's
column (rows of different shapes may declare the same schema: they share it). The column is the
table's (``columns``) if it has one; else the one the window (the batch looked at together)
makes, from the join of the key's kinds over the whole window:

- ``integer`` → long, ``number`` (or integers and numbers) → double, ``boolean``, ``string``,
  an object without conflicts → struct, an array without conflicts → list (a list of strings
  when every array is empty), a key that is only ever null → string;
- a conflict anywhere in a key's values (also inside its objects and arrays), or only empty
  objects → a string column:
  a string value is its text, any other value its compact JSON text (``5``, ``{"a":1}``).

(the window's choice is then folded into the table; see :func:`declare_shapes`). Per shape, a
key's declared type follows its column: a long column takes integers, a double column integers
and numbers (an integer spelled ``12`` then reads ``12.0`` and keeps its bytes), a string column
strings as they are and every other kind as JSON text, a struct column objects (new fields
added), a list column arrays. A kind its column cannot take (a number where the table has a
long) is declared as it is: the table cannot widen in place (Iceberg has no long → double
promotion), so the fold rejects that shape and its rows keep their bytes with the cause, as the
evolution rule of registered schemas does.

Declaring against a table's columns depends on the row's shape alone, never on the other rows of
the batch, so workers that decode a batch in pieces, ISK that reads the same records in other
batches and the driver that folded them all declare the same schemas. A shape's schema id is a
hash of its declared schema text (31 bits).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    StringType,
    StructType,
)

__all__ = [
    "MAX_SHAPES",
    "Kind",
    "ObservedRows",
    "Shape",
    "declare_shapes",
    "join",
    "joined_kinds",
    "kind_of",
    "observe",
    "shape_id",
    "within_kinds",
]

#: Distinct shapes one window of records may have (a pipeline worker's Arrow batch, a range ISK
#: reads from Kafka); rows of further shapes keep their bytes. Folds of telling values gathered
#: from such windows are not bounded again.
MAX_SHAPES = 1024

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_SCALARS = {type(None): "null", bool: "boolean", float: "number", str: "string"}


@dataclass(frozen=True)
class Kind:
    """What a JSON value (or several, joined) is; see the module docstring."""

    name: str  # null, boolean, integer, number, string, object, array, mixed
    nullable: bool = False
    fields: tuple[tuple[str, Kind], ...] = ()  # object: field kinds, in first-seen order
    items: Kind | None = None  # array: the elements' join (None: no element seen)

    def field(self, name: str) -> Kind | None:
        """The kind of an object's field ``name``, if seen."""
        for key, kind in self.fields:
            if key == name:
                return kind
        return None

    @property
    def clean(self) -> bool:
        """Whether no conflict is anywhere in it."""
        if self.name == "mixed":
            return False
        if self.items is not None and not self.items.clean:
            return False
        return all(kind.clean for _, kind in self.fields)


_NULL = Kind("null", True)


def kind_of(value: Any) -> Kind:
    """The kind of a parsed JSON value (``orjson.loads`` or ``json.loads``)."""
    name = _SCALARS.get(type(value))
    if name is not None:
        return _NULL if name == "null" else Kind(name)
    if type(value) is int:
        return Kind("integer" if _LONG_MIN <= value <= _LONG_MAX else "number")
    if type(value) is dict:
        return Kind("object", fields=tuple((k, kind_of(v)) for k, v in value.items()))
    if type(value) is list:
        items: Kind | None = None
        for element in value:
            kind = kind_of(element)
            items = kind if items is None else join(items, kind)
        return Kind("array", items=items)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def join(a: Kind, b: Kind) -> Kind:
    """The kind holding both ``a`` and ``b``."""
    if a == b:
        return a
    nullable = a.nullable or b.nullable
    if a.name == "null":
        return _nullable(b, True)
    if b.name == "null":
        return _nullable(a, True)
    if a.name == b.name == "object":
        fields = dict(a.fields)
        for key, kind in b.fields:
            fields[key] = join(fields[key], kind) if key in fields else kind
        return Kind("object", nullable, tuple(fields.items()))
    if a.name == b.name == "array":
        if a.items is None or b.items is None:
            items = a.items if b.items is None else b.items
        else:
            items = join(a.items, b.items)
        return Kind("array", nullable, items=items)
    if a.name == b.name:
        return _nullable(a, nullable)
    if {a.name, b.name} == {"integer", "number"}:
        return Kind("number", nullable)
    return Kind("mixed", nullable)


def _nullable(kind: Kind, nullable: bool) -> Kind:
    if kind.nullable == nullable:
        return kind
    return Kind(kind.name, nullable, kind.fields, kind.items)


# --------------------------------------------------------------------------- observing rows


@dataclass
class Shape:
    """One shape of a window: its keys and, per key, its value's kind."""

    keys: tuple[str, ...]
    kinds: list[Kind]
    rows: int = 0


@dataclass
class ObservedRows:
    """Per row of a window, the index of its shape in ``shapes`` (``-1``: no shape, and why in
    ``errors``), and the shapes in order of first appearance."""

    shape_of: np.ndarray
    errors: list[str | None]
    shapes: list[Shape] = field(default_factory=list)
    #: the first row of each shape: folding only these declares what folding the whole window
    #: declares
    telling: list[int] = field(default_factory=list)


def _parse(payload: bytes | memoryview) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        pass
    # the standard library reads what orjson refuses but JSON allows (integers past 64 bits)
    return json.loads(str(payload, "utf-8"))


_ShapeKey = tuple[tuple[str, ...], tuple[Kind, ...]]


def _row_shape(payload: bytes | memoryview) -> _ShapeKey | str:
    """A payload's shape (its keys in text order and their values' kinds), or why it has
    none."""
    try:
        parsed = _parse(payload)
    except UnicodeDecodeError as error:
        return f"corrupt payload: not UTF-8 ({error.reason} at byte {error.start})"
    except json.JSONDecodeError as error:
        return f"corrupt payload: {error.msg} at char {error.pos}"
    except (ValueError, RecursionError) as error:
        return f"corrupt payload: {error}"
    if type(parsed) is not dict:
        got = "null" if parsed is None else kind_of(parsed).name
        return f"value: not a JSON object but {'an' if got[0] in 'aeio' else 'a'} {got}"
    return tuple(parsed), tuple(kind_of(v) for v in parsed.values())


class _Observer:
    """Builds an :class:`ObservedRows` as rows (or groups of rows with one shape) come in row
    order."""

    def __init__(self, count: int, limit: int | None) -> None:
        self.found = ObservedRows(np.full(count, -1, np.int64), [None] * count)
        self.limit = limit
        self.index: dict[_ShapeKey, int] = {}

    def add(self, row: int, shape: _ShapeKey | str) -> int | str:
        """The shape index of ``row`` (the first of its group) with ``shape``, or its error."""
        if isinstance(shape, str):
            return shape
        position = self.index.get(shape)
        if position is None:
            found = self.found
            if self.limit is not None and len(found.shapes) >= self.limit:
                return (
                    f"more than {self.limit} distinct shapes in one batch: this one is kept as "
                    "bytes"
                )
            position = self.index[shape] = len(found.shapes)
            found.shapes.append(Shape(shape[0], list(shape[1])))
            found.telling.append(row)
        return position


def observe(values: pa.Array, limit: int | None = MAX_SHAPES, *, fast: bool = True) -> ObservedRows:
    """The shapes of a window of plain JSON payloads (``large_binary``, nulls allowed: a null
    row has no shape and no error). A payload that is not JSON, or not a JSON object, has no
    shape; its error says why; so has a row of a shape beyond the first ``limit`` (None: no
    bound).

    ``fast`` (the same result either way) lets the compiled scanner of
    :mod:`.scan` group rows by skeleton first, so only the first row of each
    skeleton (and the rows it leaves alone) is parsed in Python."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if fast:
        return _observe_fast(values, limit)
    observer = _Observer(len(values), limit)
    found = observer.found
    for row, scalar in enumerate(values):
        payload = scalar.as_buffer() if scalar.is_valid else None
        if payload is None:
            continue
        position = observer.add(row, _row_shape(memoryview(payload)))
        if isinstance(position, str):
            found.errors[row] = position
            continue
        found.shapes[position].rows += 1
        found.shape_of[row] = position
    return found


#: Distinct skeletons the scanner tells apart in one window (rows of further ones are parsed
#: one by one): many more than shapes, as rows of one shape may have many skeletons.
_MAX_SKELETONS = 65_536


def _observe_fast(values: pa.Array, limit: int | None) -> ObservedRows:
    from bergstream.plugins.value_codecs.plain_json.scan import SLOW_ROW, scan_skeletons

    if values.type != pa.large_binary():
        values = values.cast(pa.large_binary())
    count = len(values)
    observer = _Observer(count, limit)
    found = observer.found
    if not count:
        return found
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], np.int64)[values.offset : values.offset + count + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(1, np.uint8)
    valid = ~np.asarray(values.is_null(), dtype=bool) if values.null_count else np.ones(count, bool)
    skeleton_of, first_rows = scan_skeletons(data, offsets, valid, _MAX_SKELETONS)
    # in row order: the first row of each skeleton (standing for all its rows) and each row
    # the scanner left alone
    slow = np.flatnonzero(skeleton_of == SLOW_ROW)
    events = np.concatenate([first_rows, slow])
    events.sort(kind="stable")
    by_skeleton = np.full(len(first_rows), -1, np.int64)
    skeleton_errors: dict[int, str] = {}
    starts, ends = offsets[:-1], offsets[1:]
    for row in events.tolist():
        payload = memoryview(data[starts[row] : ends[row]])
        position = observer.add(row, _row_shape(payload))
        skeleton = int(skeleton_of[row])
        if skeleton >= 0:
            if isinstance(position, str):
                skeleton_errors[skeleton] = position
            else:
                by_skeleton[skeleton] = position
        elif isinstance(position, str):
            found.errors[row] = position
        else:
            found.shape_of[row] = position
    shape_of = found.shape_of
    scanned = skeleton_of >= 0
    shape_of[scanned] = by_skeleton[skeleton_of[scanned]]
    if skeleton_errors:
        failed = np.zeros(len(first_rows), bool)
        failed[list(skeleton_errors)] = True
        for row in np.flatnonzero(scanned & failed[np.maximum(skeleton_of, 0)]).tolist():
            found.errors[row] = skeleton_errors[int(skeleton_of[row])]
    tally = np.bincount(shape_of[shape_of >= 0], minlength=len(found.shapes))
    for shape, rows in zip(found.shapes, tally.tolist(), strict=True):
        shape.rows = rows
    return found


# --------------------------------------------------------------------------- declaring


@dataclass(frozen=True)
class _Column:
    """A column as declaring sees it (from the table's Iceberg type or a window's join)."""

    kind: str  # long, double, boolean, string, struct, list, other
    fields: tuple[tuple[str, _Column], ...] = ()
    element: _Column | None = None

    def field(self, name: str) -> _Column | None:
        for key, column in self.fields:
            if key == name:
                return column
        return None


_STRING = _Column("string")


def _column_of_type(type_: IcebergType) -> _Column:
    if isinstance(type_, LongType | IntegerType):
        return _Column("long")
    if isinstance(type_, DoubleType | FloatType):
        return _Column("double")
    if isinstance(type_, BooleanType):
        return _Column("boolean")
    if isinstance(type_, StringType):
        return _STRING
    if isinstance(type_, StructType):
        return _Column(
            "struct", tuple((f.name, _column_of_type(f.field_type)) for f in type_.fields)
        )
    if isinstance(type_, ListType):
        return _Column("list", element=_column_of_type(type_.element_type))
    return _Column("other")


def _column_of_kind(kind: Kind) -> _Column:
    """The column a window makes for a key whose values join to ``kind``."""
    if not kind.clean:
        return _STRING
    simple = {"null": "string", "boolean": "boolean", "integer": "long", "number": "double"}
    if kind.name in simple:
        return _Column(simple[kind.name])
    if kind.name == "object" and kind.fields:  # an empty object alone has no columns: text
        return _Column("struct", tuple((k, _column_of_kind(v)) for k, v in kind.fields))
    if kind.name == "array":
        return _Column(
            "list", element=_STRING if kind.items is None else _column_of_kind(kind.items)
        )
    return _STRING


def _typed(json_type: str, nullable: bool) -> dict[str, Any]:
    return {"type": [json_type, "null"] if nullable else json_type}


def _of_column(column: _Column, nullable: bool) -> dict[str, Any]:
    """The JSON Schema of ``column`` itself (for a key whose values are all null)."""
    if column.kind == "struct":
        return {
            **_typed("object", nullable),
            "properties": {k: _of_column(c, True) for k, c in column.fields},
        }
    if column.kind == "list":
        assert column.element is not None
        return {**_typed("array", nullable), "items": _of_column(column.element, False)}
    names = {"long": "integer", "double": "number", "boolean": "boolean"}
    return _typed(names.get(column.kind, "string"), nullable)


def _of_kind(kind: Kind) -> dict[str, Any]:
    """The JSON Schema that declares ``kind`` as it is (its own column)."""
    return _declare(_column_of_kind(kind), kind)


def _declare(column: _Column, kind: Kind, joined: Kind | None = None) -> dict[str, Any]:
    """The JSON Schema of values of ``kind`` read into ``column``: its column's type where that
    takes them, else the kind's own (which the fold then refuses). A nested field ``column``
    lacks takes the column the window's join there makes (``joined``: the window's kind at this
    path; None: the field's own kind)."""
    nullable = kind.nullable
    if kind.name == "null":
        return _of_column(column, True)
    if column.kind == "string":
        if kind.name == "string":
            return _typed("string", nullable)
        return {}  # JSON text (a JSON null there is the text "null"; absent stays null)
    if column.kind == "long" and kind.name == "integer":
        return _typed("integer", nullable)
    if column.kind == "double" and kind.name in ("integer", "number"):
        return _typed("number", nullable)
    if column.kind == "boolean" and kind.name == "boolean":
        return _typed("boolean", nullable)
    if column.kind == "struct" and kind.name == "object" and not kind.fields:
        return _of_column(column, nullable)  # {} into a struct: its fields, all null
    if column.kind == "struct" and kind.name == "object" and kind.clean:
        properties = {}
        for key, child in kind.fields:
            wide = joined.field(key) if joined is not None and joined.name == "object" else None
            inner = column.field(key) or _column_of_kind(wide or child)
            properties[key] = _declare(inner, child, wide)
        return {**_typed("object", nullable), "properties": properties}
    if column.kind == "list" and kind.name == "array" and kind.clean:
        assert column.element is not None
        items = (
            _of_column(column.element, False)
            if kind.items is None
            else _declare(
                column.element,
                kind.items,
                joined.items if joined is not None and joined.name == "array" else None,
            )
        )
        return {**_typed("array", nullable), "items": items}
    if column.kind == "other":
        return {}  # a column inference never makes: JSON text, which the fold checks
    return _of_kind(kind)


def joined_kinds(shapes: Iterable[Shape]) -> dict[str, Kind]:
    """Each top-level key's kind over ``shapes`` taken together, keys in first-seen order (what
    a window's columns are made of)."""
    joined: dict[str, Kind] = {}
    for shape in shapes:
        for key, kind in zip(shape.keys, shape.kinds, strict=True):
            joined[key] = join(joined[key], kind) if key in joined else kind
    return joined


def within_kinds(shapes: Iterable[Shape], joined: Mapping[str, Kind]) -> bool:
    """Whether ``shapes`` have only keys of ``joined``, each of a kind its joined kind holds as
    it is (joining them in would change nothing)."""
    for shape in shapes:
        for key, kind in zip(shape.keys, shape.kinds, strict=True):
            known = joined.get(key)
            if known is None or join(known, kind) != known:
                return False
    return True


def declare_shapes(
    shapes: Iterable[Shape],
    columns: Mapping[str, IcebergType] | None = None,
    *,
    window: bool = False,
) -> list[str]:
    """The JSON Schema text of each shape of one window, given the table's columns by name
    (top-level fields of the values; None or empty for a new table).

    A key the table has no column for is declared as the column the whole window makes with
    ``window``, and as its own kind without: folding a window's ``window`` declarations makes
    the columns; declaring again against them (``window`` off) gives what any other batch of the
    same rows declares, keys without a column included (they are in refused shapes only)."""
    shapes = list(shapes)
    joined = joined_kinds(shapes) if window else {}
    table = {name: _column_of_type(type_) for name, type_ in (columns or {}).items()}
    texts = []
    for shape in shapes:
        properties = {}
        for key, kind in zip(shape.keys, shape.kinds, strict=True):
            column = table.get(key) or _column_of_kind(joined.get(key, kind))
            properties[key] = _declare(column, kind, joined.get(key))
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if not properties:  # {}: a record with no fields (no columns), not JSON text
            schema["additionalProperties"] = False
        texts.append(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    return texts


def shape_id(text: str) -> int:
    """The schema id of a declared shape: 31 bits of its text's SHA-256."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") & 0x7FFFFFFF
