"""An in-process Kafka log for hotset tests: real v2 record batches (core.records.build_batch)
served as a read_committed Fetch serves them (whole batches from the one holding ``start``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bergstream.core.records import BatchInfo, Record, build_batch
from bergstream.plugins.isk_gateway.kafka.reader import FetchedRange, PartitionOffsets
from bergstream.plugins.isk_gateway.tables.provider import NoSuchTable

DAY_MS = 86_400_000


class FakeLog:
    """Topics -> partitions -> batches; implements hotset.KafkaSource."""

    def __init__(self) -> None:
        self.batches: dict[str, dict[int, list[tuple[int, int, bytes]]]] = {}
        self.log_start: dict[tuple[str, int], int] = {}
        self.fetches = 0

    def create(self, topic: str, partitions: int) -> None:
        self.batches[topic] = {p: [] for p in range(partitions)}

    def append(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Append ``records`` (offsets must follow the log's end) as one batch."""
        base = records[0].offset
        assert base == self.end(topic, partition)
        data = build_batch(records, BatchInfo(base_offset=base))
        self.batches[topic][partition].append((base, records[-1].offset + 1, data))

    def produce(
        self,
        topic: str,
        partition: int,
        count: int,
        timestamp: Callable[[int], int],
        per_batch: int = 3,
    ) -> list[Record]:
        """Append ``count`` records, ``per_batch`` per batch; record i has ``timestamp(i)``."""
        start = self.end(topic, partition)
        records = [
            Record(
                start + i,
                timestamp(start + i),
                None if i % 5 == 0 else b"k%d" % i,
                None if i % 7 == 3 else b"value-%d" % (start + i),
                (("h", b"x"), ("h", None)) if i % 2 else (),
            )
            for i in range(count)
        ]
        for first in range(0, count, per_batch):
            self.append(topic, partition, records[first : first + per_batch])
        return records

    def end(self, topic: str, partition: int) -> int:
        batches = self.batches[topic][partition]
        return batches[-1][1] if batches else 0

    async def topics(self) -> list[str]:
        return sorted(self.batches)

    async def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        if topic not in self.batches:
            raise NoSuchTable(topic)
        return {
            p: PartitionOffsets(
                p, self.log_start.get((topic, p), 0), self.end(topic, p), self.end(topic, p)
            )
            for p in self.batches[topic]
        }

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        self.fetches += 1
        blob = b"".join(
            data
            for base, next_offset, data in self.batches[topic][partition]
            if next_offset > start and base < end
        )
        return FetchedRange(blob, ())
