"""Typed coldset tables served byte for byte: the original key and value bytes of their rows.

A table is typed when its schema has the ``kafka_value_schema_id`` (or ``kafka_key_schema_id``)
column. Its layout is its own schema (typed columns carry a ``doc`` saying whose field they are)
and the schemas its rows were written with are in its ``bergstream.schema.<id>`` properties, so
KSI rebuilds bytes from the coldset alone; the ``codecs:`` section's registry is only a fallback
for an id the table does not store. The codecs are the ones the ``codecs:`` rule of the topic
names, else whichever codec reads each schema's type: the table, not the config, says which
sides are typed.

Encoding runs once per decoded row-group slice (see :mod:`.segments`), all rows of a schema id
at once through the codec's vectorized ``encode``; a fetch only copies cached bytes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bergstream.core.api import (
    BY_SCHEMA_TYPE,
    KEY_SCHEMA_ID_COLUMN,
    SCHEMA_PROPERTY_PREFIX,
    VALUE_SCHEMA_ID_COLUMN,
    BergstreamConfig,
    CodecsSettings,
    PluginRegistry,
    RegisteredSchema,
    RegistryUnavailable,
    SchemaReference,
    SchemaRegistryClient,
    ServiceContext,
    StoredSchemas,
    TopicCodecRule,
    TopicCodecs,
    TopicCodecsResolver,
    TypedLayout,
    TypedRows,
    bergstream_home,
    build_layout,
    load_registry,
    rule_for,
)
from bergstream.plugins.ksi_fetch_filter.coldset import ColdsetError
from bergstream.plugins.ksi_fetch_filter.projection import conform
from bergstream.plugins.ksi_fetch_filter.segments import PayloadEncoder

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table


def is_typed(schema: Schema) -> bool:
    """Whether a table's schema has typed columns (values or keys)."""
    names = {field.name for field in schema.fields}
    return VALUE_SCHEMA_ID_COLUMN in names or KEY_SCHEMA_ID_COLUMN in names


def stored_schemas(properties: dict[str, str]) -> StoredSchemas:
    """The schemas a table keeps in its ``bergstream.schema.<id>`` properties (a property that
    does not parse is left out: the registry may still know that id)."""
    found = []
    for name, text in properties.items():
        if not name.startswith(SCHEMA_PROPERTY_PREFIX):
            continue
        try:
            schema_id = int(name.removeprefix(SCHEMA_PROPERTY_PREFIX))
            body = json.loads(text)
            references = tuple(
                SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
                for r in body.get("references") or ()
            )
            version = body.get("version")
            found.append(
                RegisteredSchema(
                    schema_id,
                    str(body.get("schemaType") or "AVRO").upper(),
                    str(body["schema"]),
                    references,
                    subject=body.get("subject"),
                    version=int(version) if version is not None else None,
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return StoredSchemas().add(found)


class TableSchemas:
    """The schema source of one table: its stored schemas, then the registry (if configured)."""

    def __init__(self, stored: StoredSchemas, registry: SchemaRegistryClient | None) -> None:
        self.stored = stored
        self.registry = registry

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The stored schema, else the registry's; ``SchemaNotFound`` or ``RegistryUnavailable``
        when neither has it."""
        if schema_id in self.stored.by_id or self.registry is None:
            return self.stored.schema_by_id(schema_id)
        return self.registry.schema_by_id(schema_id)

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        """The versions of ``subject`` (schema references resolve through it): the ones the
        table stored (the schemas its schemas reference), else the registry's."""
        stored = self.stored.subject_schemas(subject)
        if stored or self.registry is None:
            return stored
        return self.registry.subject_schemas(subject)


class Reencoder:
    """The :data:`~.segments.PayloadEncoder` of one typed table snapshot: rows of any data file
    of the table (every column) -> their ``kafka_key``, ``kafka_value``, ``kafka_headers``."""

    def __init__(self, name: str, layout: TypedLayout, rows: TypedRows) -> None:
        self.name = name
        self.layout = layout
        self.rows = rows
        self._headers_type = layout.arrow_schema.field("kafka_headers").type

    def __call__(self, rows: pa.Table) -> pa.Table:
        """The original payload of ``rows``; raises :class:`ColdsetError` when a row cannot be
        rebuilt (a schema neither stored nor in a reachable registry, a codec failure)."""
        typed = conform(rows, self.layout.arrow_schema)
        try:
            key, value = self.rows.encode(typed)
        except RegistryUnavailable as error:
            raise ColdsetError(
                f"{self.name}: a schema is not stored in the table and the registry is "
                f"unavailable: {error}"
            ) from error
        except Exception as error:
            raise ColdsetError(
                f"{self.name}: cannot rebuild the original bytes: {type(error).__name__}: {error}"
            ) from error
        return pa.Table.from_arrays(
            [key, value, typed.column("kafka_headers")],
            names=["kafka_key", "kafka_value", "kafka_headers"],
        )


class _Broken:
    """The encoder of a typed table KSI cannot serve (the reason is reported on every read)."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __call__(self, rows: pa.Table) -> pa.Table:
        raise ColdsetError(self.message)


class TypedTables:
    """Per virtual cluster: the codecs and the registry client typed tables are rebuilt with."""

    def __init__(
        self,
        config: BergstreamConfig,
        plugins: PluginRegistry | None = None,
        home: Path | None = None,
    ) -> None:
        self.config = config
        self._plugins = plugins
        self._home = home
        self._resolvers: tuple[TopicCodecsResolver, CodecsSettings] | None = None
        self._by_type: dict[str, TopicCodecsResolver] = {}
        self._lock = threading.Lock()

    def _context(self, codecs: CodecsSettings) -> ServiceContext:
        if self._plugins is None:
            self._plugins = load_registry()
        config = self.config.model_copy(update={"codecs": codecs})
        return ServiceContext(config, self._plugins, self._home or bergstream_home())

    def _configured(self) -> TopicCodecsResolver:
        with self._lock:
            if self._resolvers is None:
                settings = self.config.codecs
                self._resolvers = (TopicCodecsResolver(self._context(settings)), settings)
            return self._resolvers[0]

    def _by_schema_type(self, topic: str) -> TopicCodecsResolver:
        """A resolver reading both sides by schema type, with the topic's rule's codec
        settings (if a rule matches)."""
        rule = rule_for(self.config.codecs, topic)
        settings: dict[str, dict[str, Any]] = {} if rule is None else dict(rule.config)
        marker = json.dumps(settings, sort_keys=True, default=str)
        with self._lock:
            resolver = self._by_type.get(marker)
            if resolver is None:
                codecs = CodecsSettings(
                    schema_registry=self.config.codecs.schema_registry,
                    topics=[
                        TopicCodecRule(
                            match="*", value=BY_SCHEMA_TYPE, key=BY_SCHEMA_TYPE, config=settings
                        )
                    ],
                )
                resolver = self._by_type[marker] = TopicCodecsResolver(self._context(codecs))
            return resolver

    def codecs_for(self, topic: str, schema: Schema) -> TopicCodecs:
        """The codecs of ``topic``'s typed sides: the configured ones, else by schema type."""
        names = {field.name for field in schema.fields}
        configured = self._configured().for_topic(topic)
        fallback = self._by_schema_type(topic).for_topic(topic)
        assert fallback is not None
        value = key = None
        if VALUE_SCHEMA_ID_COLUMN in names:
            value = (configured.value if configured else None) or fallback.value
        if KEY_SCHEMA_ID_COLUMN in names:
            key = (configured.key if configured else None) or fallback.key
        return TopicCodecs(topic, value, key)

    def registry(self) -> SchemaRegistryClient | None:
        """The configured registry's shared client, if any."""
        return self._configured().registry_client

    def encoder(self, topic: str, table: Table) -> PayloadEncoder | None:
        """The payload encoder of ``table`` (``topic``'s coldset) as loaded; None for a raw
        table. Never raises: a table that cannot be served fails its reads instead."""
        schema = table.schema()
        if not is_typed(schema):
            return None
        name = ".".join(table.name())
        try:
            stored = stored_schemas(table.properties)
            codecs = self.codecs_for(topic, schema)
            # Stored schemas name no subject: the layout is the table's own schema, nothing
            # folded in from the registry's subjects.
            layout = build_layout(schema, table.metadata.last_column_id, codecs, stored)
            source = TableSchemas(stored, self.registry())
            return Reencoder(name, layout, TypedRows(layout, codecs, source))
        except Exception as error:
            return _Broken(f"{name}: cannot read its typed layout: {type(error).__name__}: {error}")
