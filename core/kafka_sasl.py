"""SASL authentication of bergstream's own Kafka connections (PLAIN, SCRAM-SHA-256/512,
OAUTHBEARER with :mod:`~bergstream.core.kafka_oauth`, GSSAPI with
:mod:`~bergstream.core.kafka_kerberos`).

For a connection made with asyncio streams (TLS already applied with
``KafkaClientSettings.ssl_context()`` of :mod:`bergstream.core.kafka_client`),
:func:`sasl_authenticate` runs Kafka's SASL exchange (KIP-43, KIP-152): SaslHandshake v1 names the
mechanism, then each SASL token travels in a SaslAuthenticate v2 request; the broker's last answer
carries the session lifetime (KIP-368), kept in :class:`SaslSession` so a caller re-authenticates
an idle connection in time with :func:`sasl_reauthenticate`. :func:`open_kafka_connection` does the
connect, TLS and SASL in one call. Requests are built and read with kio through the proxy's codec,
as everywhere in core. Needs Kafka 2.4 or newer (SaslAuthenticate v2).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.protocol import RequestPayload, ResponsePayload

from bergstream.core.kafka_client import KafkaClientSettings, KafkaSettingsError
from bergstream.core.kafka_kerberos import GssapiExchange, KerberosError
from bergstream.core.kafka_oauth import client_first_message, refusal_text
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.oauth_tokens import OAuthTokenError, parse_extensions
from bergstream.core.proxy.codec import (
    CodecError,
    build_request,
    decode_response,
    encode_request,
    make_request_header,
)

__all__ = [
    "SASL_AUTHENTICATE_VERSION",
    "SASL_HANDSHAKE_VERSION",
    "KafkaAuthenticationError",
    "KafkaConnection",
    "SaslSession",
    "kafka_request",
    "open_kafka_connection",
    "sasl_authenticate",
    "sasl_reauthenticate",
]

#: The SaslHandshake version sent (v1: the tokens follow in SaslAuthenticate requests).
SASL_HANDSHAKE_VERSION = 1
#: The SaslAuthenticate version sent (v1+ answers with the session lifetime; v2 is flexible).
SASL_AUTHENTICATE_VERSION = 2
# The Java client re-authenticates between 85% and 95% of the lifetime; the low end leaves room.
_REAUTH_FRACTION = 0.85
_LENGTH = struct.Struct(">i")
# A TLS alert (21) or handshake (22) record, version 3.x: what a TLS listener sends back to a
# client that skipped TLS. No Kafka response is that long (over 350 MB).
_TLS_RECORD_TYPES = (0x15, 0x16)
# Far from the small ids clients start at, so a stray answer is easy to tell in a capture.
_FIRST_CORRELATION_ID = 0x5A510000


class KafkaAuthenticationError(Exception):
    """SASL authentication failed; the message says why, with the broker's own words when it
    gave any (``broker_message``) and its ``error_code``."""

    def __init__(
        self, message: str, *, error_code: int | None = None, broker_message: str | None = None
    ) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.broker_message = broker_message


@dataclass(frozen=True)
class SaslSession:
    """An authenticated SASL session: who, how, and for how long (KIP-368)."""

    mechanism: str
    username: str
    #: What the broker granted, in ms; 0 when the session never expires (the broker's
    #: ``connections.max.reauth.ms`` is 0, its default).
    session_lifetime_ms: int
    #: ``time.monotonic()`` when the broker accepted the credentials.
    authenticated_at: float

    @property
    def expires_at(self) -> float | None:
        """``time.monotonic()`` at which the broker closes the connection unless it was
        re-authenticated; None when the session never expires."""
        if self.session_lifetime_ms <= 0:
            return None
        return self.authenticated_at + self.session_lifetime_ms / 1000

    @property
    def reauthenticate_at(self) -> float | None:
        """``time.monotonic()`` at which to call :func:`sasl_reauthenticate` (85% of the lifetime,
        as Java clients do at the earliest); None when the session never expires."""
        if self.session_lifetime_ms <= 0:
            return None
        return self.authenticated_at + _REAUTH_FRACTION * self.session_lifetime_ms / 1000


@dataclass(frozen=True)
class KafkaConnection:
    """An open (and, with SASL, authenticated) connection to one broker. It unpacks as
    ``reader, writer``; ``session`` is None without SASL."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    session: SaslSession | None

    def __iter__(self) -> Iterator[Any]:
        yield self.reader
        yield self.writer

    async def close(self) -> None:
        """Close the connection and wait until it is closed."""
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def kafka_request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    payload: RequestPayload,
    *,
    correlation_id: int,
    client_id: str | None,
) -> ResponsePayload:
    """Send one request and read its response, on a connection with nothing else in flight."""
    header = make_request_header(
        payload.__api_key__, payload.__version__, correlation_id, client_id
    )
    writer.write(encode_request(header, payload))
    await writer.drain()
    prefix = await reader.readexactly(_LENGTH.size)
    if prefix[0] in _TLS_RECORD_TYPES and prefix[1] == 3:
        raise CodecError(
            "the answer is a TLS record: this listener speaks TLS (security.protocol SSL or "
            "SASL_SSL)"
        )
    (size,) = _LENGTH.unpack(prefix)
    message = await reader.readexactly(size)
    answered, response = decode_response(payload.__api_key__, payload.__version__, message)
    if answered != correlation_id:
        raise CodecError(f"response to correlation id {answered}, expected {correlation_id}")
    return response


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "the broker"


def _code(value: Any) -> int:
    return int(value.value) if isinstance(value, ErrorCode) else int(value)


class _Exchange:
    """One SASL exchange on a connection: handshake, then SaslAuthenticate round trips."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        settings: KafkaClientSettings,
        client_id: str | None,
        reauth: bool,
        host: str | None = None,
    ) -> None:
        self.reader = reader
        self.reauth = reauth
        self.writer = writer
        self.settings = settings
        self.client_id = client_id
        self.peer = _peer(writer)
        # GSSAPI names the service by the host name connected to (not the peer's address).
        self.host = host or self.peer.rpartition(":")[0] or "localhost"
        self.correlation_id = _FIRST_CORRELATION_ID
        self.lifetime_ms = 0

    async def _send(self, payload: RequestPayload) -> Any:
        self.correlation_id += 1
        return await kafka_request(
            self.reader,
            self.writer,
            payload,
            correlation_id=self.correlation_id,
            client_id=self.client_id,
        )

    async def handshake(self, mechanism: str) -> None:
        request = build_request(ApiKey.SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION, mechanism=mechanism)
        response = await self._send(request)
        code = _code(response.error_code)
        if code == ErrorCode.none.value:
            return
        enabled = ", ".join(response.mechanisms) or "none"
        if code == ErrorCode.unsupported_sasl_mechanism.value:
            raise KafkaAuthenticationError(
                f"{self.peer} does not enable the SASL mechanism {mechanism} (it enables "
                f"{enabled}): set sasl.mechanism to one of those",
                error_code=code,
            )
        if code == ErrorCode.illegal_sasl_state.value:
            why = (
                "the broker does not re-authenticate (its connections.max.reauth.ms is 0, the "
                "default; sessions then never expire)"
                if self.reauth
                else "this listener does no SASL: check security.protocol"
            )
            raise KafkaAuthenticationError(
                f"{self.peer} refused a SASL handshake (ILLEGAL_SASL_STATE): {why}",
                error_code=code,
            )
        raise KafkaAuthenticationError(
            f"{self.peer} refused the SASL handshake for {mechanism}: error code {code}",
            error_code=code,
        )

    async def token(self, data: bytes) -> bytes:
        request = build_request(
            ApiKey.SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION, auth_bytes=data
        )
        response = await self._send(request)
        code = _code(response.error_code)
        if code != ErrorCode.none.value:
            said = response.error_message or ErrorCode(code).name
            raise KafkaAuthenticationError(
                f"{self.peer} refused the credentials of {self.settings.principal!r} "
                f"({self.settings.sasl_mechanism}): {said}",
                error_code=code,
                broker_message=response.error_message,
            )
        lifetime = response.session_lifetime
        self.lifetime_ms = int(lifetime.total_seconds() * 1000) if lifetime is not None else 0
        return bytes(response.auth_bytes)

    async def run(self) -> SaslSession:
        settings = self.settings
        mechanism = settings.sasl_mechanism
        if mechanism is None:
            raise KafkaAuthenticationError("SASL needs sasl.mechanism")
        await self.handshake(mechanism)
        if mechanism == "OAUTHBEARER":
            username = await self._oauthbearer()
        elif mechanism == "GSSAPI":
            username = await self._gssapi()
        else:
            username = await self._password(mechanism)
        return SaslSession(mechanism, username, self.lifetime_ms, time.monotonic())

    async def _password(self, mechanism: str) -> str:
        settings = self.settings
        username = settings.sasl_username
        if username is None or settings.sasl_password is None:
            raise KafkaAuthenticationError(
                f"SASL {mechanism} needs sasl.username and sasl.password"
            )
        password = settings.sasl_password.get_secret_value()
        if mechanism == "PLAIN":
            # RFC 4616: authorization id (empty: the user itself), user, password.
            await self.token(b"\0" + username.encode() + b"\0" + password.encode())
            return username
        # Imported here: scramp brings asn1crypto, which only SCRAM users need.
        from scramp import ScramClient, ScramException

        try:
            scram = ScramClient([mechanism], username, password)
            server_first = await self.token(scram.get_client_first().encode())
            scram.set_server_first(server_first.decode())
            server_final = await self.token(scram.get_client_final().encode())
            scram.set_server_final(server_final.decode())
        except (ScramException, UnicodeDecodeError) as error:
            raise KafkaAuthenticationError(
                f"SCRAM exchange with {self.peer} failed: {error} (a broker that cannot "
                f"prove it knows the password of {username!r} is refused)"
            ) from None
        return username

    async def _oauthbearer(self) -> str:
        settings = self.settings
        try:
            source = settings.oauth_token_source()
            token = await asyncio.to_thread(source.token)
        except (OAuthTokenError, KafkaSettingsError) as error:
            raise KafkaAuthenticationError(str(error)) from None
        extensions = parse_extensions(settings.sasl_oauthbearer_extensions)
        challenge = await self.token(client_first_message(token.value, extensions))
        if challenge:
            # RFC 7628 3.2.3: the broker refused the token with a JSON error and waits for a
            # lone 0x01 before failing the exchange.
            refusal = refusal_text(challenge)
            try:
                await self.token(b"\x01")
            except KafkaAuthenticationError as error:
                raise KafkaAuthenticationError(
                    f"{error} ({refusal})",
                    error_code=error.error_code,
                    broker_message=error.broker_message,
                ) from None
            raise KafkaAuthenticationError(
                f"{self.peer} refused the token of client id "
                f"{settings.sasl_oauthbearer_client_id!r}: {refusal}"
            )
        return token.principal or settings.sasl_oauthbearer_client_id or "?"

    async def _gssapi(self) -> str:
        host = self.host
        try:
            exchange = await asyncio.to_thread(GssapiExchange, self.settings, host)
            reply: bytes | None = await asyncio.to_thread(exchange.first)
            while reply is not None:
                answer = await self.token(reply)
                reply = await asyncio.to_thread(exchange.answer, answer)
        except KerberosError as error:
            raise KafkaAuthenticationError(str(error)) from None
        return exchange.principal or "kerberos"


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    settings: KafkaClientSettings,
    client_id: str | None,
    timeout: float,
    reauth: bool,
    host: str | None,
) -> SaslSession:
    exchange = _Exchange(reader, writer, settings, client_id, reauth, host)
    try:
        async with asyncio.timeout(timeout):
            return await exchange.run()
    except TimeoutError:
        raise KafkaAuthenticationError(
            f"no answer from {exchange.peer} within {timeout:g} s during SASL authentication "
            "(check the address and security.protocol)"
        ) from None
    except (asyncio.IncompleteReadError, ConnectionError) as error:
        raise KafkaAuthenticationError(
            f"{exchange.peer} closed the connection during SASL authentication ({error!r}): "
            "check security.protocol and sasl.mechanism against the broker's listener"
        ) from None
    except CodecError as error:
        raise KafkaAuthenticationError(
            f"{exchange.peer} answered SASL authentication with something else ({error}): "
            "check security.protocol against the broker's listener"
        ) from None


async def sasl_authenticate(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    settings: KafkaClientSettings,
    *,
    client_id: str | None = None,
    timeout: float = 30.0,
    host: str | None = None,
) -> SaslSession:
    """Authenticate a fresh connection with the SASL settings of ``settings`` (its TLS, if
    any, already applied); :class:`KafkaAuthenticationError` when the broker refuses. ``host``
    is the broker's host name as connected to (GSSAPI's service name; the peer's address if
    None)."""
    return await _exchange(reader, writer, settings, client_id, timeout, False, host)


async def sasl_reauthenticate(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    settings: KafkaClientSettings,
    *,
    client_id: str | None = None,
    timeout: float = 30.0,
    host: str | None = None,
) -> SaslSession:
    """Re-authenticate an authenticated connection before its session expires (KIP-368); the
    caller must have no request in flight on it. The same exchange as :func:`sasl_authenticate`; a
    broker that does not re-authenticate (``connections.max.reauth.ms`` 0) refuses it."""
    return await _exchange(reader, writer, settings, client_id, timeout, True, host)


async def open_kafka_connection(
    host: str,
    port: int,
    settings: KafkaClientSettings,
    *,
    client_id: str | None = None,
    timeout: float = 30.0,
) -> KafkaConnection:
    """Connect to one broker as ``settings`` says: TCP, TLS for SSL and SASL_SSL, SASL for
    SASL_PLAINTEXT and SASL_SSL. Unpacks as ``reader, writer``; its ``session`` tells when to
    re-authenticate. Connection and TLS failures raise ``OSError`` / ``ssl.SSLError``
    (``TimeoutError`` after ``timeout``), refused credentials :class:`KafkaAuthenticationError`."""
    context = settings.ssl_context()
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=context, server_hostname=host if context is not None else None
        )
    if not settings.uses_sasl:
        return KafkaConnection(reader, writer, None)
    try:
        session = await sasl_authenticate(
            reader, writer, settings, client_id=client_id, timeout=timeout, host=host
        )
    except BaseException:
        writer.close()
        raise
    return KafkaConnection(reader, writer, session)
