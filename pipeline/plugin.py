"""The pipeline's plugin: its commands, added to ``bergstream`` through the ``register_commands``
hook (``pipeline run``, ``pipeline maintain`` and ``table describe``), and its config sections
``lake.pipeline`` and ``lake.maintenance`` (``register_config_sections``). Spark is imported only
when a command runs, so ``bergstream --help`` stays fast."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bergstream.core.api import (
    BergstreamConfig,
    ConfigError,
    ConfigSectionRegistration,
    LogComponent,
    PluginError,
    PluginRegistry,
    TableMode,
    bergstream_home,
    command_registry,
    hookimpl,
    load_config,
    mode_rule_for,
)
from bergstream.pipeline.settings import (
    MAINTENANCE_SECTION,
    PIPELINE_SECTION,
    LakeMaintenanceConfig,
    LakePipelineConfig,
    PipelineLake,
    pipeline_lake,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.core.api import MetricsServer

__all__ = ["register_commands", "register_config_sections"]

_CONFIG_OPTION = click.option(
    "-c",
    "--config",
    "config_file",
    required=True,
    type=click.Path(path_type=Path),
    help="Config file with a lake: section (see examples/lake.yaml).",
)
_TOPIC_OPTION = click.option("--topic", required=True, help="Kafka topic (its table is named so).")


def _config(config_file: Path) -> tuple[BergstreamConfig, PluginRegistry]:
    """``config_file`` loaded as ``bergstream config check`` and ``bergstream run`` load it
    (every plugin installed), so the three accept the same files; with the plugins."""
    try:
        registry = command_registry()
        return load_config(config_file, registry=registry), registry
    except (ConfigError, PluginError) as error:
        raise click.ClickException(str(error)) from None


def _lake(config_file: Path, config: BergstreamConfig | None = None) -> PipelineLake:
    """The lake of ``config_file`` (or of its already loaded ``config``)."""
    if config is None:
        config, _ = _config(config_file)
    if config.lake is None:
        raise click.ClickException(
            f"{config_file}: there is no lake: section; add one (see examples/lake.yaml and "
            "docs/configuration.md)"
        )
    return pipeline_lake(config)


def _spark(lake: PipelineLake) -> SparkSession:
    from bergstream.pipeline.session import (
        PipelineSetupError,
        attach_catalog,
        build_session,
        lake_system_properties,
        set_system_properties,
        with_system_properties,
    )

    logging.getLogger("py4j").setLevel(logging.WARNING)
    kafka_jvm = {
        **lake.config.kafka_client.java_system_properties(),
        **lake_system_properties(lake),
    }
    try:
        spark = build_session(
            with_system_properties(lake.pipeline.spark_conf, kafka_jvm),
            lake.pipeline.spark_master,
            class_data_sharing=lake.pipeline.class_data_sharing,
        )
    except PipelineSetupError as error:
        raise click.ClickException(str(error)) from None
    set_system_properties(spark, kafka_jvm)
    attach_catalog(spark, lake)
    return spark


def _metrics_endpoint(
    config: BergstreamConfig, lake: PipelineLake, host: str | None, port: int | None
) -> MetricsServer | None:
    """The running endpoint of ``pipeline run`` (Prometheus metrics, ``/healthz``, and
    ``/readyz`` probing Kafka, the catalog, S3 and the Schema Registry): at ``--metrics-port``,
    else at the file's ``metrics:`` when the file holds only a lake (a file that also runs
    proxies or services leaves its ``metrics:`` port to ``bergstream run``)."""
    own_file = not config.virtual_clusters and not config.services
    section = config.metrics if own_file and config.metrics and config.metrics.enabled else None
    if port is None and section is None:
        return None
    from bergstream.core.api import (
        MetricsConfig,
        MetricsServer,
        MetricsStartError,
        kafka_check,
        lake_checks,
        registry_check,
    )

    try:
        endpoint = MetricsServer(
            MetricsConfig(
                host=host or (section.host if section else "127.0.0.1"),
                port=port if port is not None else section.port if section else 0,
            )
        )
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--metrics-host") from None
    endpoint.add_checks([kafka_check(lake.config.kafka_bootstrap), *lake_checks(lake)])
    if config.codecs.schema_registry is not None:
        endpoint.add_checks([registry_check(config.codecs.schema_registry)])
    try:
        asyncio.run(endpoint.start())
    except MetricsStartError as error:
        raise click.ClickException(str(error).replace("metrics.port", "--metrics-port")) from None
    _echo(f"metrics: {endpoint.url}")
    return endpoint


def _echo(line: str) -> None:
    click.echo(line, err=True)


@hookimpl
def register_config_sections() -> list[ConfigSectionRegistration]:
    """Define ``lake.pipeline`` and ``lake.maintenance``, the settings only the pipeline reads."""
    return [
        ConfigSectionRegistration(
            name=PIPELINE_SECTION,
            config_model=LakePipelineConfig,
            description="how `bergstream pipeline run` reads Kafka",
        ),
        ConfigSectionRegistration(
            name=MAINTENANCE_SECTION,
            config_model=LakeMaintenanceConfig,
            description="what `bergstream pipeline maintain` does",
        ),
    ]


@hookimpl
def register_commands(cli: click.Group) -> None:
    """Add ``pipeline`` (run, maintain) and ``table`` (describe) to the command line."""

    @cli.group("pipeline")
    def pipeline_group() -> None:
        """The lake pipeline: Kafka to Iceberg exactly once, and table maintenance."""

    @pipeline_group.command("run")
    @_CONFIG_OPTION
    @click.option(
        "--topic",
        "topic_names",
        multiple=True,
        help="Kafka topic (its table is named so); repeat it for several topics.",
    )
    @click.option(
        "--topics",
        "topic_pattern",
        metavar="REGEX",
        default=None,
        help="Also copy every topic whose whole name REGEX matches, new ones included.",
    )
    @click.option(
        "--once", is_flag=True, help="Copy what the topics hold now, then exit (availableNow)."
    )
    @click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        default=None,
        help="Serve /metrics, /healthz and /readyz on this port (0: a free one); default: the "
        "file's metrics: section when the file has only a lake, else off.",
    )
    @click.option(
        "--metrics-host",
        default=None,
        help="Address the metrics endpoint listens on (default 127.0.0.1, or the file's).",
    )
    def run_command(
        config_file: Path,
        topic_names: tuple[str, ...],
        topic_pattern: str | None,
        once: bool,
        metrics_port: int | None,
        metrics_host: str | None,
    ) -> None:
        """Copy each topic into its Iceberg table, exactly once, in one Spark application; runs
        until SIGTERM/Ctrl-C unless --once. Topics: --topic (repeatable) and --topics REGEX,
        else lake.pipeline.topic and lake.pipeline.topics. Progress goes to stderr, a JSON
        summary to stdout."""
        from bergstream.core.api import ServiceContext
        from bergstream.pipeline.session import PipelineSetupError
        from bergstream.pipeline.stream import PipelineError, run_pipeline, stop_on_signals
        from bergstream.pipeline.topic_runs import run_topics
        from bergstream.pipeline.topics import TopicSelection
        from bergstream.pipeline.typed import topic_typing

        config, plugins = _config(config_file)
        lake = _lake(config_file, config)
        try:
            if topic_names or topic_pattern is not None:
                selection = TopicSelection.of(topic_names, topic_pattern)
            else:
                selection = TopicSelection.of(lake.pipeline.topic, lake.pipeline.topics)
        except ValueError as error:
            raise click.UsageError(str(error)) from None
        context = ServiceContext(config, plugins, bergstream_home())
        single = selection.single
        codecs = None
        if single is not None:
            try:
                codecs = topic_typing(context, single)
            except PipelineSetupError as error:
                raise click.ClickException(str(error)) from None
        stop = stop_on_signals()
        endpoint = _metrics_endpoint(config, lake, metrics_host, metrics_port)
        spark = _spark(lake)
        try:
            if single is None:
                many = run_topics(
                    spark,
                    lake,
                    selection,
                    once=once,
                    typing_for=lambda topic: topic_typing(context, topic),
                    mode_for=lambda topic: mode_rule_for(config.tables, topic),
                    report=_echo,
                    stop=stop,
                    on_started=endpoint.mark_ready if endpoint is not None else None,
                )
            else:
                result = run_pipeline(
                    spark,
                    lake,
                    single,
                    once=once,
                    report=_echo,
                    stop=stop,
                    codecs=codecs,
                    mode=mode_rule_for(config.tables, single),
                    on_started=endpoint.mark_ready if endpoint is not None else None,
                )
        except (PipelineError, PipelineSetupError) as error:
            raise click.ClickException(str(error)) from None
        finally:
            spark.stop()
            if endpoint is not None:
                asyncio.run(endpoint.stop())
        if single is None:
            records = sum(r.records for r in many.results.values())
            _echo(
                f"done: {records:,} records from {len(many.results)} topic(s), {many.seconds:.1f} s"
            )
            click.echo(json.dumps(many.summary()))
            if many.failures:
                failed = ", ".join(f"{f.topic} ({f.error})" for f in many.failures.values())
                raise click.ClickException(f"{len(many.failures)} topic(s) failed: {failed}")
            return
        _echo(
            f"done: {result.records:,} records in {result.batches} batch(es), "
            f"{result.seconds:.1f} s"
        )
        click.echo(json.dumps(result.summary()))

    @pipeline_group.command("maintain")
    @_CONFIG_OPTION
    @_TOPIC_OPTION
    @click.option(
        "--orphan-min-age-hours",
        type=float,
        default=None,
        help="Override lake.maintenance.orphan_min_age_hours for this run.",
    )
    def maintain_command(config_file: Path, topic: str, orphan_min_age_hours: float | None) -> None:
        """Compact small files, expire old snapshots and remove orphan files of TOPIC's table;
        safe while the pipeline runs. Prints a JSON report."""
        from bergstream.pipeline.maintain import MaintenanceError, maintain_table
        from bergstream.pipeline.session import PipelineSetupError

        lake = _lake(config_file)
        spark = _spark(lake)
        try:
            report = maintain_table(
                spark, lake, topic, report=_echo, orphan_min_age_hours=orphan_min_age_hours
            )
        except (MaintenanceError, PipelineSetupError) as error:
            raise click.ClickException(str(error)) from None
        finally:
            spark.stop()
        click.echo(json.dumps(report, indent=2, default=str))

    @cli.group("table")
    def table_group() -> None:
        """Inspect the lake's topic tables."""

    @table_group.command("describe")
    @_CONFIG_OPTION
    @_TOPIC_OPTION
    def describe_command(config_file: Path, topic: str) -> None:
        """Print JSON about TOPIC's table: its mode, rows, data files, snapshots and the
        boundary; for an upsert or debezium topic its state table's rows and delete files."""
        from bergstream.pipeline.describe import TableNotFoundError, describe_table

        config, _ = _config(config_file)
        lake = _lake(config_file, config)
        rule = mode_rule_for(config.tables, topic)
        mode = rule.mode if rule is not None else TableMode.APPEND
        try:
            click.echo(json.dumps(describe_table(lake, topic, mode), indent=2))
        except TableNotFoundError as error:
            raise click.ClickException(str(error)) from None


@hookimpl
def register_log_components() -> list[LogComponent]:
    """The pipeline logs as ``pipeline``, and so do Spark's Python side (py4j, pyspark)."""
    return [
        LogComponent(logger="bergstream.pipeline", component="pipeline"),
        LogComponent(logger="py4j", component="pipeline"),
        LogComponent(logger="pyspark", component="pipeline"),
    ]
