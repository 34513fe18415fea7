"""The SASL client against a fake broker speaking Kafka's SASL requests (PLAIN, SCRAM with
scramp's server side): success, session lifetime, refusals and wrong listeners. The real
brokers are in tests/stack/test_kafka_sasl_live.py."""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kio.static.primitive import i64Timedelta
from scramp import ScramException, ScramMechanism

from bergstream.core.kafka_client import KafkaClientSettings
from bergstream.core.kafka_sasl import (
    KafkaAuthenticationError,
    SaslSession,
    kafka_request,
    open_kafka_connection,
    sasl_reauthenticate,
)
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy.codec import build_request, build_response, decode_request
from bergstream.core.proxy.codec import encode_response as encode

PASSWORD = "pa55-w0rd"
USERS = {"alice": PASSWORD}
LIFETIME_MS = 60_000
_LEN = struct.Struct(">i")


class FakeBroker:
    """Answers SaslHandshake, SaslAuthenticate and ApiVersions like a SASL listener."""

    def __init__(self, enabled: tuple[str, ...], lifetime_ms: int = LIFETIME_MS) -> None:
        # lifetime 0: re-authentication off, as on a broker with connections.max.reauth.ms 0
        self.enabled = enabled
        self.lifetime_ms = lifetime_ms
        self.requests: list[tuple[int, int]] = []

    def _scram_server(self, mechanism: str) -> Any:
        mech = ScramMechanism(mechanism)

        def auth_fn(username: str) -> tuple[bytes, bytes, bytes, int]:
            # Unknown users get a throwaway password, so the proof fails as for a wrong one.
            return mech.make_auth_info(USERS.get(username, "x-unknown-x"), iteration_count=4096)

        return mech.make_server(auth_fn)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mechanism = None
        scram: Any = None
        authenticated = False
        try:
            while True:
                (size,) = _LEN.unpack(await reader.readexactly(4))
                header, payload = decode_request(await reader.readexactly(size))
                key, version = header.request_api_key, header.request_api_version
                self.requests.append((key, version))
                values: dict[str, Any] = {}
                if key == ApiKey.SASL_HANDSHAKE:
                    mechanism = payload.mechanism  # type: ignore[attr-defined]
                    values = {"mechanisms": self.enabled}
                    if authenticated and self.lifetime_ms == 0:
                        values["error_code"] = 34  # ILLEGAL_SASL_STATE, as Kafka answers
                    elif mechanism not in self.enabled:
                        values["error_code"] = 33
                    elif mechanism.startswith("SCRAM"):
                        scram = self._scram_server(mechanism)
                elif key == ApiKey.SASL_AUTHENTICATE:
                    values = self._authenticate(mechanism, scram, payload.auth_bytes)  # type: ignore[attr-defined]
                if key == ApiKey.SASL_AUTHENTICATE and "session_lifetime" in values:
                    authenticated = True
                writer.write(encode(header.correlation_id, build_response(key, version, **values)))
                await writer.drain()
                if values.get("error_code") == 58:
                    break  # Kafka closes the connection after a failed authentication
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    def _authenticate(self, mechanism: str | None, scram: Any, token: bytes) -> dict[str, Any]:
        lifetime = i64Timedelta.parse(datetime.timedelta(milliseconds=self.lifetime_ms))
        if mechanism == "PLAIN":
            _, user, password = token.decode().split("\0")
            if USERS.get(user) != password:
                return {"error_code": 58, "error_message": "Invalid username or password"}
            return {"session_lifetime": lifetime}
        try:
            if scram.stage is None:
                scram.set_client_first(token.decode())
                return {"auth_bytes": scram.get_server_first().encode()}
            scram.set_client_final(token.decode())
            return {"auth_bytes": scram.get_server_final().encode(), "session_lifetime": lifetime}
        except ScramException:
            return {"error_code": 58, "error_message": "invalid credentials"}


@asynccontextmanager
async def server(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[int]:
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        await srv.wait_closed()


def sasl(mechanism: str, password: str = PASSWORD, user: str = "alice") -> KafkaClientSettings:
    return KafkaClientSettings.model_validate(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
        }
    )


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_authenticates_and_keeps_the_session_lifetime(mechanism: str) -> None:
    broker = FakeBroker(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))
    async with server(broker.serve) as port:
        conn = await open_kafka_connection("127.0.0.1", port, sasl(mechanism), client_id="t")
        try:
            session = conn.session
            assert isinstance(session, SaslSession)
            assert (session.mechanism, session.username) == (mechanism, "alice")
            assert session.session_lifetime_ms == LIFETIME_MS
            assert session.expires_at == pytest.approx(session.authenticated_at + 60)
            assert session.reauthenticate_at == pytest.approx(session.authenticated_at + 51)
            reader, writer = conn  # unpacks as asyncio's pair
            answer = await kafka_request(
                reader,
                writer,
                build_request(ApiKey.API_VERSIONS, 0),
                correlation_id=5,
                client_id="t",
            )
            assert answer.error_code == 0
            again = await sasl_reauthenticate(reader, writer, sasl(mechanism), client_id="t")
            assert again.authenticated_at >= session.authenticated_at
        finally:
            await conn.close()
    steps = 2 if mechanism == "PLAIN" else 3  # handshake + tokens
    assert broker.requests[:steps] == [(17, 1)] + [(36, 2)] * (steps - 1)
    assert len(broker.requests) == 1 + 2 * steps


async def test_no_expiry_when_the_broker_grants_no_lifetime() -> None:
    async with server(FakeBroker(("PLAIN",), lifetime_ms=0).serve) as port:
        conn = await open_kafka_connection("127.0.0.1", port, sasl("PLAIN"))
        try:
            assert conn.session is not None
            assert (conn.session.expires_at, conn.session.reauthenticate_at) == (None, None)
            with pytest.raises(KafkaAuthenticationError, match="does not re-authenticate") as e:
                await sasl_reauthenticate(conn.reader, conn.writer, sasl("PLAIN"))
            assert e.value.error_code == 34
        finally:
            await conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_a_wrong_password_carries_the_brokers_message(mechanism: str) -> None:
    async with server(FakeBroker(("PLAIN", "SCRAM-SHA-512")).serve) as port:
        with pytest.raises(KafkaAuthenticationError) as caught:
            await open_kafka_connection("127.0.0.1", port, sasl(mechanism, password="nope"))
    error = caught.value
    assert error.error_code == 58
    assert error.broker_message in str(error)
    assert f"refused the credentials of 'alice' ({mechanism})" in str(error)
    assert "nope" not in str(error)


async def test_a_mechanism_the_broker_lacks_names_the_ones_it_has() -> None:
    async with server(FakeBroker(("SCRAM-SHA-512", "PLAIN")).serve) as port:
        with pytest.raises(KafkaAuthenticationError) as caught:
            await open_kafka_connection("127.0.0.1", port, sasl("SCRAM-SHA-256"))
    assert caught.value.error_code == 33
    assert "does not enable the SASL mechanism SCRAM-SHA-256" in str(caught.value)
    assert "(it enables SCRAM-SHA-512, PLAIN)" in str(caught.value)


async def test_a_tls_listener_is_recognised() -> None:
    async def tls_alert(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"\x15\x03\x03\x00\x02\x02\x28")  # a TLS alert record, then close
        await writer.drain()
        writer.close()

    async with server(tls_alert) as port:
        with pytest.raises(KafkaAuthenticationError, match="this listener speaks TLS"):
            await open_kafka_connection("127.0.0.1", port, sasl("PLAIN"))


async def test_a_closed_or_silent_listener_is_a_clear_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with server(hang_up) as port:
        with pytest.raises(KafkaAuthenticationError, match="closed the connection during SASL"):
            await open_kafka_connection("127.0.0.1", port, sasl("PLAIN"))

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async with server(silent) as port:
        with pytest.raises(KafkaAuthenticationError, match=r"no answer from .* within 0.3 s"):
            await open_kafka_connection("127.0.0.1", port, sasl("PLAIN"), timeout=0.3)


async def test_without_sasl_there_is_no_session() -> None:
    async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)

    async with server(idle) as port:
        conn = await open_kafka_connection("127.0.0.1", port, KafkaClientSettings())
        assert conn.session is None
        await conn.close()
