"""Test certificates: a CA and a client certificate it signed, as PEM, PKCS12 and a fake JKS
file (for the trust and key store tests)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    pkcs12,
)
from cryptography.x509.oid import NameOID


def _certificate(name: str, key: ec.EllipticCurvePrivateKey, issuer: tuple | None = None):
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_name, signer_key = issuer or (subject, key)
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .sign(signer_key, hashes.SHA256())
    )


def make_pki(folder: Path) -> dict[str, Path]:
    """The files, by name, written into ``folder``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test-ca", ca_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("client", client_key, (ca.subject, ca_key))
    files = {
        "ca.pem": ca.public_bytes(Encoding.PEM),
        "trust.p12": pkcs12.serialize_key_and_certificates(
            None, None, None, [ca], BestAvailableEncryption(b"trustpw")
        ),
        "client.p12": pkcs12.serialize_key_and_certificates(
            b"client", client_key, client, [ca], BestAvailableEncryption(b"keypw")
        ),
        "client.pem": client_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        + client.public_bytes(Encoding.PEM),
        "trust.jks": b"\xfe\xed\xfe\xed",
    }
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return {name: folder / name for name in files}
