"""How bergstream's own Kafka clients connect: one connection-settings model for every client.

:class:`KafkaClientSettings` is written in YAML with the librdkafka / Java client names
(``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ...) and turned into what each
client library takes: :meth:`~KafkaClientSettings.librdkafka` (confluent-kafka),
:meth:`~KafkaClientSettings.java` (Spark's Kafka source, Kafka's tools),
:meth:`~KafkaClientSettings.aiokafka` (aiokafka producers, consumers and admin clients) and
:meth:`~KafkaClientSettings.ssl_context` (raw asyncio connections, with
:mod:`bergstream.core.kafka_sasl` for SASL).

An empty string means "not set", so one block with ``${VAR:-}`` values works against a plaintext
and a secured cluster alike. A ``properties_file`` (librdkafka's ``key=value`` format, as
``bergstream stack env`` exports in ``BERGSTREAM_KAFKA_CONFIG``) supplies the keys not written
explicitly. Secrets are :class:`~pydantic.SecretStr`: ``repr``, ``str``, JSON dumps and
:meth:`~KafkaClientSettings.redacted` never show them.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from bergstream.core.home import bergstream_cache
from bergstream.core.kafka_properties import (
    REFUSED_KEYS,
    ClientFileError,
    PropertiesSyntaxError,
    jaas_credentials,
    parse_properties,
)
from bergstream.core.kafka_stores import key_files, trust_file
from bergstream.core.models import StrictModel
from bergstream.core.oauth_tokens import OidcTokenSource, parse_extensions, token_source

__all__ = [
    "ENV_PREFIX",
    "OAUTH_ALLOWED_URLS",
    "OIDC_LOGIN_HANDLER",
    "PASSWORD_MECHANISMS",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaClientSettings",
    "KafkaSettingsError",
    "librdkafka_speaks",
    "read_properties_file",
]

#: What ``security.protocol`` accepts (any case).
SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: The SASL mechanisms bergstream's clients implement.
SASL_MECHANISMS: tuple[str, ...] = (
    "PLAIN",
    "SCRAM-SHA-256",
    "SCRAM-SHA-512",
    "OAUTHBEARER",
    "GSSAPI",
)
#: The mechanisms that log in with ``sasl.username`` and ``sasl.password``.
PASSWORD_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: Prefix of the variables ``bergstream stack env`` exports (``KafkaClientSettings.from_env``).
ENV_PREFIX = "BERGSTREAM_KAFKA_"

_SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password", "sasl.oauthbearer.client.secret"})
_PATH_KEYS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")
_REDACTED = "***"
# Keys a properties file may hold besides the model's own: librdkafka's plural spelling of
# the mechanism, and the bootstrap (exposed, never a YAML key: the cluster's target has it).
_MECHANISM_ALIAS = "sasl.mechanisms"
_BOOTSTRAP = "bootstrap.servers"
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
    "GSSAPI": "com.sun.security.auth.module.Krb5LoginModule",
}
#: Java's login callback handler fetching OIDC client-credentials tokens (Kafka 3.1+).
OIDC_LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
_OIDC_HANDLERS = (
    OIDC_LOGIN_HANDLER,
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
)
#: Java's name of the URLs a Kafka 4 client may fetch tokens from (a JVM system property).
OAUTH_ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls"


@dataclass(frozen=True)
class _Login:
    """A kind of SASL login: its keys, those it cannot do without, and how messages name it."""

    keys: tuple[str, ...]
    needed: tuple[str, ...]
    how: str


#: The logins by mechanism (``password`` for PLAIN and SCRAM-SHA-256/512).
_LOGINS = {
    "password": _Login(
        ("sasl.username", "sasl.password"),
        ("sasl.username", "sasl.password"),
        "sasl.username and sasl.password",
    ),
    "OAUTHBEARER": _Login(
        (
            "sasl.oauthbearer.method",
            "sasl.oauthbearer.client.id",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.token.endpoint.url",
            "sasl.oauthbearer.scope",
            "sasl.oauthbearer.extensions",
        ),
        (
            "sasl.oauthbearer.client.id",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.token.endpoint.url",
        ),
        "an OAuth client (sasl.oauthbearer.*)",
    ),
    "GSSAPI": _Login(
        ("sasl.kerberos.service.name", "sasl.kerberos.principal", "sasl.kerberos.keytab"),
        (),
        "Kerberos (sasl.kerberos.*)",
    ),
}


class KafkaSettingsError(ValueError):
    """Kafka client settings that cannot work; the message names the key and the fix."""


def read_properties_file(path: Path) -> dict[str, str]:
    """The settings of a client properties file (librdkafka's ``key=value`` lines or Java's
    ``client.properties``, :func:`~bergstream.core.kafka_properties.parse_properties`)."""
    return {key: value for key, (_, value) in _read_lines(path).items()}


def _read_lines(path: Path) -> dict[str, tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KafkaSettingsError(
            f"properties_file {path} does not exist: give the path of a client properties file "
            "(librdkafka's or Java's), or leave properties_file empty"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise KafkaSettingsError(f"properties_file {path} cannot be read: {error}") from None
    try:
        return parse_properties(text)
    except PropertiesSyntaxError as error:
        raise KafkaSettingsError(f"properties_file {path} {error}") from None


#: Java's keys that :func:`_file_settings` turns into the model's own.
_JAVA_TRANSLATED = frozenset(
    {
        "sasl.jaas.config",
        "sasl.login.callback.handler.class",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
    }
)


def _file_settings(path: Path) -> dict[str, str]:
    """The settings of ``path`` under the model's key names: its own keys, Java's JAAS line and
    trust and key stores translated, keys bergstream sets itself refused with the reason;
    every other key is the clients' (:func:`_file_passthrough`)."""
    lines = _read_lines(path)
    where = f"properties_file {path}"
    known = {f.alias for f in KafkaClientSettings.model_fields.values() if f.alias}
    own = sorted(known | {_MECHANISM_ALIAS, _BOOTSTRAP} | _JAVA_TRANSLATED)
    for key, (number, _) in lines.items():
        if key in REFUSED_KEYS:
            raise KafkaSettingsError(
                f"{where} line {number}: {key} cannot be set here: {REFUSED_KEYS[key]}; remove "
                "it from the file"
            )
        if key == "properties_file":
            raise KafkaSettingsError(
                f"{where} line {number}: a properties file cannot name another one; remove "
                "properties_file from the file"
            )
        near = difflib.get_close_matches(key, own, n=1, cutoff=0.9)
        if key not in own and near and not librdkafka_keys(((key, lines[key][1]),)):
            raise KafkaSettingsError(
                f"{where} line {number}: {key} is no key a client knows; did you mean {near[0]}?"
            )
    props = {key: value for key, (_, value) in lines.items()}
    out = {k: v for k, v in props.items() if k in known | {_MECHANISM_ALIAS, _BOOTSTRAP}}
    out.pop("properties_file", None)
    handler = props.get("sasl.login.callback.handler.class")
    if handler not in (None, "", *_OIDC_HANDLERS):
        raise KafkaSettingsError(
            f"{where} line {lines['sasl.login.callback.handler.class'][0]}: "
            f"sasl.login.callback.handler.class {handler} is Java code bergstream's clients "
            "cannot run; OAUTHBEARER logs in with the OIDC client-credentials grant "
            f"({OIDC_LOGIN_HANDLER}): give sasl.oauthbearer.token.endpoint.url and the JAAS "
            "clientId and clientSecret"
        )
    try:
        if "sasl.jaas.config" in props:
            for key, value in jaas_credentials(props["sasl.jaas.config"], where).items():
                out.setdefault(key, value)
        cache = bergstream_cache()
        trust = trust_file(props, where, cache)
        if trust is not None:
            out.setdefault("ssl.ca.location", str(trust))
        keys = key_files(props, where, cache)
    except ClientFileError as error:
        raise KafkaSettingsError(str(error)) from None
    if keys is not None:
        chain, key, password = keys
        out.setdefault("ssl.certificate.location", str(chain))
        out.setdefault("ssl.key.location", str(key))
        if password is not None:
            out["ssl.key.password"] = password
    if out.get("ssl.endpoint.identification.algorithm") == "":
        out["ssl.endpoint.identification.algorithm"] = "none"  # Java's spelling of "no check"
    return _merge_mechanism(out, where)


def _file_passthrough(path: Path) -> dict[str, str]:
    """The keys of ``path`` that are neither the model's nor translated: the clients' own
    settings (``client.id``, timeouts, ...), given to every client that knows them."""
    known = {f.alias for f in KafkaClientSettings.model_fields.values() if f.alias}
    taken = known | {_MECHANISM_ALIAS, _BOOTSTRAP, "ssl.key.password"} | _JAVA_TRANSLATED
    return {k: v for k, v in read_properties_file(path).items() if k not in taken}


def _merge_mechanism(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``sasl.mechanisms`` (librdkafka's spelling) folded into ``sasl.mechanism``."""
    if _MECHANISM_ALIAS not in data:
        return data
    out = dict(data)
    plural = out.pop(_MECHANISM_ALIAS)
    single = out.get("sasl.mechanism")
    if single not in (None, "") and plural not in (None, "") and single != plural:
        raise KafkaSettingsError(
            f"{where}: sasl.mechanism {single!r} and sasl.mechanisms {plural!r} disagree: "
            "keep one of them"
        )
    if single in (None, ""):
        out["sasl.mechanism"] = plural
    return out


def _existing_file(value: Path | None, key: str) -> Path | None:
    if value is not None and not value.is_file():
        kind = "keytab" if key == "sasl.kerberos.keytab" else "PEM file"
        raise ValueError(
            f"{key}: file {value} does not exist: give the path of a readable {kind}, or "
            f"leave {key} empty"
        )
    return value


def _read_pem(path: Path, key: str) -> str:
    try:
        return path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as error:
        raise KafkaSettingsError(f"{key}: cannot read the PEM file {path}: {error}") from None


def _jaas_quote(value: str) -> str:
    # JAAS option values are double-quoted strings with backslash escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _redact_input(loc: tuple[str | int, ...], value: Any) -> Any:
    """An error's input without secrets (config check prints inputs)."""
    if loc and loc[-1] in _SECRET_KEYS:
        return _REDACTED
    if isinstance(value, Mapping):
        return {k: _REDACTED if k in _SECRET_KEYS else v for k, v in value.items()}
    return value


#: The clients' own keys aiokafka has an argument for: key -> (argument, conversion).
AIOKAFKA_ARGUMENTS: dict[str, tuple[str, Any]] = {
    "client.id": ("client_id", str),
    "request.timeout.ms": ("request_timeout_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "connections.max.idle.ms": ("connections_max_idle_ms", int),
}
_CLIENT_SECRET = re.compile(r"(?i)password|secret|token|jaas|private|credential")


def mask_client_secrets(props: Mapping[str, str]) -> dict[str, str]:
    """``props`` for display: a value whose key names a secret as ``***``."""
    return {k: _REDACTED if _CLIENT_SECRET.search(k) else v for k, v in props.items()}


@functools.cache
def librdkafka_keys(props: tuple[tuple[str, str], ...]) -> frozenset[str]:
    """Which keys of ``props`` librdkafka takes, asked of librdkafka itself: a client handle
    made with them and dropped without connecting refuses an unknown property by name (a known
    one with a value it refuses is kept: the client then says what is wrong with it)."""
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError:
        return frozenset()
    remaining = dict(props)
    known: set[str] = set()
    while remaining:
        try:
            Producer({**remaining, "logger": _SILENT})
        except KafkaException as error:
            text = error.args[0].str()
            found = re.search(r'property:? "([^"]+)"', text)
            if found is None or found.group(1) not in remaining:
                return frozenset(known)
            if not text.startswith("No such configuration property"):
                known.add(found.group(1))
            del remaining[found.group(1)]
            continue
        except (ValueError, TypeError):
            return frozenset(known)
        known.update(remaining)
        break
    return frozenset(known)


@functools.cache
def librdkafka_speaks(mechanism: str) -> bool:
    """Whether this process's librdkafka (confluent-kafka's) was built with SASL ``mechanism``
    (the PyPI wheels have no GSSAPI: they are built without libsasl2), asked of librdkafka."""
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError:
        return False
    config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism}
    try:
        Producer({**config, "logger": _SILENT})
    except KafkaException as error:
        return "No provider for SASL mechanism" not in error.args[0].str()
    return True


class _Silent:
    """A logger for probe handles: librdkafka warns about the missing bootstrap."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return self.log


_SILENT = _Silent()


class KafkaClientSettings(StrictModel):
    """How a bergstream client connects to a Kafka cluster, with librdkafka's key names.

    Keys: ``security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, any case),
    ``sasl.mechanism`` (or librdkafka's ``sasl.mechanisms``: PLAIN, SCRAM-SHA-256,
    SCRAM-SHA-512), ``sasl.username``, ``sasl.password``, ``ssl.ca.location``,
    ``ssl.certificate.location`` and ``ssl.key.location`` (a client certificate and its key, for
    mutual TLS), ``ssl.key.password``, ``ssl.endpoint.identification.algorithm`` (``https``
    checks the broker's host name, ``none`` does not) and ``properties_file``. Empty values are
    unset; keys missing here are taken from ``properties_file`` when it has them.
    """

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        alias="security.protocol",
        description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (any case)",
    )
    sasl_mechanism: (
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None
    ) = Field(
        None,
        alias="sasl.mechanism",
        description="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or GSSAPI (also read as "
        "sasl.mechanisms)",
    )
    sasl_username: str | None = Field(None, alias="sasl.username", description="SASL user")
    sasl_password: SecretStr | None = Field(
        None, alias="sasl.password", description="SASL password (never shown)"
    )
    ssl_ca_location: Path | None = Field(
        None,
        alias="ssl.ca.location",
        description="PEM file of the CAs that sign the brokers' certificates; system CAs if unset",
    )
    ssl_certificate_location: Path | None = Field(
        None, alias="ssl.certificate.location", description="client certificate (PEM), mutual TLS"
    )
    ssl_key_location: Path | None = Field(
        None, alias="ssl.key.location", description="private key (PEM) of the client certificate"
    )
    ssl_key_password: SecretStr | None = Field(
        None, alias="ssl.key.password", description="password of an encrypted private key"
    )
    sasl_oauthbearer_method: Literal["oidc"] | None = Field(
        None,
        alias="sasl.oauthbearer.method",
        description="oidc (the default with OAUTHBEARER): tokens from the client-credentials grant",
    )
    sasl_oauthbearer_client_id: str | None = Field(
        None, alias="sasl.oauthbearer.client.id", description="OAUTHBEARER: the OAuth client id"
    )
    sasl_oauthbearer_client_secret: SecretStr | None = Field(
        None,
        alias="sasl.oauthbearer.client.secret",
        description="OAUTHBEARER: the OAuth client secret (never shown)",
    )
    sasl_oauthbearer_token_endpoint_url: str | None = Field(
        None,
        alias="sasl.oauthbearer.token.endpoint.url",
        description="OAUTHBEARER: the identity provider's token endpoint (http or https URL)",
    )
    sasl_oauthbearer_scope: str | None = Field(
        None, alias="sasl.oauthbearer.scope", description="OAUTHBEARER: scopes asked for"
    )
    sasl_oauthbearer_extensions: str | None = Field(
        None,
        alias="sasl.oauthbearer.extensions",
        description="OAUTHBEARER: SASL extensions key=value,key2=value2 (e.g. Confluent "
        "Cloud's logicalCluster and identityPoolId)",
    )
    https_ca_location: Path | None = Field(
        None,
        alias="https.ca.location",
        description="OAUTHBEARER: PEM file of the CAs that sign the token endpoint's "
        "certificate; system CAs if unset",
    )
    sasl_kerberos_service_name: str | None = Field(
        None,
        alias="sasl.kerberos.service.name",
        description="GSSAPI: the brokers' Kerberos service name (kafka if unset)",
    )
    sasl_kerberos_principal: str | None = Field(
        None, alias="sasl.kerberos.principal", description="GSSAPI: the client's principal"
    )
    sasl_kerberos_keytab: Path | None = Field(
        None,
        alias="sasl.kerberos.keytab",
        description="GSSAPI: keytab of sasl.kerberos.principal; the ticket cache (kinit) if unset",
    )
    ssl_endpoint_identification_algorithm: Literal["https", "none"] = Field(
        "https",
        alias="ssl.endpoint.identification.algorithm",
        description="https: check the broker certificate's host name; none: do not",
    )
    properties_file: Path | None = Field(
        None,
        description="librdkafka properties file (key=value) whose settings apply under the "
        "keys given here",
    )

    _bootstrap: str | None = PrivateAttr(None)
    _passthrough: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _merge_file(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        # Empty values (a ${VAR:-} with VAR unset) mean "not set".
        explicit = {k: v for k, v in data.items() if v is not None and v != ""}
        explicit = _merge_mechanism(explicit, "settings")
        source = explicit.get("properties_file")
        if source is None:
            return explicit
        from_file = _file_settings(Path(source))
        from_file.pop(_BOOTSTRAP, None)
        return {**{k: v for k, v in from_file.items() if v != ""}, **explicit}

    @field_validator("security_protocol", mode="before")
    @classmethod
    def _protocol_case(cls, value: Any) -> Any:
        if isinstance(value, str):
            upper = value.strip().upper()
            if upper not in SECURITY_PROTOCOLS:
                raise ValueError(
                    f"unknown security.protocol {value!r}: choose from "
                    f"{', '.join(SECURITY_PROTOCOLS)}"
                )
            return upper
        return value

    @field_validator("sasl_mechanism", mode="before")
    @classmethod
    def _mechanism_case(cls, value: Any) -> Any:
        if isinstance(value, str):
            upper = value.strip().upper()
            if upper not in SASL_MECHANISMS:
                raise ValueError(
                    f"unknown sasl.mechanism {value!r}: choose from {', '.join(SASL_MECHANISMS)}"
                )
            return upper
        return value

    @field_validator("ssl_endpoint_identification_algorithm", mode="before")
    @classmethod
    def _algorithm_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("sasl_oauthbearer_method", mode="before")
    @classmethod
    def _method_case(cls, value: Any) -> Any:
        if isinstance(value, str):
            lower = value.strip().lower()
            if lower == "default":
                raise ValueError(
                    "sasl.oauthbearer.method default makes up unsecured tokens (librdkafka's "
                    "test mode), which bergstream does not: use oidc with "
                    "sasl.oauthbearer.client.id, sasl.oauthbearer.client.secret and "
                    "sasl.oauthbearer.token.endpoint.url"
                )
            return lower
        return value

    @field_validator("sasl_oauthbearer_token_endpoint_url")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parsed = urllib.parse.urlsplit(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"sasl.oauthbearer.token.endpoint.url {value!r} is no http or https URL: give "
                "the identity provider's token endpoint, e.g. "
                "https://idp.example.com/realms/kafka/protocol/openid-connect/token"
            )
        return value

    @field_validator("sasl_oauthbearer_extensions")
    @classmethod
    def _extensions(cls, value: str | None) -> str | None:
        parse_extensions(value)
        return value

    @field_validator(
        "ssl_ca_location",
        "ssl_certificate_location",
        "ssl_key_location",
        "https_ca_location",
        "sasl_kerberos_keytab",
    )
    @classmethod
    def _file_exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return _existing_file(value, cls.model_fields[info.field_name].alias or info.field_name)

    @field_validator("properties_file")
    @classmethod
    def _properties_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file {value} does not exist: give a librdkafka properties file")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> KafkaClientSettings:
        protocol = self.security_protocol
        sasl = protocol.startswith("SASL_")
        tls = protocol.endswith("SSL")
        if sasl:
            self._check_sasl(protocol, tls)
        else:
            given = [key for key in self._sasl_keys_given() if key != "https.ca.location"]
            if given:
                raise ValueError(
                    f"{', '.join(given)} set but security.protocol is {protocol}, which does no "
                    f"SASL: choose security.protocol {'SASL_SSL' if tls else 'SASL_PLAINTEXT'}, "
                    "or leave the sasl.* keys empty"
                )
        if not tls:
            given = [
                key
                for key, value in (
                    ("ssl.ca.location", self.ssl_ca_location),
                    ("ssl.certificate.location", self.ssl_certificate_location),
                    ("ssl.key.location", self.ssl_key_location),
                    ("ssl.key.password", self.ssl_key_password),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)} set but security.protocol is {protocol}, which does no "
                    f"TLS: choose security.protocol {'SASL_SSL' if sasl else 'SSL'}, or leave "
                    "the ssl.* keys empty"
                )
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            present, absent = (
                ("ssl.certificate.location", "ssl.key.location")
                if self.ssl_key_location is None
                else ("ssl.key.location", "ssl.certificate.location")
            )
            raise ValueError(
                f"{present} is set but {absent} is not: a client certificate needs its key "
                "(set both, or neither)"
            )
        if self.ssl_key_password is not None and self.ssl_key_location is None:
            raise ValueError(
                "ssl.key.password is set but ssl.key.location is not: set the key's file too"
            )
        return self

    def _sasl_keys_given(self) -> list[str]:
        """The SASL keys that are set, by their key names."""
        names = ["sasl.mechanism", *(k for login in _LOGINS.values() for k in login.keys)]
        names.append("https.ca.location")
        fields = {info.alias: name for name, info in type(self).model_fields.items()}
        return [key for key in names if getattr(self, fields[key]) is not None]

    def _check_sasl(self, protocol: str, tls: bool) -> None:
        mechanism = self.sasl_mechanism
        given = set(self._sasl_keys_given())
        if mechanism is None:
            raise ValueError(
                f"security.protocol {protocol} needs sasl.mechanism: set it (one of "
                f"{', '.join(SASL_MECHANISMS)}), or choose security.protocol "
                f"{'SSL' if tls else 'PLAINTEXT'} for a listener without SASL"
            )
        login = _LOGINS["password" if mechanism in PASSWORD_MECHANISMS else mechanism]
        missing = [key for key in login.needed if key not in given]
        if missing:
            raise ValueError(
                f"sasl.mechanism {mechanism} needs {', '.join(missing)}: set "
                f"{'it' if len(missing) == 1 else 'them'}"
            )
        # https.ca.location is librdkafka's for any HTTPS it does: never out of place.
        foreign = sorted(given - {"sasl.mechanism", "https.ca.location", *login.keys})
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)} set but sasl.mechanism {mechanism} logs in with "
                f"{login.how}: leave {'it' if len(foreign) == 1 else 'them'} empty, or choose "
                "the mechanism they belong to"
            )
        if mechanism == "GSSAPI" and self.sasl_kerberos_keytab and not self.sasl_kerberos_principal:
            raise ValueError(
                "sasl.kerberos.keytab is set but sasl.kerberos.principal is not: name the "
                "principal whose keys the keytab holds (e.g. kafka-client@EXAMPLE.COM)"
            )

    @model_validator(mode="wrap")
    @classmethod
    def _secret_free_errors(
        cls, data: Any, handler: ModelWrapValidatorHandler[KafkaClientSettings]
    ) -> KafkaClientSettings:
        # Defined last, so it wraps every other validator. pydantic puts the input in every
        # error, and a model-level error's input is the whole block: rebuild the errors with
        # the passwords masked.
        try:
            return handler(data)
        except ValidationError as error:
            details: list[Any] = [
                {
                    "type": PydanticCustomError(item["type"], item["msg"]),
                    "loc": item["loc"],
                    # An unknown key may be a misspelt password: its value is not shown.
                    "input": _REDACTED
                    if item["type"] == "extra_forbidden"
                    else _redact_input(item["loc"], item.get("input")),
                }
                for item in error.errors()
            ]
            raise ValidationError.from_exception_data(error.title, details) from None

    def model_post_init(self, context: Any, /) -> None:
        """Keep the properties file's ``bootstrap.servers`` (see :attr:`bootstrap`) and the
        clients' own keys (see :attr:`client_properties`)."""
        if self.properties_file is not None:
            self._bootstrap = read_properties_file(self.properties_file).get(_BOOTSTRAP) or None
            self._passthrough = _file_passthrough(self.properties_file)

    # ----------------------------------------------------------------------------- reading

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, prefix: str = ENV_PREFIX
    ) -> KafkaClientSettings:
        """Settings from ``<prefix>SECURITY_PROTOCOL``, ``<prefix>SASL_MECHANISM``,
        ``_SASL_USERNAME``, ``_SASL_PASSWORD``, ``_SSL_CA_LOCATION``,
        ``_SSL_CERTIFICATE_LOCATION``, ``_SSL_KEY_LOCATION`` and ``_SSL_KEY_PASSWORD`` (what
        ``bergstream stack env`` exports); PLAINTEXT when none is set."""
        source = os.environ if env is None else env
        data = {
            alias: source.get(prefix + alias.upper().replace(".", "_"), "")
            for alias in (f.alias for f in cls.model_fields.values())
            if alias and alias != "properties_file"
        }
        return cls.model_validate(data)

    @property
    def client_properties(self) -> dict[str, str]:
        """The properties file's keys that are the clients' own (``client.id``, timeouts, ...):
        :meth:`librdkafka` gives those librdkafka knows, :meth:`java` all of them (Java's clients
        ignore a key they do not know), :meth:`aiokafka` those it has an argument for."""
        return dict(self._passthrough)

    @property
    def bootstrap(self) -> str | None:
        """``bootstrap.servers`` of the properties file, if it has one."""
        return self._bootstrap

    @property
    def kerberos_service_name(self) -> str:
        """The brokers' Kerberos service name (``sasl.kerberos.service.name``, kafka if unset)."""
        return self.sasl_kerberos_service_name or "kafka"

    @property
    def principal(self) -> str | None:
        """Who these settings log in as, for messages: the SASL user, the OAuth client id or the
        Kerberos principal (None without SASL, or for GSSAPI from the ticket cache)."""
        if self.sasl_mechanism == "OAUTHBEARER":
            return self.sasl_oauthbearer_client_id
        if self.sasl_mechanism == "GSSAPI":
            return self.sasl_kerberos_principal
        return self.sasl_username

    def oauth_token_source(self) -> OidcTokenSource:
        """The process's shared token source of these OAUTHBEARER settings
        (:func:`~bergstream.core.oauth_tokens.token_source`)."""
        if (
            self.sasl_oauthbearer_token_endpoint_url is None
            or self.sasl_oauthbearer_client_id is None
            or self.sasl_oauthbearer_client_secret is None
        ):
            raise KafkaSettingsError(
                "OAUTHBEARER needs sasl.oauthbearer.client.id, sasl.oauthbearer.client.secret and "
                "sasl.oauthbearer.token.endpoint.url"
            )
        return token_source(
            self.sasl_oauthbearer_token_endpoint_url,
            self.sasl_oauthbearer_client_id,
            self.sasl_oauthbearer_client_secret.get_secret_value(),
            self.sasl_oauthbearer_scope,
            str(self.https_ca_location) if self.https_ca_location else None,
        )

    def java_system_properties(self) -> dict[str, str]:
        """JVM system properties a Java client of these settings needs besides its client
        properties: the token endpoint among Kafka 4's allowed OAuth URLs, and Kerberos's
        ``java.security.krb5.conf`` from ``$KRB5_CONFIG`` (Java does not read that variable)."""
        out: dict[str, str] = {}
        if self.sasl_mechanism == "OAUTHBEARER" and self.sasl_oauthbearer_token_endpoint_url:
            out[OAUTH_ALLOWED_URLS] = self.sasl_oauthbearer_token_endpoint_url
        if self.sasl_mechanism == "GSSAPI" and os.environ.get("KRB5_CONFIG"):
            out["java.security.krb5.conf"] = os.environ["KRB5_CONFIG"]
        return out

    def _oauth_values(self) -> dict[str, str]:
        """The OAUTHBEARER keys that are set, by name (secret included)."""
        out: dict[str, str] = {}
        for key in (*_LOGINS["OAUTHBEARER"].keys, "https.ca.location"):
            if key == "sasl.oauthbearer.method":
                continue  # always oidc: the caller writes it
            name = key.replace(".", "_")
            value = getattr(self, name)
            if value is None:
                continue
            out[key] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        return out

    def _java_login(self) -> dict[str, str]:
        """``sasl.jaas.config`` (and what goes with it) for Java's client."""
        mechanism = self.sasl_mechanism
        assert mechanism is not None
        module = _JAAS_MODULES[mechanism]
        if mechanism in PASSWORD_MECHANISMS:
            assert self.sasl_username is not None and self.sasl_password is not None
            return {
                "sasl.jaas.config": f"{module} required "
                f"username={_jaas_quote(self.sasl_username)} "
                f"password={_jaas_quote(self.sasl_password.get_secret_value())};"
            }
        if mechanism == "OAUTHBEARER":
            assert self.sasl_oauthbearer_client_id and self.sasl_oauthbearer_client_secret
            assert self.sasl_oauthbearer_token_endpoint_url is not None
            options = [
                f"clientId={_jaas_quote(self.sasl_oauthbearer_client_id)}",
                f"clientSecret={_jaas_quote(self.sasl_oauthbearer_client_secret.get_secret_value())}",
            ]
            if self.sasl_oauthbearer_scope:
                options.append(f"scope={_jaas_quote(self.sasl_oauthbearer_scope)}")
            for key, value in parse_extensions(self.sasl_oauthbearer_extensions).items():
                options.append(f"ext_{key}={_jaas_quote(value)}")
            return {
                "sasl.login.callback.handler.class": OIDC_LOGIN_HANDLER,
                "sasl.oauthbearer.token.endpoint.url": self.sasl_oauthbearer_token_endpoint_url,
                "sasl.jaas.config": f"{module} required {' '.join(options)};",
            }
        if self.sasl_kerberos_keytab is not None:
            assert self.sasl_kerberos_principal is not None
            keytab = _jaas_quote(str(self.sasl_kerberos_keytab))
            login = (
                f"useKeyTab=true storeKey=true keyTab={keytab} "
                f"principal={_jaas_quote(self.sasl_kerberos_principal)}"
            )
        else:
            login = "useTicketCache=true"
            if self.sasl_kerberos_principal is not None:
                login += f" principal={_jaas_quote(self.sasl_kerberos_principal)}"
        return {
            "sasl.kerberos.service.name": self.kerberos_service_name,
            "sasl.jaas.config": f"{module} required {login};",
        }

    @property
    def uses_tls(self) -> bool:
        """True for SSL and SASL_SSL."""
        return self.security_protocol.endswith("SSL")

    @property
    def uses_sasl(self) -> bool:
        """True for SASL_PLAINTEXT and SASL_SSL."""
        return self.security_protocol.startswith("SASL_")

    # ----------------------------------------------------------------------------- clients

    def librdkafka(self) -> dict[str, str]:
        """A confluent-kafka / librdkafka config (secrets included): the keys that are set, plus
        ``bootstrap.servers`` when the properties file has it."""
        out: dict[str, str] = {}
        if self._bootstrap is not None:
            out[_BOOTSTRAP] = self._bootstrap
        out["security.protocol"] = self.security_protocol
        if self.sasl_mechanism is not None:
            out["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            out["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            out["sasl.password"] = self.sasl_password.get_secret_value()
        if self.sasl_mechanism == "OAUTHBEARER":
            out["sasl.oauthbearer.method"] = "oidc"
            out.update(self._oauth_values())
        if self.sasl_mechanism == "GSSAPI":
            out["sasl.kerberos.service.name"] = self.kerberos_service_name
            if self.sasl_kerberos_principal is not None:
                out["sasl.kerberos.principal"] = self.sasl_kerberos_principal
            if self.sasl_kerberos_keytab is not None:
                out["sasl.kerberos.keytab"] = str(self.sasl_kerberos_keytab)
        for key in _PATH_KEYS:
            path = getattr(self, key.replace(".", "_"))
            if path is not None:
                out[key] = str(path)
        if self.ssl_key_password is not None:
            out["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        if self.uses_tls:
            out["ssl.endpoint.identification.algorithm"] = (
                self.ssl_endpoint_identification_algorithm
            )
        known = librdkafka_keys(tuple(sorted(self._passthrough.items())))
        out.update({k: v for k, v in self._passthrough.items() if k in known})
        return out

    def java(self) -> dict[str, str]:
        """Java client properties (Spark's Kafka source with a ``kafka.`` prefix, Kafka's tools):
        ``sasl.jaas.config`` with the mechanism's login module, PEM trust store by location, the
        client certificate and key inline as a PEM key store (secrets included)."""
        out: dict[str, str] = {}
        if self._bootstrap is not None:
            out[_BOOTSTRAP] = self._bootstrap
        out["security.protocol"] = self.security_protocol
        if self.uses_sasl:
            assert self.sasl_mechanism is not None
            out["sasl.mechanism"] = self.sasl_mechanism
            out.update(self._java_login())
        if self.uses_tls:
            if self.ssl_ca_location is not None:
                out["ssl.truststore.type"] = "PEM"
                out["ssl.truststore.location"] = str(self.ssl_ca_location)
            if self.ssl_certificate_location is not None and self.ssl_key_location is not None:
                out["ssl.keystore.type"] = "PEM"
                out["ssl.keystore.certificate.chain"] = _read_pem(
                    self.ssl_certificate_location, "ssl.certificate.location"
                )
                out["ssl.keystore.key"] = _read_pem(self.ssl_key_location, "ssl.key.location")
                if self.ssl_key_password is not None:
                    out["ssl.key.password"] = self.ssl_key_password.get_secret_value()
            # Java spells "no host name check" as the empty algorithm.
            out["ssl.endpoint.identification.algorithm"] = (
                "" if self.ssl_endpoint_identification_algorithm == "none" else "https"
            )
        out.update(self._passthrough)
        return out

    def java_properties_text(self) -> str:
        """:meth:`java` as a Java properties file (Kafka's tools: ``--command-config``), the
        inline PEM text with its line breaks escaped; it holds secrets: write it owner-only."""
        lines = ["# Kafka Java client settings written by bergstream."]
        for key, value in self.java().items():
            escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
            lines.append(f"{key}={escaped}")
        return "\n".join(lines) + "\n"

    def aiokafka(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka's ``AIOKafkaProducer``, ``AIOKafkaConsumer`` and
        ``AIOKafkaAdminClient`` (secrets included; the bootstrap is the caller's)."""
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_tls:
            out["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            out["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                from bergstream.core.kafka_oauth import AiokafkaTokenProvider

                out["sasl_oauth_token_provider"] = AiokafkaTokenProvider(
                    self.oauth_token_source(), parse_extensions(self.sasl_oauthbearer_extensions)
                )
            elif self.sasl_mechanism == "GSSAPI":
                from bergstream.core.kafka_kerberos import prepare_process_credentials

                prepare_process_credentials(self)
                out["sasl_kerberos_service_name"] = self.kerberos_service_name
            else:
                assert self.sasl_password is not None
                out["sasl_plain_username"] = self.sasl_username
                out["sasl_plain_password"] = self.sasl_password.get_secret_value()
        for key, value in self._passthrough.items():
            if key in AIOKAFKA_ARGUMENTS:
                name, convert = AIOKAFKA_ARGUMENTS[key]
                out[name] = convert(value)
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context (broker certificates checked against ``ssl.ca.location``, or the
        system CAs; the client certificate presented when set), or None without TLS."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH,
                cafile=str(self.ssl_ca_location) if self.ssl_ca_location else None,
            )
        except (ssl.SSLError, OSError) as error:
            raise KafkaSettingsError(
                f"ssl.ca.location: cannot load CA certificates from {self.ssl_ca_location}: {error}"
            ) from None
        if self.ssl_certificate_location is not None:
            password = self.ssl_key_password.get_secret_value() if self.ssl_key_password else None
            try:
                context.load_cert_chain(
                    self.ssl_certificate_location, self.ssl_key_location, password=password
                )
            except (ssl.SSLError, OSError) as error:
                raise KafkaSettingsError(
                    f"ssl.certificate.location / ssl.key.location: cannot load the client "
                    f"certificate {self.ssl_certificate_location} with the key "
                    f"{self.ssl_key_location}: {error} (a wrong ssl.key.password?)"
                ) from None
        context.check_hostname = self.ssl_endpoint_identification_algorithm == "https"
        return context

    # ----------------------------------------------------------------------------- display

    def redacted(self) -> dict[str, str]:
        """The settings that are set, by key, for display: secrets as ``***``, paths as text."""
        out: dict[str, str] = {"security.protocol": self.security_protocol}
        for name, info in type(self).model_fields.items():
            key = info.alias or name
            value = getattr(self, name)
            if key == "security.protocol" or value is None:
                continue
            if key == "ssl.endpoint.identification.algorithm" and not self.uses_tls:
                continue
            out[key] = _REDACTED if key in _SECRET_KEYS else str(value)
        if self._bootstrap is not None:
            out[_BOOTSTRAP] = self._bootstrap
        out.update(mask_client_secrets(self._passthrough))
        return out

    def __repr__(self) -> str:
        return f"KafkaClientSettings({self.redacted()!r})"

    def __str__(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.redacted().items())
