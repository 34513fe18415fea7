"""Avro schemas (JSON text from a registry, references included) parsed into a tree of
:class:`AvroNode`: named types resolved, logical types validated, recursion refused.

Logical types follow the Avro specification: an invalid one (a date on a string, a decimal whose
scale exceeds its precision) is ignored and the node is its underlying type. A named type used
twice is the same node object both times (the tree is a DAG); a record that contains itself is
refused with :class:`SchemaNotExpressible`, as Iceberg has no recursive types.

Why not ``fastavro.parse_schema``: it does not parse by the specification on the points that
decide whether a registered schema is served (fastavro 1.13.1, checked here): it raises on a
decimal whose scale exceeds its precision, which the specification (and Java's Avro, which the
registries run) ignore, so records written under such a registered schema would not decode; it
accepts two fields of one name and recursive records, which have no Iceberg schema; and its
output is again JSON-like dicts with named types as strings, so a tree like this one would still
be built on top. Speed does not decide it: a schema is parsed once per schema id. fastavro is a
test dependency: the property tests and benches use it as the reference writer and reader.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bergstream.core.api import RegisteredSchema, SchemaNotExpressible, SchemaReference

__all__ = ["PRIMITIVES", "AvroNode", "parse_avro"]

#: Avro's primitive type names.
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})

# logicalType -> the Avro types it may annotate.
_LOGICAL_BASES: dict[str, frozenset[str]] = {
    "date": frozenset({"int"}),
    "time-millis": frozenset({"int"}),
    "time-micros": frozenset({"long"}),
    "timestamp-millis": frozenset({"long"}),
    "timestamp-micros": frozenset({"long"}),
    "local-timestamp-millis": frozenset({"long"}),
    "local-timestamp-micros": frozenset({"long"}),
    "uuid": frozenset({"string", "fixed"}),
    "decimal": frozenset({"bytes", "fixed"}),
}


@dataclass(frozen=True, eq=False)
class AvroNode:
    """One Avro type. ``kind`` is a primitive name or ``record``, ``enum``, ``array``, ``map``,
    ``fixed`` or ``union``; ``logical`` a valid logical type (or None)."""

    kind: str
    logical: str | None = None
    name: str | None = None  # full name of a record, enum or fixed
    fields: tuple[tuple[str, AvroNode], ...] = ()  # record fields in order
    symbols: tuple[str, ...] = ()  # enum symbols
    items: AvroNode | None = None  # array items or map values
    size: int = 0  # fixed size in bytes
    branches: tuple[AvroNode, ...] = ()  # union branches in order
    precision: int = 0  # decimal
    scale: int = 0  # decimal

    @property
    def short_name(self) -> str:
        """The name of a named type without its namespace, else the type name."""
        return self.name.rsplit(".", 1)[-1] if self.name else self.kind


Resolve = Callable[[SchemaReference], RegisteredSchema]


def parse_avro(schema: RegisteredSchema, resolve: Resolve | None = None) -> AvroNode:
    """The tree of ``schema``; its references are fetched with ``resolve`` and their named types
    made visible to it. Raises :class:`SchemaNotExpressible` for an invalid or recursive schema,
    or references that cannot be resolved."""
    parser = _Parser(resolve)
    parser.load_references(schema, ())
    return parser.parse_text(schema.schema)


class _Parser:
    """Parsing state shared by a schema and its references: the named types seen so far."""

    def __init__(self, resolve: Resolve | None) -> None:
        self.resolve = resolve
        self.names: dict[str, AvroNode] = {}
        self.defining: set[str] = set()
        self.loaded: set[tuple[str, int]] = set()

    def load_references(self, schema: RegisteredSchema, chain: tuple[tuple[str, int], ...]) -> None:
        """Parse the referenced schemas of ``schema`` (depth first) into :attr:`names`."""
        for ref in schema.references:
            key = (ref.subject, ref.version)
            if key in chain:
                raise SchemaNotExpressible(f"circular schema references through {ref.subject}")
            if key in self.loaded:
                continue
            if self.resolve is None:
                raise SchemaNotExpressible(
                    f"schema references {ref.name} ({ref.subject} v{ref.version}) and no "
                    "resolver was given"
                )
            target = self.resolve(ref)
            if target.schema_type.upper() != "AVRO":
                raise SchemaNotExpressible(
                    f"reference {ref.name} is {target.schema_type}, not Avro"
                )
            self.load_references(target, (*chain, key))
            self.parse_text(target.schema)
            self.loaded.add(key)

    def parse_text(self, text: str) -> AvroNode:
        """Parse one schema's JSON text."""
        try:
            data = json.loads(text)
        except ValueError:
            # Some registries hand back a bare primitive name without JSON quotes.
            if text.strip() in PRIMITIVES:
                data = text.strip()
            else:
                raise SchemaNotExpressible("invalid Avro schema: not JSON") from None
        return self.parse(data, None)

    def parse(self, data: Any, namespace: str | None) -> AvroNode:
        """The node of one JSON schema value inside ``namespace``."""
        if isinstance(data, str):
            return self.named_or_primitive(data, namespace)
        if isinstance(data, list):
            return AvroNode("union", branches=tuple(self.parse(b, namespace) for b in data))
        if not isinstance(data, dict) or "type" not in data:
            raise SchemaNotExpressible(f"invalid Avro schema: {_show(data)}")
        kind = data["type"]
        if isinstance(kind, (dict, list)):
            return self.parse(kind, namespace)
        if not isinstance(kind, str):
            raise SchemaNotExpressible(f"invalid Avro schema: {_show(data)}")
        if kind in PRIMITIVES:
            return _with_logical(AvroNode(kind), data)
        if kind in ("record", "error"):
            return self.record(data, namespace)
        if kind == "enum":
            fullname, _ = self.fullname(data, namespace)
            symbols = data.get("symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise SchemaNotExpressible(f"enum {fullname} has no valid symbols")
            return self.define(fullname, AvroNode("enum", name=fullname, symbols=tuple(symbols)))
        if kind == "fixed":
            fullname, _ = self.fullname(data, namespace)
            size = data.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise SchemaNotExpressible(f"fixed {fullname} has no valid size")
            node = _with_logical(AvroNode("fixed", name=fullname, size=size), data)
            return self.define(fullname, node)
        if kind == "array":
            return AvroNode("array", items=self.parse(_require(data, "items"), namespace))
        if kind == "map":
            return AvroNode("map", items=self.parse(_require(data, "values"), namespace))
        return self.named_or_primitive(kind, namespace)

    def record(self, data: dict[str, Any], namespace: str | None) -> AvroNode:
        """A record: its fields parsed in its own namespace, recursion refused."""
        fullname, inner = self.fullname(data, namespace)
        fields = data.get("fields")
        if not isinstance(fields, list):
            raise SchemaNotExpressible(f"record {fullname} has no fields list")
        self.defining.add(fullname)
        parsed: list[tuple[str, AvroNode]] = []
        seen: set[str] = set()
        for field in fields:
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                raise SchemaNotExpressible(f"record {fullname} has a field without a name")
            name = field["name"]
            if name in seen:
                raise SchemaNotExpressible(f"record {fullname} has two fields named {name}")
            seen.add(name)
            parsed.append((name, self.parse(_require(field, "type"), inner)))
        self.defining.discard(fullname)
        return self.define(fullname, AvroNode("record", name=fullname, fields=tuple(parsed)))

    def fullname(self, data: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
        """The full name of a named type and the namespace its own definitions live in."""
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise SchemaNotExpressible(f"invalid Avro schema: a {data['type']} without a name")
        if "." in name:
            return name, name.rsplit(".", 1)[0]
        space = data.get("namespace", namespace)
        space = space if isinstance(space, str) and space else None
        return (f"{space}.{name}" if space else name), space

    def define(self, fullname: str, node: AvroNode) -> AvroNode:
        """Register a named type (a name defined twice keeps its first definition)."""
        return self.names.setdefault(fullname, node)

    def named_or_primitive(self, name: str, namespace: str | None) -> AvroNode:
        """A primitive, or a reference to a named type defined earlier."""
        if name in PRIMITIVES:
            return AvroNode(name)
        candidates = [f"{namespace}.{name}", name] if namespace and "." not in name else [name]
        for candidate in candidates:
            if candidate in self.defining:
                raise SchemaNotExpressible(f"recursive type {candidate}")
            if candidate in self.names:
                return self.names[candidate]
        raise SchemaNotExpressible(f"unknown Avro type {name}")


def _with_logical(node: AvroNode, data: dict[str, Any]) -> AvroNode:
    """``node`` annotated with the logical type of ``data``, if valid for it."""
    logical = data.get("logicalType")
    if not isinstance(logical, str) or node.kind not in _LOGICAL_BASES.get(logical, ()):
        return node
    if logical == "uuid" and node.kind == "fixed" and node.size != 16:
        return node
    if logical != "decimal":
        return _replace(node, logical=logical)
    precision, scale = data.get("precision"), data.get("scale", 0)
    if not _is_int(precision) or not _is_int(scale) or precision < 1 or not 0 <= scale <= precision:
        return node
    if node.kind == "fixed" and precision > _fixed_digits(node.size):
        return node
    return _replace(node, logical="decimal", precision=precision, scale=scale)


def _fixed_digits(size: int) -> int:
    """The most decimal digits a signed ``size``-byte integer always holds."""
    return math.floor(math.log10(2 ** (8 * size - 1) - 1)) if size > 0 else 0


def _replace(node: AvroNode, **changes: Any) -> AvroNode:
    values = {name: getattr(node, name) for name in AvroNode.__dataclass_fields__}
    values.update(changes)
    return AvroNode(**values)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(data: dict[str, Any], key: str) -> Any:
    if key not in data:
        raise SchemaNotExpressible(f"invalid Avro schema: {key!r} missing in {_show(data)}")
    return data[key]


def _show(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"))
    return text if len(text) <= 80 else text[:77] + "..."
