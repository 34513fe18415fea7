"""The proxy service of one virtual cluster: its listeners and its client connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from bergstream.core.choices import choice_settings
from bergstream.core.config import (
    SETUP_ERRORS,
    BergstreamConfig,
    ConfigError,
    ConfigProblem,
    VirtualClusterConfig,
)
from bergstream.core.health import ReadinessCheck
from bergstream.core.plugins import PluginRegistry
from bergstream.core.proxy.api import FilterFactory, FilterFactoryContext
from bergstream.core.proxy.connection import ProxyConnection
from bergstream.core.proxy.log import ProxyLogAdapter
from bergstream.core.proxy.stats import PUBLISH_SECONDS, ClusterStats, cluster_stats
from bergstream.core.proxy.tls import server_ssl_context
from bergstream.core.proxy.upstream import TargetCluster
from bergstream.core.readiness import kafka_check


class ProxyStartError(RuntimeError):
    """The proxy could not start (a port is taken, a TLS file is bad, a factory failed)."""


def build_filter_factories(
    cluster: VirtualClusterConfig, config: BergstreamConfig, registry: PluginRegistry
) -> list[FilterFactory[Any]]:
    """Create the filter factories of ``cluster``'s chain, in config order.

    Each ``filters[]`` entry names a registered filter plugin; its settings (validated by the
    config loader, or here if the config was loaded without a registry) go to the factory with a
    :class:`FilterFactoryContext`.

    A factory that refuses its settings (:data:`~bergstream.core.config.SETUP_ERRORS`) makes a
    :class:`~bergstream.core.config.ConfigError` naming every refusing filter of the chain, with
    its place in the file.
    """
    context = FilterFactoryContext(virtual_cluster=cluster.name, config=config, plugins=registry)
    index = next(i for i, c in enumerate(config.virtual_clusters) if c is cluster)
    factories: list[FilterFactory[Any]] = []
    refused: list[ConfigProblem] = []
    for position, instance in enumerate(cluster.filters):
        registration = registry.get("filter", instance.type)
        try:
            factories.append(registration.factory(choice_settings(instance, registry), context))
        except SETUP_ERRORS as error:
            path = f"virtual_clusters[{index}].filters[{position}]"
            refused.append(config.problem_at(path, error))
    if refused:
        raise ConfigError(refused)
    return factories


def build_proxy_servers(config: BergstreamConfig, registry: PluginRegistry) -> list[ProxyServer]:
    """One :class:`ProxyServer` per virtual cluster of ``config``."""
    return [
        ProxyServer(cluster, build_filter_factories(cluster, config, registry))
        for cluster in config.virtual_clusters
    ]


class ProxyServer:
    """Serves one virtual cluster: a bootstrap port plus one port per broker node id.

    Implements the :class:`~bergstream.core.service.Service` protocol. :meth:`start` starts the
    filter factories and binds every port; :meth:`stop` closes listeners and connections, then
    closes the factories. While it runs, its connections' request and byte counts are published
    to Prometheus every :data:`~.stats.PUBLISH_SECONDS`, and once more when it stops.
    """

    def __init__(
        self,
        cluster: VirtualClusterConfig,
        filter_factories: Sequence[FilterFactory[Any]] = (),
    ) -> None:
        self.cluster = cluster
        self.name = f"proxy:{cluster.name}"
        self.filter_factories = list(filter_factories)
        self.log = ProxyLogAdapter(cluster.name)
        try:
            self.target = TargetCluster(
                cluster.target, connect_timeout=cluster.upstream_timeout_seconds, log=self.log
            )
        except Exception as error:  # a CA or client certificate that does not load
            raise ProxyStartError(f"virtual cluster '{cluster.name}': target: {error}") from error
        self._servers: list[asyncio.Server] = []
        self._connections: set[ProxyConnection] = set()
        self._started_factories: list[FilterFactory[Any]] = []
        self._running = False
        self.stats: ClusterStats = cluster_stats(cluster.name)
        self._publisher: asyncio.Task[None] | None = None

    @property
    def connections(self) -> frozenset[ProxyConnection]:
        """The open client connections."""
        return frozenset(self._connections)

    def ports(self) -> dict[int | None, int]:
        """Listening port per node id (None is the bootstrap port)."""
        gateway = self.cluster.gateway
        ports: dict[int | None, int] = {None: gateway.port}
        for index in range(gateway.broker_count):
            node = gateway.lowest_broker_id + index
            ports[node] = gateway.first_broker_port() + index
        return ports

    def _new_connection(self, node_id: int | None) -> ProxyConnection:
        connection = ProxyConnection(
            cluster=self.cluster,
            target=self.target,
            node_id=node_id,
            filter_factories=self.filter_factories,
            on_closed=self._connections.discard,
            stats=self.stats,
        )
        self._connections.add(connection)
        return connection

    def readiness_checks(self) -> list[ReadinessCheck]:
        """The target cluster, then what each filter factory needs (``GET /readyz``)."""
        checks = [kafka_check(self.cluster.target.bootstrap)]
        for factory in self.filter_factories:
            own = getattr(factory, "readiness_checks", None)
            if callable(own):
                checks += own()
        return checks

    async def start(self) -> None:
        """Start the filter factories and listen on every gateway port; return when ready."""
        if self._running:
            return
        gateway = self.cluster.gateway
        try:
            ssl_context = server_ssl_context(gateway.tls) if gateway.tls is not None else None
        except Exception as error:
            raise ProxyStartError(f"virtual cluster '{self.cluster.name}': {error}") from error
        if gateway.advertised_host is None and gateway.host in ("0.0.0.0", "::", ""):
            self.log.warning(
                "gateway.host is %r and no advertised_host is set: clients will be told to "
                "connect to %r; set gateway.advertised_host",
                gateway.host,
                gateway.host,
            )
        self._running = True
        try:
            for factory in self.filter_factories:
                await factory.start()
                self._started_factories.append(factory)
            loop = asyncio.get_running_loop()
            for node_id, port in self.ports().items():
                try:
                    server = await loop.create_server(
                        lambda node=node_id: self._new_connection(node),  # type: ignore[misc]
                        gateway.host,
                        port,
                        ssl=ssl_context,
                        reuse_address=True,
                        backlog=1024,
                    )
                except OSError as error:
                    role = "bootstrap" if node_id is None else f"node {node_id}"
                    raise ProxyStartError(
                        f"virtual cluster '{self.cluster.name}': cannot listen on "
                        f"{gateway.host}:{port} ({role}): {error.strerror or error}"
                    ) from error
                self._servers.append(server)
        except BaseException:
            await self.stop()
            raise
        self._publisher = asyncio.get_running_loop().create_task(self._publish_forever())
        last = gateway.first_broker_port() + gateway.broker_count - 1
        self.log.info(
            "listening on %s:%d (bootstrap), %d-%d (node ids %d-%d)%s; target %s",
            gateway.host,
            gateway.port,
            gateway.first_broker_port(),
            last,
            gateway.lowest_broker_id,
            gateway.lowest_broker_id + gateway.broker_count - 1,
            " with TLS" if ssl_context is not None else "",
            self.cluster.target.bootstrap,
        )

    async def stop(self) -> None:
        """Close every listener and connection, then the filter factories; safe to call twice."""
        if not self._running:
            return
        self._running = False
        for server in self._servers:
            server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.close("the proxy is stopping", level=logging.DEBUG)
        waits = [c.closed for c in connections if c.closed is not None]
        if waits:
            await asyncio.wait(waits, timeout=10)
        for server in self._servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)
        self._servers.clear()
        for factory in reversed(self._started_factories):
            try:
                await factory.close()
            except Exception:
                self.log.warning(
                    "filter factory %s failed to close", type(factory).__name__, exc_info=True
                )
        self._started_factories.clear()
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
            self._publisher = None
        self.stats.publish()
        self.log.info("stopped")

    async def _publish_forever(self) -> None:
        """Publish the connections' counts to Prometheus every :data:`PUBLISH_SECONDS`."""
        while True:
            await asyncio.sleep(PUBLISH_SECONDS)
            try:
                self.stats.publish()
            except Exception:  # a metrics bug must never stop the proxy
                self.log.exception("publishing the proxy's metrics failed")
