"""The ``ksi`` filter: Fetch and ListOffsets served from the coldset below the boundary, from
Kafka above it, one response to the client."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from kio.schema.errors import ErrorCode

from bergstream.core.api import (
    ApiKey,
    ErrorResponse,
    FilterContext,
    FilterFactory,
    FilterFactoryContext,
    Forward,
    LakeConfigError,
    ProxyFilter,
    ReadinessCheck,
    RequestAction,
    ResponseAction,
    ShortCircuit,
    component_log,
    lake_checks,
    resolve_lake,
)
from bergstream.plugins.ksi_fetch_filter.coldset import ColdsetError
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.kafka_state import (
    EARLIEST,
    EndOffsets,
    ReadAccess,
    TopicIds,
)
from bergstream.plugins.ksi_fetch_filter.metrics import KSI_COLD_FETCHES, KSI_COLD_RECORDS
from bergstream.plugins.ksi_fetch_filter.planner import (
    ColdAnswer,
    FetchAsk,
    Key,
    OffsetAnswer,
    OffsetAsk,
    plan_fetch,
    plan_offsets,
)
from bergstream.plugins.ksi_fetch_filter.responses import (
    ColdPartition,
    TopicRef,
    build_fetch_response,
    forward_fetch,
    list_offsets_answer,
    list_offsets_error,
    merge_fetch_response,
    sessionless,
    topic_ref,
    uses_topic_ids,
)
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from bergstream.plugins.ksi_fetch_filter.topics import Served, ServedTopics
from bergstream.plugins.ksi_fetch_filter.typed import TypedTables


class KsiSetupError(ValueError):
    """The ``ksi`` filter cannot start as configured."""


def ksi_log(context: FilterContext) -> logging.LoggerAdapter[Any]:
    """The connection's logger (virtual cluster, client) with its lines tagged ``ksi``."""
    return component_log(context.log, "ksi")


@dataclass
class _OffsetsPending:
    asks: list[OffsetAsk]
    served: Served


@dataclass
class _FetchPending:
    cold: dict[TopicRef, list[ColdPartition]]
    guarded: set[tuple[TopicRef, int]] = field(default_factory=set)
    log_starts: dict[tuple[TopicRef, int], int] = field(default_factory=dict)


class KsiFilter(ProxyFilter):
    """One client connection's KSI filter (state: the requests awaiting their response)."""

    request_api_keys = frozenset({ApiKey.FETCH, ApiKey.LIST_OFFSETS})
    response_api_keys = frozenset({ApiKey.FETCH, ApiKey.LIST_OFFSETS})

    def __init__(self, factory: KsiFactory) -> None:
        self.factory = factory
        # Per connection: the broker authorizes this connection's principal.
        self._access = ReadAccess(factory.config.authorization_cache_seconds)
        self._fetches: dict[int, _FetchPending] = {}
        self._offsets: dict[int, _OffsetsPending] = {}
        # KIP-227 fetch sessions stay on until this connection fetches a topic KSI serves: the
        # broker's session would then hold partitions KSI answers (an incremental fetch leaving
        # them out would make the broker answer them), so from then on every Fetch goes
        # without a session. A consumer of other topics only keeps its incremental fetches.
        self._sessions_off = False

    # ------------------------------------------------------------------ requests

    async def on_request(self, header: Any, request: Any, context: FilterContext) -> RequestAction:
        """Split Fetch requests between coldset and Kafka; note ListOffsets to answer later."""
        if header.request_api_key == ApiKey.LIST_OFFSETS:
            wanted = [
                (topic.name, p.partition_index, p.timestamp)
                for topic in request.topics
                for p in topic.partitions
                if p.timestamp == EARLIEST or p.timestamp >= 0
            ]
            if wanted:
                served = await self.factory.topics.resolve(
                    {name for name, _, _ in wanted}, ksi_log(context)
                )
                asks = [OffsetAsk(*ask) for ask in wanted if served.covers(ask[0])]
                if asks:
                    self._offsets[header.correlation_id] = _OffsetsPending(asks, served)
            return Forward(request)
        try:
            return await self._fetch(header, request, context)
        except Exception:
            ksi_log(context).exception(
                "ksi: cannot serve a Fetch request; answering a retriable error"
            )
            return ErrorResponse(int(ErrorCode.kafka_storage_error), "KSI failed")

    async def _names(self, request: Any, version: int, context: FilterContext) -> dict[Any, str]:
        refs = {topic_ref(topic) for topic in request.topics}
        if not uses_topic_ids(version):
            return {ref: ref for ref in refs}
        ids = self.factory.topic_ids
        await ids.resolve(refs, context.send_request)
        return {ref: name for ref in refs if (name := ids.name(ref)) is not None}

    async def _fetch(self, header: Any, request: Any, context: FilterContext) -> RequestAction:
        version = header.request_api_version
        names = await self._names(request, version, context)
        served = await self.factory.topics.resolve(set(names.values()), ksi_log(context))
        covered = {name for name in names.values() if served.covers(name)}
        self._sessions_off = self._sessions_off or bool(covered)
        if covered:
            # Cold offsets only for topics Kafka lets this connection read; the others'
            # partitions go to Kafka, which refuses them as it refuses any offset.
            readable = await self._access.readable(covered, context.send_request)
            if readable != covered:
                served = served.only(readable)
        refs_of = {names[ref]: ref for ref in names if served.covers(names[ref])}
        asks = [
            FetchAsk(names[ref], p.partition, p.fetch_offset, p.partition_max_bytes)
            for topic in request.topics
            if (ref := topic_ref(topic)) in names and served.covers(names[ref])
            for p in topic.partitions
        ]
        if not asks:
            return Forward(sessionless(request) if self._sessions_off else request)
        answers = await self._plan_fetch(
            [a for a in asks if a.topic in served.tables], served.tables, request.max_bytes
        )
        for ask in asks:  # the catalog cannot say whether these have cold offsets
            if ask.topic in served.failed:
                answers[(ask.topic, ask.partition)] = ColdAnswer(error=served.failed[ask.topic])
        pending = _FetchPending(cold={})
        served_keys: set[tuple[str, int]] = set()
        for (topic, partition), answer in answers.items():
            ref = refs_of[topic]
            if answer.error is not None:
                ksi_log(context).warning(
                    "ksi: coldset failed for %s-%d: %s", topic, partition, answer.error
                )
                pending.guarded.add((ref, partition))
            if answer.log_start is not None:
                pending.log_starts[(ref, partition)] = answer.log_start
            if answer.records is not None:
                served_keys.add((topic, partition))
        ends = await self._ends(served_keys, request.isolation_level, context)
        cold_bytes = 0
        for topic, partition in served_keys:
            answer = answers[(topic, partition)]
            assert answer.records is not None
            cold_bytes += len(answer.records)
            self.factory.count_cold(topic, answer.record_count)
            pending.cold.setdefault(refs_of[topic], []).append(
                ColdPartition(
                    partition=partition,
                    high_watermark=ends.get((topic, partition), answer.next_offset or -1),
                    log_start_offset=answer.log_start if answer.log_start is not None else -1,
                    records=answer.records,
                )
            )
        keep = {
            (ref, p.partition)
            for topic in request.topics
            for p in topic.partitions
            if (
                (ref := topic_ref(topic)) not in names
                or (names[ref], p.partition) not in served_keys
            )
        }
        forwarded = forward_fetch(request, keep, cold_bytes)
        if forwarded is None:
            return ShortCircuit(build_fetch_response(version, pending.cold))
        self._fetches[header.correlation_id] = pending
        return Forward(forwarded)

    async def _plan_fetch(
        self, asks: list[FetchAsk], tables: dict[str, str], max_bytes: int
    ) -> dict[Key, ColdAnswer]:
        if not asks:
            return {}
        store = self.factory.store_of(tables)
        try:
            return await store.run(
                plan_fetch, store, asks, max_bytes, self.factory.config.batch_max_bytes
            )
        except ColdsetError as error:
            return {(a.topic, a.partition): ColdAnswer(error=str(error)) for a in asks}

    async def _ends(
        self, keys: set[tuple[str, int]], isolation_level: int, context: FilterContext
    ) -> dict[tuple[str, int], int]:
        if not keys:
            return {}
        try:
            return await self.factory.end_offsets.get(keys, isolation_level, context.send_request)
        except Exception as error:  # the answer stays valid with the boundary as end
            ksi_log(context).warning("ksi: cannot ask Kafka for end offsets: %s", error)
            return {}

    # ------------------------------------------------------------------ responses

    async def on_response(
        self, header: Any, response: Any, context: FilterContext
    ) -> ResponseAction:
        """Merge cold partitions into Fetch responses; lower ListOffsets answers to the
        coldset's where it holds older records."""
        if header.request_api_key == ApiKey.FETCH:
            pending = self._fetches.pop(header.correlation_id, None)
            if pending is None:
                return Forward(response)
            return Forward(
                merge_fetch_response(response, pending.cold, pending.guarded, pending.log_starts)
            )
        offsets = self._offsets.pop(header.correlation_id, None)
        if offsets is None:
            return Forward(response)
        tables, failed = offsets.served.tables, offsets.served.failed
        asks = [a for a in offsets.asks if a.topic in tables]
        answers: dict[Key, OffsetAnswer] = {}
        if asks:
            store = self.factory.store_of(tables)
            try:
                answers = await store.run(plan_offsets, store, asks)
            except ColdsetError as error:
                answers = {(a.topic, a.partition): OffsetAnswer(error=str(error)) for a in asks}
        for ask in offsets.asks:  # the catalog cannot say whether these have cold offsets
            if ask.topic in failed:
                answers[(ask.topic, ask.partition)] = OffsetAnswer(error=failed[ask.topic])
        return Forward(self._merge_offsets(response, answers, context))

    def _merge_offsets(
        self, response: Any, answers: dict[tuple[str, int], OffsetAnswer], context: FilterContext
    ) -> Any:
        topics = []
        for topic in response.topics:
            partitions = []
            for part in topic.partitions:
                answer = answers.get((topic.name, part.partition_index))
                if answer is not None and answer.error is not None:
                    ksi_log(context).warning(
                        "ksi: coldset failed for %s-%d: %s",
                        topic.name,
                        part.partition_index,
                        answer.error,
                    )
                    part = list_offsets_error(part)
                elif (
                    answer is not None
                    and answer.found is not None
                    and part.error_code == ErrorCode.none
                    and (part.offset < 0 or answer.found[0] < part.offset)
                ):
                    part = list_offsets_answer(part, *answer.found)
                partitions.append(part)
            topics.append(replace(topic, partitions=tuple(partitions)))
        return replace(response, topics=tuple(topics))

    async def on_close(self, context: FilterContext) -> None:
        """Forget requests still awaiting a response."""
        self._fetches.clear()
        self._offsets.clear()


class KsiFactory(FilterFactory[KsiConfig]):
    """One per virtual cluster: the coldset store and Kafka-side caches its filters share."""

    def __init__(self, config: KsiConfig, context: FilterFactoryContext) -> None:
        super().__init__(config, context)
        lake = context.config.lake
        if lake is None:
            raise KsiSetupError(
                f"{context.config.source}: virtual cluster '{context.virtual_cluster}' uses the "
                "ksi filter, which reads the coldset of the lake: section; add one (see "
                "examples/ksi.yaml)"
            )
        try:
            self.lake = resolve_lake(lake)
        except LakeConfigError as error:
            raise KsiSetupError(f"{context.config.source}: {error}") from None
        self._store: ColdStore | None = None
        self.topics = ServedTopics(
            config, list_tables=lambda: self.store.run(self.store.table_names)
        )
        self.topic_ids = TopicIds()
        self.end_offsets = EndOffsets(config.offsets_cache_seconds)
        self._counters: dict[str, tuple[Any, Any]] = {}

    def readiness_checks(self) -> list[ReadinessCheck]:
        """The lake's catalog and S3 bucket the cold reads come from."""
        return lake_checks(self.lake)

    def count_cold(self, topic: str, records: int) -> None:
        """Count one Fetch partition of ``topic`` answered from the coldset with ``records``
        records (``bergstream_ksi_cold_fetches``, ``bergstream_ksi_cold_records``)."""
        counters = self._counters.get(topic)
        if counters is None:
            labels = {"virtual_cluster": self.context.virtual_cluster, "topic": topic}
            counters = (KSI_COLD_FETCHES.labels(**labels), KSI_COLD_RECORDS.labels(**labels))
            self._counters[topic] = counters
        counters[0].inc()
        counters[1].inc(records)

    def store_of(self, tables: dict[str, str]) -> ColdStore:
        """The coldset store, serving each topic of ``tables`` (topic -> table) from its
        table."""
        store = self.store
        for topic, table in tables.items():
            store.open_table(topic, table)
        return store

    @property
    def store(self) -> ColdStore:
        """The coldset store (created by :meth:`start`)."""
        if self._store is None:
            typed = TypedTables(self.context.config, self.context.plugins)
            self._store = ColdStore(self.lake, self.config, typed=typed)
        return self._store

    async def start(self) -> None:
        """Create the coldset store (the catalog is opened on the first read) and load the
        batch encoder's compiled kernels, so the first cold Fetch does not wait for them."""
        # Imported here: the encoder's compiled kernels (numba) are loaded when the proxy
        # starts, not by `config check`, which only constructs this factory.
        from bergstream.plugins.ksi_fetch_filter.batch_encoder import warm_up as warm_up_encoder

        _ = self.store
        await asyncio.to_thread(warm_up_encoder)

    def create_filter(self) -> ProxyFilter:
        """A new filter for one client connection."""
        return KsiFilter(self)

    async def close(self) -> None:
        """Stop the reader threads."""
        if self._store is not None:
            self._store.close()
            self._store = None
