"""SSL contexts for the proxy: toward clients (server side) and toward the target cluster."""

from __future__ import annotations

import ssl
from pathlib import Path

from bergstream.core.config import ClientTlsConfig, ServerTlsConfig


class TlsConfigError(Exception):
    """A certificate, key or CA file could not be loaded; the message names the file."""


def _load(action: str, path: Path | None, call: object) -> None:
    try:
        call()  # type: ignore[operator]
    except FileNotFoundError:
        raise TlsConfigError(f"{action}: file {path} does not exist") from None
    except (ssl.SSLError, OSError, ValueError) as error:
        raise TlsConfigError(f"{action} from {path}: {error}") from None


def server_ssl_context(config: ServerTlsConfig) -> ssl.SSLContext:
    """Context presenting ``cert_file``/``key_file`` to clients; with ``ca_file`` it requires
    client certificates signed by that CA (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load(
        "cannot load the proxy's certificate and key",
        config.cert_file,
        lambda: context.load_cert_chain(config.cert_file, config.key_file),
    )
    if config.ca_file is not None:
        _load(
            "cannot load the CA that signs client certificates",
            config.ca_file,
            lambda: context.load_verify_locations(cafile=config.ca_file),
        )
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(config: ClientTlsConfig) -> ssl.SSLContext:
    """Context verifying brokers with ``ca_file`` (system CAs if unset), optionally presenting
    a client certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if config.ca_file is not None:
        _load(
            "cannot load the CA that signs broker certificates",
            config.ca_file,
            lambda: context.load_verify_locations(cafile=config.ca_file),
        )
    if config.cert_file is not None:
        _load(
            "cannot load the proxy's client certificate and key",
            config.cert_file,
            lambda: context.load_cert_chain(config.cert_file, config.key_file),
        )
    context.check_hostname = config.check_hostname
    return context
