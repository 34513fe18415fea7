"""KafkaReader against a real broker: end offsets, and read_committed fetches of offset ranges
that span many batches, transactions included."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from bergstream.plugins.isk_gateway.tables.provider import NoSuchTable

pytestmark = pytest.mark.slow


def produce(bootstrap: str, topic: str) -> None:
    """30 plain records in separate batches, then a committed and an aborted transaction."""
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(30):
        plain.produce(topic, value=b"v%d" % i, partition=0, timestamp=1_700_000_000_000 + i)
        plain.flush(30)  # one batch per record
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn"})
    txn.init_transactions(30)
    for commit in (True, False):
        txn.begin_transaction()
        for i in range(3):
            txn.produce(topic, value=b"t%d" % i, partition=0, timestamp=1_700_000_001_000)
        txn.flush(30)
        if commit:
            txn.commit_transaction(30)
        else:
            txn.abort_transaction(30)


async def test_offsets_and_ranged_read_committed_fetch(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic)
    async with KafkaReader(kafka_bootstrap, max_fetch_bytes=100) as reader:
        assert topic in await reader.topics()
        assert all(not name.startswith("__") for name in await reader.topics())
        offsets = await reader.offsets(topic)
        assert sorted(offsets) == [0, 1]
        p0 = offsets[0]
        # 30 plain + (3 + marker) committed + (3 + marker) aborted
        assert (p0.log_start, p0.high_watermark, p0.last_stable) == (0, 38, 38)
        assert (offsets[1].high_watermark, offsets[1].last_stable) == (0, 0)

        fetched = await reader.fetch(topic, 0, 5, 25)
        table = records_to_table(fetched.records, 0, 5, 25, fetched.aborted)
        assert table.column("kafka_offset").to_pylist() == list(range(5, 25))

        everything = await reader.fetch(topic, 0, 0, p0.last_stable)
        assert everything.aborted, "the aborted transaction is listed"
        rows = records_to_table(everything.records, 0, 0, p0.last_stable, everything.aborted)
        values = rows.column("kafka_value").to_pylist()
        assert values == [b"v%d" % i for i in range(30)] + [b"t0", b"t1", b"t2"]

        with pytest.raises(NoSuchTable):
            await reader.partitions(f"{topic}-missing")
        # Asking about a missing topic never creates it (the stack's brokers have
        # auto.create.topics.enable, as many clusters do).
        assert f"{topic}-missing" not in await reader.topics()
        assert await reader.partitions(topic) == [0, 1]
