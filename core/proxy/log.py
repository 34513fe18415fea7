"""Loggers of the proxy: every line names the virtual cluster and, per connection, the client.

Messages start with ``[cluster client]`` (plus the Kafka client.id once known), and the same
names travel as ``extra`` fields (``component``, ``virtual_cluster``, ``client``, ``client_id``)
for the JSON log format of :mod:`bergstream.core.logs`.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

LOGGER_NAME = "bergstream.proxy"
logger = logging.getLogger(LOGGER_NAME)


class ProxyLogAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes messages with ``[cluster client]`` and adds ``component`` (``proxy``),
    ``virtual_cluster``, ``client`` (the peer's ``host:port``) and, once the client sent one,
    its Kafka ``client_id`` to every record."""

    def __init__(
        self, virtual_cluster: str, client: str | None = None, client_id: str | None = None
    ) -> None:
        extra = {"component": "proxy", "virtual_cluster": virtual_cluster, "client": client or "-"}
        if client_id:
            extra["client_id"] = client_id
        super().__init__(logger, extra)
        names = [virtual_cluster, *(part for part in (client, client_id) if part)]
        self._prefix = f"[{' '.join(names)}] "

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Add the prefix and the extra fields (a caller's own ``extra`` wins, e.g. the
        ``component`` of a filter)."""
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return f"{self._prefix}{msg}", kwargs
