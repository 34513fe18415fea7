"""ColdsetProvider over a lake written with PyIceberg: a physical snapshot's manifests are
rewritten to gateway keys once, however many loads ask for it at the same time."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from bergstream.core.typed.row_contract import CREATE_TIME
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.isk_gateway.tables.coldset import ColdsetProvider
from bergstream.plugins.isk_gateway.tables.paths import COLDSET, MERGED
from bergstream.plugins.isk_gateway.tables.store import FileStore
from tests.kits.coldset_tables import make_lake, make_record, write_cold


class JoinSignal(dict):
    """The provider's map of rewrites in flight, setting ``joined`` when a lookup finds one
    (a second load joined the first one's rewrite)."""

    def __init__(self, joined: threading.Event) -> None:
        super().__init__()
        self.joined = joined

    def get(self, key: Any, default: Any = None) -> Any:
        found = super().get(key, default)
        if found is not None:
            self.joined.set()
        return found


class HeldRewrites(ColdsetProvider):
    """Counts rewrites; the first one waits until a second load has decided what to do (joined
    it, or started a rewrite of its own), so both loads ask while the first is in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rewrites = 0
        self.second_decided = threading.Event()
        self._counting = threading.Lock()
        self._rewriting = JoinSignal(self.second_decided)

    def _rewrite(self, topic: str, table: Any) -> Any:
        with self._counting:
            self.rewrites += 1
            first = self.rewrites == 1
        if first:
            assert self.second_decided.wait(10), "the second load never decided"
        else:
            self.second_decided.set()
        return super()._rewrite(topic, table)


async def test_concurrent_loads_rewrite_a_snapshot_once(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    rows = [(p, CREATE_TIME, make_record(i)) for p in (0, 1) for i in range(20)]
    write_cold(lake, "orders", rows, {0: 20, 1: 20}, rows_per_file=10)
    store = FileStore(LocalDiskCache(tmp_path / "cache", 1 << 24))
    provider = HeldRewrites(lake, store, bucket="gw", cluster="c1")
    first, second = await asyncio.gather(provider.snapshot("orders"), provider.snapshot("orders"))
    assert provider.rewrites == 1
    assert first is not None and second is not None
    assert first.sizes == second.sizes
    assert len(first.sizes[COLDSET]) == len(first.sizes[MERGED]) == 4
    loaded = await provider.load_table(COLDSET, "orders")  # the same snapshot: no rewrite
    assert provider.rewrites == 1
    assert loaded.metadata["current-snapshot-id"] == first.snapshot_id
