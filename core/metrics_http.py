"""The HTTP endpoint of a bergstream process (the config file's ``metrics:`` section, or
``pipeline run --metrics-port``): ``GET /metrics`` in Prometheus' text format, ``GET /healthz``
(the process is up), ``GET /readyz`` (every dependency answers, :mod:`bergstream.core.health`)
and the status page, ``GET /`` and ``GET /status.json`` (:mod:`bergstream.core.status_page`),
with what each service reports.

Served on a background thread (a threading WSGI server), so a scrape or a readiness probe never
waits for, nor delays, the event loop that moves Kafka traffic. ``/metrics`` exposes the default
registry (every metric the process's modules define plus the process and Python collectors) and
readiness as gauges, ``bergstream_ready`` and ``bergstream_dependency_up``, probed at each scrape
as ``/readyz`` would be, so Prometheus can alert on them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler
from prometheus_client.registry import Collector

from bergstream.core.config import MetricsConfig
from bergstream.core.health import ReadinessCheck, check_results
from bergstream.core.status_page import (
    StatusSection,
    StatusUnauthorized,
    render_page,
    status_json,
)

log = logging.getLogger("bergstream.metrics")

#: A page of the process: called per request with the query string, returns (content type, body).
Page = Callable[[str], tuple[str, bytes]]
#: A service's status: given the request's Authorization header, its sections.
StatusSource = Callable[[str | None], Awaitable[list[StatusSection]]]
#: Seconds a status source may take before the page shows it failed.
STATUS_TIMEOUT = 20.0
#: How long the readiness probes' results are reused (a scrape and a probe arriving together).
READINESS_REUSE_SECONDS = 2.0


class MetricsStartError(RuntimeError):
    """The metrics endpoint cannot listen where the config says."""


class MetricsServer:
    """A :class:`~bergstream.core.service.Service` serving the process's endpoint on
    ``config.host:config.port``.

    ``/readyz`` answers 503 until :meth:`mark_ready` (every service of the process accepts
    work), then runs the checks :meth:`add_checks` gave it."""

    name = "metrics"

    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._checks: list[ReadinessCheck] = []
        self._pages: dict[str, Page] = {}
        self._status_sources: list[StatusSource] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.title = "bergstream"
        self._ready = False
        self._began = time.monotonic()
        self._check_lock = threading.Lock()
        self._checked: tuple[float, list[dict[str, Any]]] | None = None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Exposed(self))
        self._metrics_app = make_wsgi_app(registry)

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

    def add_checks(self, checks: Iterable[ReadinessCheck]) -> None:
        """Dependencies ``/readyz`` probes."""
        with self._check_lock:
            self._checks.extend(checks)
            self._checked = None

    def add_page(self, path: str, page: Page) -> None:
        """Serve ``page`` at ``path`` (``/`` for the status page)."""
        self._pages[path] = page

    def add_status_source(self, source: StatusSource) -> None:
        """A service's ``status_sections`` for the status page (run on the loop that started
        this server)."""
        self._status_sources.append(source)

    def status(self, authorization: str | None) -> list[StatusSection]:
        """Every source's sections, in order (a source that fails shows as a section saying
        so); raises :class:`StatusUnauthorized` when a source refuses the credentials."""
        sections: list[StatusSection] = []
        for source in self._status_sources:
            if self._loop is None:
                break
            future = asyncio.run_coroutine_threadsafe(source(authorization), self._loop)
            try:
                sections += future.result(timeout=STATUS_TIMEOUT)
            except StatusUnauthorized:
                raise
            except Exception as error:
                future.cancel()
                log.warning("a status source failed: %s", error)
                sections.append(
                    StatusSection("unavailable", {"error": f"{type(error).__name__}: {error}"})
                )
        return sections

    def mark_ready(self, ready: bool = True) -> None:
        """Whether every service of the process has started (``/readyz`` is 503 before)."""
        self._ready = ready

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """What ``/readyz`` answers: ready or not, and the JSON body naming each dependency.
        The probes' results are reused for :data:`READINESS_REUSE_SECONDS`: a scrape and a
        readiness probe arriving together, or many dashboards at once, probe the dependencies
        once (concurrent callers wait for that one run)."""
        with self._check_lock:
            now = time.monotonic()
            if self._checked is None or now - self._checked[0] >= READINESS_REUSE_SECONDS:
                self._checked = (now, check_results(self._checks))
            results = self._checked[1]
        failing = [result["name"] for result in results if not result["ok"]]
        if not self._ready:
            failing.insert(0, "starting")
        body = {"ready": not failing, "failing": failing, "checks": results}
        return not failing, body

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics" or path.startswith("/metrics/"):
            return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            uptime = round(time.monotonic() - self._began, 1)
            return _json(start_response, 200, {"status": "up", "uptime_seconds": uptime})
        if path == "/readyz":
            ready, body = self.readiness()
            return _json(start_response, 200 if ready else 503, body)
        if path in ("/", "/status.json"):
            return self._status_page(path, environ, start_response)
        page = self._pages.get(path)
        if page is not None:
            try:
                content_type, content = page(environ.get("QUERY_STRING", ""))
            except Exception:
                log.exception("the page %s failed", path)
                return _json(start_response, 500, {"error": f"the page {path} failed; see the log"})
            start_response(
                "200 OK", [("Content-Type", content_type), ("Cache-Control", "no-store")]
            )
            return [content]
        known = ["/", "/status.json", "/metrics", "/healthz", "/readyz", *sorted(self._pages)]
        return _json(start_response, 404, {"error": f"no page {path}", "pages": known})

    def _status_page(
        self, path: str, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        try:
            sections = self.status(environ.get("HTTP_AUTHORIZATION"))
        except StatusUnauthorized as refused:
            start_response(
                "401 Unauthorized",
                [
                    ("Content-Type", "application/json"),
                    ("WWW-Authenticate", 'Basic realm="bergstream", charset="UTF-8"'),
                ],
            )
            return [json.dumps({"error": str(refused) or "credentials needed"}).encode()]
        generated = time.time()
        if path == "/status.json":
            return _json(start_response, 200, status_json(sections, generated))
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")]
        start_response("200 OK", headers)
        return [render_page(self.title, sections, generated)]

    def _serve(self, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
        server = make_server(
            host, port, self._app, ThreadingWSGIServer, handler_class=_SilentHandler
        )
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        return server, thread

    async def start(self) -> None:
        """Bind the port and start serving; return once requests are answered."""
        if self._server is not None:
            return
        self._loop = asyncio.get_running_loop()
        host, port = self.config.host, self.config.port
        try:
            self._server, self._thread = await asyncio.to_thread(self._serve, host, port)
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


class _Exposed(Collector):
    """The default registry's metrics, then the process's readiness as gauges."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def describe(self) -> list[Any]:
        """Nothing up front: the names are the default registry's and two of its own."""
        return []

    def collect(self) -> Iterable[Any]:
        """Every metric of the default registry, ``bergstream_ready`` and
        ``bergstream_dependency_up``."""
        yield from REGISTRY.collect()
        ready, body = self.server.readiness()
        yield GaugeMetricFamily(
            "bergstream_ready",
            "1 when every service of the process started and every dependency answers (as "
            "GET /readyz), else 0",
            value=1 if ready else 0,
        )
        dependencies = GaugeMetricFamily(
            "bergstream_dependency_up",
            "1 when the dependency answers its readiness probe, else 0",
            labels=["dependency", "target"],
        )
        for check in body["checks"]:
            dependencies.add_metric([check["name"], check["target"]], 1 if check["ok"] else 0)
        yield dependencies


_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}


def _json(start_response: Callable[..., Any], status: int, body: dict[str, Any]) -> list[bytes]:
    content = json.dumps(body).encode()
    start_response(
        f"{status} {_REASONS[status]}",
        [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
    )
    return [content]
