"""TLS and users for a secured local Kafka: a CA, certificates, passwords and client configs.

Everything lives in ``<home>/security`` and is made once per stack home, then reused:

- ``ca.pem`` (the CA certificate, what clients trust) and ``ca-key.pem``;
- ``broker.pem``: every broker's key and certificate chain (CN=broker, SAN 127.0.0.1 and
  localhost), Kafka's PEM key store; brokers also present it to each other (mutual TLS), so their
  principal is ``User:broker``;
- ``<user>.pem``, ``<user>-key.pem`` and ``<user>-keystore.pem`` for the users ``admin`` and
  ``noaccess`` (client certificates, CN=<user>, for the ``ssl`` mode);
- ``passwords.json``: the users' random SASL passwords;
- the client properties files written by ``write_client_files``.

Files holding a private key or a password are readable by the owner only (0600).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bergstream.core.api import KafkaClientSettings

from .env import KafkaClientSecurity

__all__ = [
    "ADMIN_USER",
    "BROKER_PRINCIPAL",
    "NOACCESS_USER",
    "SECURITY_MODES",
    "USERS",
    "KerberosService",
    "Login",
    "Logins",
    "OAuthValidation",
    "SecurityFiles",
    "broker_java_options",
    "check_mode",
    "client_listener",
    "client_properties",
    "client_security",
    "ensure_security_files",
    "java_client_properties",
    "java_client_settings",
    "load_security_files",
    "scram_format_args",
    "scram_login",
    "server_security_properties",
    "write_client_files",
]

#: What ``stack up --security`` accepts.
SECURITY_MODES: tuple[str, ...] = ("plaintext", "sasl_ssl", "ssl")
#: The super user clients authenticate as.
ADMIN_USER = "admin"
#: A user that authenticates but has no ACL, so every resource is refused to it.
NOACCESS_USER = "noaccess"
#: The brokers' own principal (CN of their certificate), a super user.
BROKER_PRINCIPAL = "broker"
#: Every user the stack creates.
USERS: tuple[str, ...] = (ADMIN_USER, NOACCESS_USER)

SCRAM_MECHANISM = "SCRAM-SHA-512"
_VALID_DAYS = 3650
# The certificates carry only a CN: this rule maps "CN=admin" to the principal "admin".
_PRINCIPAL_RULES = "RULE:^CN=([^,]+)(,.*)?$/$1/,DEFAULT"
_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class SecurityFiles:
    """The TLS material and passwords of one stack home (see the module docstring)."""

    directory: Path
    passwords: Mapping[str, str]

    @property
    def ca_cert(self) -> Path:
        """The CA certificate (PEM): the trust store of brokers and clients."""
        return self.directory / "ca.pem"

    @property
    def broker_keystore(self) -> Path:
        """The brokers' private key, certificate and CA certificate in one PEM file."""
        return self.directory / "broker.pem"

    def user_cert(self, user: str) -> Path:
        """A user's client certificate (PEM)."""
        return self.directory / f"{user}.pem"

    def user_key(self, user: str) -> Path:
        """A user's private key (PKCS#8 PEM, unencrypted)."""
        return self.directory / f"{user}-key.pem"

    def user_keystore(self, user: str) -> Path:
        """A user's key, certificate and CA certificate in one PEM file (Java's PEM key store)."""
        return self.directory / f"{user}-keystore.pem"

    def client_config(self, user: str, mechanism: str | None = None) -> Path:
        """The librdkafka properties file of ``user`` (``kcat -F``, confluent-kafka): the
        stack's default login, or ``mechanism``'s (``oauthbearer``, ``gssapi``...)."""
        suffix = f"-{mechanism}" if mechanism else ""
        return self.directory / f"kafka-{user}{suffix}.properties"

    def java_config(self, user: str, mechanism: str | None = None) -> Path:
        """The Java client properties file of ``user`` (Kafka's tools: ``--command-config``)."""
        suffix = f"-{mechanism}" if mechanism else ""
        return self.directory / f"kafka-{user}{suffix}-java.properties"


def check_mode(security: str) -> str:
    """``security`` if it is one of SECURITY_MODES, else a ValueError naming them."""
    if security not in SECURITY_MODES:
        raise ValueError(
            f"unknown Kafka security {security!r}: choose from {', '.join(SECURITY_MODES)}"
        )
    return security


# --------------------------------------------------------------------------------------------
# Certificates and passwords


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by the owner only (atomically, never world-readable)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8: the form Kafka's PEM key store reads.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _make_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("bergstream local stack CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_leaf(
    common_name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    server: bool,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate signed by the CA: client auth, plus server auth and the 127.0.0.1 /
    localhost SANs when ``server``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _complete(files: SecurityFiles) -> bool:
    needed = [files.ca_cert, files.directory / "ca-key.pem", files.broker_keystore]
    for user in USERS:
        needed += [files.user_cert(user), files.user_key(user), files.user_keystore(user)]
    return all(path.is_file() for path in needed)


def _generate(files: SecurityFiles) -> None:
    ca_key, ca_cert = _make_ca()
    ca_pem = _pem_cert(ca_cert)
    _write_private(files.directory / "ca-key.pem", _pem_key(ca_key))
    key, cert = _make_leaf(BROKER_PRINCIPAL, ca_key, ca_cert, server=True)
    _write_private(files.broker_keystore, _pem_key(key) + _pem_cert(cert) + ca_pem)
    for user in USERS:
        key, cert = _make_leaf(user, ca_key, ca_cert, server=False)
        _write_private(files.user_key(user), _pem_key(key))
        _write_public(files.user_cert(user), _pem_cert(cert))
        _write_private(files.user_keystore(user), _pem_key(key) + _pem_cert(cert) + ca_pem)
    # Last: its presence with the others marks a complete set.
    _write_public(files.ca_cert, ca_pem)


def _load_passwords(path: Path) -> dict[str, str]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}
    passwords = {user: raw[user] for user in USERS if isinstance(raw.get(user), str)}
    if len(passwords) < len(USERS):
        for user in USERS:
            # Hex only: safe inside JAAS quotes and kafka-storage's --add-scram syntax.
            passwords.setdefault(user, secrets.token_hex(16))
        _write_private(path, (json.dumps(passwords, indent=2) + "\n").encode())
    return passwords


def ensure_security_files(home: Path) -> SecurityFiles:
    """The CA, certificates and passwords of the stack in ``home`` (made on first use, then
    reused), under ``home/security``."""
    directory = home / "security"
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    files = SecurityFiles(directory, _load_passwords(directory / "passwords.json"))
    if not _complete(files):
        _generate(files)
    return files


# --------------------------------------------------------------------------------------------
# Broker side


def client_listener(security: str) -> str:
    """The name (and security protocol) of the listener clients use."""
    return {"plaintext": "PLAINTEXT", "sasl_ssl": "SASL_SSL", "ssl": "SSL"}[check_mode(security)]


@dataclass(frozen=True)
class OAuthValidation:
    """How brokers check OAUTHBEARER tokens (Kafka's ``OAuthBearerValidatorCallbackHandler``):
    the identity provider's signing keys, the issuer and audience tokens must name, and the
    claim that holds the principal's name."""

    jwks_url: str
    issuer: str
    audience: str
    principal_claim: str


@dataclass(frozen=True)
class KerberosService:
    """The brokers' Kerberos identity: their service principal, its keytab and ``krb5.conf``."""

    principal: str
    keytab: Path
    krb5_conf: Path


def server_security_properties(
    files: SecurityFiles,
    security: str,
    *,
    oauth: OAuthValidation | None = None,
    kerberos: KerberosService | None = None,
) -> dict[str, str]:
    """The broker settings for a secured stack (``sasl_ssl`` or ``ssl``): PEM key and trust
    stores, mutual TLS on the ``INTERNAL`` and ``CONTROLLER`` listeners, SASL (SCRAM-SHA-512 and
    PLAIN, plus OAUTHBEARER with ``oauth`` and GSSAPI with ``kerberos``) or mutual TLS on the
    client listener, and the standard authorizer denying what no ACL allows. Listeners
    themselves are set by ``kafka_broker.server_properties``."""
    listener = client_listener(security).lower()
    props = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_cert),
        "ssl.principal.mapping.rules": _PRINCIPAL_RULES,
        "listener.name.internal.ssl.client.auth": "required",
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": _AUTHORIZER,
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN_USER};User:{BROKER_PRINCIPAL}",
    }
    if security == "sasl_ssl":
        plain_users = " ".join(f'user_{user}="{files.passwords[user]}"' for user in USERS)
        props.update(
            {
                "sasl.enabled.mechanisms": f"{SCRAM_MECHANISM},PLAIN",
                f"listener.name.{listener}.scram-sha-512.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                f"listener.name.{listener}.plain.sasl.jaas.config": (
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f"{plain_users};"
                ),
            }
        )
        mechanisms = [SCRAM_MECHANISM, "PLAIN"]
        if oauth is not None:
            mechanisms.append("OAUTHBEARER")
            props.update(_oauth_properties(listener, oauth))
        if kerberos is not None:
            mechanisms.append("GSSAPI")
            props.update(_kerberos_properties(listener, kerberos))
        props["sasl.enabled.mechanisms"] = ",".join(mechanisms)
    else:
        props[f"listener.name.{listener}.ssl.client.auth"] = "required"
    return props


def _oauth_properties(listener: str, oauth: OAuthValidation) -> dict[str, str]:
    prefix = f"listener.name.{listener}.oauthbearer"
    return {
        f"{prefix}.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        ),
        f"{prefix}.sasl.server.callback.handler.class": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
        ),
        "sasl.oauthbearer.jwks.endpoint.url": oauth.jwks_url,
        "sasl.oauthbearer.expected.issuer": oauth.issuer,
        "sasl.oauthbearer.expected.audience": oauth.audience,
        "sasl.oauthbearer.sub.claim.name": oauth.principal_claim,
    }


def _kerberos_properties(listener: str, kerberos: KerberosService) -> dict[str, str]:
    keytab = str(kerberos.keytab).replace("\\", "\\\\").replace('"', '\\"')
    return {
        "sasl.kerberos.service.name": kerberos.principal.split("/", 1)[0],
        f"listener.name.{listener}.gssapi.sasl.jaas.config": (
            "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
            f'storeKey=true keyTab="{keytab}" principal="{kerberos.principal}";'
        ),
    }


def broker_java_options(
    oauth: OAuthValidation | None, kerberos: KerberosService | None
) -> list[str]:
    """The JVM flags a broker needs for ``oauth`` (Kafka 4 fetches keys only from allowed URLs)
    and ``kerberos`` (Java reads ``krb5.conf`` from a system property, not ``$KRB5_CONFIG``)."""
    flags: list[str] = []
    if oauth is not None:
        flags.append(f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={oauth.jwks_url}")
    if kerberos is not None:
        flags.append(f"-Djava.security.krb5.conf={kerberos.krb5_conf}")
    return flags


def scram_format_args(files: SecurityFiles) -> list[str]:
    """``kafka-storage format`` arguments creating the SCRAM-SHA-512 users (KIP-900)."""
    args: list[str] = []
    for user in USERS:
        args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={files.passwords[user]}]"]
    return args


# --------------------------------------------------------------------------------------------
# Client side


#: A user's login with one SASL mechanism: KafkaClientSettings keys (librdkafka's names).
Login = Mapping[str, str]
#: Every mechanism's logins by user, the first mechanism the stack's default.
Logins = Mapping[str, Mapping[str, Login]]


def scram_login(files: SecurityFiles, user: str) -> dict[str, str]:
    """``user``'s SCRAM-SHA-512 login (the stack's default mechanism)."""
    return {
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": user,
        "sasl.password": files.passwords[user],
    }


def client_properties(
    files: SecurityFiles,
    security: str,
    user: str,
    bootstrap: str,
    login: Login | None = None,
) -> str:
    """A librdkafka properties file for ``user`` (as ``kcat -F`` reads it; confluent-kafka takes
    the same keys as a dict), logging in with ``login`` (SCRAM-SHA-512 if None)."""
    props = {"bootstrap.servers": bootstrap, "security.protocol": client_listener(security)}
    if security == "sasl_ssl":
        own = dict(login or scram_login(files, user))
        # librdkafka's (and kcat's) plural spelling.
        props["sasl.mechanisms"] = own.pop("sasl.mechanism")
        props.update(own)
        props["ssl.ca.location"] = str(files.ca_cert)
    else:
        props.update(
            {
                "ssl.ca.location": str(files.ca_cert),
                "ssl.certificate.location": str(files.user_cert(user)),
                "ssl.key.location": str(files.user_key(user)),
            }
        )
    return _properties_text(props, f"librdkafka client config of the user {user!r}")


def java_client_properties(
    files: SecurityFiles, security: str, user: str, bootstrap: str, login: Login | None = None
) -> str:
    """A Java client properties file for ``user`` (Kafka's tools: ``--command-config``,
    ``--consumer.config``, ``--producer.config``)."""
    props = {"bootstrap.servers": bootstrap, **java_client_settings(files, security, user, login)}
    return _properties_text(props, f"Java client config of the user {user!r}")


def java_client_settings(
    files: SecurityFiles, security: str, user: str, login: Login | None = None
) -> dict[str, str]:
    """The Java client settings (security protocol, trust and key stores, SASL login) with which
    ``user`` reaches a secured stack's Kafka, bootstrap servers left out."""
    if security == "sasl_ssl" and login is not None:
        settings = KafkaClientSettings.model_validate(
            {"security.protocol": "SASL_SSL", "ssl.ca.location": str(files.ca_cert), **login}
        )
        return settings.java()
    props = {
        "security.protocol": client_listener(security),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_cert),
    }
    if security == "sasl_ssl":
        props["sasl.mechanism"] = SCRAM_MECHANISM
        props["sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{files.passwords[user]}";'
        )
    else:
        props["ssl.keystore.type"] = "PEM"
        props["ssl.keystore.location"] = str(files.user_keystore(user))
    return props


def _properties_text(props: Mapping[str, str], what: str) -> str:
    lines = [f"# {what}; written by `bergstream stack up`."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def write_client_files(
    files: SecurityFiles, security: str, bootstrap: str, logins: Logins | None = None
) -> KafkaClientSecurity:
    """Write the admin's and the no-access user's client properties files (librdkafka) and the
    admin's Java one, logging in with the first mechanism of ``logins`` (SCRAM-SHA-512 if None),
    and for each mechanism of ``logins`` the same three as ``kafka-<user>-<mechanism>``; return
    what ``stack env`` exports about them."""
    first = next(iter(logins.values())) if logins else {}
    for user in USERS:
        text = client_properties(files, security, user, bootstrap, first.get(user))
        _write_private(files.client_config(user), text.encode())
    java = java_client_properties(files, security, ADMIN_USER, bootstrap, first.get(ADMIN_USER))
    _write_private(files.java_config(ADMIN_USER), java.encode())
    for mechanism, by_user in (logins or {}).items():
        for user, login in by_user.items():
            text = client_properties(files, security, user, bootstrap, login)
            _write_private(files.client_config(user, mechanism), text.encode())
            java = java_client_properties(files, security, user, bootstrap, login)
            _write_private(files.java_config(user, mechanism), java.encode())
    return client_security(files, security, first.get(ADMIN_USER))


def client_security(
    files: SecurityFiles, security: str, login: Login | None = None
) -> KafkaClientSecurity:
    """The admin's client settings and the config file paths (for ``StackEnv``); ``login`` is
    the admin's login when it is not SCRAM-SHA-512."""
    sasl = security == "sasl_ssl"
    where = {
        "protocol": client_listener(security),
        "ca_location": files.ca_cert,
        "config": files.client_config(ADMIN_USER),
        "config_noaccess": files.client_config(NOACCESS_USER),
        "java_config": files.java_config(ADMIN_USER),
    }
    if sasl and login is not None:
        return KafkaClientSecurity(
            **where,
            sasl_mechanism=login["sasl.mechanism"],
            settings={k: v for k, v in login.items() if k != "sasl.mechanism"},
        )
    return KafkaClientSecurity(
        **where,
        sasl_mechanism=SCRAM_MECHANISM if sasl else None,
        username=ADMIN_USER if sasl else None,
        password=files.passwords[ADMIN_USER] if sasl else None,
        certificate_location=None if sasl else files.user_cert(ADMIN_USER),
        key_location=None if sasl else files.user_key(ADMIN_USER),
    )


def load_security_files(home: Path) -> SecurityFiles:
    """The security files of the stack in ``home`` as they are (nothing is generated; a
    missing password reads as empty)."""
    directory = home / "security"
    try:
        raw = json.loads((directory / "passwords.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = {}
    return SecurityFiles(directory, {user: str(raw.get(user, "")) for user in USERS})
