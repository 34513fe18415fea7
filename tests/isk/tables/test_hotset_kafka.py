"""The hotset on a real broker: produce (transactions committed and aborted, compression,
headers, a day boundary, two partitions), load the table, read it with PyIceberg through
provider.read_file and compare with what a read_committed consumer gets (the row contract)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from tests.kits.hotset_reader import data_files, scan_rows
from tests.support import consume_rows

pytestmark = pytest.mark.slow

DAY_MS = 86_400_000
MIDNIGHT = (1_700_000_000_000 // DAY_MS + 1) * DAY_MS


def produce(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap, "compression.type": "gzip"})
    for i in range(40):
        plain.produce(
            topic,
            key=None if i % 6 == 0 else b"k%d" % i,
            value=None if i % 9 == 4 else b"v%d" % i,
            headers=[("h", b"1"), ("h", None)][: i % 3],
            partition=i % 2,
            timestamp=MIDNIGHT - 20 + i,  # crosses midnight
        )
        if i % 7 == 0:
            plain.flush(30)
    plain.flush(30)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn"})
    txn.init_transactions(30)
    for commit in (True, False, True):
        txn.begin_transaction()
        for i in range(4):
            txn.produce(topic, value=b"t%s%d" % (b"c" if commit else b"a", i), partition=0)
        txn.flush(30)
        if commit:
            txn.commit_transaction(30)
        else:
            txn.abort_transaction(30)


def provider_for(
    reader: KafkaReader, tmp_path: Path, name: str, chunk_records: int = 7, **options: Any
) -> HotsetProvider:
    return HotsetProvider(
        reader,
        SqliteIndex(tmp_path / f"{name}.db"),
        LocalDiskCache(tmp_path / f"{name}-cache", 1 << 28),
        bucket="gw",
        cluster="c1",
        chunk_records=chunk_records,
        **options,
    )


async def test_hotset_table_equals_read_committed_consumption(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic)
    expected = consume_rows(kafka_bootstrap, topic, 48)
    async with KafkaReader(kafka_bootstrap) as reader:
        provider = provider_for(reader, tmp_path, "a")
        assert topic in await provider.list_tables("hotset")
        loaded = await provider.load_table("hotset", topic)
        assert await scan_rows(provider, loaded) == expected
        assert loaded == await provider.load_table("hotset", topic)  # same state, same metadata

        days = {
            key.split("/day=")[1].split("/")[0]
            for key, _ in await provider.list_keys(f"c1/hotset/{topic}/data/", 1000)
        }
        # files split at midnight; the transactions carry the broker's "now"
        assert {"2023-11-14", "2023-11-15"} < days and len(days) == 3

        # an open transaction: its records stay out until it commits (up to the LSO only)
        from confluent_kafka import Producer

        txn = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-open"})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce(topic, value=b"pending", partition=1)
        txn.flush(30)
        offsets = await reader.offsets(topic)
        assert offsets[1].last_stable < offsets[1].high_watermark
        pending = await provider.load_table("hotset", topic)
        assert await scan_rows(provider, pending) == expected
        summary = pending.metadata["snapshots"][0]["summary"]
        assert f'"1":{offsets[1].last_stable}' in summary["bergstream.hotset-offsets"]
        txn.commit_transaction(30)
        committed = await provider.load_table("hotset", topic)
        rows = await scan_rows(provider, committed)
        assert len(rows) == len(expected) + 1 and rows[-1]["kafka_value"] == b"pending"

        # another gateway with an empty cache rebuilds data files from their keys alone
        fresh = provider_for(reader, tmp_path, "b")
        for key, size in await provider.list_keys(f"c1/hotset/{topic}/data/", 1000):
            data = await fresh.read_file(key)
            assert len(data) == size and data == await provider.read_file(key)


def produce_round(bootstrap: str, topic: str, round_number: int, producers: dict) -> int:
    """Three plain records to partition 0 of ``topic``; every third round also a committed
    transaction of two records and an aborted one of one (their markers take offsets too).
    Returns the records a read_committed consumer gets from the round."""
    from confluent_kafka import Producer

    plain = producers.setdefault("plain", Producer({"bootstrap.servers": bootstrap}))
    for i in range(3):
        plain.produce(topic, key=b"k%d" % i, value=b"r%d-%d" % (round_number, i), partition=0)
    plain.flush(30)
    if round_number % 3:
        return 3
    if "txn" not in producers:
        producers["txn"] = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-rounds"}
        )
        producers["txn"].init_transactions(30)
    txn = producers["txn"]
    for commit, count in ((True, 2), (False, 1)):
        txn.begin_transaction()
        for i in range(count):
            txn.produce(
                topic,
                value=b"t%d-%s%d" % (round_number, b"c" if commit else b"a", i),
                partition=0,
            )
        txn.flush(30)
        if commit:
            txn.commit_transaction(30)
        else:
            txn.abort_transaction(30)
    return 5


async def test_small_files_of_frequent_loads_are_rebuilt_from_the_broker(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A table loaded after every few records (plain, committed and aborted transactions) gets
    a small file per load; runs of them are read again from the broker as one file, and every
    snapshot, a REPLACE too, still reads the read_committed records it read when served."""
    topic = new_topic(partitions=1)
    producers: dict = {}
    counts: list[int] = []  # the read_committed records each load's snapshot holds
    async with KafkaReader(kafka_bootstrap) as reader:
        # A window of 40 offsets; with coalesce_files 4 a chunk under 10 offsets is small.
        provider = provider_for(reader, tmp_path, "r", chunk_records=40, coalesce_files=4)
        tables = []
        for round_number in range(12):
            counts.append((counts[-1] if counts else 0) + produce_round(
                kafka_bootstrap, topic, round_number, producers
            ))  # fmt: skip
            tables.append(await provider.load_table("hotset", topic))
            await provider.indexer.settle()
        last = tables[-1]
        expected = consume_rows(kafka_bootstrap, topic, counts[-1])
        assert len(expected) == counts[-1]
        assert await scan_rows(provider, last) == expected

        files = await data_files(provider, last)
        assert len(files) < len(tables), files
        snapshots = last.metadata["snapshots"]
        operations = "".join(s["summary"]["operation"][0] for s in snapshots)
        assert "r" in operations and operations.count("a") == len(tables), operations
        appended = 0
        for snapshot in snapshots:
            appended += snapshot["summary"]["operation"] == "append"
            rows = await scan_rows(provider, last, snapshot_id=snapshot["snapshot-id"])
            assert rows == expected[: counts[appended - 1]], (operations, snapshot)
        # A table served before the rebuilds reads the same rows from its own (small) files.
        assert await scan_rows(provider, tables[4]) == expected[: counts[4]]
        # Another gateway with an empty cache builds the rebuilt files from their keys alone.
        fresh = provider_for(reader, tmp_path, "r2", chunk_records=40, coalesce_files=4)
        for key, size in await provider.list_keys(f"c1/hotset/{topic}/data/", 1000):
            data = await fresh.read_file(key)
            assert len(data) == size and data == await provider.read_file(key)
