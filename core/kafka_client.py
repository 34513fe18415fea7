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
from collections.abc import Mapping
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

__all__ = [
    "ENV_PREFIX",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaClientSettings",
    "KafkaSettingsError",
    "read_properties_file",
]

#: What ``security.protocol`` accepts (any case).
SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: The SASL mechanisms bergstream's clients implement.
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: Mechanisms Kafka has that bergstream does not implement (a clear error, not a silent skip).
_UNSUPPORTED_MECHANISMS = ("GSSAPI", "OAUTHBEARER")
#: Prefix of the variables ``bergstream stack env`` exports (``KafkaClientSettings.from_env``).
ENV_PREFIX = "BERGSTREAM_KAFKA_"

_SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password"})
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
        raise ValueError(
            f"{key}: file {value} does not exist: give the path of a readable PEM file, or "
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
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None,
        alias="sasl.mechanism",
        description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (also read as sasl.mechanisms)",
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
            if upper in _UNSUPPORTED_MECHANISMS:
                raise ValueError(
                    f"sasl.mechanism {upper} is not supported by bergstream: use "
                    f"{', '.join(SASL_MECHANISMS)}"
                )
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

    @field_validator("ssl_ca_location", "ssl_certificate_location", "ssl_key_location")
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
            missing = [
                key
                for key, value in (
                    ("sasl.mechanism", self.sasl_mechanism),
                    ("sasl.username", self.sasl_username),
                    ("sasl.password", self.sasl_password),
                )
                if value is None
            ]
            if missing:
                raise ValueError(
                    f"security.protocol {protocol} needs {', '.join(missing)}: set "
                    f"{'it' if len(missing) == 1 else 'them'}, or choose security.protocol "
                    f"{'SSL' if tls else 'PLAINTEXT'} for a listener without SASL"
                )
        else:
            given = [
                key
                for key, value in (
                    ("sasl.mechanism", self.sasl_mechanism),
                    ("sasl.username", self.sasl_username),
                    ("sasl.password", self.sasl_password),
                )
                if value is not None
            ]
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
            assert self.sasl_mechanism and self.sasl_username and self.sasl_password
            out["sasl.mechanism"] = self.sasl_mechanism
            out["sasl.jaas.config"] = (
                f"{_JAAS_MODULES[self.sasl_mechanism]} required "
                f"username={_jaas_quote(self.sasl_username)} "
                f"password={_jaas_quote(self.sasl_password.get_secret_value())};"
            )
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
            assert self.sasl_password is not None
            out["sasl_mechanism"] = self.sasl_mechanism
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
