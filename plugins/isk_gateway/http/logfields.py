"""Log fields of the ISK HTTP listeners: which component and which client a line concerns."""

from __future__ import annotations

from aiohttp import web

__all__ = ["client_fields"]


def client_fields(request: web.Request) -> dict[str, str]:
    """``extra=`` for a log line about ``request``: component ``isk`` and the client's
    ``host:port``."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else (request.remote or "-")
    return {"component": "isk", "client": client}
