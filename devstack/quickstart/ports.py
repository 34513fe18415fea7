"""Where the quickstart's ISK catalog, ISK S3 gateway and KSI proxy listen: fixed ports as in the
examples (so the printed instructions stay the same from run to run), overridable by option or
environment, and moved to free ones when something else holds them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bergstream.devstack.stack.ports import free_port_block, free_ports, port_is_free

__all__ = [
    "DEFAULT_CATALOG_PORT",
    "DEFAULT_PROXY_PORT",
    "DEFAULT_S3_PORT",
    "PROXY_PORTS",
    "QuickstartPorts",
    "choose_ports",
]

DEFAULT_CATALOG_PORT = 18181
DEFAULT_S3_PORT = 19000
DEFAULT_PROXY_PORT = 19092
#: The proxy's bootstrap port plus one port per broker node id 0, 1 and 2.
PROXY_PORTS = 4

_ENV = {
    "catalog": "BERGSTREAM_ISK_CATALOG_PORT",
    "s3": "BERGSTREAM_ISK_S3_PORT",
    "proxy": "BERGSTREAM_PROXY_PORT",
}


@dataclass(frozen=True)
class QuickstartPorts:
    """Where ISK's catalog, ISK's S3 gateway and the KSI proxy listen; ``moved`` names the ones
    that had to leave their wanted port because something else held it."""

    catalog: int
    s3: int
    proxy: int
    moved: tuple[str, ...] = ()


def _wanted(name: str, given: int | None, default: int) -> int:
    if given is not None:
        return given
    raw = os.environ.get(_ENV[name])
    if raw:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{_ENV[name]}={raw!r} is not a port number") from None
    return default


def choose_ports(
    catalog: int | None = None, s3: int | None = None, proxy: int | None = None
) -> QuickstartPorts:
    """The ports to use: the given ones, else ``$BERGSTREAM_ISK_CATALOG_PORT``,
    ``$BERGSTREAM_ISK_S3_PORT`` and ``$BERGSTREAM_PROXY_PORT``, else 18181, 19000 and 19092;
    a port that is taken is replaced by a free one (the proxy needs 4 consecutive ports)."""
    want_catalog = _wanted("catalog", catalog, DEFAULT_CATALOG_PORT)
    want_s3 = _wanted("s3", s3, DEFAULT_S3_PORT)
    want_proxy = _wanted("proxy", proxy, DEFAULT_PROXY_PORT)
    moved: list[str] = []
    proxy_block = set(range(want_proxy, want_proxy + PROXY_PORTS))
    if not all(port_is_free(port) for port in proxy_block):
        want_proxy = free_port_block(PROXY_PORTS)
        proxy_block = set(range(want_proxy, want_proxy + PROXY_PORTS))
        moved.append("proxy")
    taken = set(proxy_block)
    if want_catalog in taken or not port_is_free(want_catalog):
        want_catalog = free_ports(1, exclude=taken)[0]
        moved.append("catalog")
    taken.add(want_catalog)
    if want_s3 in taken or not port_is_free(want_s3):
        want_s3 = free_ports(1, exclude=taken)[0]
        moved.append("s3")
    return QuickstartPorts(want_catalog, want_s3, want_proxy, tuple(moved))
