"""Raw reads from Kafka for the hotset: record-batch bytes of an offset range, and end offsets.

Uses aiokafka's low-level client (metadata, leader routing, version negotiation) with plain
Fetch and ListOffsets requests, ``read_committed``: the bytes returned are what a Fetch response's
``records`` field holds (batches as stored, aborted ones included) together with the aborted
transactions the broker listed, exactly the input :mod:`..synthesis` expects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.structs import TopicPartition

from bergstream.core.records import split_batches
from bergstream.plugins.isk_gateway.provider import NoSuchTable, ProviderUnavailable

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

    records: bytes
    aborted: tuple[tuple[int, int], ...]


class KafkaReader:
    """Reads raw batches and end offsets from one Kafka cluster (``async with`` or start/close)."""

    def __init__(
        self,
        bootstrap: str,
        client_id: str = "bergstream-isk",
        max_fetch_bytes: int = 16 * 1024 * 1024,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self._client = AIOKafkaClient(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
        )
        self._max_bytes = max_fetch_bytes
        self._bytes_per_offset: dict[tuple[str, int], float] = {}
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
        ratio = self._bytes_per_offset.get((topic, partition))
        if ratio is None:
            return self._max_bytes
        return int(min(self._max_bytes, max(_MIN_FETCH_BYTES, ratio * offsets * 1.25 + 4096)))

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
        blob = bytearray()
        aborted: set[tuple[int, int]] = set()
        offset = start
        while offset < end:
            leader = await self._leader(topic, partition)
            wanted = self._wanted_bytes(topic, partition, end - offset)
            request = FetchRequest(
                0,
                1,
                wanted,
                READ_COMMITTED,
                [(topic, [(partition, offset, wanted)])],
            )
            try:
                response = await self._client.send(leader, request)
            except KafkaError as error:
                raise ProviderUnavailable(f"Fetch {topic}/{partition}: {error}") from error
            ((_topic, parts),) = response.topics
            ((_partition, error_code, _high, *data),) = parts
            if error_code != _NO_ERROR:
                await self._client.force_metadata_update()
                raise ProviderUnavailable(
                    f"Fetch {topic}/{partition}@{offset}: {for_code(error_code).__name__}"
                )
            listed = data[2] if response.API_VERSION >= 11 else data[-2]
            aborted.update((producer, first) for producer, first in listed or ())
            records = data[-1] or b""
            batches = list(split_batches(records))
            if not batches:
                break
            # Batches starting at or past ``end`` are not part of the range: leave them out.
            kept = [b for b in batches if int.from_bytes(b[:8], "big") < end]
            kept = kept or batches[:1]
            size = sum(len(batch) for batch in kept)
            blob += records[:size]
            next_offset = DefaultRecordBatch(bytes(kept[-1])).next_offset
            if next_offset <= offset:
                break
            self._learn(topic, partition, size, next_offset - offset)
            offset = next_offset
        return FetchedRange(bytes(blob), tuple(sorted(aborted)))
