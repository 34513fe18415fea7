"""Starts everything a config file configures and stops it cleanly on SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from bergstream.core.arrow_memory import use_system_allocator
from bergstream.core.backends import ServiceContext
from bergstream.core.choices import choice_settings
from bergstream.core.config import (
    SETUP_ERRORS,
    BergstreamConfig,
    ConfigError,
    ConfigProblem,
)
from bergstream.core.home import bergstream_home
from bergstream.core.plugins import PluginRegistry
from bergstream.core.service import Service

log = logging.getLogger("bergstream.runner")


def build_services(config: BergstreamConfig, registry: PluginRegistry) -> list[Service]:
    """The metrics endpoint (when ``metrics:`` enables it, first, so it stops last), then one
    service per virtual cluster (its proxy) and per ``services:`` entry, in config order.

    Builds without starting (nothing listens, nothing connects): what ``bergstream run`` does
    with a loaded config before it starts anything, so a file it refuses fails here, with one
    :class:`ConfigError` naming every filter and service that refused its settings, and where."""
    from bergstream.core.metrics_http import MetricsServer
    from bergstream.core.proxy.server import ProxyServer, build_filter_factories

    services: list[Service] = []
    refused: list[ConfigProblem] = []
    if config.metrics is not None and config.metrics.enabled:
        services.append(MetricsServer(config.metrics))
    for cluster in config.virtual_clusters:
        try:
            services.append(ProxyServer(cluster, build_filter_factories(cluster, config, registry)))
        except ConfigError as error:
            refused += error.problems
    context = ServiceContext(config=config, plugins=registry, home=bergstream_home())
    for index, instance in enumerate(config.services):
        registration = registry.get("service", instance.type)
        try:
            services.append(registration.factory(choice_settings(instance, registry), context))
        except SETUP_ERRORS as error:
            refused.append(config.problem_at(f"services[{index}]", error))
    if refused:
        raise ConfigError(refused)
    for service in services:
        if isinstance(service, MetricsServer):
            service.add_checks(
                check
                for other in services
                if callable(getattr(other, "readiness_checks", None))
                for check in other.readiness_checks()  # type: ignore[attr-defined]
            )
            for other in services:
                source = getattr(other, "status_sections", None)
                if callable(source):
                    service.add_status_source(source)
    return services


async def run_services(
    services: list[Service], stop: asyncio.Event, on_ready: Callable[[], None] | None = None
) -> None:
    """Start ``services`` in order, call ``on_ready``, wait for ``stop``, then stop in reverse.

    If one fails to start, the ones already started are stopped before the error propagates.
    """
    started: list[Service] = []
    try:
        for service in services:
            await service.start()
            started.append(service)
            log.info("started %s", service.name)
        if on_ready is not None:
            on_ready()
        await stop.wait()
    finally:
        for service in reversed(started):
            try:
                await service.stop()
                log.info("stopped %s", service.name)
            except Exception:
                log.exception("stopping %s failed", service.name)


def ready_line(services: list[Service]) -> str:
    """``bergstream: ready: NAME, NAME[; metrics: URL]``: what ``bergstream run`` prints on
    stderr once every service accepts work."""
    names = ", ".join(service.name for service in services if service.name != "metrics")
    line = f"bergstream: ready: {names}"
    for service in services:
        url = getattr(service, "url", None)
        if service.name == "metrics" and isinstance(url, str):
            line += f"; metrics: {url}"
    return line


def run_until_signalled(config: BergstreamConfig, registry: PluginRegistry) -> None:
    """Run the config's services until SIGTERM or SIGINT, then stop them cleanly (Arrow on the
    system allocator unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise)."""
    log.debug("Arrow allocator: %s", use_system_allocator())

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        services = build_services(config, registry)
        if not services:
            log.warning("%s configures no virtual cluster and no service", config.source)

        def ready() -> None:
            for service in services:
                mark_ready = getattr(service, "mark_ready", None)
                if callable(mark_ready):
                    mark_ready()
            print(ready_line(services), file=sys.stderr, flush=True)

        await run_services(services, stop, ready)

    asyncio.run(main())
