"""Raw reads from Kafka for the hotset: record-batch bytes of an offset range, and end offsets.

Uses aiokafka's low-level client for metadata, leader routing and ListOffsets, and Fetch
connections of its own (:mod:`.raw_fetch`, one receive per response) for the bulk reads,
``read_committed``: the bytes returned are what a Fetch response's ``records`` field holds
(batches as stored, aborted ones included) together with the aborted transactions the broker
listed, exactly the input :mod:`..files.batch_decoder` expects. Where a fetch's complete
batches end is read with :func:`..files.batch_decoder.batch_bounds` (headers only, no decoding).

Both connect as the reader's :class:`~bergstream.core.api.KafkaClientSettings` say (TLS, SASL).
Every request goes to the partition's leader; a leader that moved (NOT_LEADER_OR_FOLLOWER,
UNKNOWN_LEADER_EPOCH...), a closed connection (a broker restarting, a SASL session the broker
ended) or any other retriable answer refreshes the metadata and retries, a bounded number of
times, before the engine sees an error. Refused credentials are never retried.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from aiokafka.client import AIOKafkaClient
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.structs import TopicPartition
from prometheus_client import Counter

from bergstream.core.api import (
    KafkaAuthenticationError,
    KafkaClientSettings,
    open_kafka_connection,
)
from bergstream.plugins.isk_gateway.files.batch_decoder import batch_bounds
from bergstream.plugins.isk_gateway.kafka.buffers import RECEIVED_RECORDS, BufferLease
from bergstream.plugins.isk_gateway.kafka.raw_fetch import (
    FetchAuthenticationError,
    FetchConnections,
    FetchError,
    PartitionFetch,
)
from bergstream.plugins.isk_gateway.tables.provider import NoSuchTable, ProviderUnavailable

__all__ = ["FetchedRange", "KafkaReader", "PartitionOffsets"]

READ_COMMITTED = 1
READ_UNCOMMITTED = 0
_LATEST = -1
_EARLIEST = -2
_NO_ERROR = 0
_UNKNOWN_TOPIC_OR_PARTITION = 3
_TOPIC_AUTHORIZATION_FAILED = 29
#: The smallest fetch size asked for once a partition's record size is known.
_MIN_FETCH_BYTES = 64 * 1024
#: Tries of one request whose leader moved or whose connection closed, and the first pause.
_ATTEMPTS = 5
_FIRST_BACKOFF_SECONDS = 0.1
#: Per broker, when finding out why a secured bootstrap failed (the request is waiting).
_PROBE_TIMEOUT_SECONDS = 10.0

log = logging.getLogger("bergstream.isk")

_T = TypeVar("_T")

#: Kafka reads of this process (every reader): ``range`` counts completed :meth:`KafkaReader.fetch`
#: calls (one per file built from Kafka), ``repeat`` those of a range a reader of this process
#: had read before (a file built twice: only an evicted or expired cache entry explains one),
#: ``request`` the Fetch requests sent for them (retries of one request not counted).
KAFKA_FETCHES = Counter(
    "bergstream_isk_kafka_fetches", "Kafka reads of ISK (kind: range, repeat, request)", ["kind"]
)
#: Ranges remembered for ``repeat`` (about 150 bytes each).
_REMEMBERED_RANGES = 100_000
_read_ranges: OrderedDict[tuple[str, str, int, int, int], None] = OrderedDict()


class _Retry(Exception):
    """A retriable failure of one try: refresh the metadata and try again."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class _SaslRedaction(logging.Filter):
    """Hides the tokens of SaslAuthenticate requests in aiokafka's debug lines: with PLAIN they
    hold the password itself, with SCRAM a proof an attacker could test passwords against."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace any SaslAuthenticate request among the record's arguments; keep the line."""
        args = record.args
        if isinstance(args, tuple) and any(
            type(arg).__name__.startswith("SaslAuthenticateRequest") for arg in args
        ):
            record.args = tuple(
                "SaslAuthenticateRequest(sasl_auth_bytes=***)"
                if type(arg).__name__.startswith("SaslAuthenticateRequest")
                else arg
                for arg in args
            )
        return True


_SASL_REDACTION = _SaslRedaction()


def _retriable(code: int) -> bool:
    error = for_code(code)
    return bool(getattr(error, "retriable", False) or getattr(error, "invalid_metadata", False))


@dataclass(frozen=True)
class PartitionOffsets:
    """End offsets of one partition: log start, high watermark and last stable offset."""

    partition: int
    log_start: int
    high_watermark: int
    last_stable: int


@dataclass(frozen=True)
class FetchedRange:
    """Record batches covering ``[start, end)`` (possibly more on both sides) and the aborted
    transactions ``(producer_id, first_offset)`` listed with them; ``lease`` holds the buffers
    the records were received into, if they came from a pool."""

    records: bytes | memoryview
    aborted: tuple[tuple[int, int], ...]
    lease: BufferLease | None = None

    def release(self) -> None:
        """Give the buffers behind ``records`` back to their pool: call it only once nothing
        refers to ``records`` (or anything decoded from them without a copy)."""
        if self.lease is not None:
            self.lease.release()


def _grown(buffer: np.ndarray, filled: int, size: int, lease: BufferLease) -> np.ndarray:
    """A buffer of ``size`` bytes starting with ``buffer[:filled]``."""
    grown = lease.take(size)
    grown[:filled] = buffer[:filled]
    return grown


class KafkaReader:
    """Reads raw batches and end offsets from one Kafka cluster (``async with`` or start/close),
    connecting as ``settings`` say (PLAINTEXT when None)."""

    def __init__(
        self,
        bootstrap: str,
        client_id: str = "bergstream-isk",
        max_fetch_bytes: int = 64 * 1024 * 1024,
        request_timeout_ms: int = 30_000,
        settings: KafkaClientSettings | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._settings = settings
        if settings is not None and settings.uses_sasl:
            logging.getLogger("aiokafka.conn").addFilter(_SASL_REDACTION)  # once: same object
        self._client_id = client_id
        self._timeout = request_timeout_ms / 1000
        self._client = AIOKafkaClient(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            **(settings.aiokafka() if settings is not None else {}),
        )
        self._max_bytes = max_fetch_bytes
        self._bytes_per_offset: dict[tuple[str, int], float] = {}
        self._fetches = FetchConnections(client_id, self._timeout, settings)
        self._started = False

    async def start(self) -> None:
        """Connect to the cluster; :class:`ProviderUnavailable` saying why when it cannot
        (refused credentials and untrusted certificates named as such)."""
        if not self._started:
            try:
                await self._client.bootstrap()
            except KafkaError as error:
                why = await self._connect_problem()
                raise ProviderUnavailable(
                    f"Kafka at {self._bootstrap} is unreachable: {why or error}"
                ) from error
            self._started = True

    async def _connect_problem(self) -> str | None:
        """Why a secured bootstrap failed, found by connecting to its brokers with core's own
        TLS and SASL (aiokafka logs the cause but raises a generic error); None without TLS
        and SASL, or when a broker accepts the connection."""
        settings = self._settings
        if settings is None or settings.security_protocol == "PLAINTEXT":
            return None
        problems: list[str] = []
        for part in self._bootstrap.split(","):
            host, _, port = part.strip().rpartition(":")
            host = host.strip("[]")
            try:
                connection = await open_kafka_connection(
                    host,
                    int(port),
                    settings,
                    client_id=self._client_id,
                    timeout=min(self._timeout, _PROBE_TIMEOUT_SECONDS),
                )
            except KafkaAuthenticationError as error:
                return f"authentication failed: {error}"
            except ssl.SSLCertVerificationError as error:
                return (
                    f"TLS to {host}:{port}: the broker's certificate is not trusted "
                    f"({error.verify_message}): check ssl.ca.location"
                )
            except ssl.SSLError as error:
                return f"TLS to {host}:{port} failed: {error} (check security.protocol)"
            except (OSError, TimeoutError, ValueError) as error:
                problems.append(f"{host}:{port}: {error!r}")
                continue
            await connection.close()
            return None
        return "; ".join(problems) or None

    async def _with_retries(self, what: str, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """``attempt()`` until it does not raise :class:`_Retry`, refreshing the metadata and
        pausing (doubling) between tries; :class:`ProviderUnavailable` after the last."""
        backoff = _FIRST_BACKOFF_SECONDS
        for number in range(1, _ATTEMPTS + 1):
            try:
                return await attempt()
            except _Retry as error:
                if number == _ATTEMPTS:
                    raise ProviderUnavailable(
                        f"{what}: {error} (still after {_ATTEMPTS} tries)"
                    ) from None
                log.debug("isk: %s: %s; retrying after a metadata refresh", what, error)
                await asyncio.sleep(backoff)
                backoff *= 2
                try:
                    await self._client.force_metadata_update()
                except KafkaError as refresh:
                    log.debug("isk: metadata refresh failed: %s", refresh)
        raise AssertionError("unreachable")

    async def _metadata(self) -> ClusterMetadata:
        async def attempt() -> ClusterMetadata:
            try:
                return await self._client.fetch_all_metadata()
            except KafkaError as error:
                # Also "no broker answered": every connection may have just been closed
                # (sessions opened together expire together); new ones are opened next try.
                raise _Retry(str(error) or type(error).__name__) from None

        return await self._with_retries("Kafka metadata", attempt)

    async def close(self) -> None:
        """Close every connection."""
        await self._client.close()
        self._fetches.close()
        self._started = False

    async def __aenter__(self) -> KafkaReader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def topics(self) -> list[str]:
        """Names of the cluster's topics, internal ones (``__consumer_offsets``...) left out."""
        await self.start()
        metadata = await self._metadata()
        topics = metadata.topics(exclude_internal_topics=True)
        return sorted(t for t in topics if t[:2] != "__")

    async def partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic``; :class:`NoSuchTable` if Kafka does not know it (or this
        client may not describe it). Asks Kafka about this one topic only (a LoadTable must not
        cost more on a cluster of 10,000 topics than on one of ten), and never lets the request
        create it (``allow_auto_topic_creation`` false, whatever the brokers'
        ``auto.create.topics.enable``)."""
        await self.start()

        async def attempt() -> list[int]:
            node = self._client.get_random_node()
            if node is None:
                raise _Retry("no broker known yet")
            request = MetadataRequest([topic], allow_auto_topic_creation=False)
            try:
                response = await self._client.send(node, request)
            except KafkaError as error:
                raise _Retry(str(error) or type(error).__name__) from None
            for error_code, name, *rest in response.topics:
                if name != topic:
                    continue
                if error_code in (_UNKNOWN_TOPIC_OR_PARTITION, _TOPIC_AUTHORIZATION_FAILED):
                    raise NoSuchTable(f"no topic {topic!r} in Kafka")
                if error_code != _NO_ERROR:
                    if _retriable(error_code):
                        raise _Retry(f"{topic}: {for_code(error_code).__name__}")
                    raise ProviderUnavailable(
                        f"Kafka metadata of {topic}: {for_code(error_code).__name__}"
                    )
                partitions = sorted(int(info[1]) for info in rest[-1])
                if not partitions:
                    raise NoSuchTable(f"no topic {topic!r} in Kafka")
                return partitions
            raise NoSuchTable(f"no topic {topic!r} in Kafka")

        return await self._with_retries(f"Kafka metadata of {topic}", attempt)

    async def _leader(self, topic: str, partition: int) -> int:
        tp = TopicPartition(topic, partition)
        leader = self._client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            await self._client.force_metadata_update()
            leader = self._client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            raise _Retry(f"no leader for {topic}/{partition}")
        return leader

    async def _list_offsets(
        self, topic: str, partitions: Iterable[int], timestamp: int, isolation: int
    ) -> dict[int, int]:
        out: dict[int, int] = {}
        wanted = list(partitions)

        async def attempt() -> dict[int, int]:
            # Partitions answered by an earlier try are not asked again.
            by_leader: dict[int, list[int]] = {}
            for partition in wanted:
                if partition not in out:
                    by_leader.setdefault(await self._leader(topic, partition), []).append(partition)
            retry: list[str] = []
            for leader, parts in by_leader.items():
                request = OffsetRequest(-1, isolation, [(topic, [(p, timestamp) for p in parts])])
                try:
                    response = await self._client.send(leader, request)
                except KafkaError as error:
                    if getattr(error, "retriable", False):
                        retry.append(f"broker {leader}: {error or type(error).__name__}")
                        continue
                    raise ProviderUnavailable(f"ListOffsets {topic}: {error}") from error
                for _topic, part_data in response.topics:
                    for partition, error_code, *info in part_data:
                        if error_code == _NO_ERROR:
                            out[partition] = info[1] if response.API_VERSION >= 1 else info[0][0]
                            continue
                        name = for_code(error_code).__name__
                        if not _retriable(error_code):
                            raise ProviderUnavailable(f"ListOffsets {topic}/{partition}: {name}")
                        retry.append(f"{topic}/{partition}: {name}")
            if retry:
                raise _Retry(", ".join(retry))
            return out

        return await self._with_retries(f"ListOffsets {topic}", attempt)

    async def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        """Log start, high watermark and last stable offset of every partition of ``topic``."""
        partitions = await self.partitions(topic)
        start = await self._list_offsets(topic, partitions, _EARLIEST, READ_UNCOMMITTED)
        high = await self._list_offsets(topic, partitions, _LATEST, READ_UNCOMMITTED)
        stable = await self._list_offsets(topic, partitions, _LATEST, READ_COMMITTED)
        return {
            p: PartitionOffsets(p, start[p], high[p], min(stable[p], high[p])) for p in partitions
        }

    def _wanted_bytes(self, topic: str, partition: int, offsets: int) -> int:
        """Fetch size for ``offsets`` more offsets: what they took so far (bytes per offset
        learnt from earlier fetches of the partition) plus a margin, within bounds; a fetch
        sized for the whole log would read far past a small chunk."""
        return min(self._max_bytes, self._expected_bytes(topic, partition, offsets))

    def _expected_bytes(self, topic: str, partition: int, offsets: int) -> int:
        """What ``offsets`` more offsets take, with a margin (the fetch size, uncapped)."""
        ratio = self._bytes_per_offset.get((topic, partition))
        if ratio is None:
            return self._max_bytes
        return int(max(_MIN_FETCH_BYTES, ratio * offsets * 1.25 + 4096))

    def _learn(self, topic: str, partition: int, size: int, offsets: int) -> None:
        if offsets <= 0:
            return
        ratio = size / offsets
        known = self._bytes_per_offset.get((topic, partition))
        self._bytes_per_offset[(topic, partition)] = (
            ratio if known is None else max(ratio, 0.5 * known + 0.5 * ratio)
        )

    async def _fetch_leader(
        self, topic: str, partition: int, offset: int, size: int, into: np.ndarray
    ) -> PartitionFetch:
        """One Fetch from the partition's current leader; :class:`_Retry` when the leader is
        unknown or moved, or its connection failed."""
        leader = await self._leader(topic, partition)
        broker = self._client.cluster.broker_metadata(leader)
        if broker is None:
            raise _Retry(f"no address for broker {leader}")
        try:
            response = await self._fetches.fetch(
                (broker.host, broker.port), topic, partition, offset, size, into
            )
        except FetchAuthenticationError as error:
            raise ProviderUnavailable(f"Fetch {topic}/{partition}: {error}") from None
        except FetchError as error:
            raise _Retry(str(error)) from None
        code = response.error_code
        if code != _NO_ERROR:
            name = for_code(code).__name__
            if not _retriable(code):
                raise ProviderUnavailable(f"Fetch {topic}/{partition}@{offset}: {name}")
            raise _Retry(f"broker {leader} answered {name}")
        return response

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        """The batches holding offsets ``[start, end)`` (``end`` at most the last stable
        offset), read_committed, fetching again from the next offset until ``end`` is reached
        (a fetch may return a single batch). Stops early only if the log has nothing more."""
        await self.start()
        # Responses are received straight into one buffer, one after the other; it grows
        # (one copy) only when a response would not fit.
        # Pages of the buffer that are never filled cost nothing.
        lease = RECEIVED_RECORDS.lease()
        buffer = lease.take(self._expected_bytes(topic, partition, end - start))
        filled = 0
        aborted: set[tuple[int, int]] = set()
        offset = start
        while offset < end:
            wanted = self._wanted_bytes(topic, partition, end - offset)
            if buffer.size - filled < wanted:
                buffer = _grown(buffer, filled, filled + wanted, lease)
            KAFKA_FETCHES.labels("request").inc()
            response = await self._with_retries(
                f"Fetch {topic}/{partition}@{offset}",
                functools.partial(
                    self._fetch_leader, topic, partition, offset, wanted, buffer[filled:]
                ),
            )
            aborted.update(response.aborted)
            records = response.records
            base_offsets, next_offsets, ends = batch_bounds(records)
            if not base_offsets.size:
                break
            # Batches starting at or past ``end`` are not part of the range: leave them out.
            kept = max(int(np.searchsorted(base_offsets, end)), 1)
            size = int(ends[kept - 1])
            if buffer.size - filled < len(records):  # did not fit: received elsewhere
                buffer = _grown(buffer, filled, filled + size, lease)
                buffer[filled : filled + size] = np.frombuffer(records[:size], dtype=np.uint8)
            filled += size
            next_offset = int(next_offsets[kept - 1])
            if next_offset <= offset:
                break
            self._learn(topic, partition, size, next_offset - offset)
            offset = next_offset
        _count_range((self._bootstrap, topic, partition, start, end))
        records = memoryview(buffer[:filled]).cast("B")
        return FetchedRange(records, tuple(sorted(aborted)), lease)


def _count_range(read: tuple[str, str, int, int, int]) -> None:
    """Count one completed range read, as a ``repeat`` too if it was read before."""
    KAFKA_FETCHES.labels("range").inc()
    if read in _read_ranges:
        KAFKA_FETCHES.labels("repeat").inc()
        _read_ranges.move_to_end(read)
        return
    _read_ranges[read] = None
    if len(_read_ranges) > _REMEMBERED_RANGES:
        _read_ranges.popitem(last=False)
