"""Temporary S3 credentials: what LoadTable vends, scoped to one table and expiring.

A vended set is an access key id, a secret and a session token, as AWS STS issues them. The
session token carries everything the S3 gateway needs, so no state is kept and every ISK
instance configured with the same root pair (``http.access_key`` / ``http.secret_key``)
accepts the credentials any of them issued:

- session token: ``isks1.<payload>.<mac>``, the payload base64url JSON of the table's key
  prefix (``<cluster>/<namespace>/<topic>`` in the gateway bucket), the principal's name (or
  none) and the expiry (epoch seconds); the MAC an HMAC-SHA256 over both, keyed from the root;
- access key id: ``ASIA`` (AWS's prefix of temporary keys) + 16 base32 digits of the token's
  SHA-256, so a key id names its token and no other;
- secret: HMAC-SHA256 of the token, keyed from the root secret (base64url).

The gateway recomputes the secret from the token it receives (``X-Amz-Security-Token``) and
checks the request's SigV4 signature with it: a signature made with another secret, a key id of
another token, a forged or altered token all fail. The root secret never leaves the service and
says nothing an issued secret could reveal. Changing the root pair ends every issued credential.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "SESSION_KEY_PREFIX",
    "CredentialKeys",
    "SessionCredentials",
    "TokenExpired",
    "TokenInvalid",
]

#: AWS's prefix of temporary access key ids; clients and logs tell them from long-lived ones.
SESSION_KEY_PREFIX = "ASIA"
_VERSION = "isks1"
_KEY_ID_DIGITS = 16


class TokenInvalid(Exception):
    """A session token this service did not issue (malformed, altered, another root's)."""


class TokenExpired(Exception):
    """A genuine session token past its expiry."""


@dataclass(frozen=True)
class SessionCredentials:
    """One vended credential set and what it allows: reading the keys under ``scope``."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: str = field(repr=False)
    #: The table's key prefix in the gateway bucket, without the trailing ``/``.
    scope: str
    #: The principal the credentials were vended to; None without principals.
    principal: str | None
    #: Epoch seconds after which the gateway refuses them.
    expires_at: int

    def allows(self, key: str) -> bool:
        """Whether ``key`` is one of the scope's objects."""
        return key.startswith(self.scope + "/")

    def allows_listing(self, prefix: str) -> bool:
        """Whether a listing under ``prefix`` can stay within the scope (a prefix of the
        scope, or one inside it); the listing must still leave out keys outside it."""
        within = self.scope + "/"
        return prefix.startswith(within) or within.startswith(prefix)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CredentialKeys:
    """Issues and verifies session credentials with keys derived from the root pair."""

    def __init__(
        self,
        root_access_key: str,
        root_secret: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        root = root_secret.encode()
        # Separate keys per purpose: a token's MAC is never a usable secret, and vice versa.
        self._mac_key = hmac.new(
            root, f"isk-s3-session-token\0{root_access_key}".encode(), hashlib.sha256
        ).digest()
        self._secret_key = hmac.new(
            root, f"isk-s3-session-secret\0{root_access_key}".encode(), hashlib.sha256
        ).digest()
        self._clock = clock

    def issue(self, scope: str, principal: str | None, ttl_seconds: int) -> SessionCredentials:
        """Credentials reading only the keys under ``scope`` (a key prefix, no trailing
        ``/``) for ``ttl_seconds`` from now, on behalf of ``principal``."""
        scope = scope.strip("/")
        if not scope:
            raise ValueError("a session scope must name a key prefix")
        expires_at = int(self._clock()) + ttl_seconds
        payload = json.dumps(
            {"e": expires_at, "p": principal, "s": scope}, separators=(",", ":"), sort_keys=True
        )
        body = f"{_VERSION}.{_b64(payload.encode())}"
        token = f"{body}.{_b64(self._mac(body))}"
        return self._credentials(token, scope, principal, expires_at)

    def verify(self, token: str) -> SessionCredentials:
        """The credentials of ``token``; :class:`TokenInvalid` unless this root issued it,
        :class:`TokenExpired` once it is past its expiry."""
        version, dot, rest = token.partition(".")
        encoded, dot2, mac = rest.partition(".")
        if version != _VERSION or not dot or not dot2 or not encoded or not mac:
            raise TokenInvalid("not a session token of this service")
        try:
            given = _unb64(mac)
        except (binascii.Error, ValueError) as exc:
            raise TokenInvalid("malformed session token") from exc
        if not hmac.compare_digest(given, self._mac(f"{version}.{encoded}")):
            raise TokenInvalid("the session token's signature does not match")
        try:
            payload = json.loads(_unb64(encoded))
            expires_at, principal, scope = payload["e"], payload["p"], payload["s"]
        except (binascii.Error, ValueError, KeyError, TypeError) as exc:
            raise TokenInvalid("malformed session token") from exc
        if (
            not isinstance(expires_at, int)
            or not isinstance(scope, str)
            or not scope
            or not (principal is None or isinstance(principal, str))
        ):
            raise TokenInvalid("malformed session token")
        if expires_at <= self._clock():
            raise TokenExpired("the session token has expired")
        return self._credentials(token, scope, principal, expires_at)

    def _mac(self, body: str) -> bytes:
        return hmac.new(self._mac_key, body.encode(), hashlib.sha256).digest()

    def _credentials(
        self, token: str, scope: str, principal: str | None, expires_at: int
    ) -> SessionCredentials:
        digest = hashlib.sha256(token.encode()).digest()
        key_id = SESSION_KEY_PREFIX + base64.b32encode(digest).decode()[:_KEY_ID_DIGITS]
        secret = _b64(hmac.new(self._secret_key, token.encode(), hashlib.sha256).digest())
        return SessionCredentials(key_id, secret, token, scope, principal, expires_at)
