"""Principals: who a catalog or S3 request runs as, and which Kafka identity decides for it.

Each entry of the ``isk`` service's ``principals`` maps catalog credentials (an OAuth client for
``POST /v1/oauth/tokens``, and/or an HTTP Basic user) to the Kafka credentials of that principal.
:class:`PrincipalDirectory` authenticates requests (client credentials, Basic, the bearer tokens
it issues, keyed from the root pair of ``http.access_key`` / ``http.secret_key``) and asks its
``readable`` callable which topics a principal may read. That callable is Kafka's answer for the
principal's own credentials (:mod:`..kafka.authorization`); bergstream keeps no list of who may
read what. The S3 credentials LoadTable vends name their principal (:mod:`.credentials`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from bergstream.core.api import KafkaClientSettings, StrictModel

__all__ = [
    "INHERITED_KAFKA_KEYS",
    "IskPrincipalConfig",
    "Principal",
    "PrincipalDirectory",
    "PrincipalRefused",
    "mask_secrets",
    "merge_principal_kafka",
    "principals_errors",
    "secret_free_errors",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,99}")
#: Keys of the service's ``kafka_client`` a principal's connection takes when it does not give
#: them: how to reach the cluster, never who connects (SASL user, client certificate), so no
#: principal ever talks to Kafka as the service.
INHERITED_KAFKA_KEYS = (
    "security.protocol",
    "sasl.mechanism",
    "ssl.ca.location",
    "ssl.endpoint.identification.algorithm",
    # OAUTHBEARER's identity provider and GSSAPI's service: where to log in, not who.
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope",
    "https.ca.location",
    "sasl.kerberos.service.name",
)
_SASL_KEYS = ("sasl.username", "sasl.password")
_TOKEN_PREFIX = "isk1"
#: Keys whose values an error never shows (``config check`` prints the input of an error).
_SECRET_KEYS = frozenset(
    {"client_secret", "password", "secret_key", "sasl.password", "ssl.key.password"}
)
_MASK = "***"
_M = TypeVar("_M")


def mask_secrets(value: Any) -> Any:
    """``value`` with the values of secret keys (at any depth) replaced by ``***``."""
    if isinstance(value, Mapping):
        return {
            k: _MASK if k in _SECRET_KEYS and v is not None else mask_secrets(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_secrets(v) for v in value]
    return value


def secret_free_errors(data: Any, handler: ModelWrapValidatorHandler[Any], title: str) -> Any:
    """``handler(data)``, its validation errors rebuilt with the secrets of their inputs
    masked (for a model's wrap validator: pydantic puts the whole input in model errors)."""
    try:
        return handler(data)
    except ValidationError as error:
        details: list[Any] = [
            {
                "type": PydanticCustomError(item["type"], item["msg"]),
                "loc": item["loc"],
                "input": _MASK
                if item["loc"] and item["loc"][-1] in _SECRET_KEYS
                else mask_secrets(item.get("input")),
            }
            for item in error.errors()
        ]
        raise ValidationError.from_exception_data(title, details) from None


class PrincipalRefused(Exception):
    """Kafka refused the credentials configured for a principal (catalog: 401, S3: 403)."""


class IskPrincipalConfig(StrictModel):
    """One entry of the ``isk`` service's ``principals``: catalog credentials and the Kafka
    identity whose rights decide what the principal sees."""

    name: str = Field(description="the principal's name (logs, key derivation)")
    client_id: str | None = Field(
        None, min_length=1, description="OAuth client id (POST /v1/oauth/tokens)"
    )
    client_secret: SecretStr | None = Field(None, description="OAuth client secret")
    user: str | None = Field(None, min_length=1, description="HTTP Basic user name")
    password: SecretStr | None = Field(None, description="HTTP Basic password")
    kafka_client: KafkaClientSettings = Field(
        description="the principal's Kafka connection: its sasl.username and sasl.password (or "
        "a whole kafka_client block: its OAuth client, its Kerberos principal and keytab); "
        "security.protocol, sasl.mechanism, ssl.ca.location, "
        "ssl.endpoint.identification.algorithm, the OAuth token endpoint, scope and CA and the "
        "Kerberos service name default to the service's"
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"principal name {value!r}: use 1-100 letters, digits, '.', '_', '@' or '-', "
                "starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _credentials(self) -> IskPrincipalConfig:
        if (self.client_id is None) != (self.client_secret is None):
            raise ValueError(
                f"principal {self.name!r}: set both client_id and client_secret, or neither"
            )
        if (self.user is None) != (self.password is None):
            raise ValueError(f"principal {self.name!r}: set both user and password, or neither")
        if self.client_id is None and self.user is None:
            raise ValueError(
                f"principal {self.name!r} has no catalog credential: give client_id and "
                "client_secret (OAuth), or user and password (HTTP Basic)"
            )
        kafka = self.kafka_client
        if not kafka.uses_sasl and kafka.ssl_certificate_location is None:
            raise ValueError(
                f"principal {self.name!r}: its Kafka connection has no identity (security."
                f"protocol {kafka.security_protocol}, no SASL user, no client certificate), so "
                "Kafka could not tell it from anyone else: give sasl.username and sasl.password"
            )
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _secret_free(
        cls, data: Any, handler: ModelWrapValidatorHandler[IskPrincipalConfig]
    ) -> IskPrincipalConfig:
        # Defined last, so it wraps the others.
        return secret_free_errors(data, handler, cls.__name__)


def _explicit(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None and v != ""}


def merge_principal_kafka(entry: Any, service: KafkaClientSettings) -> Any:
    """A raw ``principals[]`` entry with its Kafka settings made whole: the ``sasl.username`` /
    ``sasl.password`` shortcut folded into ``kafka_client``, and the keys of
    :data:`INHERITED_KAFKA_KEYS` it does not give taken from the service's ``service``. A block
    with a ``properties_file`` is a whole connection of its own and inherits nothing (its file
    gives those keys). Anything that is not a mapping is returned as is, for the model to refuse.
    """
    if not isinstance(entry, Mapping):
        return entry
    out = dict(entry)
    block = out.get("kafka_client")
    if block is None:
        block = {}
    elif isinstance(block, KafkaClientSettings):
        block = block.model_dump(by_alias=True, exclude_none=True, exclude_unset=True)
    elif not isinstance(block, Mapping):
        return out
    given = _explicit(block)
    shortcut = {key: out.pop(key) for key in _SASL_KEYS if key in out}
    shortcut = _explicit(shortcut)
    if shortcut:
        clash = [key for key in shortcut if key in given]
        if clash:
            raise ValueError(
                f"{', '.join(clash)} given both in the principal and in its kafka_client: "
                "keep one of them"
            )
        given.update(shortcut)
    if not given:
        raise ValueError(
            f"principal {out.get('name')!r} has no Kafka credentials: give sasl.username and "
            "sasl.password (or a kafka_client block)"
        )
    if "properties_file" not in given:
        dumped = service.model_dump(by_alias=True, exclude_none=True)
        inherited = {key: dumped[key] for key in INHERITED_KAFKA_KEYS if key in dumped}
        given = {**inherited, **given}
    out["kafka_client"] = given
    return out


def _hmac(key: bytes, label: str, value: str) -> bytes:
    return hmac.new(key, f"{label}\0{value}".encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class Principal:
    """A configured principal as requests see it: its name and its Kafka connection settings."""

    name: str
    kafka: KafkaClientSettings = field(repr=False)


class PrincipalDirectory:
    """The configured principals: catalog authentication, bearer tokens, and which topics each
    may read (``readable``: Kafka's answer for the principal's own credentials)."""

    def __init__(
        self,
        principals: list[IskPrincipalConfig],
        *,
        root_access_key: str,
        root_secret: str,
        token_ttl_seconds: int,
        readable: Callable[[Principal], Awaitable[frozenset[str]]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token_ttl_seconds = token_ttl_seconds
        self._readable = readable
        self._clock = clock
        self._token_key = _hmac(root_secret.encode(), "isk-catalog-token-key", root_access_key)
        self._by_name: dict[str, Principal] = {}
        self._clients: dict[str, tuple[bytes, Principal]] = {}
        self._users: dict[str, tuple[bytes, Principal]] = {}
        for entry in principals:
            principal = Principal(entry.name, entry.kafka_client)
            self._by_name[entry.name] = principal
            if entry.client_id is not None and entry.client_secret is not None:
                secret = entry.client_secret.get_secret_value().encode()
                self._clients[entry.client_id] = (secret, principal)
            if entry.user is not None and entry.password is not None:
                self._users[entry.user] = (entry.password.get_secret_value().encode(), principal)

    @property
    def principals(self) -> list[Principal]:
        """Every principal, in configuration order."""
        return list(self._by_name.values())

    def client(self, client_id: str, client_secret: str) -> Principal | None:
        """The principal of OAuth client ``client_id`` if ``client_secret`` is its secret."""
        return _check(self._clients, client_id, client_secret)

    def basic(self, user: str, password: str) -> Principal | None:
        """The principal of HTTP Basic user ``user`` if ``password`` is its password."""
        return _check(self._users, user, password)

    def by_name(self, name: str) -> Principal | None:
        """The principal named ``name``; None if none is configured so."""
        return self._by_name.get(name)

    def issue_token(self, principal: Principal) -> str:
        """A bearer token for ``principal`` valid ``token_ttl_seconds`` from now."""
        expiry = str(int(self._clock()) + self.token_ttl_seconds)
        name = base64.urlsafe_b64encode(principal.name.encode()).decode().rstrip("=")
        return f"{_TOKEN_PREFIX}.{name}.{expiry}.{self._token_mac(principal.name, expiry)}"

    def token_principal(self, token: str) -> Principal | None:
        """The principal a token issued by :meth:`issue_token` names; None if the token is
        malformed, forged, expired, or names a principal no longer configured."""
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != _TOKEN_PREFIX or not parts[2].isdigit():
            return None
        _, encoded, expiry, mac = parts
        try:
            name = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not hmac.compare_digest(mac.encode(), self._token_mac(name, expiry).encode()):
            return None
        if int(expiry) <= self._clock():
            return None
        return self._by_name.get(name)

    def _token_mac(self, name: str, expiry: str) -> str:
        return hmac.new(self._token_key, f"{name}\0{expiry}".encode(), hashlib.sha256).hexdigest()

    async def readable(self, principal: Principal) -> frozenset[str]:
        """The topics ``principal`` may DESCRIBE and READ (Kafka's answer, briefly cached);
        :class:`PrincipalRefused` when Kafka refuses its credentials."""
        return await self._readable(principal)


def _check(
    table: Mapping[str, tuple[bytes, Principal]], name: str, secret: str
) -> Principal | None:
    found = table.get(name)
    # Compared even for an unknown name, so the answer takes as long either way.
    expected, principal = found if found is not None else (b"\0" * 32, None)
    if not hmac.compare_digest(expected, secret.encode()) or principal is None:
        return None
    return principal


def principals_errors(principals: list[IskPrincipalConfig], has_oauth_client: bool) -> list[str]:
    """What makes a list of principals ambiguous: repeated names, OAuth clients or Basic users,
    or the single ``http.client_id`` next to them."""
    problems: list[str] = []
    for what, values in (
        ("name", [p.name for p in principals]),
        ("client_id", [p.client_id for p in principals if p.client_id is not None]),
        ("user", [p.user for p in principals if p.user is not None]),
    ):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            problems.append(
                f"principals: {what} {', '.join(map(repr, repeated))} is given more than once: "
                f"each principal needs its own {what}"
            )
    if principals and has_oauth_client:
        problems.append(
            "http.client_id / http.client_secret cannot be used with principals (whose "
            "identity would its tokens carry?): give that client its own principals entry"
        )
    return problems
