"""The codecs of each topic, built once from the ``codecs:`` section, and the shared registry
client: what the pipeline, ISK and KSI ask before decoding a topic's rows."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

from bergstream.core.backends import is_shape_codec
from bergstream.core.typed.codecs_config import (
    BY_SCHEMA_TYPE,
    CODEC_KIND,
    RAW,
    CodecsSettings,
    TopicCodecRule,
    codec_settings,
    rule_for,
)
from bergstream.core.typed.schema_registry import SchemaRegistryClient, SchemaRegistrySettings
from bergstream.core.typed.typed_rows import SideCodecs, TopicCodecs

if TYPE_CHECKING:
    from bergstream.core.backends import ServiceContext, ValueCodec

__all__ = ["TopicCodecsResolver", "shared_registry_client"]

_clients: dict[str, SchemaRegistryClient] = {}
_clients_lock = threading.Lock()


def shared_registry_client(settings: SchemaRegistrySettings) -> SchemaRegistryClient:
    """One client (and so one schema cache) per registry settings in this process."""
    key = json.dumps(settings.model_dump(mode="json"), sort_keys=True)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = SchemaRegistryClient(settings)
        return client


class TopicCodecsResolver:
    """Which codecs read a topic's values and keys, per the ``codecs:`` section of a config."""

    def __init__(self, context: ServiceContext) -> None:
        self.context = context
        self.settings: CodecsSettings = context.config.codecs
        self._codecs: dict[tuple[str, str], ValueCodec] = {}
        self._lock = threading.Lock()

    @property
    def registry_client(self) -> SchemaRegistryClient | None:
        """The shared client of the configured registry; None when none is configured."""
        registry = self.settings.schema_registry
        return None if registry is None else shared_registry_client(registry)

    def for_topic(self, topic: str) -> TopicCodecs | None:
        """The codecs of ``topic``; None when no rule matches or both sides are raw."""
        rule = rule_for(self.settings, topic)
        if rule is None:
            return None
        value = self._side(rule, rule.value, rule.value_subject_for(topic))
        key = self._side(rule, rule.key, rule.key_subject_for(topic))
        if value is None and key is None:
            return None
        return TopicCodecs(topic, value, key)

    def _side(self, rule: TopicCodecRule, name: str, subject: str) -> SideCodecs | None:
        if name == RAW:
            return None
        plugins = self.context.plugins
        names = sorted(plugins.registrations(CODEC_KIND)) if name == BY_SCHEMA_TYPE else [name]
        by_type: dict[str, ValueCodec] = {}
        for codec_name in names:
            codec = self._codec(rule, codec_name)
            if name == BY_SCHEMA_TYPE and is_shape_codec(codec):
                continue  # plain values name no schema type: such a codec is chosen by name
            for schema_type in codec.schema_types:
                by_type.setdefault(schema_type.upper(), codec)
        return SideCodecs(by_type, subject)

    def _codec(self, rule: TopicCodecRule, name: str) -> ValueCodec:
        settings = codec_settings(rule, name, self.context.plugins)
        key = (name, json.dumps(settings.model_dump(mode="json"), sort_keys=True))
        with self._lock:
            codec = self._codecs.get(key)
            if codec is None:
                registration = self.context.plugins.get(CODEC_KIND, name)
                codec = self._codecs[key] = registration.factory(settings, self.context)
            return codec
