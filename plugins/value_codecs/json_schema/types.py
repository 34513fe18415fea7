"""JSON Schema (Draft-07 and later) -> a tree of :class:`JsonNode` -> an Iceberg type.

The mapping, for the part of JSON Schema that describes the *shape* of values:

- ``type: object`` with ``properties`` -> struct, fields in ``properties`` order. A property
  listed in ``required`` is a required field unless its schema admits null; every other one is
  optional (the table layout makes top-level columns optional anyway). ``additionalProperties``
  and combinators next to ``properties`` do not change the columns: properties a value has
  beyond the schema's are not decoded (the row keeps its bytes).
- ``type: object`` at the top, with no ``properties`` and ``additionalProperties: false``: a
  record with no fields (no columns; the value is always ``{}``).
- ``type: object`` with no ``properties`` and ``additionalProperties: <schema>`` ->
  map<string, T>.
- ``type: array`` with ``items: <schema>`` -> list<T>.
- ``integer`` -> long; ``number`` -> double; ``boolean``; ``string``, except ``format:
  date-time`` -> timestamptz, ``format: date`` -> date and ``format: uuid`` -> uuid. ``enum``
  whose members are all strings (and maybe null) -> string.
- ``type: [T, "null"]`` -> optional T; so is ``anyOf``/``oneOf`` of one schema and
  ``{"type": "null"}`` (the form pydantic writes for ``Optional``), and of several schemas that
  all map to the same type. ``allOf`` of a single schema is that schema.
- Local ``$ref`` (``#/definitions/X``, ``#/$defs/X``, any ``#/...`` JSON pointer) is resolved,
  and so is a ``$ref`` to a registry reference by its name (``other.json`` or
  ``other.json#/$defs/X``). A reference to a schema that is being expanded (a recursive type) is
  refused with :class:`SchemaNotExpressible` naming the property path, as Iceberg has no
  recursive types.

**The JSON-text rule.** Everything else (no ``type``, ``true``/``{}``, several non-null types,
``anyOf``/``oneOf``/``allOf`` whose branches differ, tuple ``items``, an object with neither
``properties`` nor an ``additionalProperties`` schema, ``null`` alone, non-string enums) is a
*string* column holding that sub-value's JSON text, written compactly as
``json.dumps(v, separators=(",", ":"), ensure_ascii=False)`` writes it (so a JSON ``null``
there is the text ``null``, and an absent property is a null column value).

Field ids are placeholders, unique within the type, assigned in pre-order (a struct numbers its
fields, then the fields' own types; a list its element; a map its key and value).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    IcebergType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
    UUIDType,
)

from bergstream.core.api import RegisteredSchema, SchemaNotExpressible, SchemaReference

__all__ = ["JsonField", "JsonNode", "iceberg_type", "parse_json_schema"]

#: Node kinds that are leaves, with their Iceberg types (``json`` is the JSON-text rule).
_LEAF_TYPES: dict[str, IcebergType] = {
    "long": LongType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "string": StringType(),
    "timestamptz": TimestamptzType(),
    "date": DateType(),
    "uuid": UUIDType(),
    "json": StringType(),
}

_SIMPLE = {"integer": "long", "number": "double", "boolean": "boolean"}
_FORMATS = {"date-time": "timestamptz", "date": "date", "uuid": "uuid"}

Resolve = Callable[[SchemaReference], RegisteredSchema]


@dataclass(frozen=True)
class JsonField:
    """A struct field: its property name, its node, and whether ``required`` lists it."""

    name: str
    node: JsonNode
    listed_required: bool

    @property
    def required(self) -> bool:
        """Whether the Iceberg field is required: listed in ``required``, null not admitted
        (a JSON-text field always holds text when the property is there)."""
        return self.listed_required and not self.node.nullable


@dataclass(frozen=True)
class JsonNode:
    """The shape of one JSON value: ``kind`` is ``struct``, ``list``, ``map`` or a leaf kind
    (``long``, ``double``, ``boolean``, ``string``, ``timestamptz``, ``date``, ``uuid``,
    ``json``); ``nullable`` says JSON null is a valid value (never for ``json``, whose null is
    the text ``null``)."""

    kind: str
    nullable: bool = False
    fields: tuple[JsonField, ...] = ()
    items: JsonNode | None = None  # list element or map value

    def with_nullable(self, nullable: bool) -> JsonNode:
        """This node, admitting null or not (a ``json`` node never does)."""
        nullable = nullable and self.kind != "json"
        if nullable == self.nullable:
            return self
        return JsonNode(self.kind, nullable, self.fields, self.items)


_JSON_TEXT = JsonNode("json")


def parse_json_schema(schema: RegisteredSchema, resolve: Resolve | None = None) -> JsonNode:
    """The tree of ``schema``; references are fetched with ``resolve``. Raises
    :class:`SchemaNotExpressible` for text that is not a JSON schema, a recursive ``$ref`` or
    a ``$ref`` that cannot be resolved."""
    root = _load(schema.schema, "the schema")
    parser = _Parser(resolve, {ref.name: ref for ref in schema.references})
    parser.expanding.append((id(root), ""))  # a "$ref": "#" inside is recursive
    return parser.node(root, root, "", "")


def iceberg_type(node: JsonNode) -> IcebergType:
    """The Iceberg type of a whole value of ``node`` (placeholder field ids, pre-order)."""
    return _Ids().type_of(node)


def _load(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise SchemaNotExpressible(f"{what} is not JSON: {error}") from None


def _where(path: str) -> str:
    return f"property {path}" if path else "the root schema"


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


class _Parser:
    """Conversion state: referenced documents loaded so far, references being expanded."""

    def __init__(self, resolve: Resolve | None, references: dict[str, SchemaReference]) -> None:
        self.resolve = resolve
        self.references = references
        self.documents: dict[str, Any] = {}
        self.expanding: list[tuple[int, str]] = []

    def node(self, schema: Any, doc: Any, doc_name: str, path: str) -> JsonNode:
        """The node of ``schema`` (a part of document ``doc``) found at property ``path``."""
        if isinstance(schema, bool):
            return _JSON_TEXT
        if not isinstance(schema, dict):
            raise SchemaNotExpressible(f"{_where(path)}: a schema must be an object or a boolean")
        if "$ref" in schema:
            return self.reference(schema["$ref"], doc, doc_name, path)
        if "type" in schema:
            return self.typed(schema, doc, doc_name, path)
        if "enum" in schema:
            return _enum_node(schema["enum"])
        for keyword in ("anyOf", "oneOf"):
            if isinstance(schema.get(keyword), list) and schema[keyword]:
                return self.alternatives(schema[keyword], doc, doc_name, path)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1:
            return self.node(all_of[0], doc, doc_name, path)
        if "properties" in schema:  # an object schema that leaves out "type": "object"
            return self.typed({**schema, "type": "object"}, doc, doc_name, path)
        return _JSON_TEXT

    def reference(self, ref: Any, doc: Any, doc_name: str, path: str) -> JsonNode:
        """The node a ``$ref`` points to."""
        if not isinstance(ref, str):
            raise SchemaNotExpressible(f"{_where(path)}: $ref must be a string")
        base, _, pointer = ref.partition("#")
        if base:
            doc, doc_name = self.document(base, path), base
        key = (id(doc), pointer)
        if key in self.expanding:
            raise SchemaNotExpressible(
                f"{_where(path)}: recursive $ref {ref!r} (Iceberg has no recursive types)"
            )
        target = doc
        for token in pointer.split("/")[1:] if pointer else ():
            token = _unescape(token)
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise SchemaNotExpressible(f"{_where(path)}: $ref {ref!r} points to nothing")
        self.expanding.append(key)
        try:
            return self.node(target, doc, doc_name, path)
        finally:
            self.expanding.pop()

    def document(self, name: str, path: str) -> Any:
        """The referenced schema registered as ``name``."""
        if name in self.documents:
            return self.documents[name]
        reference = self.references.get(name)
        if reference is None or self.resolve is None:
            raise SchemaNotExpressible(
                f"{_where(path)}: $ref to {name!r}, which is not a known reference"
            )
        registered = self.resolve(reference)
        document = _load(registered.schema, f"reference {name!r}")
        for inner in registered.references:
            self.references.setdefault(inner.name, inner)
        self.documents[name] = document
        return document

    def typed(self, schema: dict[str, Any], doc: Any, doc_name: str, path: str) -> JsonNode:
        """The node of a schema with a ``type``."""
        types = schema["type"]
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise SchemaNotExpressible(
                f"{_where(path)}: type must be a string or a list of strings"
            )
        nullable = "null" in types
        others = [t for t in types if t != "null"]
        if len(others) != 1:
            return _JSON_TEXT
        kind = others[0]
        if kind in _SIMPLE:
            node = JsonNode(_SIMPLE[kind])
        elif kind == "string":
            fmt = schema.get("format")
            node = JsonNode(_FORMATS.get(fmt, "string") if isinstance(fmt, str) else "string")
        elif kind == "array":
            items = schema.get("items")
            if not isinstance(items, dict | bool):  # tuple validation, or no items at all
                return _JSON_TEXT
            element = self.node(items, doc, doc_name, f"{path}[]")
            node = JsonNode("list", items=element)
        elif kind == "object":
            node = self.object_node(schema, doc, doc_name, path)
        else:
            return _JSON_TEXT
        return node.with_nullable(nullable)

    def object_node(self, schema: dict[str, Any], doc: Any, doc_name: str, path: str) -> JsonNode:
        """A struct, a map, or JSON text."""
        properties = schema.get("properties")
        if isinstance(properties, dict) and properties:
            required = schema.get("required")
            listed = set(required) if isinstance(required, list) else set()
            fields = []
            for name, sub in properties.items():
                child = self.node(sub, doc, doc_name, f"{path}.{name}" if path else name)
                fields.append(JsonField(name, child, name in listed))
            return JsonNode("struct", fields=tuple(fields))
        extra = schema.get("additionalProperties")
        if extra is False and not properties and not path:
            return JsonNode("struct", fields=())  # a record that has no fields, like Avro's
        if isinstance(extra, dict) and not properties and "patternProperties" not in schema:
            return JsonNode("map", items=self.node(extra, doc, doc_name, f"{path}{{}}"))
        return _JSON_TEXT

    def alternatives(self, branches: list[Any], doc: Any, doc_name: str, path: str) -> JsonNode:
        """``anyOf`` / ``oneOf``: one type (maybe with null) or JSON text."""
        nodes = []
        nullable = False
        for branch in branches:
            if isinstance(branch, dict) and branch.get("type") == "null" and len(branch) == 1:
                nullable = True
            else:
                nodes.append(self.node(branch, doc, doc_name, path))
        if not nodes:
            return _JSON_TEXT
        first = nodes[0].with_nullable(False)
        if any(node.with_nullable(False) != first for node in nodes[1:]):
            return _JSON_TEXT
        return first.with_nullable(nullable or any(node.nullable for node in nodes))


def _enum_node(members: Any) -> JsonNode:
    if not isinstance(members, list) or not members:
        return _JSON_TEXT
    strings = [m for m in members if m is not None]
    if not strings or not all(isinstance(m, str) for m in strings):
        return _JSON_TEXT
    return JsonNode("string", nullable=len(strings) < len(members))


class _Ids:
    def __init__(self) -> None:
        self.ids = itertools.count(1)

    def type_of(self, node: JsonNode) -> IcebergType:
        if node.kind in _LEAF_TYPES:
            return _LEAF_TYPES[node.kind]
        if node.kind == "list":
            assert node.items is not None
            element_id = next(self.ids)
            element = self.type_of(node.items)
            return ListType(element_id, element, element_required=not node.items.nullable)
        if node.kind == "map":
            assert node.items is not None
            key_id, value_id = next(self.ids), next(self.ids)
            value = self.type_of(node.items)
            return MapType(
                key_id, StringType(), value_id, value, value_required=not node.items.nullable
            )
        ids = [next(self.ids) for _ in node.fields]
        return StructType(
            *(
                NestedField(field_id, field.name, self.type_of(field.node), required=field.required)
                for field_id, field in zip(ids, node.fields, strict=True)
            )
        )
