"""The registered schemas a codec has read and compiled (the avro, json-schema and protobuf
codecs share it).

Each schema (its text and references) is parsed once, references resolved through the
registry: parsed schemas are kept across pickling, so a Spark worker never needs the registry.
What is compiled from them (decoders, encoders, message classes) is rebuilt on first use after
unpickling. A codec keeps at most ``limit`` compiled schemas (a topic has a handful of
versions); past that the compiled ones are dropped, the parsed ones stay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from bergstream.core.api import RegisteredSchema, SchemaNotExpressible, SchemaReference

__all__ = ["MAX_SCHEMAS", "Resolve", "SchemaCache"]

Resolve = Callable[[SchemaReference], RegisteredSchema]
Parsed = TypeVar("Parsed")
Compiled = TypeVar("Compiled")
_Key = tuple[str, tuple[SchemaReference, ...]]

#: Compiled schemas a codec keeps.
MAX_SCHEMAS = 512


class SchemaCache(Generic[Parsed, Compiled]):
    """Parsed and compiled schemas of one registry schema type (see the module docstring);
    ``parse`` and ``build`` must be module-level functions (they are pickled)."""

    def __init__(
        self,
        schema_type: str,
        what: str,
        parse: Callable[[RegisteredSchema, Resolve | None], Parsed],
        build: Callable[[Parsed], Compiled],
        limit: int = MAX_SCHEMAS,
    ) -> None:
        self.schema_type = schema_type
        self.what = what
        self.parse = parse
        self.build = build
        self.limit = limit
        self._parsed: dict[_Key, Parsed] = {}
        self._compiled: dict[_Key, Compiled] = {}
        self._lock = threading.Lock()

    def get(self, schema: RegisteredSchema, resolve: Resolve | None) -> Compiled:
        """``schema`` compiled; ``resolve`` fetches its references the first time (None: it
        must have been parsed before, here or where this cache was pickled). Raises
        :class:`SchemaNotExpressible` for a schema of another type or one the codec refuses."""
        key = (schema.schema, schema.references)
        compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        if schema.schema_type.upper() != self.schema_type:
            raise SchemaNotExpressible(f"a {schema.schema_type} schema is not {self.what}")
        parsed = self._parsed.get(key)
        if parsed is None:
            parsed = self.parse(schema, resolve)
        compiled = self.build(parsed)
        with self._lock:
            if len(self._compiled) >= self.limit:
                self._compiled.clear()  # parsed schemas stay: they hold resolved references
            self._parsed[key] = parsed
            self._compiled[key] = compiled
        return compiled

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_compiled", "_lock")}
        state["_parsed"] = dict(self._parsed)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compiled = {}
        self._lock = threading.Lock()
