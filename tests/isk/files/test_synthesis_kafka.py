"""Synthesis of batches a real broker returns: transactions (committed and aborted), control
batches, compression, headers; rows must equal what a read_committed consumer sees."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.structs import TopicPartition

from bergstream.core.records import split_batches
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from tests.support import consume_rows

pytestmark = pytest.mark.slow

READ_COMMITTED = 1


def produce(bootstrap: str, topic: str) -> None:
    """A committed, an aborted and a committed transaction, then plain gzip records."""
    from confluent_kafka import Producer

    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn"})
    txn.init_transactions(30)
    for commit, count in ((True, 5), (False, 3), (True, 4)):
        txn.begin_transaction()
        for i in range(count):
            txn.produce(
                topic,
                key=None if i == 0 else b"" if i == 1 else f"k{i}".encode(),
                value=None if i == 2 else f"{'c' if commit else 'a'}{i}".encode(),
                headers=[("h", b"1"), ("h", None), ("ключ", b"\x00")][: i % 4],
                partition=0,
                timestamp=1_700_000_000_000 + i,
            )
        txn.flush(30)  # an abort purges unsent records: make the broker write them first
        if commit:
            txn.commit_transaction(30)
        else:
            txn.abort_transaction(30)
    plain = Producer({"bootstrap.servers": bootstrap, "compression.type": "gzip"})
    for i in range(3):
        plain.produce(topic, key=b"p", value=b"plain%d" % i, partition=0, timestamp=0)
    plain.flush(30)


async def raw_fetch(bootstrap: str, topic: str) -> tuple[bytes, list[tuple[int, int]], int]:
    """Records bytes, aborted transactions and last stable offset of partition 0, fetched
    read_committed from offset 0 up to the last stable offset (a fetch may stop early, so
    fetch again from the next offset, as consumers do)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    blob = bytearray()
    aborted: set[tuple[int, int]] = set()
    offset, last_stable = 0, None
    try:
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(TopicPartition(topic, 0))
        deadline = time.monotonic() + 60
        while last_stable is None or offset < last_stable:
            assert time.monotonic() < deadline, f"fetching stalled at offset {offset}"
            request = FetchRequest(
                100, 1, 10_000_000, READ_COMMITTED, [(topic, [(0, offset, 10_000_000)])]
            )
            response = await client.send(leader, request)
            ((_topic, partitions),) = response.topics
            ((_partition, error_code, _high, *part_data),) = partitions
            assert error_code == 0 and response.API_VERSION >= 4
            # v4..v10: [lso, (log_start,) aborted, records];
            # v11+: [lso, log_start, aborted, preferred_read_replica, records]
            last_stable = part_data[0]
            listed = part_data[2] if response.API_VERSION >= 11 else part_data[-2]
            aborted.update((producer, first) for producer, first in listed or ())
            batches = list(split_batches(part_data[-1]))
            if batches:
                blob += part_data[-1]
                last = DefaultRecordBatch(bytes(batches[-1]))
                offset = last.next_offset
        return bytes(blob), sorted(aborted), last_stable
    finally:
        await client.close()


async def test_real_batches_synthesize_to_what_read_committed_consumers_see(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    produce(kafka_bootstrap, topic)
    expected = consume_rows(kafka_bootstrap, topic, 12)
    records, aborted, last_stable = await raw_fetch(kafka_bootstrap, topic)
    assert aborted, "the broker should list the aborted transaction"
    table = records_to_table(records, 0, end_offset=last_stable, aborted_transactions=aborted)
    assert table.to_pylist() == expected
    uncommitted = records_to_table(records, 0, end_offset=last_stable)
    assert uncommitted.num_rows == len(expected) + 3  # the aborted records, when not dropped
