"""Raw reads from Kafka for the hotset: record-batch bytes of an offset range, and end offsets.

Uses aiokafka's low-level client for metadata, leader routing and ListOffsets, and Fetch
connections of its own (:mod:`.raw_fetch`, one receive per response) for the bulk reads,
``read_committed``: the bytes returned are what a Fetch response's ``records`` field holds
(batches as stored, aborted ones included) together with the aborted transactions the broker
listed, exactly the input :mod:`..files.batch_decoder` expects. Where a fetch's complete
batches end is read with :func:`..files.batch_decoder.batch_bounds` (headers only, no decoding).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.structs import TopicPartition

from bergstream.plugins.isk_gateway.files.batch_decoder import batch_bounds
from bergstream.plugins.isk_gateway.kafka.buffers import pooled_array
from bergstream.plugins.isk_gateway.kafka.raw_fetch import FetchConnections, FetchError
from bergstream.plugins.isk_gateway.tables.provider import NoSuchTable, ProviderUnavailable

__all__ = ["FetchedRange", "KafkaReader", "PartitionOffsets"]

READ_COMMITTED = 1
READ_UNCOMMITTED = 0
_LATEST = -1
_EARLIEST = -2
_NO_ERROR = 0
#: The smallest fetch size asked for once a partition's record size is known.
_MIN_FETCH_BYTES = 64 * 1024


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
    transactions ``(producer_id, first_offset)`` listed with them."""

    records: bytes | memoryview
    aborted: tuple[tuple[int, int], ...]


def _grown(buffer: np.ndarray, filled: int, size: int) -> np.ndarray:
    """A buffer of ``size`` bytes starting with ``buffer[:filled]``."""
    grown = pooled_array(size)
    grown[:filled] = buffer[:filled]
    return grown


class KafkaReader:
    """Reads raw batches and end offsets from one Kafka cluster (``async with`` or start/close)."""

    def __init__(
        self,
        bootstrap: str,
        client_id: str = "bergstream-isk",
        max_fetch_bytes: int = 64 * 1024 * 1024,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self._client = AIOKafkaClient(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
        )
        self._max_bytes = max_fetch_bytes
        self._bytes_per_offset: dict[tuple[str, int], float] = {}
        self._fetches = FetchConnections(client_id, request_timeout_ms / 1000)
        self._started = False

    async def start(self) -> None:
        """Connect to the cluster."""
        if not self._started:
            try:
                await self._client.bootstrap()
            except KafkaError as error:
                raise ProviderUnavailable(f"Kafka is unreachable: {error}") from error
            self._started = True

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
        try:
            metadata = await self._client.fetch_all_metadata()
        except KafkaError as error:
            raise ProviderUnavailable(f"Kafka metadata: {error}") from error
        return sorted(t for t in metadata.topics(exclude_internal_topics=True) if t[:2] != "__")

    async def partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic``; :class:`NoSuchTable` if Kafka does not know it."""
        await self.start()
        try:
            metadata = await self._client.fetch_all_metadata()
        except KafkaError as error:
            raise ProviderUnavailable(f"Kafka metadata: {error}") from error
        partitions = metadata.partitions_for_topic(topic)
        if not partitions:
            raise NoSuchTable(f"no topic {topic!r} in Kafka")
        return sorted(partitions)

    async def _leader(self, topic: str, partition: int) -> int:
        tp = TopicPartition(topic, partition)
        leader = self._client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            await self._client.force_metadata_update()
            leader = self._client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            raise ProviderUnavailable(f"no leader for {topic}/{partition}")
        return leader

    async def _list_offsets(
        self, topic: str, partitions: Iterable[int], timestamp: int, isolation: int
    ) -> dict[int, int]:
        by_leader: dict[int, list[int]] = {}
        for partition in partitions:
            by_leader.setdefault(await self._leader(topic, partition), []).append(partition)
        out: dict[int, int] = {}
        for leader, parts in by_leader.items():
            request = OffsetRequest(-1, isolation, [(topic, [(p, timestamp) for p in parts])])
            try:
                response = await self._client.send(leader, request)
            except KafkaError as error:
                raise ProviderUnavailable(f"ListOffsets {topic}: {error}") from error
            for _topic, part_data in response.topics:
                for partition, error_code, *info in part_data:
                    if error_code != _NO_ERROR:
                        await self._client.force_metadata_update()
                        raise ProviderUnavailable(
                            f"ListOffsets {topic}/{partition}: {for_code(error_code).__name__}"
                        )
                    out[partition] = info[1] if response.API_VERSION >= 1 else info[0][0]
        return out

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

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        """The batches holding offsets ``[start, end)`` (``end`` at most the last stable
        offset), read_committed, fetching again from the next offset until ``end`` is reached
        (a fetch may return a single batch). Stops early only if the log has nothing more."""
        await self.start()
        # Responses are received straight into one buffer, one after the other; it grows
        # (one copy) only when a response would not fit.
        # Pages of the buffer that are never filled cost nothing.
        buffer = pooled_array(self._expected_bytes(topic, partition, end - start))
        filled = 0
        aborted: set[tuple[int, int]] = set()
        offset = start
        while offset < end:
            leader = await self._leader(topic, partition)
            broker = self._client.cluster.broker_metadata(leader)
            if broker is None:
                await self._client.force_metadata_update()
                raise ProviderUnavailable(f"no address for broker {leader}")
            wanted = self._wanted_bytes(topic, partition, end - offset)
            if buffer.size - filled < wanted:
                buffer = _grown(buffer, filled, filled + wanted)
            try:
                response = await self._fetches.fetch(
                    (broker.host, broker.port), topic, partition, offset, wanted, buffer[filled:]
                )
            except FetchError as error:
                raise ProviderUnavailable(f"Fetch {topic}/{partition}: {error}") from error
            if response.error_code != _NO_ERROR:
                await self._client.force_metadata_update()
                raise ProviderUnavailable(
                    f"Fetch {topic}/{partition}@{offset}: {for_code(response.error_code).__name__}"
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
                buffer = _grown(buffer, filled, filled + size)
                buffer[filled : filled + size] = np.frombuffer(records[:size], dtype=np.uint8)
            filled += size
            next_offset = int(next_offsets[kept - 1])
            if next_offset <= offset:
                break
            self._learn(topic, partition, size, next_offset - offset)
            offset = next_offset
        records = memoryview(buffer[:filled]).cast("B")
        return FetchedRange(records, tuple(sorted(aborted)))
