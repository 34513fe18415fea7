"""TLS material for ISK's HTTPS tests, made with the stack's own certificate helpers: a CA and a
server certificate for 127.0.0.1 / localhost signed by it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bergstream.devstack.stack import kafka_security


@dataclass(frozen=True)
class ServerCertificate:
    """PEM files: the CA that signed the server certificate, the certificate and its key."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def write_server_certificate(directory: Path, name: str = "isk") -> ServerCertificate:
    """A fresh CA and a server certificate (SANs 127.0.0.1 and localhost) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = kafka_security._make_ca()
    key, cert = kafka_security._make_leaf(name, ca_key, ca_cert, server=True)
    files = ServerCertificate(
        directory / f"{name}-ca.pem", directory / f"{name}.pem", directory / f"{name}-key.pem"
    )
    files.ca_file.write_bytes(kafka_security._pem_cert(ca_cert))
    files.cert_file.write_bytes(kafka_security._pem_cert(cert))
    files.key_file.write_bytes(kafka_security._pem_key(key))
    return files
