"""FileStore: files built for a client reach the cache backend behind the response
(write-behind), are served from memory meanwhile, and are all in the cache after flush."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.isk_gateway.tables import store as store_module
from bergstream.plugins.isk_gateway.tables.store import FileStore


class SlowCache(LocalDiskCache):
    """A local cache whose puts wait for a gate, to watch what happens meanwhile."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, 1 << 24)
        self.gate = threading.Event()

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.gate.wait(10)
        super().put(key, data)


async def test_write_behind_serves_pending_files_and_flush_writes_them(tmp_path: Path) -> None:
    cache = SlowCache(tmp_path)
    store = FileStore(cache, memory_bytes=8, cache_prefix="day.snappy.v2")  # memory holds none
    await asyncio.wait_for(store.keep("a", b"first file", write_behind=True), 1)
    await asyncio.wait_for(store.keep("b", memoryview(b"second file"), write_behind=True), 1)
    assert not store.holds("a")  # too big for memory: only the pending put has it
    assert await store.get("a") == b"first file"
    assert cache.get("day.snappy.v2/a") is None  # not written yet
    cache.gate.set()
    await asyncio.wait_for(store.flush(), 10)
    assert cache.get("day.snappy.v2/a") == b"first file"
    assert cache.get("day.snappy.v2/b") == b"second file"
    assert await store.get("b") == b"second file"  # now from the cache backend


async def test_too_many_pending_bytes_make_keep_wait(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(store_module, "_PENDING_BYTES", 10)
    cache = SlowCache(tmp_path)
    store = FileStore(cache, cache_prefix="p")
    await store.keep("a", b"12345678", write_behind=True)
    blocked = asyncio.create_task(store.keep("b", b"12345678", write_behind=True))
    await asyncio.sleep(0.2)
    assert not blocked.done()  # over the bound: this keep writes inline, behind the gate
    cache.gate.set()
    await asyncio.wait_for(blocked, 10)
    await store.flush()
    assert cache.get("p/a") == b"12345678" and cache.get("p/b") == b"12345678"


async def test_a_failing_put_is_dropped_not_raised(tmp_path: Path) -> None:
    class Broken(LocalDiskCache):
        def put(self, key: str, data: bytes | memoryview) -> None:
            raise OSError("disk full")

    store = FileStore(Broken(tmp_path, 1 << 20), memory_bytes=0)
    await store.keep("a", b"data", write_behind=True)
    await asyncio.wait_for(store.flush(), 5)
    assert await store.get("a") is None  # gone from pending; never cached


async def test_write_behind_waits_for_a_pause_in_builds(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(store_module, "_QUIET_SECONDS", 0.5)
    cache = LocalDiskCache(tmp_path, 1 << 20)
    store = FileStore(cache)
    for i in range(4):  # a burst: one file every 0.1 s
        await store.keep(f"f{i}", b"data", write_behind=True)
        await asyncio.sleep(0.1)
    assert cache.get("f0") is None  # nothing written while files keep coming
    await asyncio.sleep(1.0)
    assert all(cache.get(f"f{i}") == b"data" for i in range(4))  # written after the pause


async def test_write_behind_waits_while_files_are_read_or_built(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(store_module, "_QUIET_SECONDS", 0.3)
    cache = LocalDiskCache(tmp_path, 1 << 20)
    store = FileStore(cache)
    await store.keep("built", b"data", write_behind=True)
    for _ in range(6):  # a scan reads the file every 0.1 s for 0.6 s
        await asyncio.sleep(0.1)
        assert store.held("built") == b"data"
    assert cache.get("built") is None  # not written while it is read
    store.begin_build()  # a build of another file for a reader
    await asyncio.sleep(0.6)
    assert cache.get("built") is None  # not written while a build runs
    store.end_build()
    await asyncio.sleep(0.8)
    assert cache.get("built") == b"data"  # written once reads and builds paused


async def test_write_behind_writes_after_the_longest_delay_however_busy(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(store_module, "_QUIET_SECONDS", 0.3)
    monkeypatch.setattr(store_module, "_MAX_DELAY_SECONDS", 0.5)
    cache = LocalDiskCache(tmp_path, 1 << 20)
    store = FileStore(cache)
    await store.keep("built", b"data", write_behind=True)
    store.begin_build()  # never quiet
    for _ in range(15):
        await asyncio.sleep(0.1)
        store.held("built")
    assert cache.get("built") == b"data"  # written 0.5 s after it was kept
    store.end_build()
