"""``BufferArena``: one anonymous memory region the process keeps for its large buffers (records
received from Kafka, decoded columns, Parquet files built), handed out in pieces and taken back
when nothing refers to a piece any more, so memory once touched is touched again instead of
coming fresh from the kernel.

Why: a fresh page costs a fault and the kernel clearing it, and on a virtual machine whose host
takes freed guest memory back (free page reporting, as on the Firecracker VMs of the benches)
it also costs a fault on the host: measured here, writing 1 GiB of memory the process never
touched took 2.5-2.6 s, writing it again 0.10 s, and memory another process had freed
less than a second before 0.19 s (``bench/isk_query.py`` prints this machine's figures). A cold
ISK query of 1 GB spent 47% of ISK's CPU clearing fresh pages (``perf``, ``clear_page_erms``)
before the arena. Freed buffers go back to the C library, which returns large ones to the
kernel at once; the arena keeps them.

How: ``mmap`` of ``capacity`` bytes (private, anonymous, advised to use transparent huge pages),
pieces in multiples of 2 MiB, best fit from a free list whose neighbours merge. A piece is an
Arrow buffer over a NumPy view of the region; a finalizer on that view gives the piece back once
it is garbage. Every array, view and slice made from the buffer keeps the view alive, so a piece
is never reused while anything can still read or write it. A request the free pieces cannot hold
gets ``None`` (the caller allocates as before). :meth:`BufferArena.pretouch` writes every page
once, at start.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import sys
import threading
import time
import weakref

import numpy as np
import pyarrow as pa

__all__ = ["ARENA_ALIGNMENT", "BufferArena"]

log = logging.getLogger("bergstream.isk")

#: Pieces start and end on 2 MiB boundaries (a transparent huge page).
ARENA_ALIGNMENT = 2 << 20
_PAGE = 4096
#: No swap reserved for the whole region up front: only touched pages count (Linux's value;
#: Python's mmap module does not name it before 3.13).
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


class BufferArena:
    """``capacity`` bytes (rounded up to 2 MiB) of one region, handed out by :meth:`take`."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"an arena needs a positive capacity, not {capacity}")
        self.capacity = -(-capacity // ARENA_ALIGNMENT) * ARENA_ALIGNMENT
        self._region = mmap.mmap(
            -1,
            self.capacity,
            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
        )
        madvise_hugepage = getattr(mmap, "MADV_HUGEPAGE", None)
        if madvise_hugepage is not None:
            with contextlib.suppress(OSError):  # advice: without THP, small pages
                self._region.madvise(madvise_hugepage)
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, self.capacity)]  # (start, length) by start
        # Pieces given back, merged into ``_free`` under the lock by the next call: a finalizer
        # may run in any thread at any allocation, even one holding the lock (cyclic garbage
        # collected inside ``take``), so it only appends (atomic) and never takes the lock.
        self._returned: collections.deque[tuple[int, int]] = collections.deque()
        self._taken = 0
        self.high_water_bytes = 0
        self.misses = 0  # requests the free pieces could not hold
        self.touched = False  # pretouch ran

    def take(self, size: int) -> pa.Buffer | None:
        """A mutable buffer of ``size`` bytes (contents undefined) from the arena, or None if
        no free piece holds it."""
        length = -(-max(size, 1) // ARENA_ALIGNMENT) * ARENA_ALIGNMENT
        with self._lock:
            self._merge_returned()
            best = -1
            for index, (_, free) in enumerate(self._free):
                if free >= length and (best < 0 or free < self._free[best][1]):
                    best = index
            if best < 0:
                self.misses += 1
                return None
            start, free = self._free[best]
            if free == length:
                del self._free[best]
            else:
                self._free[best] = (start + length, free - length)
            self._taken += length
            self.high_water_bytes = max(self.high_water_bytes, self._taken)
        view = np.frombuffer(self._region, dtype=np.uint8, count=size, offset=start)
        weakref.finalize(view, self._give, start, length)
        return pa.py_buffer(view)

    def _give(self, start: int, length: int) -> None:
        """A piece is garbage: queue it to be merged back (see ``_returned``)."""
        self._returned.append((start, length))

    def _merge_returned(self) -> None:
        """Merge the pieces given back into the free list, with their free neighbours (the
        caller holds the lock)."""
        free = self._free
        while self._returned:
            start, length = self._returned.popleft()
            self._taken -= length
            low, high = 0, len(free)
            while low < high:  # the first free piece after ``start``
                middle = (low + high) // 2
                if free[middle][0] < start:
                    low = middle + 1
                else:
                    high = middle
            end = start + length
            if low < len(free) and free[low][0] == end:
                end += free[low][1]
                del free[low]
            if low > 0 and free[low - 1][0] + free[low - 1][1] == start:
                start = free[low - 1][0]
                del free[low - 1]
                low -= 1
            free.insert(low, (start, end - start))

    @property
    def taken_bytes(self) -> int:
        """Bytes of the pieces handed out and not yet garbage (whole 2 MiB pieces)."""
        with self._lock:
            self._merge_returned()
            return self._taken

    @property
    def free_pieces(self) -> list[tuple[int, int]]:
        """The free pieces as (start, length), by start (for tests and diagnostics)."""
        with self._lock:
            self._merge_returned()
            return list(self._free)

    def pretouch(self) -> float:
        """Write every page of the region once (so no request pays its first-touch cost);
        returns the seconds it took (0 if it ran before). Only before any piece is handed out."""
        if self.high_water_bytes:
            raise RuntimeError("pretouch an arena before it hands out pieces")
        if self.touched:
            return 0.0
        started = time.perf_counter()
        pages = np.frombuffer(self._region, dtype=np.uint8)
        pages[::_PAGE] = 0
        del pages
        self.touched = True
        seconds = time.perf_counter() - started
        log.info("isk: %d MiB of buffer memory touched in %.2f s", self.capacity >> 20, seconds)
        return seconds
