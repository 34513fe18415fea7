"""ISK instances sharing a cache backend with ``put_if_absent`` keep one snapshot history per
table in it: whichever instance serves a log state, its metadata is the same, byte for byte,
and every snapshot one served stays in the history the other serves."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import ChunkEntry, SnapshotRecord
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.tables import history as history_module
from bergstream.plugins.isk_gateway.tables.history import HistorySettings, history_table_name
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.provider import LoadedTable
from bergstream.plugins.isk_gateway.tables.shared_history import SharedEntry, SharedLog
from tests.isk.tables.hotset_cases import T0, expected_rows
from tests.kits.fake_log import FakeLog
from tests.kits.hotset_reader import scan_rows


def instance(tmp_path: Path, log: FakeLog, name: str, **options: Any) -> HotsetProvider:
    """An ISK with its own index and the cache directory every instance of the test shares."""
    return HotsetProvider(
        log,
        SqliteIndex(tmp_path / f"index-{name}.db"),
        LocalDiskCache(tmp_path / "shared-cache", 1 << 28),
        bucket="gw",
        cluster="c1",
        chunk_records=10,
        **options,
    )


def operations(loaded: LoadedTable) -> list[str]:
    return [s["summary"]["operation"] for s in loaded.metadata["snapshots"]]


def ids(loaded: LoadedTable) -> list[int]:
    return [s["snapshot-id"] for s in loaded.metadata["snapshots"]]


async def test_alternating_instances_serve_one_history(tmp_path: Path, log: FakeLog) -> None:
    one, two = instance(tmp_path, log, "one"), instance(tmp_path, log, "two")
    produced: dict[int, list[Any]] = {0: [], 1: []}
    previous: list[int] = []
    replaced = 0
    for round_ in range(6):
        for partition, count in ((0, 3 + round_), (1, 2)):
            produced[partition] += log.produce(
                "orders", partition, count, lambda i, r=round_: T0 + 1000 * r + i
            )
        first, second = (one, two) if round_ % 2 == 0 else (two, one)
        loaded = await first.load_table("hotset", "orders")
        # The other instance serves the same state as the same snapshot, byte for byte.
        assert await second.load_table("hotset", "orders") == loaded
        # Each state is one APPEND on top of the snapshots served before, by either instance,
        # after a REPLACE when one rebuilt small files since (windows of 10 offsets the tail
        # left): the same rows in fewer files, recorded once and listed by both.
        assert ids(loaded)[: len(previous)] == previous
        assert operations(loaded)[len(previous) :] in (["append"], ["replace", "append"])
        replaced += operations(loaded)[-2:] == ["replace", "append"]
        previous = ids(loaded)
        assert await scan_rows(second, loaded) == expected_rows(produced)
        await first.indexer.settle()
    assert replaced


async def test_concurrent_loads_of_one_state_record_one_snapshot(
    tmp_path: Path, log: FakeLog
) -> None:
    one, two = instance(tmp_path, log, "one"), instance(tmp_path, log, "two")
    log.produce("orders", 0, 14, lambda i: T0 + i)
    first, second = await asyncio.gather(
        one.load_table("hotset", "orders"), two.load_table("hotset", "orders")
    )
    assert first == second and len(ids(first)) == 1
    log.produce("orders", 0, 4, lambda i: T0 + 100 + i)
    first, second = await asyncio.gather(
        two.load_table("hotset", "orders"), one.load_table("hotset", "orders")
    )
    assert first == second and operations(first) == ["append", "append"]


async def test_chunks_another_instance_indexed_are_cut_at_the_shared_watermarks(
    tmp_path: Path, log: FakeLog
) -> None:
    one, two = instance(tmp_path, log, "one"), instance(tmp_path, log, "two")
    log.produce("orders", 0, 13, lambda i: T0 + i)
    served = await one.load_table("hotset", "orders")  # seals [10, 13) at the watermark
    log.produce("orders", 0, 9, lambda i: T0 + 100 + i)
    await two.indexer.index_topic("orders")  # its own index: [0, 10), [10, 20)
    name = f"orders#{two.layout}"
    assert [(c.start_offset, c.end_offset) for c in two.index.chunks(name, 0)][:2] == [
        (0, 10), (10, 20)
    ]  # fmt: skip
    loaded = await two.load_table("hotset", "orders")
    assert ids(loaded)[:-1] == ids(served)
    assert operations(loaded) == ["append", "append"]
    newest = loaded.metadata["snapshots"][-1]["summary"]
    assert newest["added-records"] == "9" and newest["added-data-files"] == "2"  # [13,20) [20,22)
    assert await one.load_table("hotset", "orders") == loaded


async def test_an_instance_new_to_the_table_serves_the_retained_history(
    tmp_path: Path, log: FakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_module, "CHECKPOINT_POSITIONS", 4)
    settings = HistorySettings(max_count=3)
    one = instance(tmp_path, log, "one", history=settings)
    for round_ in range(10):
        log.produce("orders", round_ % 2, 7, lambda i, r=round_: T0 + 1000 * r + i)
        loaded = await one.load_table("hotset", "orders")
    # Once the small files it found are rebuilt, the same state: the same bytes.
    await one.indexer.settle()
    loaded = await one.load_table("hotset", "orders")
    assert len(ids(loaded)) == 3
    assert await one.load_table("hotset", "orders") == loaded
    # Reads positions 5 (a checkpoint: every chunk) to 10, and keeps the same ones.
    late = instance(tmp_path, log, "late", history=settings)
    assert await late.load_table("hotset", "orders") == loaded


async def test_an_instance_whose_cache_cannot_share_keeps_its_own_history(
    tmp_path: Path, log: FakeLog
) -> None:
    class PlainCache(LocalDiskCache):
        put_if_absent = None  # type: ignore[assignment]

    assert not SharedLog.can_share(PlainCache(tmp_path / "plain", 1 << 20))
    assert SharedLog.can_share(LocalDiskCache(tmp_path / "conditional", 1 << 20))
    provider = HotsetProvider(
        log, SqliteIndex(tmp_path / "index.db"), PlainCache(tmp_path / "plain", 1 << 28),
        bucket="gw", cluster="c1", chunk_records=10,
    )  # fmt: skip
    assert provider.histories.shared is None
    log.produce("orders", 0, 5, lambda i: T0 + i)
    assert len(ids(await provider.load_table("hotset", "orders"))) == 1


def test_a_shared_entry_round_trips_with_binary_and_time_bounds() -> None:
    chunk = ChunkEntry(
        "orders#day", 1, 10, 13, 3, 999,
        {
            "kafka_offset": (10, 12),
            "kafka_key": (b"\x00a", b"\xffz"),
            "at": (dt.datetime(2026, 11, 25, tzinfo=dt.UTC), dt.datetime(2026, 11, 26, 1, 2)),
        },
    )  # fmt: skip
    entry = SharedEntry(7, SnapshotRecord(5, 2, T0, '{"format":1}'), "orders#day", [chunk])
    assert SharedEntry.decode(entry.encode()) == entry
    assert SharedEntry.decode(b"not json") is None
    assert SharedEntry.decode(b'{"format": 99}') is None


async def test_an_entry_this_version_cannot_read_is_passed_over_not_waited_on(
    tmp_path: Path, log: FakeLog, caplog: pytest.LogCaptureFixture
) -> None:
    # An entry of another format (a newer bergstream during a rolling upgrade) holds its
    # position: instances skip it and record after it, rather than losing that position forever.
    one, two = instance(tmp_path, log, "one"), instance(tmp_path, log, "two")
    log.produce("orders", 0, 5, lambda i: T0 + i)
    first = await one.load_table("hotset", "orders")
    shared = one.histories.shared
    assert shared is not None
    name = history_table_name("hotset", "orders", None)
    assert shared.cache.put_if_absent(shared.prefix + f"history/{name}/{2:012d}", b'{"format":2}')
    for provider in (two, one, two):
        log.produce("orders", 1, 3, lambda i: T0 + 100 + i)
        loaded = await provider.load_table("hotset", "orders")
        assert ids(loaded)[: len(ids(first))] == ids(first)
        assert operations(loaded) == ["append"] * len(ids(loaded))
    assert await one.load_table("hotset", "orders") == loaded
    assert "is not readable; skipped" in caplog.text
