"""The checks of a config file that span several keys, run on every part that validated by itself,
so a field error elsewhere does not hide them (pydantic skips a model's own cross-field checks
once one of its fields failed): two virtual clusters of one name, and two listeners of one process
on one port; and, for the commands, a file that gives them nothing to run.

A service plugin's settings take part in the port check by a ``listeners()`` method returning
``(name, host, port)`` triples (``docs/hooks.md``, *Services*).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from bergstream.core.problems import Loc, Problem

if TYPE_CHECKING:
    from bergstream.core.config import BergstreamConfig, ConfigProblem

__all__ = ["Listener", "cross_checks", "listener_conflicts", "nothing_to_run"]

#: Sockets a process listens on: what they are (for messages), where they sit in the file, the
#: host, and the first and last port of the range.
Listener = tuple[str, Loc, str, int, int]

_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def cross_checks(data: dict[str, Any], services: Sequence[Any] = ()) -> list[Problem]:
    """Every cross-key problem of the file's ``data`` (interpolated, not yet validated);
    ``services`` are the validated settings of ``services[]`` (None where one did not validate)."""
    return [
        *_duplicate_cluster_names(data),
        *listener_conflicts([*_file_listeners(data), *_service_listeners(services)]),
    ]


def nothing_to_run(config: BergstreamConfig, *, lake_runs: bool) -> list[ConfigProblem]:
    """The problem of a file that gives a command nothing to run: no virtual cluster, no service
    and (where the command takes a lake, ``lake_runs``, as ``config check`` does for ``pipeline
    run``) no lake."""
    from bergstream.core.config import ConfigProblem

    if config.virtual_clusters or config.services or (lake_runs and config.lake is not None):
        return []
    if config.lake is not None:
        message = (
            "the file has a lake but no virtual_clusters and no services: `bergstream pipeline "
            "run -c FILE --topic T` runs the lake's pipeline; `bergstream run` runs proxies and "
            "ISK services"
        )
    else:
        message = (
            "the file configures nothing to run: add virtual_clusters (a Kafka proxy), "
            "services (an ISK gateway) or lake (the pipeline); see examples/ and "
            "docs/configuration.md"
        )
    return [ConfigProblem(config.source, "", message, 1 if config.lines else None)]


def _clusters(data: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    clusters = data.get("virtual_clusters")
    if isinstance(clusters, list):
        for index, cluster in enumerate(clusters):
            if isinstance(cluster, dict):
                yield index, cluster


def _duplicate_cluster_names(data: dict[str, Any]) -> list[Problem]:
    first: dict[str, int] = {}
    problems: list[Problem] = []
    for index, cluster in _clusters(data):
        name = cluster.get("name")
        if not isinstance(name, str):
            continue
        if name in first:
            problems.append(
                (
                    ("virtual_clusters", index, "name"),
                    f"virtual cluster name '{name}' is also the name of virtual_clusters"
                    f"[{first[name]}]: give each cluster its own name",
                )
            )
        first.setdefault(name, index)
    return problems


def _valid(model: type[BaseModel], raw: Any) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def _file_listeners(data: dict[str, Any]) -> list[Listener]:
    from bergstream.core.config import GatewayConfig, MetricsConfig

    listeners: list[Listener] = []
    for index, cluster in _clusters(data):
        gateway = _valid(GatewayConfig, cluster.get("gateway"))
        if gateway is None:
            continue
        loc: Loc = ("virtual_clusters", index, "gateway")
        name = cluster.get("name", index)
        first = gateway.first_broker_port()
        listeners += [
            (
                f"virtual cluster '{name}' bootstrap",
                (*loc, "port"),
                gateway.host,
                *[gateway.port] * 2,
            ),
            (
                f"virtual cluster '{name}' broker ports",
                (*loc, "broker_start_port" if gateway.broker_start_port else "broker_count"),
                gateway.host,
                first,
                first + gateway.broker_count - 1,
            ),
        ]
    raw_metrics = data.get("metrics")
    metrics = _valid(MetricsConfig, {} if raw_metrics is None else raw_metrics)
    if "metrics" in data and metrics is not None and metrics.enabled:
        port = metrics.port
        listeners.append(("the metrics endpoint", ("metrics", "port"), metrics.host, port, port))
    return listeners


def _service_listeners(services: Sequence[Any]) -> list[Listener]:
    listeners: list[Listener] = []
    for index, settings in enumerate(services):
        declared = getattr(settings, "listeners", None)
        if settings is None or not callable(declared):
            continue
        for name, host, port in declared():
            listeners.append((f"services[{index}] {name}", ("services", index), host, port, port))
    return listeners


def _overlap(first_host: str, second_host: str) -> bool:
    return first_host == second_host or first_host in _WILDCARDS or second_host in _WILDCARDS


def listener_conflicts(listeners: Sequence[Listener]) -> list[Problem]:
    """A problem for each listener whose ports another one of the same process already takes
    (port 0, a free port picked at start, never conflicts)."""
    problems: list[Problem] = []
    for later, (name, loc, host, first, last) in enumerate(listeners):
        if first == 0:
            continue
        for taken, _, taken_host, taken_first, taken_last in listeners[:later]:
            in_range = taken_first != 0 and first <= taken_last and taken_first <= last
            if in_range and _overlap(host, taken_host):
                ports = f"port {first}" if first == last else f"ports {first}-{last}"
                problems.append(
                    (
                        loc,
                        f"{name} ({ports}) would listen where {taken} already does: "
                        "give one of them other ports",
                    )
                )
                break
    return problems
