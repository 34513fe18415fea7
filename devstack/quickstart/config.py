"""The quickstart's config file: ISK, a KSI virtual cluster, a lake and the topic's codecs, in one
YAML file.

It follows ``examples/typed.yaml`` (the isk, ksi and lake examples plus a ``codecs:`` section:
the topic's values are Avro of the stack's Schema Registry, typed columns everywhere) with every
value resolved (the stack's Kafka and registry addresses, ports, paths under
``$BERGSTREAM_HOME/quickstart``), so the file runs as is:
``bergstream run -c $BERGSTREAM_HOME/quickstart.yaml``.

Every section is typed here (:class:`QuickstartConfig` and the classes it is made of) without
importing a model: core's models are core's to change, and the ``ksi`` and ``isk`` settings and the
lake's ``pipeline`` section belong to plugins, whose models another plugin may not import. The
written file is then checked exactly as ``bergstream config check`` does
(:func:`write_checked_config`), so a key that core or a plugin no longer accepts stops the
quickstart, listing each problem, before anything is started on the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Generic, TypedDict, TypeVar

import yaml

from bergstream.core.api import (
    BergstreamConfig,
    ConfigError,
    PluginError,
    load_config,
    load_registry,
)

from .ports import PROXY_PORTS, QuickstartPorts

__all__ = [
    "ISK_ACCESS_KEY",
    "ISK_SECRET_KEY",
    "Choice",
    "CodecRuleSection",
    "CodecsSection",
    "GatewaySection",
    "IskHttpSettings",
    "IskSettings",
    "KsiSettings",
    "LakeCatalogSection",
    "LakeSection",
    "LocalCacheSettings",
    "PipelineSettings",
    "QuickstartConfig",
    "QuickstartConfigError",
    "SchemaRegistrySection",
    "SqliteIndexSettings",
    "TargetSection",
    "VirtualClusterSection",
    "check_config",
    "codecs_section",
    "isk_settings",
    "ksi_settings",
    "pipeline_settings",
    "quickstart_config",
    "write_checked_config",
    "write_config",
]

#: The demo key pair of ``examples/isk.yaml``: the root of the credentials vended to clients,
#: accepted as is by the S3 gateway (the operator's key; never vended itself).
ISK_ACCESS_KEY = "isk-demo"
ISK_SECRET_KEY = "isk-demo-secret"

SettingsT = TypeVar("SettingsT")


class QuickstartConfigError(ValueError):
    """The written config does not pass ``bergstream config check``; ``problems`` lists each."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            f"the config the quickstart wrote, {path}, does not pass `bergstream config check`:\n"
            + "\n".join(f"  {problem}" for problem in problems)
        )


class Choice(TypedDict, Generic[SettingsT]):
    """A ``{type, config}`` choice of a registered plugin (a filter, a service, a backend)."""

    type: str
    config: SettingsT


class KsiSettings(TypedDict):
    """The ``config`` of the ``ksi`` filter (keys of the ksi plugin's config model)."""

    topics: list[str]
    read_ahead_segments: int
    cache_max_bytes: int


class SqliteIndexSettings(TypedDict):
    """The ``config`` of the ``sqlite`` index backend."""

    path: str


class LocalCacheSettings(TypedDict):
    """The ``config`` of the ``local`` cache backend."""

    directory: str
    max_bytes: int


class IskHttpSettings(TypedDict):
    """ISK's ``http`` section: where the catalog and the S3 gateway listen, and the S3 keys."""

    catalog_host: str
    catalog_port: int
    s3_host: str
    s3_port: int
    region: str
    bucket: str
    access_key: str
    secret_key: str


class IskSettings(TypedDict):
    """The ``config`` of the ``isk`` service (keys of the isk plugin's config model)."""

    cluster: str
    kafka_bootstrap: str
    chunk_records: int
    http: IskHttpSettings
    index: Choice[SqliteIndexSettings]
    cache: Choice[LocalCacheSettings]


class PipelineSettings(TypedDict):
    """The lake's ``pipeline`` section (read by the lake pipeline)."""

    checkpoint_dir: str
    spark_conf: dict[str, str]


class TargetSection(TypedDict):
    """A virtual cluster's ``target``: the real Kafka cluster."""

    bootstrap: str


class GatewaySection(TypedDict):
    """A virtual cluster's ``gateway``: the bootstrap port, then one port per broker node id."""

    host: str
    port: int
    lowest_broker_id: int
    broker_count: int


class VirtualClusterSection(TypedDict):
    """The ``ksi`` virtual cluster: the stack's Kafka behind the KSI filter."""

    name: str
    target: TargetSection
    gateway: GatewaySection
    filters: list[Choice[KsiSettings]]


class LakeCatalogSection(TypedDict):
    """``lake.catalog``: the embedded SQL catalog and its warehouse directory."""

    type: str
    uri: str
    warehouse: str


class LakeSection(TypedDict):
    """The ``lake:`` section the pipeline fills and ISK and KSI read."""

    kafka_bootstrap: str
    namespace: str
    catalog: LakeCatalogSection
    pipeline: PipelineSettings


class SchemaRegistrySection(TypedDict):
    """``codecs.schema_registry``: where the Schema Registry's Confluent-compatible API is."""

    url: str


class CodecRuleSection(TypedDict):
    """One rule of ``codecs.topics``: the codecs of the topics ``match`` names."""

    match: str
    value: str
    key: str


class CodecsSection(TypedDict):
    """The ``codecs:`` section, read alike by the pipeline, ISK and KSI."""

    schema_registry: SchemaRegistrySection
    topics: list[CodecRuleSection]


class QuickstartConfig(TypedDict):
    """The whole file."""

    codecs: CodecsSection
    virtual_clusters: list[VirtualClusterSection]
    services: list[Choice[IskSettings]]
    lake: LakeSection


def codecs_section(registry_url: str, topic: str) -> CodecsSection:
    """``topic``'s values decoded by the codec of their registered schema's type (Avro here),
    the schemas read from the registry at ``registry_url``; keys stay bytes."""
    return {
        "schema_registry": {"url": registry_url},
        "topics": [{"match": topic, "value": "registry", "key": "raw"}],
    }


def ksi_settings(topic: str) -> KsiSettings:
    """KSI serving ``topic`` from the coldset, with a small read-ahead and a 256 MiB cache."""
    return {"topics": [topic], "read_ahead_segments": 2, "cache_max_bytes": 268_435_456}


def isk_settings(kafka_bootstrap: str, ports: QuickstartPorts, directory: Path) -> IskSettings:
    """ISK on the stack's Kafka, listening on ``ports``, with its index and cache in
    ``directory``."""
    return {
        "cluster": "local",
        "kafka_bootstrap": kafka_bootstrap,
        "chunk_records": 100_000,
        "http": {
            "catalog_host": "127.0.0.1",
            "catalog_port": ports.catalog,
            "s3_host": "127.0.0.1",
            "s3_port": ports.s3,
            "region": "us-east-1",
            "bucket": "bergstream",
            "access_key": ISK_ACCESS_KEY,
            "secret_key": ISK_SECRET_KEY,
        },
        "index": {"type": "sqlite", "config": {"path": str(directory / "index.sqlite")}},
        "cache": {
            "type": "local",
            "config": {"directory": str(directory / "cache"), "max_bytes": 2 * 1024**3},
        },
    }


def pipeline_settings(lake: Path) -> PipelineSettings:
    """Checkpoints under ``lake``; Spark kept small on purpose, as the quickstart runs on a
    laptop next to Kafka and ISK."""
    return {
        "checkpoint_dir": str(lake / "checkpoints"),
        "spark_conf": {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"},
    }


def quickstart_config(
    kafka_bootstrap: str, registry_url: str, topic: str, ports: QuickstartPorts, workdir: Path
) -> QuickstartConfig:
    """The config as a mapping: ``topic``'s codecs (values by the Schema Registry at
    ``registry_url``), the ``isk`` service, the ``ksi`` virtual cluster serving ``topic`` and the
    ``lake:`` section, with all state under ``workdir``."""
    lake = workdir / "lake"
    return {
        "codecs": codecs_section(registry_url, topic),
        "virtual_clusters": [
            {
                "name": "ksi",
                "target": {"bootstrap": kafka_bootstrap},
                "gateway": {
                    "host": "127.0.0.1",
                    "port": ports.proxy,
                    # The stack's single broker has node id 1; ports cover node ids 0, 1 and 2.
                    "lowest_broker_id": 0,
                    "broker_count": PROXY_PORTS - 1,
                },
                "filters": [{"type": "ksi", "config": ksi_settings(topic)}],
            }
        ],
        "services": [
            {"type": "isk", "config": isk_settings(kafka_bootstrap, ports, workdir / "isk")}
        ],
        "lake": {
            "kafka_bootstrap": kafka_bootstrap,
            "namespace": "coldset",
            "catalog": {
                "type": "sql",
                "uri": f"sqlite:///{lake / 'catalog.db'}",
                "warehouse": str(lake / "warehouse"),
            },
            "pipeline": pipeline_settings(lake),
        },
    }


def write_config(path: Path, config: Mapping[str, object]) -> Path:
    """Write ``config`` as YAML to ``path`` (with a header saying how to run it)."""
    header = (
        "# Written by `bergstream quickstart`: ISK (Iceberg REST catalog + S3 gateway), a KSI\n"
        "# virtual cluster, the lake the pipeline fills, and the topic's Avro values as typed\n"
        "# columns through the Schema Registry. Run it yourself with\n"
        f"#   bergstream run -c {path}\n"
        "# Every key is in docs/configuration.md.\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path


def check_config(path: Path) -> BergstreamConfig:
    """Validate the file at ``path`` against core's models and every installed plugin's, as
    ``bergstream config check`` does; raises :class:`QuickstartConfigError` listing each
    problem."""
    try:
        return load_config(path, registry=load_registry())
    except ConfigError as error:
        raise QuickstartConfigError(path, [str(problem) for problem in error.problems]) from None
    except PluginError as error:
        raise QuickstartConfigError(path, [str(error)]) from None


def write_checked_config(path: Path, config: Mapping[str, object]) -> BergstreamConfig:
    """Write ``config`` to ``path`` and check it (:func:`check_config`); returns the loaded
    config."""
    return check_config(write_config(path, config))
