"""One Spark session per test process (an xdist worker), and the lake pipeline run in it.

Starting Spark is the dearest part of a short pipeline run: a ``bergstream pipeline run --once``
process starts a JVM, loads the Iceberg and Kafka jars and imports PySpark before it copies
anything, which on CI's two busy cores costs more than the copy. Tests that need the pipeline
only to fill a coldset (ISK's merged and current tables, KSI's cold reads, the lag metric) run it
here, in the worker's session, through the same ``run_pipeline`` the command calls with the same
config file; the tests of the command itself (``tests/pipeline``, the crash tests) start the
process. A lake whose ``lake.pipeline.master`` is not local runs as the command.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.core.plugins import PluginRegistry
    from bergstream.pipeline.settings import PipelineLake

_session: SparkSession | None = None


def worker_spark() -> SparkSession:
    """The worker's Spark session: started on first use with the pipeline's settings
    (``build_session``; a running one if a test started it), kept until the worker exits
    (PySpark's JVM ends with it)."""
    global _session
    from pyspark import SparkContext

    stopped = _session is not None and _session.sparkContext._jsc is None
    if _session is None or stopped or SparkContext._active_spark_context is None:
        # (a test that started its own session with other settings may have stopped it)
        from bergstream.pipeline.session import build_session

        _session = build_session({"spark.driver.memory": "2g"})
    return _session


@functools.cache
def _registry() -> PluginRegistry:
    from bergstream.core.plugins import load_registry

    return load_registry()


@contextlib.contextmanager
def lake_catalog(spark: SparkSession, lake: PipelineLake) -> Iterator[None]:
    """``lake``'s catalog attached to ``spark`` under its name for the block, and whatever that
    name meant before restored after it. Spark keeps a catalog once loaded, by name, and the
    tests' lakes share names but not their places: the block starts and ends by dropping every
    loaded catalog (the next use loads it again from the settings)."""
    from bergstream.pipeline.session import attach_catalog

    prefix = f"spark.sql.catalog.{lake.catalog_name}"
    catalogs = spark._jsparkSession.sessionState().catalogManager()

    def settings() -> dict[str, str]:
        return {
            key: value
            for key, value in spark.conf.getAll.items()
            if key == prefix or key.startswith(f"{prefix}.")
        }

    saved = settings()
    for key in saved:
        spark.conf.unset(key)
    catalogs.reset()
    try:
        attach_catalog(spark, lake)
        yield
    finally:
        for key in settings():
            spark.conf.unset(key)
        for key, value in saved.items():
            spark.conf.set(key, value)
        catalogs.reset()


def run_pipeline_in_worker(config: Path, topic: str) -> dict[str, Any] | None:
    """``bergstream pipeline run -c config --topic topic --once`` in the worker's session; the
    summary the command prints (``table``, ``batches``, ``records``, ``bytes_written``,
    ``seconds``, ``boundary``). ``None`` for a lake on a Spark cluster (the caller runs the
    command). A failure raises ``RuntimeError`` with the run's progress lines."""
    from bergstream.core.api import ServiceContext, bergstream_home, load_config, mode_rule_for
    from bergstream.pipeline.settings import is_local_master, pipeline_lake
    from bergstream.pipeline.stream import run_pipeline
    from bergstream.pipeline.typed import topic_typing

    registry = _registry()
    loaded = load_config(config, registry=registry)
    lake = pipeline_lake(loaded)
    if not is_local_master(lake.pipeline.spark_master):
        return None
    spark = worker_spark()
    progress: list[str] = []
    try:
        with lake_catalog(spark, lake):
            result = run_pipeline(
                spark,
                lake,
                topic,
                once=True,
                report=progress.append,
                codecs=topic_typing(ServiceContext(loaded, registry, bergstream_home()), topic),
                mode=mode_rule_for(loaded.tables, topic),
            )
    except Exception as error:
        lines = "\n".join(progress[-40:])
        raise RuntimeError(f"the pipeline failed: {error}\n{lines}") from error
    return result.summary()


def maintain_in_worker(config: Path, topic: str) -> dict[str, Any]:
    """``bergstream pipeline maintain -c config --topic topic`` in the worker's session (a lake
    on a local master); its report."""
    from bergstream.core.api import load_config
    from bergstream.pipeline.maintain import maintain_table
    from bergstream.pipeline.settings import is_local_master, pipeline_lake

    lake = pipeline_lake(load_config(config, registry=_registry()))
    assert is_local_master(lake.pipeline.spark_master), "maintain a cluster's lake as a command"
    spark = worker_spark()
    progress: list[str] = []
    try:
        with lake_catalog(spark, lake):
            return maintain_table(spark, lake, topic, report=progress.append)
    except Exception as error:
        lines = "\n".join(progress[-40:])
        raise RuntimeError(f"maintenance failed: {error}\n{lines}") from error
