"""NamespaceRouter: a metadata file missing from a fresh store is rebuilt by reloading its table,
for every reader that asked for it at the same time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.paths import HOTSET, key_from_uri
from bergstream.plugins.isk_gateway.tables.router import NamespaceRouter
from tests.kits.fake_log import FakeLog

T0 = 1_700_000_000_000


def make_router(tmp_path: Path, log: FakeLog, name: str) -> NamespaceRouter:
    provider = HotsetProvider(
        log,
        SqliteIndex(tmp_path / f"index-{name}.db"),
        LocalDiskCache(tmp_path / f"cache-{name}", 1 << 28),
        bucket="gw",
        cluster="c1",
        chunk_records=10,
    )
    return NamespaceRouter({HOTSET: provider}, provider.store)


async def test_concurrent_reads_of_a_missing_metadata_file_all_get_it(tmp_path: Path) -> None:
    log = FakeLog()
    log.create("orders", 1)
    log.produce("orders", 0, 12, lambda i: T0 + i)
    built = make_router(tmp_path, log, "a")
    loaded = await built.load_table(HOTSET, "orders")
    key = key_from_uri("gw", loaded.metadata_location)
    expected = await built.read_file(key)
    restarted = make_router(tmp_path, log, "b")  # a fresh store: the file must be rebuilt
    # The readers miss together (one lookup of the missing file, shared); one reload serves all.
    results = await asyncio.gather(*(restarted.read_file(key) for _ in range(4)))
    assert results == [expected] * 4
