"""The Prometheus endpoint of ``bergstream run`` (the config file's ``metrics:`` section).

Served by ``prometheus_client``'s own HTTP server on a background thread, so a scrape never waits
for, nor delays, the event loop that moves Kafka traffic. It exposes the default registry: every
metric of :mod:`bergstream.core.metrics` plus the process and Python collectors.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from bergstream.core.config import MetricsConfig

log = logging.getLogger("bergstream.metrics")


class MetricsStartError(RuntimeError):
    """The metrics endpoint cannot listen where the config says."""


class MetricsServer:
    """A :class:`~bergstream.core.service.Service` serving ``GET /metrics`` in Prometheus' text
    format on ``config.host:config.port``."""

    name = "metrics"

    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port listened on (the configured one, or the one picked for port 0)."""
        if self._server is not None:
            return int(self._server.server_port)
        return self.config.port

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        return self.config.url(self.port)

    async def start(self) -> None:
        """Bind the port and start serving; return once scrapes are answered."""
        if self._server is not None:
            return
        host, port = self.config.host, self.config.port
        try:
            self._server, self._thread = await asyncio.to_thread(start_http_server, port, host)
        except OSError as error:
            raise MetricsStartError(
                f"metrics: cannot listen on {host}:{port}: {error.strerror or error} "
                "(change metrics.host or metrics.port)"
            ) from error
        log.info("serving Prometheus metrics on %s", self.url)

    async def stop(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        server, thread = self._server, self._thread
        if server is None:
            return
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join, 5)
        self._server = self._thread = None
        log.info("stopped the metrics endpoint")
