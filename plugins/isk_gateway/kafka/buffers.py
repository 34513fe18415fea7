"""Large byte and number buffers for Kafka responses received straight into memory, the columns
the batch decoder fills and the Parquet files written from them.

ISK runs Arrow on the system allocator (:mod:`bergstream.core.arrow_memory`), which maps a large
allocation fresh from the kernel each time: its first write costs a page fault per 4 KiB page,
more CPU than the decoding that fills it (100 MB filled: 54 ms on fresh pages, 24 ms on huge
pages, 2-core machine of the benches). So a large buffer asks the kernel for transparent huge
pages (``madvise(MADV_HUGEPAGE)``, honoured when THP is ``always`` or ``madvise``) before it is
touched; where that is not available the buffer is used as it is. Once a process installs a
:class:`~.arena.BufferArena` (:func:`install_arena`, the ``isk`` service's ``buffers``
settings), large buffers come from it first, so their pages stay touched between uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
import time

import numpy as np
import pyarrow as pa

from bergstream.plugins.isk_gateway.kafka.arena import BufferArena

__all__ = [
    "DECODED_COLUMNS",
    "HUGE_PAGE_MIN_BYTES",
    "RECEIVED_RECORDS",
    "BufferLease",
    "BufferPool",
    "install_arena",
    "installed_arena",
    "large_buffer",
    "pooled_array",
]

#: Buffers from this size on are advised to use huge pages (smaller ones may share heap pages).
HUGE_PAGE_MIN_BYTES = 8 << 20
_MADV_HUGEPAGE = 14
_PAGE = 4096
_HUGE_PAGE = 2 << 20


def _load_madvise() -> ctypes._NamedFuncPointer | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise()
_arena: BufferArena | None = None


def install_arena(capacity: int) -> BufferArena:
    """Make large buffers of this process come from an arena of ``capacity`` bytes (the one
    installed before, if any: one per process) and return it."""
    global _arena
    if _arena is None:
        _arena = BufferArena(capacity)
    return _arena


def installed_arena() -> BufferArena | None:
    """The process's arena, if :func:`install_arena` made one."""
    return _arena


def large_buffer(size: int) -> pa.Buffer:
    """An uninitialised mutable buffer of ``size`` bytes: from the installed arena when it has
    room (from :data:`HUGE_PAGE_MIN_BYTES` on), else from Arrow's memory pool, on huge pages
    where the kernel gives them (from :data:`HUGE_PAGE_MIN_BYTES` on)."""
    if _arena is not None and size >= HUGE_PAGE_MIN_BYTES:
        piece = _arena.take(size)
        if piece is not None:
            return piece
    buffer = pa.allocate_buffer(max(size, 1))
    if _madvise is not None and size >= HUGE_PAGE_MIN_BYTES:
        start = (buffer.address + _PAGE - 1) & ~(_PAGE - 1)
        end = (buffer.address + size) & ~(_PAGE - 1)
        _madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: a refusal changes nothing
    return buffer


def pooled_array(count: int, dtype: type[np.generic] = np.uint8) -> np.ndarray:
    """An uninitialised array of ``count`` items of ``dtype`` in Arrow's memory pool (a
    :func:`large_buffer`)."""
    item = np.dtype(dtype).itemsize
    return np.frombuffer(large_buffer(max(count, 1) * item), dtype=dtype)[:count]


class BufferLease:
    """Byte buffers taken from a :class:`BufferPool` for one piece of work (decoding a chunk),
    all given back at once by :meth:`release` when nothing refers to them any more."""

    def __init__(self, pool: BufferPool) -> None:
        self._pool = pool
        self._taken: list[np.ndarray] = []

    def take(self, count: int) -> np.ndarray:
        """An uninitialised ``uint8`` array of ``count`` bytes, reused from the pool when it has
        one that fits (small arrays are never pooled)."""
        if count < HUGE_PAGE_MIN_BYTES:
            return pooled_array(count)
        base = self._pool.take(count)
        self._taken.append(base)
        return base[:count]

    def release(self) -> None:
        """Give every buffer taken back to the pool: the caller guarantees that no array, Arrow
        buffer or view of them is used after this."""
        taken, self._taken = self._taken, []
        for base in taken:
            self._pool.give(base)


class BufferPool:
    """Large byte buffers kept for reuse between pieces of work, so their pages are not cleared
    and faulted in again: at most ``max_buffers`` and ``max_bytes`` free ones, each dropped after
    ``idle_seconds`` unused (the memory goes back to the process's arena if it has one, else
    to the system, once the work stops).

    Decoding a 100,000-record chunk of 1 KB records fills a 100 MB value column: fresh pages
    for it cost more CPU than the decoding (the kernel clears every page first), and the columns
    of one chunk are garbage once its Parquet file is written."""

    def __init__(
        self, max_buffers: int = 3, max_bytes: int = 512 << 20, idle_seconds: float = 10.0
    ) -> None:
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        self.idle_seconds = idle_seconds
        self._free: list[tuple[float, np.ndarray]] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.reused = 0  # buffers handed out again (for tests and diagnostics)

    def lease(self) -> BufferLease:
        """A lease for one piece of work."""
        return BufferLease(self)

    @property
    def free_bytes(self) -> int:
        """Bytes of the free buffers kept now."""
        with self._lock:
            return sum(base.size for _, base in self._free)

    def take(self, count: int) -> np.ndarray:
        """The smallest free buffer of at least ``count`` bytes, or a new one."""
        with self._lock:
            fitting = [
                (base.size, position)
                for position, (_, base) in enumerate(self._free)
                if count <= base.size
            ]
            if fitting:
                _, position = min(fitting)
                _, base = self._free.pop(position)
                self.reused += 1
                return base
        # A quarter more, in whole huge pages, so that a larger chunk later still fits (pages
        # never touched cost nothing).
        size = -(-(count + count // 4) // _HUGE_PAGE) * _HUGE_PAGE
        return np.frombuffer(large_buffer(size), dtype=np.uint8)

    def give(self, base: np.ndarray) -> None:
        """Keep ``base`` for reuse if the bounds allow (the largest are kept first)."""
        now = time.monotonic()
        with self._lock:
            self._free.append((now, base))
            self._free.sort(key=lambda entry: -entry[1].size)
            kept: list[tuple[float, np.ndarray]] = []
            total = 0
            for entry in self._free:
                if len(kept) < self.max_buffers and total + entry[1].size <= self.max_bytes:
                    kept.append(entry)
                    total += entry[1].size
            self._free = kept
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.idle_seconds, self.trim)
            self._timer.daemon = True
            self._timer.start()

    def trim(self) -> None:
        """Drop the free buffers unused for ``idle_seconds``."""
        oldest = time.monotonic() - self.idle_seconds
        with self._lock:
            self._free = [(since, base) for since, base in self._free if since > oldest]


#: The process's pools of buffers for decoded columns and for record batches received from
#: Kafka (ISK's synthesis); at most 512 MB each, kept while files are built.
DECODED_COLUMNS = BufferPool()
RECEIVED_RECORDS = BufferPool()
