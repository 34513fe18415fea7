"""Where a gateway keeps the files it built: recent ones in memory, all of them in the cache
backend, and per table the keys and sizes of its current snapshot (for HEAD and ListObjectsV2)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping

from bergstream.core.backends import CacheBackend

__all__ = ["FileStore"]

#: Sizes of listed keys remembered for HEAD requests (about 100 bytes each).
_KNOWN_SIZES = 1_000_000


class FileStore:
    """Built files by key: an in-memory LRU of at most ``memory_bytes`` in front of ``cache``
    (ranged GETs of a file then slice memory instead of reading and verifying the cache entry
    again for each range)."""

    def __init__(self, cache: CacheBackend, memory_bytes: int = 1 << 30) -> None:
        self.cache = cache
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._memory_bytes = memory_bytes
        self._held = 0
        self._listings: dict[tuple[str, str], dict[str, int]] = {}
        self._sizes: OrderedDict[str, int] = OrderedDict()

    def remember(self, key: str, data: bytes) -> None:
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

    async def keep(self, key: str, data: bytes) -> None:
        """Keep ``data`` in memory and in the cache backend."""
        self.remember(key, data)
        await asyncio.to_thread(self.cache.put, key, data)

    async def get(self, key: str) -> bytes | None:
        """The bytes of ``key`` from memory or the cache backend; None if neither has them."""
        data = self._memory.get(key)
        if data is not None:
            self._memory.move_to_end(key)
            return data
        data = await asyncio.to_thread(self.cache.get, key)
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
