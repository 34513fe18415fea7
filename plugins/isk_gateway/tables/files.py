"""Where a gateway keeps the files it built: recent ones in memory, all of them in the cache
backend, and per table the keys and sizes of its current snapshot (for HEAD and ListObjectsV2)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping

from bergstream.core.backends import CacheBackend

__all__ = ["FileStore"]


class FileStore:
    """Built files by key: an in-memory LRU of ``memory_files`` entries in front of ``cache``."""

    def __init__(self, cache: CacheBackend, memory_files: int = 4096) -> None:
        self.cache = cache
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._memory_files = memory_files
        self._listings: dict[tuple[str, str], dict[str, int]] = {}

    def remember(self, key: str, data: bytes) -> None:
        """Keep ``data`` in memory (not in the cache backend)."""
        self._memory[key] = data
        self._memory.move_to_end(key)
        while len(self._memory) > self._memory_files:
            self._memory.popitem(last=False)

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
        return await asyncio.to_thread(self.cache.get, key)

    def set_listing(self, namespace: str, table: str, sizes: Mapping[str, int]) -> None:
        """The keys (with sizes) of the current snapshot of ``namespace.table``."""
        self._listings[(namespace, table)] = dict(sizes)

    def size(self, key: str) -> int | None:
        """The size of ``key`` if a current snapshot lists it."""
        for listing in self._listings.values():
            size = listing.get(key)
            if size is not None:
                return size
        return None

    def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Listed keys under ``prefix`` with their sizes, sorted, at most ``limit``."""
        found: dict[str, int] = {}
        for listing in self._listings.values():
            found.update((k, size) for k, size in listing.items() if k.startswith(prefix))
        return sorted(found.items())[: max(limit, 0)]
