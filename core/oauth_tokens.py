"""OAuth 2.0 access tokens for SASL OAUTHBEARER: OIDC's client-credentials grant, refreshed in time.

An :class:`OidcTokenSource` asks an identity provider's token endpoint (Keycloak, Okta, Entra
ID, Confluent Cloud's, ...) for an access token with a client id and secret (RFC 6749 section
4.4, the credentials in HTTP Basic authentication as librdkafka and Java's
``OAuthBearerLoginCallbackHandler`` send them), keeps it, and asks again once
``refresh_fraction`` of its lifetime has passed, so a connection opened or re-authenticated
(KIP-368) late in a token's life never presents one about to expire. One source per client id
and endpoint is shared by every connection of a process (:func:`token_source`), as one
librdkafka client shares its token.

The token's claims are read (not verified: the broker verifies them against the provider's
keys) only to name the principal in messages. Standard library only (``urllib.request``).
"""

from __future__ import annotations

import base64
import functools
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AccessToken",
    "OAuthTokenError",
    "OidcTokenSource",
    "parse_extensions",
    "token_claims",
    "token_source",
]

#: Share of a token's lifetime after which a new one is fetched (Java clients: 80%).
REFRESH_FRACTION = 0.8
# A token without expires_in is kept this long (RFC 6749 makes expires_in only recommended).
_DEFAULT_LIFETIME_S = 300.0
# The identity provider's words about a refusal are kept to this many characters.
_BODY_LIMIT = 300


class OAuthTokenError(RuntimeError):
    """The token endpoint gave no token; the message names the endpoint, the client id and
    what the provider said (never the secret)."""


@dataclass(frozen=True)
class AccessToken:
    """An access token and when it was fetched and expires (``time.time()`` seconds)."""

    value: str
    fetched_at: float
    expires_at: float
    #: The principal the token names (its ``sub`` claim, else ``azp`` or ``client_id``), or
    #: None when it is no JWT.
    principal: str | None

    @property
    def lifetime(self) -> float:
        """Seconds from fetch to expiry."""
        return self.expires_at - self.fetched_at


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (its middle part, base64url JSON), unverified; {} when ``token`` is
    no JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, UnicodeDecodeError):
        return {}
    return claims if isinstance(claims, dict) else {}


def parse_extensions(text: str | None) -> dict[str, str]:
    """SASL/OAUTHBEARER extensions (KIP-342) from librdkafka's ``sasl.oauthbearer.extensions``
    form, ``key=value,key2=value2``; a ValueError names a malformed part."""
    out: dict[str, str] = {}
    if not text:
        return out
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key or not key.isalpha() or key == "auth":
            raise ValueError(
                f"sasl.oauthbearer.extensions part {part.strip()!r} is no key=value with a "
                "letters-only key other than 'auth' (write key=value,key2=value2)"
            )
        out[key] = value
    return out


class OidcTokenSource:
    """Client-credentials access tokens from ``token_endpoint``, fetched when first asked for and
    again after ``refresh_fraction`` of their lifetime (or once expired). Thread-safe:
    concurrent callers wait for one fetch."""

    def __init__(
        self,
        token_endpoint: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        *,
        ca_file: str | None = None,
        refresh_fraction: float = REFRESH_FRACTION,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token_endpoint = token_endpoint
        self.client_id = client_id
        self._secret = client_secret
        self.scope = scope or None
        self._context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.refresh_fraction = refresh_fraction
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._current: AccessToken | None = None
        #: How many tokens were fetched (tests and the status page read it).
        self.fetches = 0

    def __repr__(self) -> str:
        return f"OidcTokenSource({self.token_endpoint!r}, client_id={self.client_id!r})"

    def _fresh(self, token: AccessToken | None) -> bool:
        if token is None:
            return False
        refresh_at = token.fetched_at + self.refresh_fraction * token.lifetime
        return self._clock() < min(refresh_at, token.expires_at)

    def token(self) -> AccessToken:
        """A token that has not yet reached its refresh time (fetched now if needed);
        :class:`OAuthTokenError` when the endpoint refuses or cannot be reached."""
        with self._lock:
            if not self._fresh(self._current):
                self._current = self._fetch()
            assert self._current is not None
            return self._current

    def _request(self) -> urllib.request.Request:
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        basic = base64.b64encode(
            f"{urllib.parse.quote(self.client_id, safe='')}:"
            f"{urllib.parse.quote(self._secret, safe='')}".encode()
        ).decode()
        return urllib.request.Request(
            self.token_endpoint,
            data=urllib.parse.urlencode(form).encode(),
            headers={
                "Authorization": f"Basic {basic}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
            method="POST",
        )

    def _fetch(self) -> AccessToken:
        who = f"client id {self.client_id!r} at {self.token_endpoint}"
        started = self._clock()
        try:
            with urllib.request.urlopen(
                self._request(), timeout=self.timeout, context=self._context
            ) as answer:
                body = answer.read()
        except urllib.error.HTTPError as error:
            said = _provider_words(error.read())
            raise OAuthTokenError(
                f"the token endpoint refused {who}: HTTP {error.code}{said} (check "
                "sasl.oauthbearer.client.id, sasl.oauthbearer.client.secret and "
                "sasl.oauthbearer.scope)"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise OAuthTokenError(
                f"no token for {who}: {reason} (check sasl.oauthbearer.token.endpoint.url)"
            ) from None
        try:
            answer_json = json.loads(body)
            value = answer_json["access_token"]
            if not isinstance(value, str) or not value:
                raise KeyError("access_token")
        except (ValueError, KeyError, TypeError):
            raise OAuthTokenError(
                f"the token endpoint answered {who} without an access_token: {body[:_BODY_LIMIT]!r}"
            ) from None
        lifetime = _lifetime(answer_json, value)
        self.fetches += 1
        return AccessToken(value, started, started + lifetime, _principal(token_claims(value)))


def _provider_words(body: bytes) -> str:
    """``: error (description)`` from an RFC 6749 error answer, or its first characters."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body[:_BODY_LIMIT].decode("utf-8", "replace").strip()
        return f": {text}" if text else ""
    if not isinstance(data, Mapping):
        return ""
    error = data.get("error")
    description = data.get("error_description")
    if error and description:
        return f": {error} ({description})"
    return f": {error}" if error else ""


def _lifetime(answer: Mapping[str, Any], token: str) -> float:
    expires_in = answer.get("expires_in")
    if isinstance(expires_in, int | float) and expires_in > 0:
        return float(expires_in)
    claims = token_claims(token)
    exp, iat = claims.get("exp"), claims.get("iat")
    if isinstance(exp, int | float) and isinstance(iat, int | float) and exp > iat:
        return float(exp - iat)
    return _DEFAULT_LIFETIME_S


def _principal(claims: Mapping[str, Any]) -> str | None:
    for claim in ("sub", "azp", "client_id"):
        value = claims.get(claim)
        if isinstance(value, str) and value:
            return value
    return None


@functools.cache
def _shared(
    token_endpoint: str, client_id: str, client_secret: str, scope: str | None, ca_file: str | None
) -> OidcTokenSource:
    return OidcTokenSource(token_endpoint, client_id, client_secret, scope, ca_file=ca_file)


def token_source(
    token_endpoint: str,
    client_id: str,
    client_secret: str,
    scope: str | None = None,
    ca_file: str | None = None,
) -> OidcTokenSource:
    """The process's one :class:`OidcTokenSource` for these credentials (every connection of a
    process with the same settings shares its token)."""
    return _shared(token_endpoint, client_id, client_secret, scope or None, ca_file)
