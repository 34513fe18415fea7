"""Concurrent LoadTables of one table share their work without losing zero lag.

A LoadTable must see every record acked before it arrived, so it cannot simply join a load that
is already reading Kafka (that load may have asked for the end offsets before the record was
acked). It can join the *next* load: one that starts once the load in flight ends, and that
every LoadTable arriving meanwhile shares. So however many clients load a table at once, at most
two loads of it run back to back, and each client gets a state at least as new as its request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["LoadCoalescer"]

K = TypeVar("K")
R = TypeVar("R")


class LoadCoalescer(Generic[K, R]):
    """Runs ``load(key)`` for concurrent callers of one key as described in the module doc."""

    def __init__(self, load: Callable[[K], Awaitable[R]]) -> None:
        self._load = load
        self._in_flight: dict[K, asyncio.Future[R]] = {}
        self._queued: dict[K, asyncio.Future[R]] = {}

    async def __call__(self, key: K) -> R:
        """The result of a load of ``key`` that started after this call did."""
        # No await until this caller has joined or started a load: the bookkeeping below and
        # in _run is consistent at every await point.
        queued = self._queued.get(key)
        if queued is None:
            in_flight = self._in_flight.get(key)
            if in_flight is None:
                queued = asyncio.ensure_future(self._run(key, None))
                self._in_flight[key] = queued
            else:
                queued = asyncio.ensure_future(self._run(key, in_flight))
                self._queued[key] = queued
        return await asyncio.shield(queued)

    async def _run(self, key: K, after: asyncio.Future[R] | None) -> R:
        """Wait for the load ``after`` (its outcome is its callers'), then load ``key`` as the
        load in flight."""
        if after is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(after)
            current = self._queued.pop(key)
            self._in_flight[key] = current
        try:
            return await self._load(key)
        finally:
            self._in_flight.pop(key, None)
