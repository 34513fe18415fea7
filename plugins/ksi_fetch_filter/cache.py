"""A thread-safe LRU cache bounded by the bytes of what it holds."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByteBoundedCache(Generic[V]):
    """Least recently used entries are evicted once the sizes given to :meth:`put` exceed
    ``max_bytes``; an entry larger than the bound on its own is not kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._demoted: dict[Hashable, int] = {}
        self._demoted_bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> int:
        """Bytes held now."""
        return self._size

    @property
    def live_size(self) -> int:
        """Bytes held by entries not demoted (still expected to be read)."""
        return self._size - self._demoted_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, key: Hashable) -> V | None:
        """The entry for ``key`` (now most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self._undemote(key)
            self.hits += 1
            return entry[0]

    def demote(self, key: Hashable) -> None:
        """Make ``key`` the first to go (a sequential reader is done with it); reading it
        again promotes it back."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key, last=False)
                if key not in self._demoted:
                    self._demoted[key] = entry[1]
                    self._demoted_bytes += entry[1]

    def put(self, key: Hashable, value: V, size: int) -> None:
        """Store ``value`` of ``size`` bytes, evicting least recently used entries."""
        with self._lock:
            old = self._entries.pop(key, None)
            self._undemote(key)
            if old is not None:
                self._size -= old[1]
            if size > self.max_bytes:
                return
            self._entries[key] = (value, size)
            self._size += size
            while self._size > self.max_bytes:
                gone, (_, evicted) = self._entries.popitem(last=False)
                self._undemote(gone)
                self._size -= evicted

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._demoted.clear()
            self._demoted_bytes = 0
            self._size = 0

    def _undemote(self, key: Hashable) -> None:
        """Forget that ``key`` was demoted (the lock held)."""
        size = self._demoted.pop(key, None)
        if size is not None:
            self._demoted_bytes -= size
