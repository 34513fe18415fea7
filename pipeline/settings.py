"""The pipeline's own settings: ``lake.pipeline`` and ``lake.maintenance``.

Core keeps both sections as raw mappings; the pipeline registers these models for them
(``register_config_sections`` in :mod:`bergstream.pipeline.plugin`), so ``bergstream config
check`` and ``bergstream run`` validate them like any other key. :func:`resolve_pipeline_lake` adds
them, with the checkpoint directory's default, to the lake core resolves. Nothing here imports
pyspark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from bergstream.core.api import (
    BergstreamConfig,
    LakeConfig,
    ResolvedLake,
    StrictModel,
    bergstream_home,
    resolve_lake,
)
from bergstream.pipeline.topics import compile_topic_pattern

__all__ = [
    "DEFAULT_MASTER",
    "MAINTENANCE_SECTION",
    "PIPELINE_SECTION",
    "LakeMaintenanceConfig",
    "LakePipelineConfig",
    "PipelineLake",
    "check_master",
    "cluster_warnings",
    "is_local_master",
    "pipeline_lake",
    "resolve_pipeline_lake",
]

#: Dotted paths of the sections the pipeline defines.
PIPELINE_SECTION = "lake.pipeline"
MAINTENANCE_SECTION = "lake.maintenance"

#: Spark master of a pipeline that names none: in process, two cores.
DEFAULT_MASTER = "local[2]"
_LOCAL = re.compile(r"local\[(\d+|\*)(,\d+)?\]|local-cluster\[\d+,\d+,\d+\]")


class LakePipelineConfig(StrictModel):
    """How ``bergstream pipeline run`` reads Kafka (``lake.pipeline``)."""

    trigger_interval_seconds: float = Field(
        10.0, gt=0, description="micro-batch interval when running continuously"
    )
    checkpoint_dir: Path | None = Field(
        None, description="Spark checkpoints (default $BERGSTREAM_HOME/lake/checkpoints)"
    )
    max_offsets_per_trigger: int | None = Field(
        None, ge=1, description="cap on records per micro-batch, all partitions together"
    )
    fail_on_data_loss: bool = Field(
        True, description="stop when Kafka deleted records before they were copied"
    )
    kafka_options: dict[str, str] = Field(
        default_factory=dict,
        description="more Java Kafka client settings over lake.kafka_client's (client.id, ...)",
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="more Spark settings (spark.driver.memory, ...)"
    )
    class_data_sharing: bool = Field(
        True,
        description="the driver's JVM maps a class archive written by the first start under "
        "$BERGSTREAM_CACHE/class-archives (starts in about half the CPU)",
    )
    master: str = Field(
        DEFAULT_MASTER,
        description="Spark master: local[N], spark://host:port, yarn, k8s://https://host:port, "
        "... (client mode: the driver runs in bergstream)",
    )
    topic: list[str] = Field(
        default_factory=list,
        description="topics `pipeline run` copies when no --topic or --topics is given",
    )
    topics: str | None = Field(
        None,
        description="regular expression: `pipeline run` also copies every topic whose whole name "
        "it matches (internal topics never), new ones included, when no --topic or --topics "
        "is given",
    )
    topics_refresh_seconds: float = Field(
        30.0, gt=0, description="how often a pattern is matched again against Kafka's topics"
    )
    topic_retry_seconds: float = Field(
        10.0,
        gt=0,
        description="wait before a failed topic's copy starts again (doubled after each "
        "failure in a row, up to topic_retry_max_seconds); the other topics go on meanwhile",
    )
    topic_retry_max_seconds: float = Field(
        300.0, gt=0, description="the longest wait before a failed topic starts again"
    )
    topic_attempts: int = Field(
        3, ge=1, description="attempts per topic of a --once run before it is reported failed"
    )
    group_topics: bool = Field(
        True,
        description="copy the raw append topics of a run (no codecs: rule, mode append) in one "
        "streaming query: one Kafka read and one write job per micro-batch for all of them, "
        "one commit per table; false: one query per topic",
    )

    @field_validator("topics")
    @classmethod
    def _check_topics(cls, value: str | None) -> str | None:
        if value is not None:
            compile_topic_pattern(value)
        return value

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: list[str]) -> list[str]:
        if any(not name for name in value):
            raise ValueError("a topic name is empty")
        return value

    @field_validator("master")
    @classmethod
    def _check_master(cls, value: str) -> str:
        return check_master(value)

    @model_validator(mode="after")
    def _one_master(self) -> LakePipelineConfig:
        other = self.spark_conf.get("spark.master")
        if other is not None and "master" in self.model_fields_set and other != self.master:
            raise ValueError(
                f"two Spark masters: master is {self.master!r} but spark_conf has spark.master "
                f"{other!r}; set it once, as lake.pipeline.master"
            )
        if other is not None:
            check_master(other)
        return self

    @property
    def spark_master(self) -> str:
        """The master the session starts with: ``master``, or ``spark_conf``'s
        ``spark.master`` where only that is set."""
        if "master" not in self.model_fields_set:
            return self.spark_conf.get("spark.master", self.master)
        return self.master


def check_master(master: str) -> str:
    """``master`` if it looks like a Spark master URL, else ValueError saying what is wrong.

    Only the mistakes Spark would report late or obscurely are refused (blank, spaces, a
    ``spark://`` URL without ``host:port``, a ``k8s://`` URL without the API server); any other
    value goes to Spark, which knows its cluster managers (and plugged-in ones)."""
    text = master.strip()
    if not text or text != master or any(c.isspace() for c in text):
        raise ValueError(
            f"Spark master {master!r} is blank or has spaces: give e.g. local[2], "
            "spark://host:7077, yarn or k8s://https://host:6443"
        )
    if text.startswith("spark://"):
        for address in text.removeprefix("spark://").split(","):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"Spark master {master!r}: each standalone master must be host:port, e.g. "
                    "spark://host:7077 (or spark://host1:7077,host2:7077 with standby masters)"
                )
    elif text.startswith("k8s://") and len(text) == len("k8s://"):
        raise ValueError(
            f"Spark master {master!r} names no Kubernetes API server: k8s://https://host:6443"
        )
    elif "://" not in text and not (text in {"local", "yarn"} or _LOCAL.fullmatch(text)):
        raise ValueError(
            f"Spark master {master!r} is not one Spark knows: local, local[N], local[*], "
            "local[N,F], spark://host:port, yarn, k8s://https://host:port"
        )
    return text


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs every executor inside the driver's JVM (local, local[...])."""
    return master == "local" or master.startswith("local[")


class LakeMaintenanceConfig(StrictModel):
    """What ``bergstream pipeline maintain`` does (``lake.maintenance``)."""

    target_file_size_bytes: int = Field(
        134_217_728, ge=1_048_576, description="compaction target size of a data file"
    )
    min_input_files: int = Field(
        2, ge=1, description="compact a partition only when it has this many small files"
    )
    snapshot_retention_hours: float = Field(
        120.0, ge=0, description="expire snapshots older than this"
    )
    retain_last: int = Field(5, ge=1, description="always keep this many recent snapshots")
    orphan_min_age_hours: float = Field(
        72.0,
        ge=0,
        description="delete unreferenced files only when older than this (protects writes "
        "in flight)",
    )


@dataclass(frozen=True)
class PipelineLake(ResolvedLake):
    """A resolved lake with the pipeline's settings and its absolute checkpoint directory."""

    pipeline: LakePipelineConfig
    maintenance: LakeMaintenanceConfig
    checkpoint_dir: Path


def resolve_pipeline_lake(
    config: LakeConfig,
    home: Path | str | None = None,
    *,
    pipeline: LakePipelineConfig | None = None,
    maintenance: LakeMaintenanceConfig | None = None,
) -> PipelineLake:
    """:func:`~bergstream.core.api.resolve_lake` plus the pipeline's settings: ``pipeline``
    and ``maintenance`` as the config loader validated them, else validated here from the
    lake's raw sections (a lake built in code). Checkpoints default to
    ``$BERGSTREAM_HOME/lake/checkpoints`` (``home`` as in ``resolve_lake``)."""
    lake = resolve_lake(config, home)
    # Sections plugins define are the lake's extra keys (absent when the file leaves them out).
    sections = config.model_extra or {}
    if pipeline is None:
        pipeline = LakePipelineConfig.model_validate(sections.get("pipeline", {}))
    if maintenance is None:
        maintenance = LakeMaintenanceConfig.model_validate(sections.get("maintenance", {}))
    checkpoints = pipeline.checkpoint_dir or bergstream_home(home) / "lake" / "checkpoints"
    return PipelineLake(
        **{item.name: getattr(lake, item.name) for item in fields(ResolvedLake)},
        pipeline=pipeline,
        maintenance=maintenance,
        checkpoint_dir=Path(checkpoints).expanduser().resolve(),
    )


def pipeline_lake(config: BergstreamConfig, home: Path | str | None = None) -> PipelineLake:
    """The pipeline's lake of a loaded config file (which must have a ``lake:`` section), with
    the sections the loader validated."""
    if config.lake is None:
        raise ValueError(f"{config.source}: there is no lake: section")
    return resolve_pipeline_lake(
        config.lake,
        home,
        pipeline=config.sections.get(PIPELINE_SECTION),
        maintenance=config.sections.get(MAINTENANCE_SECTION),
    )


def _loopback(host: str) -> bool:
    host = host.strip().strip("[]").lower()
    return host in {"localhost", "::1", "0.0.0.0"} or host.startswith("127.")


def _host_of(url: str) -> str:
    """The host of ``host:port`` or ``scheme://host:port/...``."""
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    if rest.startswith("["):
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0] if rest.count(":") == 1 else rest


def cluster_warnings(lake: PipelineLake, master: str) -> list[str]:
    """What executors on other machines than the driver could not reach, for a pipeline on
    ``master``: a local warehouse directory, Kafka or S3 at a loopback address. None for a local
    master, nor where these are fine: a cluster whose workers all run on this machine."""
    if is_local_master(master):
        return []
    where = f"on Spark master {master} executors"
    warnings = []
    if lake.warehouse is not None and lake.warehouse.startswith("file://"):
        warnings.append(
            f"warning: the warehouse {lake.warehouse} is a local directory: {where} write the "
            "table's data files there, so every worker must see it at that path (a shared "
            "filesystem) unless all run on this machine; or use an s3:// warehouse"
        )
    loopback = [
        address
        for address in lake.config.kafka_bootstrap.split(",")
        if address.strip() and _loopback(_host_of(address))
    ]
    if loopback:
        warnings.append(
            f"warning: lake.kafka_bootstrap {','.join(loopback)} is a loopback address: {where} "
            "on other machines cannot reach Kafka there; give an address they can reach"
        )
    if lake.s3 is not None and lake.s3.endpoint and _loopback(_host_of(lake.s3.endpoint)):
        warnings.append(
            f"warning: lake.s3.endpoint {lake.s3.endpoint} is a loopback address: {where} on "
            "other machines cannot write data files there; give an address they can reach"
        )
    return warnings
