"""Java trust and key stores (``ssl.truststore.*``, ``ssl.keystore.*``) turned into the PEM files
Python's and librdkafka's clients read: a PEM store is used where it is, inline PEM text and a
PKCS12 store are written under ``$BERGSTREAM_CACHE/kafka-pem/`` (owner-only; a private key stays
encrypted with the store's password). A JKS store cannot be read without Java's keytool, so it is
refused with the command that converts it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    PrivateFormat,
    load_pem_private_key,
    pkcs12,
)

from bergstream.core.kafka_properties import ClientFileError

__all__ = ["key_files", "trust_file"]


def _store_type(props: dict[str, str], prefix: str, location: str | None) -> str:
    declared = props.get(f"{prefix}.type", "").strip().upper()
    if declared:
        return declared
    if location and location.lower().endswith((".p12", ".pfx")):
        return "PKCS12"
    if location and location.lower().endswith((".pem", ".crt")):
        return "PEM"
    return "JKS"  # Java's default store type


def _jks_refused(where: str, key: str, location: str) -> ClientFileError:
    return ClientFileError(
        f"{where}: {key} {location} is a JKS store, which only Java reads: convert it with "
        f"keytool -importkeystore -srckeystore {location} -destkeystore {location}.p12 "
        "-deststoretype PKCS12, then give the .p12 with the type PKCS12"
    )


def _private_file(
    cache_dir: Path, source: bytes, name: str, content: bytes, *, keep: bool = False
) -> Path:
    """``content`` in an owner-only file named by the digest of ``source``; ``keep`` leaves an
    existing file (an encrypted key differs at each encryption but means the same)."""
    folder = cache_dir / "kafka-pem" / hashlib.sha256(source).hexdigest()[:20]
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / name
    if keep and path.is_file():
        return path
    if not path.is_file() or path.read_bytes() != content:
        temporary = path.with_name(f".{name}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        temporary.replace(path)
    return path


def _read(where: str, key: str, location: str) -> bytes:
    try:
        return Path(location).read_bytes()
    except OSError as error:
        raise ClientFileError(
            f"{where}: {key} {location} cannot be read: {error.strerror}"
        ) from None


def _pkcs12(
    where: str, key: str, data: bytes, password: str | None
) -> pkcs12.PKCS12KeyAndCertificates:
    try:
        return pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError:
        raise ClientFileError(
            f"{where}: {key} does not open as PKCS12 with the store's password: check it and "
            f"the {key.rsplit('.', 1)[0]}.password"
        ) from None


def trust_file(props: dict[str, str], where: str, cache_dir: Path) -> Path | None:
    """The PEM file of the CAs the ``ssl.truststore.*`` keys give, or None when they give
    none."""
    inline = props.get("ssl.truststore.certificates", "").strip()
    location = props.get("ssl.truststore.location", "").strip() or None
    if inline:
        return _private_file(cache_dir, inline.encode(), "ca.pem", inline.encode() + b"\n")
    if location is None:
        return None
    kind = _store_type(props, "ssl.truststore", location)
    if kind == "PEM":
        return Path(location)
    if kind != "PKCS12":
        if kind == "JKS":
            raise _jks_refused(where, "ssl.truststore.location", location)
        raise ClientFileError(f"{where}: ssl.truststore.type {kind} is none of PEM, PKCS12")
    data = _read(where, "ssl.truststore.location", location)
    store = _pkcs12(where, "ssl.truststore.location", data, props.get("ssl.truststore.password"))
    certificates = [entry.certificate for entry in store.additional_certs]
    if store.cert is not None:
        certificates.append(store.cert.certificate)
    if not certificates:
        raise ClientFileError(f"{where}: ssl.truststore.location {location} holds no certificate")
    pem = b"".join(c.public_bytes(Encoding.PEM) for c in certificates)
    return _private_file(cache_dir, data, "ca.pem", pem)


def key_files(
    props: dict[str, str], where: str, cache_dir: Path
) -> tuple[Path, Path, str | None] | None:
    """``(certificate chain PEM, private key PEM, key password)`` of the ``ssl.keystore.*``
    keys, or None when they give no key store."""
    location = props.get("ssl.keystore.location", "").strip() or None
    inline_key = props.get("ssl.keystore.key", "").strip()
    inline_chain = props.get("ssl.keystore.certificate.chain", "").strip()
    key_password = props.get("ssl.key.password") or None
    if inline_key or inline_chain:
        if not (inline_key and inline_chain):
            raise ClientFileError(
                f"{where}: ssl.keystore.key and ssl.keystore.certificate.chain go together"
            )
        source = (inline_key + inline_chain).encode()
        chain = _private_file(cache_dir, source, "chain.pem", inline_chain.encode() + b"\n")
        key = _private_file(cache_dir, source, "key.pem", inline_key.encode() + b"\n")
        return chain, key, key_password
    if location is None:
        return None
    kind = _store_type(props, "ssl.keystore", location)
    if kind == "JKS":
        raise _jks_refused(where, "ssl.keystore.location", location)
    data = _read(where, "ssl.keystore.location", location)
    if kind == "PEM":  # one file holding the key and its certificate chain
        password = key_password.encode() if key_password else None
        try:
            load_pem_private_key(data, password)
        except (ValueError, TypeError):
            raise ClientFileError(
                f"{where}: ssl.keystore.location {location} holds no private key that opens "
                "(with ssl.key.password when it is encrypted)"
            ) from None
        return Path(location), Path(location), key_password
    if kind != "PKCS12":
        raise ClientFileError(f"{where}: ssl.keystore.type {kind} is none of PEM, PKCS12")
    store_password = props.get("ssl.keystore.password")
    store = _pkcs12(where, "ssl.keystore.location", data, store_password)
    if store.key is None or store.cert is None:
        raise ClientFileError(
            f"{where}: ssl.keystore.location {location} holds no private key with its certificate"
        )
    chain = store.cert.certificate.public_bytes(Encoding.PEM) + b"".join(
        entry.certificate.public_bytes(Encoding.PEM) for entry in store.additional_certs
    )
    # The key stays encrypted, with the store's password (or the key's own).
    secret = key_password or store_password or hashlib.sha256(data).hexdigest()
    pem_key = store.key.private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(secret.encode())
    )
    return (
        _private_file(cache_dir, data, "chain.pem", chain),
        _private_file(cache_dir, data, "key.pem", pem_key, keep=True),
        secret,
    )
