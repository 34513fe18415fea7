"""Fetch requests for bulk reads on connections of their own: each response is received straight
into one preallocated buffer, and its records are handed on as a view of that buffer.

A general client (aiokafka) grows a stream buffer chunk by chunk, copies the frame out of it and
copies the records out of the frame: three copies of every byte, which cost more CPU than
decoding the records. Here a response costs one receive into memory allocated once.

Fetch v4 (Kafka >= 0.11, still served by Kafka 4): read_committed, one partition per request.
Connections are pooled per broker; one request at a time per connection.

A PLAINTEXT cluster is read on plain sockets, received into the buffer in place. Any other
``security.protocol`` goes through core's :func:`~bergstream.core.api.open_kafka_connection`
(TCP, TLS, SASL): TLS decrypts into a stream buffer, so there a response is copied once more. A
pooled SASL connection whose session is due for re-authentication (KIP-368) is closed rather than
reused, so the broker never closes it under a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import time
from dataclasses import dataclass

import numpy as np

from bergstream.core.api import (
    ApiKey,
    KafkaAuthenticationError,
    KafkaClientSettings,
    KafkaConnection,
    open_kafka_connection,
)
from bergstream.plugins.isk_gateway.kafka.buffers import pooled_array

__all__ = ["FetchAuthenticationError", "FetchConnections", "FetchError", "PartitionFetch"]

_VERSION = 4
_READ_COMMITTED = 1
_MAX_FRAME = 1 << 31
_IDLE_PER_BROKER = 4


class FetchError(Exception):
    """A Fetch that could not be sent or whose response could not be read."""


class FetchAuthenticationError(FetchError):
    """The broker refused the client's credentials or its TLS handshake failed: retrying with
    the same settings cannot help."""


@dataclass(frozen=True)
class PartitionFetch:
    """One partition's part of a Fetch response: its error code, high watermark, last stable
    offset, aborted transactions ``(producer_id, first_offset)`` and records (a view)."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    aborted: tuple[tuple[int, int], ...]
    records: memoryview


def _encode_request(
    correlation_id: int, client_id: bytes, topic: bytes, partition: int, offset: int, size: int
) -> bytes:
    body = struct.pack(
        f">hhih{len(client_id)}s iiiib i h{len(topic)}s i iqi",
        ApiKey.FETCH, _VERSION, correlation_id, len(client_id), client_id,
        -1, 500, 1, size, _READ_COMMITTED,
        1, len(topic), topic,
        1, partition, offset, size,
    )  # fmt: skip
    return struct.pack(">i", len(body)) + body


class _Connection:
    """One connection to one broker; subclasses say how bytes are sent and received."""

    def __init__(self) -> None:
        self.correlation_id = 0

    def expired(self, now: float) -> bool:
        """Whether the connection must not be reused at ``time.monotonic()`` ``now``."""
        return False

    async def _send(self, data: bytes) -> None:
        raise NotImplementedError

    async def _receive(self, size: int, view: memoryview | None = None) -> memoryview:
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection."""
        raise NotImplementedError

    async def fetch(
        self,
        client_id: bytes,
        topic: bytes,
        partition: int,
        offset: int,
        size: int,
        into: np.ndarray | None,
    ) -> PartitionFetch:
        """Send one Fetch and read its response field by field, the records straight into the
        start of ``into`` when they fit (else into a buffer of their own)."""
        self.correlation_id = (self.correlation_id + 1) & 0x7FFFFFFF
        request = _encode_request(self.correlation_id, client_id, topic, partition, offset, size)
        await self._send(request)
        (length,) = struct.unpack(">i", await self._receive(4))
        if not 0 < length < _MAX_FRAME:
            raise FetchError(f"Fetch response of invalid length {length}")
        got, _throttle, topics, name_length = struct.unpack(">iiih", await self._receive(14))
        if got != self.correlation_id:
            raise FetchError(f"response to request {got}, expected {self.correlation_id}")
        if topics != 1 or name_length < 0:
            raise FetchError(f"{topics} topics in a one-partition response")
        fixed = await self._receive(name_length + 30)
        partitions, _partition, error_code, high, stable, aborted_count = struct.unpack_from(
            ">iihqqi", fixed, name_length
        )
        if partitions != 1:
            raise FetchError(f"{partitions} partitions in a one-partition response")
        listed = await self._receive(16 * max(aborted_count, 0) + 4)
        aborted = tuple(struct.unpack_from(">qq", listed, 16 * i) for i in range(aborted_count))
        (records_size,) = struct.unpack_from(">i", listed, len(listed) - 4)
        records_size = max(records_size, 0)
        rest = length - 14 - len(fixed) - len(listed) - records_size
        if rest < 0:
            raise FetchError("Fetch response records run past the frame")
        if into is not None and records_size <= into.size:
            records = memoryview(into[:records_size]).cast("B")
            await self._receive(records_size, records)
        else:
            records = await self._receive(records_size)
        if rest:
            await self._receive(rest)  # fields of later versions: none in v4
        return PartitionFetch(error_code, high, stable, aborted, records)


class _SocketConnection(_Connection):
    """A plain socket (PLAINTEXT): responses received straight into the caller's buffer."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    async def _send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def _receive(self, size: int, view: memoryview | None = None) -> memoryview:
        loop = asyncio.get_running_loop()
        if view is None:
            view = memoryview(pooled_array(size)).cast("B")
        received = 0
        while received < size:
            count = await loop.sock_recv_into(self.sock, view[received:size])
            if not count:
                raise FetchError("the broker closed the connection")
            received += count
        return view

    def close(self) -> None:
        """Close the socket."""
        with contextlib.suppress(OSError):
            self.sock.close()


class _StreamConnection(_Connection):
    """A connection opened by core (TLS and/or SASL), read through its stream."""

    def __init__(self, connection: KafkaConnection) -> None:
        super().__init__()
        self.connection = connection

    def expired(self, now: float) -> bool:
        """True once the SASL session is due for re-authentication."""
        session = self.connection.session
        due = session.reauthenticate_at if session is not None else None
        return due is not None and now >= due

    async def _send(self, data: bytes) -> None:
        self.connection.writer.write(data)
        await self.connection.writer.drain()

    async def _receive(self, size: int, view: memoryview | None = None) -> memoryview:
        try:
            data = await self.connection.reader.readexactly(size)
        except asyncio.IncompleteReadError:
            raise FetchError("the broker closed the connection") from None
        if view is None:
            return memoryview(data)
        view[:size] = data
        return view

    def close(self) -> None:
        """Close the stream (without waiting for the TLS shutdown)."""
        with contextlib.suppress(OSError, RuntimeError):
            self.connection.writer.close()


class FetchConnections:
    """Pooled Fetch connections per broker address, opened as ``settings`` says (PLAINTEXT when
    None)."""

    def __init__(
        self,
        client_id: str,
        timeout_seconds: float = 30.0,
        settings: KafkaClientSettings | None = None,
    ) -> None:
        self._client_id_text = client_id
        self._client_id = client_id.encode()
        self._timeout = timeout_seconds
        self._settings = settings
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def fetch(
        self,
        address: tuple[str, int],
        topic: str,
        partition: int,
        offset: int,
        size: int,
        into: np.ndarray | None = None,
    ) -> PartitionFetch:
        """Fetch up to ``size`` bytes of ``topic``/``partition`` from ``offset`` on the broker at
        ``address``, read_committed, the records received into the start of ``into`` (a uint8
        array) if they fit; :class:`FetchError` on any connection or protocol error (the
        connection is then dropped), :class:`FetchAuthenticationError` when the broker refuses
        the credentials or the TLS handshake fails."""
        connection = await self._take(address)
        try:
            async with asyncio.timeout(self._timeout):
                result = await connection.fetch(
                    self._client_id, topic.encode(), partition, offset, size, into
                )
        except TimeoutError as error:
            connection.close()
            raise FetchError(
                f"Fetch from {address[0]}:{address[1]}: no whole response within "
                f"{self._timeout:g} s"
            ) from error
        except (OSError, FetchError) as error:
            connection.close()
            raise FetchError(f"Fetch from {address[0]}:{address[1]}: {error}") from error
        except BaseException:
            connection.close()
            raise
        idle = self._idle.setdefault(address, [])
        if len(idle) < _IDLE_PER_BROKER:
            idle.append(connection)
        else:
            connection.close()
        return result

    async def _take(self, address: tuple[str, int]) -> _Connection:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.expired(now):
                return connection
            connection.close()
        settings = self._settings
        if settings is not None and settings.security_protocol != "PLAINTEXT":
            return await self._open(address, settings)
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(*address, type=socket.SOCK_STREAM)
        except OSError as error:
            raise FetchError(f"resolve {address[0]}:{address[1]}: {error}") from error
        family, kind, proto, _name, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(self._timeout):
                await loop.sock_connect(sock, sockaddr)
        except BaseException as error:
            sock.close()
            if isinstance(error, OSError | TimeoutError):
                raise FetchError(f"connect to {address[0]}:{address[1]}: {error}") from error
            raise
        return _SocketConnection(sock)

    async def _open(
        self, address: tuple[str, int], settings: KafkaClientSettings
    ) -> _StreamConnection:
        host, port = address
        try:
            connection = await open_kafka_connection(
                host, port, settings, client_id=self._client_id_text, timeout=self._timeout
            )
        except KafkaAuthenticationError as error:
            raise FetchAuthenticationError(f"authenticate to {host}:{port}: {error}") from None
        except ssl.SSLCertVerificationError as error:
            raise FetchAuthenticationError(
                f"TLS to {host}:{port}: the broker's certificate is not trusted "
                f"({error.verify_message}): check ssl.ca.location"
            ) from None
        except ssl.SSLError as error:
            raise FetchAuthenticationError(
                f"TLS to {host}:{port}: {error} (check security.protocol and the ssl.* settings)"
            ) from None
        except (OSError, TimeoutError) as error:
            raise FetchError(f"connect to {host}:{port}: {error!r}") from error
        return _StreamConnection(connection)

    def close(self) -> None:
        """Close every idle connection."""
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
