"""What clients need to reach a running local stack."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["S3_REGION", "KafkaClientSecurity", "StackEnv"]

#: The region every S3 client is told to use (clients refuse or call AWS without one).
S3_REGION = "us-east-1"


@dataclass(frozen=True)
class KafkaClientSecurity:
    """How a client reaches a secured local Kafka as the admin user, and the config files that
    say it (librdkafka properties for the admin and for the user without rights, Java client
    properties for the admin)."""

    protocol: str  # SASL_SSL or SSL
    ca_location: Path
    config: Path
    config_noaccess: Path
    java_config: Path
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    certificate_location: Path | None = None
    key_location: Path | None = None

    def as_dict(self) -> dict[str, str]:
        """The ``BERGSTREAM_KAFKA_*`` variables of the secured Kafka (unset fields left out)."""
        out = {
            "BERGSTREAM_KAFKA_CONFIG": str(self.config),
            "BERGSTREAM_KAFKA_CONFIG_NOACCESS": str(self.config_noaccess),
            "BERGSTREAM_KAFKA_JAVA_CONFIG": str(self.java_config),
            "BERGSTREAM_KAFKA_SECURITY_PROTOCOL": self.protocol,
        }
        optional = {
            "BERGSTREAM_KAFKA_SASL_MECHANISM": self.sasl_mechanism,
            "BERGSTREAM_KAFKA_SASL_USERNAME": self.username,
            "BERGSTREAM_KAFKA_SASL_PASSWORD": self.password,
            "BERGSTREAM_KAFKA_SSL_CA_LOCATION": self.ca_location,
            "BERGSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION": self.certificate_location,
            "BERGSTREAM_KAFKA_SSL_KEY_LOCATION": self.key_location,
        }
        out.update({name: str(value) for name, value in optional.items() if value is not None})
        return out


@dataclass(frozen=True)
class StackEnv:
    """Addresses and keys of a running local stack. A field is None when that component is not
    part of the stack (``stack up`` with a subset of components). ``kafka_bootstrap`` lists
    every broker (comma-separated)."""

    home: Path
    kafka_bootstrap: str | None = None
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_region: str = S3_REGION
    redis_url: str | None = None
    schema_registry_url: str | None = None
    #: Set when Kafka runs with ``--security sasl_ssl`` or ``ssl``; None for plaintext.
    kafka_security: KafkaClientSecurity | None = None
    #: ``postgresql://bergstream:PASSWORD@127.0.0.1:PORT/bergstream`` (a superuser).
    postgres_url: str | None = None
    #: The Kafka Connect worker's REST API, ``http://127.0.0.1:PORT``.
    connect_url: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The environment variables (``BERGSTREAM_*``) for this stack, absent components left
        out."""
        out = {"BERGSTREAM_HOME": str(self.home)}
        if self.kafka_bootstrap is not None:
            out["BERGSTREAM_KAFKA_BOOTSTRAP"] = self.kafka_bootstrap
            if self.kafka_security is not None:
                out.update(self.kafka_security.as_dict())
        if self.s3_endpoint is not None:
            out["BERGSTREAM_S3_ENDPOINT"] = self.s3_endpoint
            out["BERGSTREAM_S3_ACCESS_KEY"] = self.s3_access_key or ""
            out["BERGSTREAM_S3_SECRET_KEY"] = self.s3_secret_key or ""
            out["BERGSTREAM_S3_REGION"] = self.s3_region
        if self.redis_url is not None:
            out["BERGSTREAM_REDIS_URL"] = self.redis_url
        if self.schema_registry_url is not None:
            out["BERGSTREAM_SCHEMA_REGISTRY_URL"] = self.schema_registry_url
        if self.postgres_url is not None:
            out["BERGSTREAM_POSTGRES_URL"] = self.postgres_url
        if self.connect_url is not None:
            out["BERGSTREAM_CONNECT_URL"] = self.connect_url
        return out

    def as_exports(self) -> str:
        """Shell lines ``export NAME=VALUE`` (values shell-quoted), one per variable, for
        ``eval "$(bergstream stack env)"``."""
        return "\n".join(
            f"export {name}={shlex.quote(value)}" for name, value in self.as_dict().items()
        )
