"""Concurrent LoadTables of one table: at most two loads back to back, and every caller gets a
load that started after it arrived (zero lag)."""

from __future__ import annotations

import asyncio

import pytest

from bergstream.plugins.isk_gateway.tables.load_coalescer import LoadCoalescer


async def settle() -> None:
    """Let every ready task run until it waits."""
    for _ in range(10):
        await asyncio.sleep(0)


class Loads:
    """A load that records when it started and waits to be released."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.release = asyncio.Event()
        self.fail_next = False

    async def __call__(self, key: str) -> tuple[str, int]:
        number = len(self.started)
        self.started.append(number)
        await self.release.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError(f"load {number} failed")
        return key, number


async def test_callers_during_a_load_share_the_next_one() -> None:
    loads = Loads()
    coalesce = LoadCoalescer(loads)
    first = asyncio.create_task(coalesce("t"))
    await settle()
    assert loads.started == [0]
    later = [asyncio.create_task(coalesce("t")) for _ in range(5)]
    other = asyncio.create_task(coalesce("u"))  # another table loads at the same time
    await settle()
    assert loads.started == [0, 1]  # load 1 is "u"; the five wait for "t"'s next load
    loads.release.set()
    assert await first == ("t", 0)
    assert await other == ("u", 1)
    # The five arrived while load 0 ran: they share one load that started after it.
    assert [await task for task in later] == [("t", 2)] * 5
    assert loads.started == [0, 1, 2]


async def test_a_failed_load_fails_its_callers_only() -> None:
    loads = Loads()
    coalesce = LoadCoalescer(loads)
    loads.fail_next = True
    failing = asyncio.create_task(coalesce("t"))
    await settle()
    queued = asyncio.create_task(coalesce("t"))
    loads.release.set()
    with pytest.raises(RuntimeError, match="load 0 failed"):
        await failing
    assert await queued == ("t", 1)
    assert await coalesce("t") == ("t", 2)


async def test_a_cancelled_caller_does_not_cancel_the_shared_load() -> None:
    loads = Loads()
    coalesce = LoadCoalescer(loads)
    first = asyncio.create_task(coalesce("t"))
    second = asyncio.create_task(coalesce("t"))
    await settle()
    first.cancel()
    loads.release.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second == ("t", 1)  # it arrived while load 0 ran: the next one is its own
