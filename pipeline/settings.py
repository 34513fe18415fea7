"""The pipeline's own settings: ``lake.pipeline`` and ``lake.maintenance``.

Core keeps both sections as raw mappings; the pipeline registers these models for them
(``register_config_sections`` in :mod:`bergstream.pipeline.plugin`), so ``bergstream config
check`` and ``bergstream run`` validate them like any other key. :func:`resolve_pipeline_lake` adds
them, with the checkpoint directory's default, to the lake core resolves. Nothing here imports
pyspark.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from pydantic import Field

from bergstream.core.api import (
    BergstreamConfig,
    LakeConfig,
    ResolvedLake,
    StrictModel,
    bergstream_home,
    resolve_lake,
)

__all__ = [
    "MAINTENANCE_SECTION",
    "PIPELINE_SECTION",
    "LakeMaintenanceConfig",
    "LakePipelineConfig",
    "PipelineLake",
    "pipeline_lake",
    "resolve_pipeline_lake",
]

#: Dotted paths of the sections the pipeline defines.
PIPELINE_SECTION = "lake.pipeline"
MAINTENANCE_SECTION = "lake.maintenance"


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
    if pipeline is None:
        pipeline = LakePipelineConfig.model_validate(config.pipeline)
    if maintenance is None:
        maintenance = LakeMaintenanceConfig.model_validate(config.maintenance)
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
