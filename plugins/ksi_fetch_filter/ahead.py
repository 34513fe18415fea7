"""Cold answers built ahead: once a Fetch has served a partition up to an offset, the batches a
sequential consumer asks for next are encoded on a reader thread while it reads these, so its
next Fetch finds them ready instead of waiting for the encoder.

An answer is only used for the very ask it was built for: the same partition, offset, byte
budget and first-in-response rule, on the same table snapshot and schema; anything else is
built afresh. What is built ahead is bounded in bytes (the budgets of the answers held)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from bergstream.plugins.ksi_fetch_filter.batches import ColdBatches
from bergstream.plugins.ksi_fetch_filter.coldset import ColdRead


@dataclass(frozen=True, slots=True)
class Built:
    """An answer built ahead: the read and its batches (both None: no cold rows there)."""

    read: ColdRead | None
    batches: ColdBatches | None


@dataclass(frozen=True, slots=True)
class AheadKey:
    """The ask an answer is built for."""

    topic: str
    partition: int
    offset: int
    budget: int
    first_in_response: bool
    #: The table's state the answer reads (snapshot id and schema shape).
    version: Any


class BuiltAhead:
    """Answers being built or built ahead, oldest dropped first beyond ``max_bytes`` of
    budgets."""

    def __init__(self, executor: Executor, max_bytes: int) -> None:
        self._executor = executor
        self.max_bytes = max_bytes
        self._entries: OrderedDict[AheadKey, Future[Built]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def schedule(self, key: AheadKey, build: Callable[[], Built]) -> None:
        """Build the answer to ``key`` on a reader thread (unless it is already there or the
        budget alone exceeds the bound)."""
        if key.budget > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            while self._entries and self._bytes + key.budget > self.max_bytes:
                old, future = self._entries.popitem(last=False)
                future.cancel()
                self._bytes -= old.budget
            future = self._executor.submit(build)
            self._entries[key] = future
            self._bytes += key.budget

    def schedule_many(self, items: list[tuple[AheadKey, Callable[[], Built]]]) -> None:
        """:meth:`schedule` each of ``items`` in order, without submitting the builds the later
        ones would drop at once: only the last items whose budgets fit the bound together are
        scheduled (a request naming thousands of partitions queues no builds it cancels)."""
        kept: list[tuple[AheadKey, Callable[[], Built]]] = []
        room = self.max_bytes
        for key, build in reversed(items):
            if key.budget > self.max_bytes:
                continue  # never scheduled, drops nothing
            if key.budget > room:
                break
            kept.append((key, build))
            room -= key.budget
        for key, build in reversed(kept):
            self.schedule(key, build)

    def take(self, key: AheadKey) -> Built | None:
        """The answer built for ``key`` (waiting for it if it is being built), or None
        when there is none: not scheduled, not started yet (then cancelled, for the caller
        builds it now rather than wait behind other reads), or failed (the caller builds it
        again and reports what fails)."""
        with self._lock:
            future = self._entries.pop(key, None)
            if future is None:
                return None
            self._bytes -= key.budget
        if future.cancel():
            return None
        try:
            built = future.result()
        except Exception:
            return None
        self.hits += 1
        return built

    def clear(self) -> None:
        """Drop every answer (cancelling those not started)."""
        with self._lock:
            for future in self._entries.values():
                future.cancel()
            self._entries.clear()
            self._bytes = 0
