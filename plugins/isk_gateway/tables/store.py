"""Where a gateway keeps the files it built: recent ones in memory, all of them in the cache
backend, and per table the keys and sizes of its current snapshot (for HEAD and ListObjectsV2)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Mapping

from bergstream.core.api import CacheBackend

__all__ = ["FileStore"]

#: Sizes of listed keys remembered for HEAD requests (about 100 bytes each).
_KNOWN_SIZES = 1_000_000
#: Bytes of write-behind puts waiting for the cache backend before ``keep`` waits for them.
_PENDING_BYTES = 1 << 30
#: Write-behind puts wait until no file was kept or read for this long (a scan is over).
_QUIET_SECONDS = 0.3
#: ... but not longer than this after it was kept (a gateway that is never quiet still caches).
_MAX_DELAY_SECONDS = 5.0


class FileStore:
    """Built files by key: an in-memory LRU of at most ``memory_bytes`` in front of ``cache``
    (ranged GETs of a file then slice memory instead of reading and verifying the cache entry
    again for each range). Cache entries are kept under ``cache_prefix`` (the gateway's layout
    name), so gateways writing other layouts can share one cache backend."""

    def __init__(
        self, cache: CacheBackend, memory_bytes: int = 1 << 30, cache_prefix: str = ""
    ) -> None:
        self.cache = cache
        self._cache_prefix = f"{cache_prefix}/" if cache_prefix else ""
        self._memory: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self._memory_bytes = memory_bytes
        self._held = 0
        self._listings: dict[tuple[str, str], dict[str, int]] = {}
        self._sizes: OrderedDict[str, int] = OrderedDict()
        # Write-behind puts, in order, until the cache backend has them, and when each was kept.
        self._pending: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self._pending_since: dict[str, float] = {}
        self._pending_bytes = 0
        self._writer: asyncio.Task[None] | None = None
        self._last_use = 0.0
        self._builds = 0
        self._flushing = False

    def cache_key(self, key: str) -> str:
        """The key ``key``'s bytes are kept under in the cache backend."""
        return self._cache_prefix + key

    def remember(self, key: str, data: bytes | memoryview) -> None:
        """Keep ``data`` in memory (not in the cache backend); a file over a quarter of the
        bound is not kept."""
        old = self._memory.pop(key, None)
        if old is not None:
            self._held -= len(old)
        if len(data) > self._memory_bytes // 4:
            return
        self._memory[key] = data
        self._held += len(data)
        while self._held > self._memory_bytes:
            _key, dropped = self._memory.popitem(last=False)
            self._held -= len(dropped)

    def holds(self, key: str) -> bool:
        """Whether ``key`` is in memory now."""
        return key in self._memory

    async def keep(self, key: str, data: bytes | memoryview, write_behind: bool = False) -> None:
        """Keep ``data`` in memory and in the cache backend. With ``write_behind`` the cache
        backend gets it after this returns, in order, one put at a time, once no file was
        built, kept or read from memory for ``_QUIET_SECONDS`` (at most ``_MAX_DELAY_SECONDS``
        after this): a scan's files are built and served first and cached after, so writing
        them (a copy into the page cache and a checksum) does not take CPU from the scan a
        client waits for. Past ``_PENDING_BYTES`` of such puts, this waits as without it."""
        self.remember(key, data)
        self._last_use = time.monotonic()
        if not write_behind or self._pending_bytes + len(data) > _PENDING_BYTES:
            await asyncio.to_thread(self.cache.put, self.cache_key(key), data)
            return
        old = self._pending.pop(key, None)
        self._pending_bytes += len(data) - (len(old) if old is not None else 0)
        self._pending[key] = data
        self._pending_since[key] = self._last_use
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending())

    async def _write_pending(self) -> None:
        while self._pending:
            key, data = next(iter(self._pending.items()))
            now = time.monotonic()
            quiet = _QUIET_SECONDS - (now - self._last_use)
            wait = min(
                max(quiet, _QUIET_SECONDS if self._builds else 0.0),
                _MAX_DELAY_SECONDS - (now - self._pending_since.get(key, now)),
            )
            if wait > 0 and not self._flushing:
                await asyncio.sleep(wait)
                continue
            try:
                await asyncio.to_thread(self.cache.put, self.cache_key(key), data)
            except Exception:  # the backend's own wrapper logs failures; a put is best-effort
                pass
            finally:
                if self._pending.get(key) is data:
                    del self._pending[key]
                    self._pending_since.pop(key, None)
                    self._pending_bytes -= len(data)

    @property
    def builds(self) -> int:
        """Files being built now (between :meth:`begin_build` and :meth:`end_build`)."""
        return self._builds

    def begin_build(self) -> None:
        """A file is being built for a reader: write-behind puts wait until none is."""
        self._builds += 1

    def end_build(self) -> None:
        """A build begun with :meth:`begin_build` ended."""
        self._builds -= 1
        self._last_use = time.monotonic()

    async def flush(self) -> None:
        """Wait until every write-behind put reached the cache backend (now, not after a
        quiet moment)."""
        self._flushing = True
        try:
            while self._writer is not None and not self._writer.done():
                await asyncio.shield(self._writer)
        finally:
            self._flushing = False

    def held(self, key: str) -> bytes | memoryview | None:
        """The bytes of ``key`` if memory or a write-behind put waiting for the cache backend
        holds them; None otherwise. Never waits: a caller can check this and act on the
        answer with no other task running in between."""
        data = self._memory.get(key)
        if data is None:
            data = self._pending.get(key)
        else:
            self._memory.move_to_end(key)
        if data is not None and self._pending:
            self._last_use = time.monotonic()  # a scan is served: write-behind waits for it
        return data

    async def get(self, key: str) -> bytes | memoryview | None:
        """The bytes of ``key`` from memory or the cache backend; None if neither has them."""
        data = self.held(key)
        if data is not None:
            return data
        data = await asyncio.to_thread(self.cache.get, self.cache_key(key))
        if data is not None:
            self.remember(key, data)
        return data

    def set_listing(self, namespace: str, table: str, sizes: Mapping[str, int]) -> None:
        """The keys (with sizes) of the current snapshot of ``namespace.table``."""
        self._listings[(namespace, table)] = dict(sizes)
        # A key names its content, so its size never changes: remember it past the snapshot.
        for key, size in sizes.items():
            self._sizes[key] = size
            self._sizes.move_to_end(key)
        while len(self._sizes) > _KNOWN_SIZES:
            self._sizes.popitem(last=False)

    def size(self, key: str) -> int | None:
        """The size of ``key`` if a loaded snapshot listed it."""
        return self._sizes.get(key)

    def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Listed keys under ``prefix`` with their sizes, sorted, at most ``limit``."""
        found: dict[str, int] = {}
        for listing in self._listings.values():
            found.update((k, size) for k, size in listing.items() if k.startswith(prefix))
        return sorted(found.items())[: max(limit, 0)]
