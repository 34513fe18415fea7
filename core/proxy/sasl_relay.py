"""The client's SASL exchanges, passed through to the broker untouched (also re-authentication
on a live connection, KIP-368).

The proxy follows them only to know when one is under way: a broker refuses any other request
mid-exchange, so the proxy's own (out-of-band) requests on the connection wait until it is over.
SaslHandshake v0 is refused: its tokens follow as bare bytes, not Kafka frames.
"""

from __future__ import annotations

import asyncio

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy.connection_state import ConnectionState

_SASL_HANDSHAKE = ApiKey.SASL_HANDSHAKE
# What a client may send while it (re-)authenticates; any other request means it is done.
_DURING_SASL = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.API_VERSIONS})


class SaslRelay(ConnectionState):
    """Whether a SASL exchange of the client's is under way on this connection."""

    def _sasl_request(self, api_key: int, api_version: int) -> bool:
        """Note a client request that starts or ends a SASL exchange (called for a
        SaslHandshake and for every request during an exchange); False when it closed the
        connection."""
        if api_key == _SASL_HANDSHAKE:
            if api_version == 0:
                self.close(
                    "the client sent SaslHandshake v0, whose SASL tokens follow as bare "
                    "bytes the proxy cannot relay: use a client that sends SaslHandshake "
                    "v1 (any Kafka client since 1.0; librdkafka since 0.11)"
                )
                return False
            self._sasl_idle.clear()
        elif api_key not in _DURING_SASL:
            self._sasl_idle.set()
        return True

    async def _wait_sasl_idle(self, timeout: float) -> None:
        """Return once no SASL exchange of the client's is under way (TimeoutError after
        ``timeout`` seconds)."""
        if not self._sasl_idle.is_set():
            await asyncio.wait_for(self._sasl_idle.wait(), timeout)
