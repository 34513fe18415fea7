"""What clients need to reach a running local stack."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["S3_REGION", "KafkaClientSecurity", "OidcEnv", "StackEnv"]

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
    #: The admin's other login keys (OAUTHBEARER's client, GSSAPI's principal and keytab), by
    #: their KafkaClientSettings names.
    settings: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, str]:
        """The ``BERGSTREAM_KAFKA_*`` variables of the secured Kafka (unset fields left out), as
        ``KafkaClientSettings.from_env`` reads them."""
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
        for key, value in self.settings.items():
            out["BERGSTREAM_KAFKA_" + key.upper().replace(".", "_")] = value
        return out


@dataclass(frozen=True)
class OidcEnv:
    """The stack's OIDC provider (``oidc``, Keycloak): the realm's issuer and endpoints, and the
    client-credentials clients ``admin`` and ``noaccess`` with their secrets."""

    issuer: str
    token_endpoint: str
    jwks_url: str
    client_id: str
    client_secret: str
    noaccess_client_id: str
    noaccess_client_secret: str

    def as_dict(self) -> dict[str, str]:
        """The ``BERGSTREAM_OIDC_*`` variables."""
        return {
            "BERGSTREAM_OIDC_ISSUER": self.issuer,
            "BERGSTREAM_OIDC_TOKEN_ENDPOINT": self.token_endpoint,
            "BERGSTREAM_OIDC_JWKS_URL": self.jwks_url,
            "BERGSTREAM_OIDC_CLIENT_ID": self.client_id,
            "BERGSTREAM_OIDC_CLIENT_SECRET": self.client_secret,
            "BERGSTREAM_OIDC_NOACCESS_CLIENT_ID": self.noaccess_client_id,
            "BERGSTREAM_OIDC_NOACCESS_CLIENT_SECRET": self.noaccess_client_secret,
        }


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
    #: The Kerberos KDC (``kdc``): the clients' ``krb5.conf`` (``KRB5_CONFIG``), the realm, and
    #: the keytab and principal of the users ``admin`` and ``noaccess``.
    krb5_config: Path | None = None
    kerberos_realm: str | None = None
    kerberos_keytab: Path | None = None
    kerberos_principal: str | None = None
    kerberos_noaccess_keytab: Path | None = None
    kerberos_noaccess_principal: str | None = None
    #: The OIDC provider (``oidc``, Keycloak) of Kafka's SASL OAUTHBEARER.
    oidc: OidcEnv | None = None
    #: Iceberg's REST catalog server (``rest-catalog``): its base URL and where it keeps table
    #: files (``s3://rest-catalog/warehouse`` on the stack's S3).
    rest_catalog_url: str | None = None
    rest_catalog_warehouse: str | None = None

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
        if self.rest_catalog_url is not None:
            out["BERGSTREAM_REST_CATALOG_URL"] = self.rest_catalog_url
            out["BERGSTREAM_REST_CATALOG_WAREHOUSE"] = self.rest_catalog_warehouse or ""
        kerberos = {
            "BERGSTREAM_KRB5_CONFIG": self.krb5_config,
            "BERGSTREAM_KERBEROS_REALM": self.kerberos_realm,
            "BERGSTREAM_KERBEROS_KEYTAB": self.kerberos_keytab,
            "BERGSTREAM_KERBEROS_PRINCIPAL": self.kerberos_principal,
            "BERGSTREAM_KERBEROS_NOACCESS_KEYTAB": self.kerberos_noaccess_keytab,
            "BERGSTREAM_KERBEROS_NOACCESS_PRINCIPAL": self.kerberos_noaccess_principal,
        }
        out.update({name: str(value) for name, value in kerberos.items() if value is not None})
        if self.oidc is not None:
            out.update(self.oidc.as_dict())
        login = self.kafka_security.sasl_mechanism if self.kafka_security else None
        if self.krb5_config is not None and login == "GSSAPI":
            # What Kerberos clients read (Java's get it as java.security.krb5.conf from it).
            out["KRB5_CONFIG"] = str(self.krb5_config)
        return out

    def as_exports(self) -> str:
        """Shell lines ``export NAME=VALUE`` (values shell-quoted), one per variable, for
        ``eval "$(bergstream stack env)"``."""
        return "\n".join(
            f"export {name}={shlex.quote(value)}" for name, value in self.as_dict().items()
        )
