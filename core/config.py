"""One YAML config file, interpolated from the environment and validated into typed models.

Every problem is reported with the file, the line, the path inside the file (for example
``virtual_clusters[0].filters[1].type``), what is wrong and what would be valid. All problems of a
file are collected before raising, so one ``bergstream config check`` shows them all.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from bergstream.core.lake import LakeConfig
from bergstream.core.models import Bootstrap, StrictModel

if TYPE_CHECKING:
    from bergstream.core.plugins import PluginRegistry
    from bergstream.core.registrations import Registration

Loc = tuple[str | int, ...]

_VAR = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config file."""

    file: str
    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path or '<root>'}: {self.message}"


class ConfigError(Exception):
    """A config file failed to load; ``problems`` lists every problem found."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def format_loc(loc: Loc) -> str:
    """Render a location tuple as ``a.b[0].c``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


# --------------------------------------------------------------------------- models


class ClientTlsConfig(StrictModel):
    """TLS from the proxy toward the target cluster."""

    ca_file: Path | None = Field(
        None, description="CA bundle to verify brokers; system CAs if unset"
    )
    cert_file: Path | None = Field(None, description="client certificate for mutual TLS")
    key_file: Path | None = Field(None, description="private key of cert_file")
    check_hostname: bool = Field(True, description="verify the broker certificate's host name")


class ServerTlsConfig(StrictModel):
    """TLS from clients toward the proxy."""

    cert_file: Path = Field(description="certificate (chain) the proxy presents to clients")
    key_file: Path = Field(description="private key of cert_file")
    ca_file: Path | None = Field(None, description="if set, clients must present a cert it signed")


class TargetClusterConfig(StrictModel):
    """The real Kafka cluster behind a virtual cluster."""

    bootstrap: Bootstrap = Field(description="comma-separated host:port list of the real cluster")
    tls: ClientTlsConfig | None = Field(None, description="TLS toward the brokers; plain if unset")

    def addresses(self) -> list[tuple[str, int]]:
        """The bootstrap list as (host, port) pairs."""
        pairs = []
        for part in self.bootstrap.split(","):
            host, _, port = part.strip().rpartition(":")
            pairs.append((host.strip("[]"), int(port)))
        return pairs


class GatewayConfig(StrictModel):
    """Port-per-broker gateway: a bootstrap port, then one port per broker node id."""

    host: str = Field("127.0.0.1", description="address the proxy listens on")
    port: int = Field(ge=1, le=65535, description="bootstrap port clients connect to")
    advertised_host: str | None = Field(
        None, description="host name put in Metadata responses; defaults to host"
    )
    broker_start_port: int | None = Field(
        None, ge=1, le=65535, description="port of the lowest broker id; defaults to port + 1"
    )
    lowest_broker_id: int = Field(0, ge=0, description="node id served on broker_start_port")
    broker_count: int = Field(3, ge=1, le=1024, description="how many broker ports to open")
    tls: ServerTlsConfig | None = Field(None, description="TLS toward clients; plain if unset")

    def first_broker_port(self) -> int:
        """Port of node ``lowest_broker_id``."""
        return self.broker_start_port if self.broker_start_port is not None else self.port + 1

    def broker_port(self, node_id: int) -> int | None:
        """The proxy port serving ``node_id``, or None when it falls outside the port range."""
        index = node_id - self.lowest_broker_id
        if 0 <= index < self.broker_count:
            return self.first_broker_port() + index
        return None

    @model_validator(mode="after")
    def _ports_fit(self) -> GatewayConfig:
        last = self.first_broker_port() + self.broker_count - 1
        if last > 65535:
            raise ValueError(f"broker ports run to {last}, past 65535: lower port or broker_count")
        if self.first_broker_port() <= self.port <= last:
            raise ValueError(
                f"bootstrap port {self.port} overlaps the broker ports "
                f"{self.first_broker_port()}-{last}: set broker_start_port"
            )
        return self


class PluginInstanceConfig(StrictModel):
    """A plugin chosen by ``type`` with its own ``config`` block."""

    type: str = Field(description="registered name of the plugin")
    config: dict[str, Any] = Field(default_factory=dict, description="the plugin's own settings")
    settings: Any = Field(None, exclude=True, description="(internal) the validated config model")


class VirtualClusterConfig(StrictModel):
    """One virtual cluster: what clients connect to, what it fronts, which filters it runs."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="name used in logs and metrics")
    target: TargetClusterConfig
    gateway: GatewayConfig
    filters: list[PluginInstanceConfig] = Field(default_factory=list)
    max_frame_bytes: int = Field(
        104_857_600, ge=1024, description="larger client frames close the connection"
    )
    upstream_timeout_seconds: float = Field(
        30.0, gt=0, description="time to connect to a broker before the client is dropped"
    )


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_listen_host(value: str) -> str:
    """Validate an address to listen on: an IPv4/IPv6 address or a DNS host name."""
    text = value.strip("[]")
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if not text or len(text) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise ValueError(
            f"'{value}' is not an IP address or host name: use e.g. 127.0.0.1 (this machine "
            "only), 0.0.0.0 (every interface) or ::1"
        )
    return text


class MetricsConfig(StrictModel):
    """The Prometheus endpoint ``bergstream run`` serves (``GET /metrics``)."""

    enabled: bool = Field(True, description="serve the endpoint; false keeps the section but off")
    host: str = Field("127.0.0.1", description="address the endpoint listens on")
    port: int = Field(9464, ge=0, le=65535, description="port of the endpoint; 0 picks a free port")

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_listen_host(value)

    def url(self, port: int | None = None) -> str:
        """``http://host:port/metrics`` (with ``port`` instead of the configured one if given)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}/metrics"


class LoggingConfig(StrictModel):
    """How ``bergstream run`` writes its log (to stderr)."""

    format: Literal["text", "json"] = Field(
        "text", description="text lines for people or JSON lines for log pipelines"
    )
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="lowest level written; -v on the command line means debug"
    )


class BergstreamConfig(StrictModel):
    """The whole config file."""

    virtual_clusters: list[VirtualClusterConfig] = Field(default_factory=list)
    services: list[PluginInstanceConfig] = Field(default_factory=list)
    lake: LakeConfig | None = Field(
        None, description="the Iceberg coldset and the pipeline that fills it (see core/lake.py)"
    )
    metrics: MetricsConfig | None = Field(
        None, description="the Prometheus endpoint of bergstream run; none when unset"
    )
    logging: LoggingConfig = Field(
        default_factory=LoggingConfig, description="log format and level of bergstream run"
    )
    source: str = Field("<memory>", exclude=True, description="(internal) where it was loaded from")

    @model_validator(mode="before")
    @classmethod
    def _bare_metrics_key(cls, data: Any) -> Any:
        # A bare ``metrics:`` line (YAML null) means the endpoint with every default.
        if isinstance(data, dict) and "metrics" in data and data["metrics"] is None:
            return {**data, "metrics": {}}
        return data

    @model_validator(mode="after")
    def _unique_cluster_names(self) -> BergstreamConfig:
        seen: set[str] = set()
        for cluster in self.virtual_clusters:
            if cluster.name in seen:
                raise ValueError(f"virtual cluster name '{cluster.name}' is used twice")
            seen.add(cluster.name)
        return self


# --------------------------------------------------------------------------- loading


def interpolate(
    value: Any, env: Mapping[str, str], loc: Loc, problems: list[tuple[Loc, str]]
) -> Any:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in strings; ``$${`` is a literal ``${``."""
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            escaped, name, default = match.groups()
            if escaped:
                return match.group(0)[1:]
            if name in env and (env[name] != "" or default is None):
                return env[name]
            if default is not None:
                return default
            problems.append(
                (
                    loc,
                    f"environment variable {name} is not set: set it, or write "
                    f"${{{name}:-default}} to give a default",
                )
            )
            return match.group(0)

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, env, (*loc, str(k)), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, (*loc, i), problems) for i, v in enumerate(value)]
    return value


def _construct(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> Any:
    """Build plain Python data from a YAML node tree, noting the line of every location."""
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(yaml.safe_load(yaml.serialize(key_node)))
            out[key] = _construct(value_node, (*loc, key), lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(child, (*loc, i), lines) for i, child in enumerate(node.value)]
    # The composer already resolved the scalar's tag; construct it directly (re-serializing
    # a bare null, as in ``metrics:``, yields a document YAML cannot parse back).
    return yaml.SafeLoader("").construct_object(node, deep=True)


def _line_for(loc: Loc, lines: Mapping[Loc, int]) -> int | None:
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


def _pydantic_problems(error: ValidationError, prefix: Loc = ()) -> list[tuple[Loc, str]]:
    out = []
    for item in error.errors():
        loc = (*prefix, *item["loc"])
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key: remove it or check its spelling"
        elif item["type"] == "missing":
            message = "required key is missing"
        elif "input" in item and item["type"] not in ("model_type", "dict_type"):
            message = f"{message} (got {item['input']!r})"
        out.append((loc, message))
    return out


def _plugin_sections(data: Mapping[str, Any]) -> list[tuple[Loc, Mapping[str, Any], str]]:
    """Every ``{type, config}`` block of the raw data, with its location and plugin kind."""
    sections: list[tuple[Loc, Mapping[str, Any], str]] = []
    clusters = data.get("virtual_clusters")
    for ci, cluster in enumerate(clusters if isinstance(clusters, list) else []):
        filters = cluster.get("filters") if isinstance(cluster, dict) else None
        for fi, block in enumerate(filters if isinstance(filters, list) else []):
            sections.append((("virtual_clusters", ci, "filters", fi), block, "filter"))
    services = data.get("services")
    for si, block in enumerate(services if isinstance(services, list) else []):
        sections.append((("services", si), block, "service"))
    return [(loc, block, kind) for loc, block, kind in sections if isinstance(block, dict)]


def _validate_plugins(
    data: Mapping[str, Any], registry: PluginRegistry
) -> tuple[dict[Loc, BaseModel], list[tuple[Loc, str]]]:
    """Resolve each plugin ``type`` and validate its ``config``; works on raw data so plugin
    problems are reported even when the rest of the file has problems too."""
    settings: dict[Loc, BaseModel] = {}
    problems: list[tuple[Loc, str]] = []
    for loc, block, kind in _plugin_sections(data):
        name = block.get("type")
        if not isinstance(name, str):
            continue  # the model validation reports a missing or non-string type
        registered: dict[str, Registration] = registry.registrations(kind)
        registration = registered.get(name)
        if registration is None:
            names = ", ".join(sorted(registered)) or "none"
            problems.append(
                (
                    (*loc, "type"),
                    f"no {kind} plugin named '{name}' is installed; installed {kind}s: {names}",
                )
            )
            continue
        try:
            settings[loc] = registration.config_model.model_validate(block.get("config") or {})
        except ValidationError as error:
            problems.extend(_pydantic_problems(error, (*loc, "config")))
    return settings, problems


def _attach_settings(config: BergstreamConfig, settings: Mapping[Loc, BaseModel]) -> None:
    for ci, cluster in enumerate(config.virtual_clusters):
        for fi, instance in enumerate(cluster.filters):
            object.__setattr__(
                instance, "settings", settings[("virtual_clusters", ci, "filters", fi)]
            )
    for si, instance in enumerate(config.services):
        object.__setattr__(instance, "settings", settings[("services", si)])


def parse_config(
    text: str,
    *,
    source: str = "<memory>",
    registry: PluginRegistry | None = None,
    env: Mapping[str, str] | None = None,
) -> BergstreamConfig:
    """Parse, interpolate and validate config ``text``; raise :class:`ConfigError` on problems.

    With a ``registry``, every plugin ``type`` is resolved and its ``config`` block validated
    against the plugin's config model (stored on ``instance.settings``).
    """
    lines: dict[Loc, int] = {}
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        raise ConfigError(
            [
                ConfigProblem(
                    source,
                    "",
                    f"not valid YAML: {error}",
                    mark.line + 1 if mark is not None else None,
                )
            ]
        ) from None
    raw = {} if node is None else _construct(node, (), lines)
    if not isinstance(raw, dict):
        raise ConfigError(
            [ConfigProblem(source, "", "the file must hold a mapping at top level", 1)]
        )

    found: list[tuple[Loc, str]] = []
    data = interpolate(raw, os.environ if env is None else env, (), found)

    config: BergstreamConfig | None = None
    if not found:
        try:
            config = BergstreamConfig.model_validate({**data, "source": source})
        except ValidationError as error:
            found.extend(_pydantic_problems(error))
        if registry is not None:
            settings, plugin_problems = _validate_plugins(data, registry)
            found.extend(plugin_problems)
            if config is not None and not plugin_problems:
                _attach_settings(config, settings)
    if found:
        raise ConfigError(
            [
                ConfigProblem(source, format_loc(loc), msg, _line_for(loc, lines))
                for loc, msg in found
            ]
        )
    assert config is not None
    return config


def load_config(
    path: str | os.PathLike[str],
    *,
    registry: PluginRegistry | None = None,
    env: Mapping[str, str] | None = None,
) -> BergstreamConfig:
    """Read and validate the config file at ``path`` (see :func:`parse_config`)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            [ConfigProblem(str(file), "", f"cannot read the file: {error.strerror}")]
        ) from None
    return parse_config(text, source=str(file), registry=registry, env=env)
