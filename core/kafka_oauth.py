"""SASL OAUTHBEARER for bergstream's own Kafka connections (KIP-255, KIP-768, RFC 7628).

The client's first (and, when the broker accepts, only) message carries the bearer token and
any SASL extensions (KIP-342): ``n,,\\x01auth=Bearer <token>\\x01key=value\\x01\\x01``. A broker
that refuses the token answers with a JSON error (``{"status": "invalid_token", ...}``) and
waits for a lone ``\\x01`` before failing the exchange (RFC 7628 section 3.2.3):
:func:`refusal_text` turns that JSON into words. Tokens come from an
:class:`~bergstream.core.oauth_tokens.OidcTokenSource`; :class:`AiokafkaTokenProvider` hands
them to aiokafka's clients.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from aiokafka.abc import AbstractTokenProvider

from bergstream.core.oauth_tokens import OidcTokenSource

__all__ = ["AiokafkaTokenProvider", "client_first_message", "refusal_text"]


def client_first_message(token: str, extensions: Mapping[str, str]) -> bytes:
    """The OAUTHBEARER initial client response for ``token`` with ``extensions``."""
    parts = [f"auth=Bearer {token}", *(f"{key}={value}" for key, value in extensions.items())]
    return ("n,," + "".join(f"\x01{part}" for part in parts) + "\x01\x01").encode()


def refusal_text(challenge: bytes) -> str:
    """The broker's JSON error challenge as words (``status``, ``scope``), or its text."""
    try:
        data = json.loads(challenge)
    except ValueError:
        return challenge.decode("utf-8", "replace")
    if not isinstance(data, Mapping):
        return str(data)
    words = [f"status {data.get('status', '?')}"]
    if data.get("scope"):
        words.append(f"scope {data['scope']}")
    return ", ".join(words)


class AiokafkaTokenProvider(AbstractTokenProvider):
    """aiokafka's ``sasl_oauth_token_provider``: the source's current token (fetched in a
    thread, so the event loop never waits on the identity provider) and the SASL extensions."""

    def __init__(self, source: OidcTokenSource, extensions: Mapping[str, str]) -> None:
        self._source = source
        self._extensions = dict(extensions)

    async def token(self) -> str:
        """A token that has not reached its refresh time."""
        token = await asyncio.to_thread(self._source.token)
        return token.value

    def extensions(self) -> dict[str, str]:
        """The SASL extensions sent with every token."""
        return dict(self._extensions)
