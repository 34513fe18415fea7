"""Which typed layout each topic's hotset files are built with, resolved once and shared by the
hotset, merged, the background indexer and the ``hotset-parquet`` synthesizer.

A topic no codec rule types (or whose subjects have no version and whose base is untyped) has
no layout: it is served exactly as before typed tables existed. Otherwise its layout is the base
(:mod:`.lake_schemas`: the coldset's schema, or the row contract) folded with the versions of
its value (and key) subject, read from the Schema Registry (cached by the shared client for
``subject_refresh_seconds``, schemas by id forever), and kept by digest: a data key names the
digest of the layout its file was built with, and :meth:`TopicLayouts.by_digest` finds it again
(or, after a restart, resolves the topic again and refuses a digest that is not current).

A registry that cannot be reached is :class:`~.provider.ProviderUnavailable` (REST 503,
S3 503 SlowDown): a retriable error, never a layout guessed without it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from bergstream.core.api import (
    RegisteredSchema,
    RegistryUnavailable,
    ResolvedLake,
    SchemaRegistryClient,
    SchemaRegistryError,
    ServiceContext,
    TopicCodecs,
    TopicCodecsResolver,
    TypedRows,
    build_layout,
    rule_for,
)
from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic, layout_digest
from bergstream.plugins.isk_gateway.tables.lake_schemas import (
    CONTRACT_BASE,
    BaseSchema,
    LakeSchemas,
)
from bergstream.plugins.isk_gateway.tables.provider import (
    NoSuchFile,
    ProviderUnavailable,
    TableNotServable,
)

__all__ = ["TopicLayouts"]


@dataclass
class _PinnedSubjects:
    """A schema source whose subjects are the versions read once (so the layout and its memo
    key come from the same answer); schemas by id from the registry."""

    client: SchemaRegistryClient
    subjects: dict[str, list[RegisteredSchema]] = field(default_factory=dict)

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        return self.client.schema_by_id(schema_id)

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        if subject not in self.subjects:
            self.subjects[subject] = self.client.subject_schemas(subject)
        return self.subjects[subject]


class TopicLayouts:
    """Typed layouts of one gateway's topics (see the module docstring)."""

    def __init__(
        self,
        codecs: TopicCodecsResolver,
        lake: LakeSchemas | None = None,
        remembered: int = 256,
    ) -> None:
        self.codecs = codecs
        self.lake = lake
        self._remembered = remembered
        self._by_digest: OrderedDict[tuple[str, str], TypedTopic] = OrderedDict()
        # (topic, base, subject versions) -> digest: a layout is folded once per such state
        self._digests: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_context(cls, context: ServiceContext, lake: ResolvedLake | None) -> TopicLayouts:
        """Layouts per the ``codecs:`` section of ``context``'s config, based on ``lake``'s
        tables when there is a lake."""
        return cls(TopicCodecsResolver(context), LakeSchemas(lake) if lake is not None else None)

    def typed(self, topic: str) -> bool:
        """Whether a codec rule types ``topic`` (it may still have no layout: no version yet)."""
        return rule_for(self.codecs.settings, topic) is not None

    async def resolve(self, topic: str, base: BaseSchema | None = None) -> TypedTopic | None:
        """The layout ``topic``'s files are built with now; None for a raw topic. ``base``: the
        table schema to start from (None: the coldset's, else the row contract's)."""
        if not self.typed(topic):
            return None
        return await asyncio.to_thread(self._resolve, topic, base)

    async def by_digest(self, topic: str, digest: str) -> TypedTopic:
        """The layout a data key names; :class:`NoSuchFile` if it is not one this gateway
        built with and not the topic's current one (the client should load the table again)."""
        with self._lock:
            known = self._by_digest.get((topic, digest))
        if known is not None:
            return known
        current = await self.resolve(topic)
        if current is None or current.digest != digest:
            raise NoSuchFile(
                f"no layout {digest} for topic {topic!r}: its schemas changed since the table was "
                "loaded; load the table again"
            )
        return current

    def remember_base(self, topic: str, base: BaseSchema | None) -> None:
        """A coldset base just read by the coldset or merged namespace (fresher than the TTL)."""
        if self.lake is not None:
            self.lake.remember(topic, base)

    # ------------------------------------------------------------------ in a worker thread

    def _resolve(self, topic: str, base: BaseSchema | None) -> TypedTopic | None:
        codecs = self._codecs(topic)
        if codecs is None:
            return None
        for side in (codecs.value, codecs.key):
            if side is not None and side.shape_codec is not None:
                raise TableNotServable(
                    f"topic {topic!r} has plain values read by a codec that infers their columns "
                    "(such as json): ISK does not serve such topics yet; read its coldset "
                    "through the lake's own catalog, or give the topic a codec of registered "
                    "schemas"
                )
        client = self.codecs.registry_client
        if client is None:
            raise TableNotServable(
                f"topic {topic!r} has a codec rule but codecs.schema_registry is not set"
            )
        if base is None:
            base = (self.lake.base(topic) if self.lake is not None else None) or CONTRACT_BASE
        source = _PinnedSubjects(client)
        try:
            state = self._state(topic, base, codecs, source)
            known = self._known(state)
            if known is not None:
                return known
            layout = build_layout(base.schema, base.last_column_id, codecs, source)
        except RegistryUnavailable as error:
            raise ProviderUnavailable(
                f"the Schema Registry cannot be reached for the layout of {topic!r}: {error}"
            ) from error
        except SchemaRegistryError as error:
            raise TableNotServable(
                f"the Schema Registry refused the layout of {topic!r}: {error}"
            ) from error
        if not layout.typed:
            return None
        rule = rule_for(self.codecs.settings, topic)
        assert rule is not None
        digest = layout_digest(layout, json.loads(rule.model_dump_json()))
        with self._lock:
            self._digests[state] = digest
            while len(self._digests) > self._remembered:
                self._digests.popitem(last=False)
            known = self._by_digest.get((topic, digest))
            if known is not None:
                self._by_digest.move_to_end((topic, digest))
                return known
            typed = TypedTopic(topic, layout, TypedRows(layout, codecs, client), digest)
            self._by_digest[(topic, digest)] = typed
            while len(self._by_digest) > self._remembered:
                self._by_digest.popitem(last=False)
        return typed

    @staticmethod
    def _state(
        topic: str, base: BaseSchema, codecs: TopicCodecs, source: _PinnedSubjects
    ) -> tuple[str, str, str]:
        """What a layout is made of: the topic, its base and its subjects' versions (read
        now, and kept in ``source`` for the fold)."""
        versions = {
            side.subject: [(s.schema_id, s.version) for s in source.subject_schemas(side.subject)]
            for side in (codecs.value, codecs.key)
            if side is not None
        }
        base_text = f"{base.last_column_id}:{base.schema.model_dump_json()}"
        return topic, base_text, json.dumps(versions, sort_keys=True)

    def _known(self, state: tuple[str, str, str]) -> TypedTopic | None:
        """The layout folded from ``state`` before, if it is still remembered."""
        with self._lock:
            digest = self._digests.get(state)
            if digest is None:
                return None
            self._digests.move_to_end(state)
            known = self._by_digest.get((state[0], digest))
            if known is not None:
                self._by_digest.move_to_end((state[0], digest))
            return known

    def _codecs(self, topic: str) -> TopicCodecs | None:
        try:
            return self.codecs.for_topic(topic)
        except ValueError as error:  # settings a codec refuses (config check reports them too)
            raise TableNotServable(f"the codecs of topic {topic!r}: {error}") from error
