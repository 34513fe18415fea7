"""Which topics a principal may read, as Kafka says for the principal's own credentials.

:class:`TopicAuthorizer` opens a connection authenticated as the principal (core's
``open_kafka_connection``: TLS, SASL) and sends one Metadata request for every topic with
``include_topic_authorized_operations``: the broker leaves out the topics the principal may not
DESCRIBE and, for the others, answers the operations its authorizer allows. A topic is readable
when both DESCRIBE and READ are allowed. Answers are kept ``ttl_seconds`` per principal (a
revoked ACL takes effect within that time); concurrent requests of one principal share one
lookup; failures are not kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable

from bergstream.core.api import (
    ApiKey,
    KafkaAuthenticationError,
    KafkaClientSettings,
    build_request,
    kafka_request,
    open_kafka_connection,
)
from bergstream.plugins.isk_gateway.http.principals import Principal, PrincipalRefused
from bergstream.plugins.isk_gateway.tables.provider import ProviderUnavailable

__all__ = [
    "DESCRIBE",
    "OPERATIONS_NOT_COMPUTED",
    "READ",
    "TopicAuthorizer",
    "readable_topics",
]

log = logging.getLogger("bergstream.isk")

#: Bits of Kafka's authorized-operations bitfield (``AclOperation`` codes).
READ = 1 << 3
DESCRIBE = 1 << 8
#: The bitfield of a broker that did not compute the operations (INT32_MIN).
OPERATIONS_NOT_COMPUTED = -(2**31)
#: Metadata v12 (Kafka 2.8+): topic ids, topic authorized operations, no cluster operations.
_METADATA_VERSION = 12
_CORRELATION_ID = 1


def readable_topics(topics: list[tuple[str | None, int, bool]]) -> tuple[frozenset[str], int]:
    """From ``(name, authorized_operations, is_internal)`` of a Metadata answer: the topics
    allowing DESCRIBE and READ, and how many came without computed operations (left out:
    what the broker did not decide is not allowed)."""
    readable: set[str] = set()
    not_computed = 0
    for name, operations, internal in topics:
        if name is None or internal:
            continue
        if operations == OPERATIONS_NOT_COMPUTED:
            not_computed += 1
            continue
        if operations & READ and operations & DESCRIBE:
            readable.add(name)
    return frozenset(readable), not_computed


class TopicAuthorizer:
    """Kafka's answer, per principal, to "which topics may it DESCRIBE and READ"."""

    def __init__(
        self,
        bootstrap: str,
        *,
        ttl_seconds: float,
        client_id: str = "bergstream-isk-authz",
        timeout: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._brokers = [_host_port(part) for part in bootstrap.split(",") if part.strip()]
        self._ttl = ttl_seconds
        self._client_id = client_id
        self._timeout = timeout
        self._clock = clock
        self._known: dict[str, tuple[float, frozenset[str]]] = {}
        self._pending: dict[str, asyncio.Task[frozenset[str]]] = {}

    async def readable(self, principal: Principal) -> frozenset[str]:
        """The topics ``principal`` may DESCRIBE and READ; :class:`PrincipalRefused` when Kafka
        refuses its credentials, :class:`ProviderUnavailable` when no broker answers."""
        known = self._known.get(principal.name)
        if known is not None and known[0] > self._clock():
            return known[1]
        pending = self._pending.get(principal.name)
        if pending is None:
            pending = asyncio.create_task(self._lookup(principal))
            self._pending[principal.name] = pending
            pending.add_done_callback(lambda _: self._pending.pop(principal.name, None))
        return await asyncio.shield(pending)

    async def _lookup(self, principal: Principal) -> frozenset[str]:
        started = self._clock()
        topics = await self._ask(principal.name, principal.kafka)
        readable, not_computed = readable_topics(topics)
        if not_computed:
            log.warning(
                "isk: Kafka did not compute the authorized operations of %d topics for "
                "principal %s: they are not served to it",
                not_computed,
                principal.name,
            )
        if self._ttl > 0:
            self._known[principal.name] = (started + self._ttl, readable)
        return readable

    async def _ask(
        self, name: str, settings: KafkaClientSettings
    ) -> list[tuple[str | None, int, bool]]:
        problems: list[str] = []
        for host, port in self._brokers:
            try:
                connection = await open_kafka_connection(
                    host, port, settings, client_id=self._client_id, timeout=self._timeout
                )
            except KafkaAuthenticationError as error:
                raise PrincipalRefused(
                    f"Kafka refused the credentials configured for principal {name!r}: {error}"
                ) from None
            except (OSError, TimeoutError, ssl.SSLError, ValueError) as error:
                problems.append(f"{host}:{port}: {error!r}")
                continue
            try:
                request = build_request(
                    ApiKey.METADATA,
                    _METADATA_VERSION,
                    topics=None,
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=True,
                )
                async with asyncio.timeout(self._timeout):
                    response = await kafka_request(
                        connection.reader,
                        connection.writer,
                        request,
                        correlation_id=_CORRELATION_ID,
                        client_id=self._client_id,
                    )
            except Exception as error:  # closed, timed out, or an answer that does not decode
                problems.append(f"{host}:{port}: {error!r}")
                continue
            finally:
                with contextlib.suppress(Exception):
                    await connection.close()
            return [
                (topic.name, int(topic.topic_authorized_operations), bool(topic.is_internal))
                for topic in response.topics
            ]
        raise ProviderUnavailable(
            f"cannot ask Kafka what principal {name!r} may read: {'; '.join(problems)}"
        )


def _host_port(part: str) -> tuple[str, int]:
    host, _, port = part.strip().rpartition(":")
    return host.strip("[]"), int(port)
