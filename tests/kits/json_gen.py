"""Hypothesis strategies for the JSON Schema codec: schemas (Draft-07 shapes the codec maps, and
some it keeps as JSON text), valid values of a parsed schema in canonical form, the column
values they decode to, and a liberal writer that spells the same value in the other ways JSON
allows (spacing, key order, escapes, number and date-time spellings, omitted nulls, duplicate
and unknown properties)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from hypothesis import strategies as st

from bergstream.plugins.value_codecs.json_schema.types import JsonNode

_NAMES = st.sampled_from(["a", "b", "id", "é", "x y", 'q"t', "amount", "n1", "\u2028"])

_LEAVES = [
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "string"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"enum": ["red", "green"]},
    {},  # any value: JSON text
    {"type": ["string", "integer"]},  # several types: JSON text
    {"anyOf": [{"type": "string"}, {"type": "null"}]},  # optional string
]


@st.composite
def _nullable(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    if isinstance(schema.get("type"), str) and draw(st.booleans()):
        return {**schema, "type": [schema["type"], "null"]}
    return schema


def _containers(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    objects = st.builds(
        lambda props, required: {
            "type": "object",
            "properties": props,
            "required": [name for name in props if name in required],
        },
        st.dictionaries(_NAMES, children, min_size=1, max_size=4),
        st.sets(_NAMES),
    )
    arrays = st.builds(lambda items: {"type": "array", "items": items}, children)
    maps = st.builds(lambda v: {"type": "object", "additionalProperties": v}, children)
    return st.one_of(objects, arrays, maps).flatmap(_nullable)


#: Schemas of any shape (the root may be a leaf).
SCHEMAS = st.recursive(st.sampled_from(_LEAVES).flatmap(_nullable), _containers, max_leaves=10)


@st.composite
def object_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A root object schema; some of its properties are moved to ``definitions`` or
    ``$defs`` and used through ``$ref``."""
    props = draw(st.dictionaries(_NAMES, SCHEMAS, min_size=1, max_size=6))
    required = draw(st.sets(st.sampled_from(sorted(props))))
    defs: dict[str, Any] = {}
    keyword = draw(st.sampled_from(["definitions", "$defs"]))
    for index, name in enumerate(list(props)):
        if draw(st.integers(0, 3)) == 0:
            defs[f"d{index}"] = props[name]
            props[name] = {"$ref": f"#/{keyword}/d{index}"}
    schema: dict[str, Any] = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": props,
        "required": sorted(required),
    }
    if defs:
        schema[keyword] = defs
    return schema


_JSON_ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_UTC_TIMES = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)
)


def _leaf(kind: str) -> st.SearchStrategy[Any]:
    """Canonical JSON values of a leaf kind."""
    if kind == "long":
        return st.integers(-(2**63), 2**63 - 1)
    if kind == "double":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text()
    if kind == "timestamptz":
        return _UTC_TIMES.map(lambda t: t.replace(tzinfo=None).isoformat() + "Z")
    if kind == "date":
        return st.dates().map(dt.date.isoformat)
    if kind == "uuid":
        return st.uuids().map(str)
    return _JSON_ANY


_ABSENT = object()


def values_of(node: JsonNode, canonical: bool = True) -> st.SearchStrategy[Any]:
    """Valid JSON values of ``node`` (Python objects as ``json.loads`` gives them), keys in
    schema order. ``canonical``: every property whose schema admits null is present."""
    inner = _inner_values(node, canonical)
    return st.none() | inner if node.nullable else inner


def _inner_values(node: JsonNode, canonical: bool) -> st.SearchStrategy[Any]:
    if node.kind == "list":
        assert node.items is not None
        return st.lists(values_of(node.items, canonical), max_size=3)
    if node.kind == "map":
        assert node.items is not None
        return st.dictionaries(st.text(max_size=4), values_of(node.items, canonical), max_size=3)
    if node.kind != "struct":
        return _leaf(node.kind)

    @st.composite
    def struct(draw: st.DrawFn) -> dict[str, Any]:
        out = {}
        for field in node.fields:
            may_omit = not field.listed_required and not (canonical and field.node.nullable)
            if may_omit and draw(st.booleans()):
                continue
            out[field.name] = draw(values_of(field.node, canonical))
        return out

    return struct()


def canonical_bytes(value: Any) -> bytes:
    """The canonical payload of a canonical value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def expected(node: JsonNode, value: Any) -> Any:
    """The column value (as ``to_pylist`` gives it) a valid JSON value of ``node`` decodes to;
    ``_ABSENT`` stands for a missing property."""
    if value is None or value is _ABSENT:
        return "null" if node.kind == "json" and value is None else None
    kind = node.kind
    if kind == "double":
        return float(value)
    if kind == "long":
        return int(value)
    if kind == "timestamptz":
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if kind == "date":
        return dt.date.fromisoformat(value)
    if kind == "uuid":
        return uuid.UUID(value)
    if kind == "json":
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if kind == "list":
        assert node.items is not None
        return [expected(node.items, item) for item in value]
    if kind == "map":
        assert node.items is not None
        return [(key, expected(node.items, item)) for key, item in value.items()]
    if kind == "struct":
        return {f.name: expected(f.node, value.get(f.name, _ABSENT)) for f in node.fields}
    return value


class LiberalWriter:
    """Writes a valid value of a node as JSON text, taking liberties drawn by hypothesis; the
    text decodes to the same column values (:func:`expected` of ``value``)."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def chance(self) -> bool:
        return self.draw(st.integers(0, 4)) == 0

    def space(self) -> str:
        return self.draw(st.sampled_from([" ", "\n", "\t ", "\r\n"])) if self.chance() else ""

    def string(self, text: str) -> str:
        if not self.chance():
            return json.dumps(text, ensure_ascii=False)
        return json.dumps(text, ensure_ascii=self.draw(st.booleans())).replace("/", "\\/")

    def write(self, node: JsonNode, value: Any) -> str:
        """The text of ``value``, a valid value of ``node``."""
        return self.space() + self._write(node, value) + self.space()

    def _write(self, node: JsonNode, value: Any) -> str:
        if value is None:
            return "null"
        kind = node.kind
        if kind == "long" and abs(value) < 2**53 and self.chance():
            return self.draw(st.sampled_from([f"{value}.0", f"{value}e0", f"{value}E+0"]))
        if kind == "double" and self.chance():
            if value.is_integer() and abs(value) < 2**53:
                return str(int(value)) + self.draw(st.sampled_from(["", ".00", "e0"]))
            return self.draw(st.sampled_from([f"{value:.17e}", f"{value!r}".upper()]))
        if kind == "timestamptz" and self.chance():
            moment = expected(node, value)
            zone = dt.timezone(dt.timedelta(minutes=self.draw(st.integers(-900, 900))))
            try:
                moment = moment.astimezone(zone)
            except OverflowError:
                return json.dumps(value)
            text = moment.isoformat(timespec=self.draw(st.sampled_from(["auto", "microseconds"])))
            return json.dumps(text.replace("+00:00", "Z") if self.chance() else text)
        if kind == "uuid" and self.chance():
            return json.dumps(value.upper())
        if kind in ("string", "timestamptz", "date", "uuid"):
            return self.string(value)
        if kind == "list":
            assert node.items is not None
            items = [self.write(node.items, item) for item in value]
            return "[" + self.space() + ",".join(items) + "]"
        if kind == "map":
            assert node.items is not None
            return self._object([(k, self.write(node.items, v)) for k, v in value.items()])
        if kind == "struct":
            return self._struct(node, value)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    def _struct(self, node: JsonNode, value: dict[str, Any]) -> str:
        entries = []
        for field in node.fields:
            if field.name in value:
                item = value[field.name]
                if (
                    item is None
                    and field.node.nullable
                    and not field.listed_required
                    and self.chance()
                ):
                    continue  # a null may be left out
                entries.append((field.name, self.write(field.node, item)))
        if self.chance():
            entries.append(("zz_unknown", "[1,2]"))
        if self.chance():
            entries = list(self.draw(st.permutations(entries)))
        if entries and self.chance():
            name, _ = entries[self.draw(st.integers(0, len(entries) - 1))]
            entries.insert(0, (name, '"overwritten"'))  # duplicate key, the later one wins
        return self._object(entries)

    def _object(self, entries: list[tuple[str, str]]) -> str:
        parts = [self.string(k) + self.space() + ":" + text for k, text in entries]
        return "{" + self.space() + ",".join(parts) + "}"
