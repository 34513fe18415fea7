"""Snapshot history of hotset tables: every served state stays a snapshot (time travel), new
records come as APPEND snapshots of new files only (incremental reads), the history survives a
restart and is pruned by retention and by what Kafka still holds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pyiceberg.manifest import ManifestEntryStatus

from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.tables.history import HistorySettings
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.paths import key_from_uri
from bergstream.plugins.isk_gateway.tables.router import NamespaceRouter
from bergstream.plugins.isk_gateway.tables.snapshot_recorder import SnapshotRecorder
from tests.isk.tables.hotset_cases import T0, expected_rows, make_provider
from tests.kits.fake_log import FakeLog
from tests.kits.hotset_reader import open_table, scan_rows


def snapshot_ids(metadata: dict[str, Any]) -> list[int]:
    return [s["snapshot-id"] for s in metadata["snapshots"]]


async def added_files(provider: HotsetProvider, loaded: Any, snapshot_id: int) -> set[str]:
    """Paths of the data files the manifests of ``snapshot_id`` list as ADDED by it."""
    table = open_table(provider, loaded, asyncio.get_running_loop())

    def read() -> set[str]:
        snapshot = table.snapshot_by_id(snapshot_id)
        assert snapshot is not None
        return {
            entry.data_file.file_path
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io)
            if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot_id
        }

    return await asyncio.to_thread(read)


async def test_an_earlier_snapshot_stays_readable_after_new_records(
    tmp_path: Path, log: FakeLog
) -> None:
    first = {0: log.produce("orders", 0, 12, lambda i: T0 + i)}
    provider = make_provider(tmp_path, log, chunk_records=10)
    one = await provider.load_table("hotset", "orders")
    earlier = one.metadata["current-snapshot-id"]

    more = log.produce("orders", 0, 5, lambda i: T0 + 100 + i)
    two = await provider.load_table("hotset", "orders")
    current = two.metadata["current-snapshot-id"]
    assert current != earlier
    assert snapshot_ids(two.metadata) == [earlier, current]
    newest = two.metadata["snapshots"][-1]
    assert newest["parent-snapshot-id"] == earlier
    assert newest["sequence-number"] == 2
    assert newest["summary"]["operation"] == "append"
    assert newest["summary"]["added-records"] == "5"
    assert [e["snapshot-id"] for e in two.metadata["snapshot-log"]] == [earlier, current]

    assert await scan_rows(provider, two, snapshot_id=earlier) == expected_rows(first)
    assert await scan_rows(provider, two) == expected_rows({0: first[0] + more})
    # Only the new records' file is ADDED by the new snapshot: an incremental read between the
    # two snapshots sees exactly them.
    added = await added_files(provider, two, current)
    assert [p.rsplit("/", 1)[1] for p in sorted(added)] == ["12-17.parquet"]

    # The same state again: the same metadata, byte for byte.
    again = await provider.load_table("hotset", "orders")
    assert again == two
    key = key_from_uri("gw", two.metadata_location)
    assert await provider.read_file(key) == await provider.read_file(
        key_from_uri("gw", again.metadata_location)
    )


async def test_the_history_survives_a_restart(tmp_path: Path, log: FakeLog) -> None:
    first = {0: log.produce("orders", 0, 7, lambda i: T0 + i)}
    provider = make_provider(tmp_path, log)
    earlier = (await provider.load_table("hotset", "orders")).metadata["current-snapshot-id"]
    log.produce("orders", 0, 3, lambda i: T0 + 50 + i)
    await provider.load_table("hotset", "orders")
    provider.index.close()

    restarted = make_provider(tmp_path, log)  # same index file and cache directory
    log.produce("orders", 1, 2, lambda i: T0 + 60 + i)
    loaded = await restarted.load_table("hotset", "orders")
    assert len(loaded.metadata["snapshots"]) == 3
    assert snapshot_ids(loaded.metadata)[0] == earlier
    assert await scan_rows(restarted, loaded, snapshot_id=earlier) == expected_rows(first)


async def test_retention_keeps_the_newest_snapshots(tmp_path: Path, log: FakeLog) -> None:
    provider = make_provider(tmp_path, log, history=HistorySettings(max_count=2))
    ids = []
    for round_ in range(4):
        log.produce("orders", 0, 2, lambda i, r=round_: T0 + 10 * r + i)
        ids.append((await provider.load_table("hotset", "orders")).metadata["current-snapshot-id"])
    loaded = await provider.load_table("hotset", "orders")
    assert snapshot_ids(loaded.metadata) == ids[-2:]
    assert [r.snapshot_id for r in provider.index.snapshots("hotset/orders#raw")] == ids[-2:]


async def test_a_snapshot_whose_records_kafka_deleted_is_dropped(
    tmp_path: Path, log: FakeLog
) -> None:
    log.produce("orders", 0, 6, lambda i: T0 + i)
    provider = make_provider(tmp_path, log)
    earlier = (await provider.load_table("hotset", "orders")).metadata["current-snapshot-id"]
    records = log.produce("orders", 0, 4, lambda i: T0 + 20 + i)
    middle = (await provider.load_table("hotset", "orders")).metadata["current-snapshot-id"]
    log.log_start[("orders", 0)] = 6  # Kafka deleted offsets 0..5: the first snapshot's file
    loaded = await provider.load_table("hotset", "orders")
    ids = snapshot_ids(loaded.metadata)
    assert earlier not in ids
    # The middle snapshot read offsets 0..9 (files [0,6) and [6,10)): gone too; the current one
    # lists only what Kafka holds.
    assert middle not in ids
    assert await scan_rows(provider, loaded) == expected_rows({0: records})


async def test_the_recorder_takes_a_snapshot_nobody_asked_for(tmp_path: Path, log: FakeLog) -> None:
    log.produce("orders", 0, 4, lambda i: T0 + i)
    provider = make_provider(tmp_path, log)
    recorder = SnapshotRecorder(provider.histories, {"hotset": provider}, interval=3600)
    earlier = (await provider.load_table("hotset", "orders")).metadata["current-snapshot-id"]
    assert await recorder.record_due() == 0  # recorded just now: not due
    log.produce("orders", 1, 3, lambda i: T0 + 10 + i)
    recorder.interval = 0
    await asyncio.sleep(0.01)
    assert await recorder.record_due() == 1
    recorded = [r.snapshot_id for r in provider.index.snapshots("hotset/orders#raw")]
    assert len(recorded) == 2 and recorded[0] == earlier
    # The client's next LoadTable (no new records) serves the recorded snapshot.
    loaded = await provider.load_table("hotset", "orders")
    assert snapshot_ids(loaded.metadata) == recorded


async def test_snapshots_whose_metadata_the_cache_lost_are_dropped(
    tmp_path: Path, log: FakeLog
) -> None:
    """After a restart with an emptied cache, the older snapshots' manifest lists are gone:
    they leave the history (never listed unreadable); the current state is served again."""
    first = log.produce("orders", 0, 5, lambda i: T0 + i)
    provider = make_provider(tmp_path, log)
    await provider.load_table("hotset", "orders")
    more = log.produce("orders", 0, 5, lambda i: T0 + 10 + i)
    current = (await provider.load_table("hotset", "orders")).metadata["current-snapshot-id"]
    provider.index.close()

    restarted = HotsetProvider(
        log,
        SqliteIndex(tmp_path / "index-a.db"),
        LocalDiskCache(tmp_path / "emptied-cache", 1 << 28),
        bucket="gw",
        cluster="c1",
        chunk_records=10,
    )
    loaded = await restarted.load_table("hotset", "orders")
    (snapshot,) = loaded.metadata["snapshots"]  # the same state: the same id, a new root
    assert snapshot["snapshot-id"] == current and "parent-snapshot-id" not in snapshot
    assert [r.snapshot_id for r in restarted.index.snapshots("hotset/orders#raw")] == [current]
    assert await scan_rows(restarted, loaded) == expected_rows({0: first + more})


async def test_the_recorder_through_the_router_never_loads_beside_a_client(
    tmp_path: Path, log: FakeLog
) -> None:
    """As the service wires it: the recorder's loads join clients' loads of the same table, so
    no load of a table runs beside another (one could serve older offsets than the other)."""
    log.produce("orders", 0, 4, lambda i: T0 + i)
    provider = make_provider(tmp_path, log)
    router = NamespaceRouter({"hotset": provider}, provider.store)
    await router.load_table("hotset", "orders")
    running, most = 0, 0
    load = provider.load_table

    async def counted(namespace: str, table: str) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.05)
            return await load(namespace, table)
        finally:
            running -= 1

    provider.load_table = counted  # type: ignore[method-assign]
    recorder = SnapshotRecorder(provider.histories, {"hotset": router}, interval=0)
    log.produce("orders", 1, 3, lambda i: T0 + 10 + i)
    await asyncio.sleep(0.01)
    await asyncio.gather(
        recorder.record_due(), *(router.load_table("hotset", "orders") for _ in range(3))
    )
    assert most == 1
