"""Which typed layout each topic's hotset files are built with, resolved once and shared by the
hotset, merged, the background indexer and the ``hotset-parquet`` synthesizer.

A topic no codec rule types (or whose subjects have no version and whose base is untyped) has
no layout: it is served exactly as before typed tables existed. Otherwise its layout is the base
(:mod:`.lake_schemas`: the coldset's schema, or the row contract) folded with the versions of
its value (and key) subject, read from the Schema Registry (cached by the shared client for
``subject_refresh_seconds``, schemas by id forever), and kept by digest: a data key names the
digest of the layout its file was built with, and :meth:`TopicLayouts.by_digest` finds it again
(or, after a restart, resolves the topic again and refuses a digest that is not current).

A side read by a codec that infers its columns from plain values (a ``ShapeCodec`` such as
``json``: no framing, no registry) has no subject to read: its versions are the shapes of the
records the hotset serves. The layout folds the *telling* values (a few per shape) of every
partition from its log start up to its last stable offset, in partition then offset order
(:func:`~bergstream.core.api.build_layout_of_shapes`), so every record any namespace serves has
a shape the layout folded (``merged`` serves a part of that range and shares the layout, its
digest and the background indexer's chunks). The telling values are kept per block of
offsets below the last stable offset (records there never change), so a load after new records
reads only those from Kafka; the layout is folded again only when the telling values, the base
or the framed side's versions changed, and its digest changes only when the layout does (a new
shape). After a restart the same log gives the same layout, so a digest resolves again; one
whose shapes left the log (retention) is refused like a digest of an old schema version.

A registry that cannot be reached is :class:`~.provider.ProviderUnavailable` (REST 503,
S3 503 SlowDown): a retriable error, never a layout guessed without it; so is a Kafka read that
fails while the telling values are gathered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from bergstream.core.api import (
    RegisteredSchema,
    RegistryUnavailable,
    ResolvedLake,
    SchemaNotFound,
    SchemaRegistryClient,
    SchemaRegistryError,
    ServiceContext,
    StoredSchemas,
    TopicCodecs,
    TopicCodecsResolver,
    TypedLayout,
    TypedRows,
    build_layout,
    build_layout_of_shapes,
    rule_for,
)
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic, layout_digest
from bergstream.plugins.isk_gateway.kafka.reader import FetchedRange
from bergstream.plugins.isk_gateway.tables.lake_schemas import (
    CONTRACT_BASE,
    BaseSchema,
    LakeSchemas,
)
from bergstream.plugins.isk_gateway.tables.provider import (
    NoSuchFile,
    NoSuchTable,
    ProviderUnavailable,
    TableNotServable,
)

if TYPE_CHECKING:
    from bergstream.core.api import ShapeCodec, SideCodecs
    from bergstream.plugins.isk_gateway.files.hotset_parquet import KafkaRanges

__all__ = ["TopicLayouts"]

#: Offsets per block of a partition whose telling values are kept (blocks start at multiples).
BLOCK_OFFSETS = 100_000
#: Offsets read from Kafka at once while telling values are gathered (bounds the memory).
_READ_OFFSETS = 20_000
#: The row-contract column holding each side's bytes.
_COLUMNS = (("kafka_value", "value"), ("kafka_key", "key"))

#: Telling values by row-contract column (``kafka_value``, ``kafka_key``), in offset order.
Telling = dict[str, pa.Array]


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


@dataclass
class _ShapesFirst:
    """The schema source rows are decoded with: the declared shapes, then the registry (if
    any)."""

    shapes: dict[int, RegisteredSchema]
    client: SchemaRegistryClient | None

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        found = self.shapes.get(schema_id)
        if found is not None:
            return found
        if self.client is None:
            raise SchemaNotFound(f"unknown schema id {schema_id}")
        return self.client.schema_by_id(schema_id)

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        return self.client.subject_schemas(subject) if self.client is not None else []


@dataclass
class _Block:
    """The telling values of offsets ``[start, end)`` of one block of a partition."""

    start: int
    end: int
    telling: Telling


def _shape_codecs(codecs: TopicCodecs) -> dict[str, ShapeCodec]:
    """The shape codec of each side of plain values, by its row-contract column."""
    out: dict[str, ShapeCodec] = {}
    for column, name in _COLUMNS:
        side: SideCodecs | None = getattr(codecs, name)
        if side is not None and side.shape_codec is not None:
            out[column] = side.shape_codec
    return out


def _tell(codec: ShapeCodec, values: pa.Array, *, telling: bool = False) -> pa.Array:
    """The telling values of ``values`` (``telling``: values that are telling values already),
    in their order."""
    rows = np.sort(np.asarray(codec.telling_rows(values, telling=telling), dtype=np.int64))
    return values.take(pa.array(rows, pa.int64()))


def _joined(codecs: dict[str, ShapeCodec], parts: list[Telling]) -> Telling:
    """The telling values of consecutive ranges taken together (telling again: a shape met
    before adds nothing)."""
    out: Telling = {}
    for column, codec in codecs.items():
        arrays = [part[column] for part in parts if column in part]
        values = pa.concat_arrays(arrays) if arrays else pa.array([], pa.large_binary())
        out[column] = _tell(codec, values, telling=True) if len(arrays) > 1 else values
    return out


def _telling_of(
    codecs: dict[str, ShapeCodec], fetched: FetchedRange, partition: int, start: int, end: int
) -> Telling:
    """The telling values of the records of ``[start, end)`` in ``fetched``, as the hotset
    serves them (aborted ones left out)."""
    table = records_to_table(fetched.records, partition, start, end, fetched.aborted)
    out: Telling = {}
    for column, codec in codecs.items():
        values = table.column(column).combine_chunks().cast(pa.large_binary())
        out[column] = _tell(codec, values)
    return out


def _telling_digest(telling: Telling) -> str:
    """A digest of telling values: the same values give the same layout."""
    digest = hashlib.sha256()
    for column in sorted(telling):
        digest.update(column.encode() + b"\x00")
        for value in telling[column].to_pylist():
            if value is None:
                digest.update(b"n")
            else:
                digest.update(b"v%d:" % len(value) + value)
    return digest.hexdigest()


class TopicLayouts:
    """Typed layouts of one gateway's topics (see the module docstring)."""

    def __init__(
        self,
        codecs: TopicCodecsResolver,
        lake: LakeSchemas | None = None,
        remembered: int = 256,
        source: KafkaRanges | None = None,
    ) -> None:
        self.codecs = codecs
        self.lake = lake
        #: Where the records of topics of plain values are read (the hotset provider sets it).
        self.source = source
        self._remembered = remembered
        self._by_digest: OrderedDict[tuple[str, str], TypedTopic] = OrderedDict()
        # (topic, base, subject versions and telling values) -> digest: a layout is folded once
        # per such state
        self._digests: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        self._lock = threading.Lock()
        # topic -> partition -> block number -> its telling values (topics of plain values)
        self._blocks: OrderedDict[str, dict[int, dict[int, _Block]]] = OrderedDict()
        self._reading: dict[str, asyncio.Lock] = {}

    @classmethod
    def from_context(
        cls,
        context: ServiceContext,
        lake: ResolvedLake | None,
        source: KafkaRanges | None = None,
    ) -> TopicLayouts:
        """Layouts per the ``codecs:`` section of ``context``'s config, based on ``lake``'s
        tables when there is a lake, reading topics of plain values from ``source``."""
        return cls(
            TopicCodecsResolver(context),
            LakeSchemas(lake) if lake is not None else None,
            source=source,
        )

    def typed(self, topic: str) -> bool:
        """Whether a codec rule types ``topic`` (it may still have no layout: no version yet)."""
        return rule_for(self.codecs.settings, topic) is not None

    async def resolve(self, topic: str, base: BaseSchema | None = None) -> TypedTopic | None:
        """The layout ``topic``'s files are built with now; None for a raw topic. ``base``: the
        table schema to start from (None: the coldset's, else the row contract's)."""
        if not self.typed(topic):
            return None
        codecs = self._codecs(topic)
        if codecs is None:
            return None
        shape_codecs = _shape_codecs(codecs)
        telling = await self._telling(topic, shape_codecs) if shape_codecs else None
        return await asyncio.to_thread(self._resolve, topic, base, codecs, telling)

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

    # ------------------------------------------------------------------ telling values

    async def _telling(self, topic: str, codecs: dict[str, ShapeCodec]) -> Telling:
        """The telling values of every record the hotset serves of ``topic`` (each partition
        from its log start up to its last stable offset), in partition then offset order;
        only the offsets no kept block covers are read from Kafka."""
        if self.source is None:
            raise TableNotServable(
                f"topic {topic!r} has plain values whose columns are inferred from its records, "
                "and this gateway has no Kafka reader for its layouts"
            )
        lock = self._reading.setdefault(topic, asyncio.Lock())
        async with lock:
            try:
                offsets = await self.source.offsets(topic)
            except NoSuchTable:  # merged serves a coldset whose topic is gone
                offsets = {}
            with self._lock:
                kept = self._blocks.pop(topic, {})
            blocks: dict[int, dict[int, _Block]] = {}
            parts: list[Telling] = []
            done = False
            try:
                for partition in sorted(offsets):
                    part = offsets[partition]
                    known = kept.get(partition, {})
                    blocks[partition] = mine = {}
                    low, high = part.log_start, part.last_stable
                    for number in range(low // BLOCK_OFFSETS, -(-high // BLOCK_OFFSETS)):
                        start = max(low, number * BLOCK_OFFSETS)
                        end = min(high, (number + 1) * BLOCK_OFFSETS)
                        if start >= end:
                            continue
                        block = await self._block(
                            topic, partition, codecs, known.get(number), start, end
                        )
                        mine[number] = block
                        parts.append(block.telling)
                done = True
            finally:
                if not done:  # a failed read keeps what was read before and since
                    blocks = {p: {**kept.get(p, {}), **blocks.get(p, {})} for p in {*kept, *blocks}}
                with self._lock:  # blocks of offsets gone (retention) are dropped
                    self._blocks[topic] = blocks
                    self._blocks.move_to_end(topic)
                    while len(self._blocks) > self._remembered:
                        self._blocks.popitem(last=False)
        return await asyncio.to_thread(_joined, codecs, parts)

    async def _block(
        self,
        topic: str,
        partition: int,
        codecs: dict[str, ShapeCodec],
        known: _Block | None,
        start: int,
        end: int,
    ) -> _Block:
        """The telling values of ``[start, end)`` of one block, reading from Kafka only what
        ``known`` (the block as kept before) does not cover."""
        if known is not None and known.start == start and known.end == end:
            return known
        reader = self.source
        assert reader is not None
        parts: list[Telling] = []
        position = start
        if known is not None and known.start == start and known.end < end:
            parts.append(known.telling)
            position = known.end
        while position < end:
            high = min(position + _READ_OFFSETS, end)
            fetched = await reader.fetch(topic, partition, position, high)
            parts.append(
                await asyncio.to_thread(_telling_of, codecs, fetched, partition, position, high)
            )
            position = high
        return _Block(start, end, await asyncio.to_thread(_joined, codecs, parts))

    # ------------------------------------------------------------------ in a worker thread

    def _resolve(
        self,
        topic: str,
        base: BaseSchema | None,
        codecs: TopicCodecs,
        telling: Telling | None,
    ) -> TypedTopic | None:
        client = self.codecs.registry_client
        framed = [
            side
            for side in (codecs.value, codecs.key)
            if side is not None and side.shape_codec is None
        ]
        if client is None and (framed or telling is None):
            raise TableNotServable(
                f"topic {topic!r} has a codec rule but codecs.schema_registry is not set"
            )
        if base is None:
            base = (self.lake.base(topic) if self.lake is not None else None) or CONTRACT_BASE
        source: _PinnedSubjects | StoredSchemas = (
            _PinnedSubjects(client) if client is not None else StoredSchemas()
        )
        try:
            state = self._state(topic, base, framed, source, telling)
            known = self._known(state)
            if known is not None:
                return known
            layout, shapes = self._fold(base, codecs, source, telling)
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
            rows_source = _ShapesFirst(shapes, client)
            typed = TypedTopic(topic, layout, TypedRows(layout, codecs, rows_source), digest)
            self._by_digest[(topic, digest)] = typed
            while len(self._by_digest) > self._remembered:
                self._by_digest.popitem(last=False)
        return typed

    @staticmethod
    def _fold(
        base: BaseSchema,
        codecs: TopicCodecs,
        source: _PinnedSubjects | StoredSchemas,
        telling: Telling | None,
    ) -> tuple[TypedLayout, dict[int, RegisteredSchema]]:
        """The layout: ``base`` folded with the framed sides' versions and, for sides of plain
        values, the shapes of their telling values (returned too, by id: the rejected ones are
        no version of the layout, and their rows say why)."""
        if telling is None:
            return build_layout(base.schema, base.last_column_id, codecs, source), {}
        shaped = build_layout_of_shapes(
            base.schema,
            base.last_column_id,
            codecs,
            source,
            telling.get("kafka_value"),
            telling.get("kafka_key"),
        )
        return shaped.layout, dict(shaped.shapes)

    @staticmethod
    def _state(
        topic: str,
        base: BaseSchema,
        framed: list[SideCodecs],
        source: _PinnedSubjects | StoredSchemas,
        telling: Telling | None,
    ) -> tuple[str, str, str]:
        """What a layout is made of: the topic, its base, its framed subjects' versions (read
        now, and kept in ``source`` for the fold) and the telling values of its plain sides."""
        versions: dict[str, object] = {
            side.subject: [(s.schema_id, s.version) for s in source.subject_schemas(side.subject)]
            for side in framed
        }
        if telling is not None:
            versions["\x00telling"] = _telling_digest(telling)
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
