"""One YAML config file, interpolated from the environment and validated into typed models.

Every problem is reported with the file, the line, the path inside the file (for example
``virtual_clusters[0].filters[1].type``), what is wrong and what would be valid. All problems of a
file are collected before raising, so one ``bergstream config check`` shows them all. Given the
plugin registry, the loader also resolves every ``{type, config}`` choice of the file, however
deep (:mod:`bergstream.core.choices`), and validates the sections plugins define
(:mod:`bergstream.core.sections`): what loads here is what ``bergstream run`` accepts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from bergstream.core.choices import ChoiceResolver, FilterChoice, ServiceChoice
from bergstream.core.config_checks import cross_checks
from bergstream.core.config_source import decode_source, read_yaml
from bergstream.core.kafka_client import KafkaClientSettings
from bergstream.core.lake import LakeConfig, LakeConfigError, resolve_lake
from bergstream.core.models import Bootstrap, StrictModel, is_host
from bergstream.core.plugins import PluginError
from bergstream.core.problems import Loc, Problem, format_loc, pydantic_problems
from bergstream.core.sections import check_sections
from bergstream.core.table_modes import TablesSettings
from bergstream.core.typed.codecs_config import CodecsSettings, check_codecs, check_codecs_data

if TYPE_CHECKING:
    from bergstream.core.plugins import PluginRegistry

_VAR = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config file."""

    file: str
    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}" + (f":{self.column}" if self.column else "")
        return f"{where}: {self.path or '<root>'}: {self.message}"

    def as_json(self) -> dict[str, Any]:
        """The problem as ``config check --json`` prints it."""
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "message": self.message,
        }


class ConfigError(Exception):
    """A config file failed to load; ``problems`` lists every problem found."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


#: What a plugin's factory raises when it cannot work with its settings (``bergstream run`` and
#: ``config check`` report them as problems of the file, not tracebacks).
SETUP_ERRORS: tuple[type[BaseException], ...] = (PluginError, OSError, ValueError, RuntimeError)


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
    kafka_client: KafkaClientSettings = Field(
        default_factory=KafkaClientSettings,
        description="how the proxy reaches the brokers (librdkafka key names): its TLS settings "
        "apply to every upstream connection; its SASL identity to the proxy's own connections, "
        "while clients authenticate through the proxy with their own credentials",
    )

    @model_validator(mode="after")
    def _one_tls_block(self) -> TargetClusterConfig:
        if self.tls is not None and self.kafka_client.uses_tls:
            raise ValueError(
                "both tls and kafka_client (security.protocol "
                f"{self.kafka_client.security_protocol}) say how to speak TLS to the brokers: "
                "keep kafka_client and remove tls"
            )
        return self

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

    @field_validator("host", "advertised_host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return None if value is None else check_listen_host(value)

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


class VirtualClusterConfig(StrictModel):
    """One virtual cluster: what clients connect to, what it fronts, which filters it runs."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="name used in logs and metrics")
    target: TargetClusterConfig
    gateway: GatewayConfig
    filters: list[FilterChoice] = Field(default_factory=list)
    max_frame_bytes: int = Field(
        104_857_600, ge=1024, description="larger client frames close the connection"
    )
    upstream_timeout_seconds: float = Field(
        30.0, gt=0, description="time to connect to a broker before the client is dropped"
    )


def check_listen_host(value: str) -> str:
    """Validate an address to listen on: an IPv4/IPv6 address or a DNS host name."""
    if not is_host(value):
        raise ValueError(
            f"'{value}' is not an IP address or host name: use e.g. 127.0.0.1 (this machine "
            "only), 0.0.0.0 (every interface) or ::1"
        )
    return value.strip("[]")


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
    services: list[ServiceChoice] = Field(default_factory=list)
    lake: LakeConfig | None = Field(
        None, description="the Iceberg coldset and the pipeline that fills it (see core/lake.py)"
    )
    metrics: MetricsConfig | None = Field(
        None, description="the Prometheus endpoint of bergstream run; none when unset"
    )
    logging: LoggingConfig = Field(
        default_factory=LoggingConfig, description="log format and level of bergstream run"
    )
    codecs: CodecsSettings = Field(
        default_factory=CodecsSettings,
        description="which topics' values and keys become typed columns, and the Schema Registry",
    )
    tables: TablesSettings = Field(
        default_factory=TablesSettings,
        description="which topics' tables hold a current state (upsert, debezium) besides the log",
    )
    source: str = Field("<memory>", exclude=True, description="(internal) where it was loaded from")
    sections: dict[str, Any] = Field(
        default_factory=dict,
        exclude=True,
        description="(internal) the settings of each plugin-defined section (lake.pipeline, ...) "
        "by dotted path, as the loader validated them; empty without a registry",
    )

    lines: dict[str, int] = Field(
        default_factory=dict,
        exclude=True,
        description="(internal) the line of each path of the file (``virtual_clusters[0]``)",
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_section_keys(cls, data: Any) -> Any:
        # A bare ``metrics:`` line (YAML null) means the endpoint with every default; so does a
        # bare ``logging:`` etc., and a bare ``lake:`` then asks for the lake's required keys.
        if isinstance(data, dict):
            return {
                key: _EMPTY_SECTIONS[key]() if value is None and key in _EMPTY_SECTIONS else value
                for key, value in data.items()
            }
        return data

    def problem_at(self, path: str, error: BaseException) -> ConfigProblem:
        """``error`` (a plugin refusing its settings) as a problem of this file at ``path``."""
        message = str(error).removeprefix(f"{self.source}: ")
        return ConfigProblem(self.source, path, message, self.line_of(path))

    def line_of(self, path: str) -> int | None:
        """The line of ``path`` (``virtual_clusters[0].filters[1]``) in the file, or of its
        nearest enclosing key."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[: max(path.rfind("."), path.rfind("["), 0)]
        return None


_EMPTY_SECTIONS: dict[str, type] = {
    "metrics": dict,
    "logging": dict,
    "codecs": dict,
    "tables": dict,
    "lake": dict,
    "virtual_clusters": list,
    "services": list,
}


# --------------------------------------------------------------------------- loading


def interpolate(value: Any, env: Mapping[str, str], loc: Loc, problems: list[Problem]) -> Any:
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


def _line_for(loc: Loc, lines: Mapping[Loc, int]) -> int | None:
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


def _lake_problems(data: dict[str, Any]) -> list[Problem]:
    """What :func:`~bergstream.core.lake.resolve_lake` (run by every user of the lake) refuses,
    when the ``lake:`` section validates by itself."""
    raw = data.get("lake")
    if not isinstance(raw, dict):
        return []
    try:
        lake = LakeConfig.model_validate(raw)
    except ValidationError:
        return []
    try:
        resolve_lake(lake)
    except LakeConfigError as error:
        return [(tuple(error.path.split(".")), str(error))]
    return []


def _plugin_problems(
    data: dict[str, Any], config: BergstreamConfig | None, registry: PluginRegistry
) -> list[Problem]:
    """Resolve every plugin choice and plugin-defined section of the file against ``registry``,
    attaching their settings to ``config``. Works from the raw ``data`` where the file did not
    validate, so plugin problems show up together with the others."""
    resolver = ChoiceResolver(registry)
    if config is not None:
        resolver.resolve_tree(config, ())
    else:
        resolver.check_raw(BergstreamConfig, data, ())
        resolver.problems.extend(check_codecs_data(data.get("codecs"), registry))
    sections, problems = check_sections(BergstreamConfig, data, registry)
    for name, settings in sections.items():
        resolver.resolve_tree(settings, tuple(name.split(".")))
    if config is not None:
        object.__setattr__(config, "sections", sections)
        problems = [*problems, *check_codecs(config.codecs, registry)]
    return [*resolver.problems, *problems]


def parse_config(
    text: str,
    *,
    source: str = "<memory>",
    registry: PluginRegistry | None = None,
    env: Mapping[str, str] | None = None,
) -> BergstreamConfig:
    """Parse, interpolate and validate config ``text``; raise :class:`ConfigError` listing every
    problem of the file at once (YAML, variables, fields, cross-key checks, plugins).

    With a ``registry``, every ``{type, config}`` choice of the file (``filters[]``,
    ``services[]`` and those inside plugin settings) is resolved and its ``config`` validated
    against the chosen plugin's model (stored on the choice's ``settings``), and every section a
    plugin defines is validated (stored in ``config.sections``).
    """
    parsed = read_yaml(text)
    early = [
        ConfigProblem(source, format_loc(p.loc), p.message, p.line, p.column)
        for p in parsed.problems
    ]
    if parsed.data is None:
        raise ConfigError(early)
    if not isinstance(parsed.data, dict):
        raise ConfigError(
            [ConfigProblem(source, "", "the file must hold a mapping of keys at top level", 1)]
        )
    lines = parsed.lines
    unset: list[Problem] = []
    data = interpolate(parsed.data, os.environ if env is None else env, (), unset)
    found: list[Problem] = []

    config: BergstreamConfig | None = None
    try:
        config = BergstreamConfig.model_validate(
            {**data, "source": source, "lines": {format_loc(loc): n for loc, n in lines.items()}}
        )
    except ValidationError as error:
        found += pydantic_problems(error)
    found += _lake_problems(data)
    if registry is not None:
        found += _plugin_problems(data, config, registry)
    services = [getattr(c, "settings", None) for c in config.services] if config else []
    found += cross_checks(data, services)
    # A value still holding an unset ${VAR} is reported as such, not as what it fails to be.
    found = [*unset, *(p for p in found if not _under(p[0], unset))]
    problems = early + [
        ConfigProblem(source, format_loc(loc), msg, _line_for(loc, lines)) for loc, msg in found
    ]
    if problems:
        raise ConfigError(problems)
    assert config is not None
    return config


def _under(loc: Loc, problems: list[Problem]) -> bool:
    return any(loc[: len(other)] == other for other, _ in problems)


def load_config(
    path: str | os.PathLike[str],
    *,
    registry: PluginRegistry | None = None,
    env: Mapping[str, str] | None = None,
) -> BergstreamConfig:
    """Read and validate the config file at ``path`` (see :func:`parse_config`)."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as error:
        raise ConfigError(
            [ConfigProblem(str(file), "", f"cannot read the file: {error.strerror}")]
        ) from None
    text, problem = decode_source(raw)
    if problem is not None:
        raise ConfigError(
            [ConfigProblem(str(file), "", problem.message, problem.line, problem.column)]
        )
    assert text is not None
    return parse_config(text, source=str(file), registry=registry, env=env)
