"""Loggers of the proxy: every line names the virtual cluster and, per connection, the client."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

LOGGER_NAME = "bergstream.proxy"
logger = logging.getLogger(LOGGER_NAME)


class ProxyLogAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes messages with ``[cluster client]`` and adds both as ``extra`` attributes."""

    def __init__(self, virtual_cluster: str, client: str | None = None) -> None:
        super().__init__(logger, {"virtual_cluster": virtual_cluster, "client": client or "-"})
        self._prefix = f"[{virtual_cluster}{' ' + client if client else ''}] "

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Add the prefix and the extra fields."""
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return f"{self._prefix}{msg}", kwargs
