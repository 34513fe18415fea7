"""Fetch connections of ISK's bulk reads: a broker answering with a bad frame costs one
connection and a clear FetchError, never a hang, a crash or wrong bytes. The happy path runs
against the real broker in test_kafka_reader.py."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from bergstream.plugins.isk_gateway.kafka.raw_fetch import FetchConnections, FetchError

Reply = Callable[[int], bytes]


def frame(correlation_id: int, records: bytes, records_size: int | None = None) -> bytes:
    """A Fetch v4 response for topic "t" partition 0."""
    size = len(records) if records_size is None else records_size
    body = struct.pack(">iiih1s", correlation_id, 0, 1, 1, b"t")
    body += struct.pack(">iihqqi", 1, 0, 0, 10, 10, 1) + struct.pack(">qq", 7, 3)
    body += struct.pack(">i", size) + records
    return struct.pack(">i", len(body)) + body


async def serve(reply: Reply, test: Callable[[tuple[str, int]], Awaitable[None]]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = struct.unpack(">i", await reader.readexactly(4))
                request = await reader.readexactly(length)
                (correlation_id,) = struct.unpack_from(">i", request, 4)
                writer.write(reply(correlation_id))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        await test(server.sockets[0].getsockname()[:2])
    finally:
        server.close()
        await server.wait_closed()


async def test_records_arrive_in_the_given_buffer_with_the_aborted_list() -> None:
    async def test(address: tuple[str, int]) -> None:
        connections = FetchConnections("test")
        into = np.zeros(16, dtype=np.uint8)
        result = await connections.fetch(address, "t", 0, 0, 100, into)
        assert bytes(result.records) == b"records!"
        assert bytes(into[:8]) == b"records!"  # received in place, not copied after
        assert result.aborted == ((7, 3),) and result.high_watermark == 10
        small = await connections.fetch(address, "t", 0, 0, 100, np.zeros(2, dtype=np.uint8))
        assert bytes(small.records) == b"records!"  # too big for the buffer: its own
        connections.close()

    await serve(lambda cid: frame(cid, b"records!"), test)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (lambda cid: frame(cid + 1, b"x"), "expected"),
        (lambda cid: frame(cid, b"x", records_size=50), "run past the frame|closed"),
        (lambda cid: frame(cid, b"xyz")[:-2], "no whole response within 1 s"),
        (lambda cid: struct.pack(">i", -5), "invalid length"),
    ],
    ids=["wrong correlation id", "records past the frame", "cut short", "bad length"],
)
async def test_a_bad_response_is_a_fetch_error_naming_it(reply: Reply, message: str) -> None:
    async def test(address: tuple[str, int]) -> None:
        connections = FetchConnections("test", timeout_seconds=1)
        with pytest.raises(FetchError, match=message):
            await connections.fetch(address, "t", 0, 0, 100)
        assert not connections._idle.get(address)  # the spoiled connection is not reused
        connections.close()

    await serve(reply, test)


async def test_a_silent_broker_times_out() -> None:
    async def test(address: tuple[str, int]) -> None:
        connections = FetchConnections("test", timeout_seconds=0.5)
        with pytest.raises(FetchError, match=r"no whole response within 0\.5 s"):
            await connections.fetch(address, "t", 0, 0, 100)

    await serve(lambda cid: b"", test)


async def test_an_unreachable_broker_is_a_fetch_error() -> None:
    with pytest.raises(FetchError, match="connect to"):
        await FetchConnections("test", timeout_seconds=2).fetch(("127.0.0.1", 1), "t", 0, 0, 1)
