"""The pipeline's pure parts, without Spark or Kafka: where a run starts, Spark's offset log,
the per-topic lock, the catalog settings handed to Spark, its own config sections, and the
commands' errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bergstream.core.config import ConfigError, parse_config
from bergstream.core.lake import LakeConfig, LakeS3Config, resolve_lake
from bergstream.core.plugins import load_registry
from bergstream.pipeline.checkpoint import batch_end_offsets, checkpoint_path, topic_lock
from bergstream.pipeline.jars import PACKAGES, SPARK_VERSION, ivy_settings
from bergstream.pipeline.kafka import TopicOffsets
from bergstream.pipeline.session import PipelineSetupError, catalog_conf, session_conf
from bergstream.pipeline.settings import (
    LakeMaintenanceConfig,
    LakePipelineConfig,
    pipeline_lake,
    resolve_pipeline_lake,
)
from bergstream.pipeline.stream import RunResult, starting_offsets

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")


def test_start_at_the_boundary_else_the_log_start():
    offsets = TopicOffsets("t", log_start={0: 0, 1: 40, 2: 0}, end={0: 9, 1: 90, 2: 0})
    lines: list[str] = []
    start = starting_offsets(offsets, {0: 7, 1: 55}, True, lines.append)
    assert start == {"t": {"0": 7, "1": 55, "2": -2}}
    assert lines == []


def test_records_deleted_before_they_were_copied():
    offsets = TopicOffsets("t", log_start={0: 40}, end={0: 90})
    with pytest.raises(PipelineSetupError, match=r"offsets 10\.\.39 of partition 0.*retention"):
        starting_offsets(offsets, {0: 10}, True, print)
    lines: list[str] = []
    assert starting_offsets(offsets, {0: 10}, False, lines.append) == {"t": {"0": -2}}
    assert "skipping them" in lines[0]


def test_offset_log(tmp_path: Path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"t":{"1":20,"0":12}}\n'
    )
    assert batch_end_offsets(tmp_path, 3, "t") == {0: 12, 1: 20}
    with pytest.raises(PipelineSetupError, match="no offsets for topic 'u'"):
        batch_end_offsets(tmp_path, 3, "u")
    with pytest.raises(PipelineSetupError, match="cannot read"):
        batch_end_offsets(tmp_path, 4, "t")


def test_one_pipeline_per_topic(tmp_path: Path):
    with topic_lock(tmp_path, "coldset", "orders"):
        with (
            pytest.raises(PipelineSetupError, match=r"another pipeline .* topic 'orders'"),
            topic_lock(tmp_path, "coldset", "orders"),
        ):
            pass
        with topic_lock(tmp_path, "coldset", "other"):
            pass
    with topic_lock(tmp_path, "coldset", "orders"):
        pass
    assert checkpoint_path(tmp_path, "coldset", "a/b", "u1") == tmp_path / "coldset.a_b" / "u1"


def test_spark_settings(tmp_path: Path):
    conf = session_conf({"spark.driver.memory": "1g"})
    assert conf["spark.master"] == "local[2]" and conf["spark.ui.enabled"] == "false"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.driver.memory"] == "1g"
    assert f"spark-sql-kafka-0-10_2.13:{SPARK_VERSION}" in conf["spark.jars.packages"]
    assert len(PACKAGES) == 4 and all(p.count(":") == 2 for p in PACKAGES)
    assert "repo1.maven.org" in ivy_settings().read_text()

    sql = resolve_lake(LakeConfig(kafka_bootstrap="127.0.0.1:9092"), home=tmp_path)
    prefix = "spark.sql.catalog.bergstream"
    assert catalog_conf(sql)[prefix] == "org.apache.iceberg.spark.SparkCatalog"
    assert catalog_conf(sql)[f"{prefix}.type"] == "jdbc"
    assert catalog_conf(sql)[f"{prefix}.uri"] == f"jdbc:sqlite:{tmp_path}/lake/catalog.db"
    assert catalog_conf(sql)[f"{prefix}.cache-enabled"] == "false"
    assert f"{prefix}.io-impl" not in catalog_conf(sql)

    s3 = resolve_lake(
        LakeConfig(
            kafka_bootstrap="127.0.0.1:9092",
            catalog={"warehouse": "s3://bucket/wh"},  # type: ignore[arg-type]
            s3=LakeS3Config(endpoint="http://127.0.0.1:8333", access_key="a", secret_key="s"),
        ),
        home=tmp_path,
    )
    conf = catalog_conf(s3)
    assert conf[f"{prefix}.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert conf[f"{prefix}.s3.endpoint"] == "http://127.0.0.1:8333"
    assert conf[f"{prefix}.s3.path-style-access"] == "true"
    assert conf[f"{prefix}.warehouse"] == "s3://bucket/wh"


def test_checkpoint_dir_defaults_under_home(tmp_path: Path):
    lake = resolve_pipeline_lake(LakeConfig(kafka_bootstrap="127.0.0.1:9092"), home=tmp_path)
    assert lake.checkpoint_dir == tmp_path / "lake" / "checkpoints"
    assert lake.pipeline == LakePipelineConfig() and lake.maintenance == LakeMaintenanceConfig()
    assert lake.catalog_uri == resolve_lake(lake.config, home=tmp_path).catalog_uri
    moved = resolve_pipeline_lake(
        LakeConfig(kafka_bootstrap="127.0.0.1:9092", pipeline={"checkpoint_dir": "~/cp"}),
        home=tmp_path,
    )
    assert moved.checkpoint_dir == Path.home() / "cp"


LAKE = """
lake:
  kafka_bootstrap: 127.0.0.1:9092
  pipeline:
    max_offsets_per_trigger: 1000
    spark_conf: {spark.driver.memory: 2g}
  maintenance: {retain_last: 3}
"""


def test_the_pipeline_reads_the_sections_the_loader_validated(tmp_path: Path):
    config = parse_config(LAKE, registry=load_registry(), env={})
    pipeline = config.sections["lake.pipeline"]
    assert isinstance(pipeline, LakePipelineConfig) and pipeline.max_offsets_per_trigger == 1000
    lake = pipeline_lake(config, home=tmp_path)
    assert lake.pipeline is pipeline and lake.maintenance is config.sections["lake.maintenance"]
    assert lake.pipeline.spark_conf == {"spark.driver.memory": "2g"}
    assert lake.maintenance.retain_last == 3
    # Loaded without a registry (core alone), the same settings are validated from the raw file.
    bare = parse_config(LAKE, env={})
    assert bare.sections == {} and bare.lake is not None
    assert pipeline_lake(bare, home=tmp_path).pipeline == pipeline


def test_the_pipeline_sections_are_checked_with_path_and_line():
    text = LAKE.replace("retain_last: 3", "retain_last: 0, keep: 1").replace(
        "  spark_conf", "  trigger: 5\n    spark_conf"
    )
    with pytest.raises(ConfigError) as error:
        parse_config(text, source="lake.yaml", registry=load_registry(), env={})
    found = {(p.path, p.line): p.message for p in error.value.problems}
    assert found == {
        ("lake.pipeline.trigger", 6): "unknown key: remove it or check its spelling",
        ("lake.maintenance.retain_last", 8): "Input should be greater than or equal to 1 (got 0)",
        ("lake.maintenance.keep", 8): "unknown key: remove it or check its spelling",
    }


def test_the_pipeline_registers_its_sections():
    sections = load_registry().registrations("config section")
    assert sections["lake.pipeline"].config_model is LakePipelineConfig
    assert sections["lake.maintenance"].config_model is LakeMaintenanceConfig


def _bergstream(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BERGSTREAM, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_commands_without_a_lake_section(tmp_path: Path):
    config = tmp_path / "proxy-only.yaml"
    config.write_text("virtual_clusters: []\n")
    for command in (["pipeline", "run"], ["pipeline", "maintain"], ["table", "describe"]):
        done = _bergstream(*command, "-c", str(config), "--topic", "t", cwd=tmp_path)
        assert done.returncode == 1
        assert "there is no lake: section" in done.stderr and "examples/lake.yaml" in done.stderr


def test_commands_refuse_a_bad_pipeline_setting_like_config_check(tmp_path: Path):
    config = tmp_path / "lake.yaml"
    config.write_text(LAKE.replace("max_offsets_per_trigger", "max_offset_per_trigger"))
    for command in (["pipeline", "run"], ["pipeline", "maintain"], ["table", "describe"]):
        done = _bergstream(*command, "-c", str(config), "--topic", "t", cwd=tmp_path)
        assert done.returncode == 1
        assert f"{config}:5: lake.pipeline.max_offset_per_trigger: unknown key" in done.stderr


def test_describe_a_missing_table(tmp_path: Path):
    config = tmp_path / "lake.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            lake:
              kafka_bootstrap: 127.0.0.1:9
              catalog: {{uri: "sqlite:///{tmp_path}/catalog.db", warehouse: {tmp_path}/wh}}
            """
        )
    )
    done = _bergstream("table", "describe", "-c", str(config), "--topic", "nope", cwd=tmp_path)
    assert done.returncode == 1
    assert "table coldset.nope does not exist" in done.stderr
    assert "bergstream pipeline run --topic nope" in done.stderr


def test_help_does_not_start_spark():
    code = (
        "import sys; from bergstream.core.cli import build_cli; cli = build_cli(); "
        "assert {'pipeline', 'table'} <= set(cli.commands); "
        "assert 'pyspark' not in sys.modules, 'pyspark imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_run_summary_is_what_the_command_prints() -> None:
    """``pipeline run`` prints :meth:`RunResult.summary`: partitions as text keys in order,
    seconds to the millisecond (the in-process test runs return the same)."""
    result = RunResult("coldset.t", 2, 30, 4096, 1.23456, {10: 7, 2: 23})
    assert result.summary() == {
        "table": "coldset.t",
        "batches": 2,
        "records": 30,
        "bytes_written": 4096,
        "seconds": 1.235,
        "boundary": {"2": 23, "10": 7},
    }


def test_where_pipeline_run_serves_its_metrics(tmp_path: Path) -> None:
    import asyncio

    from bergstream.pipeline.plugin import _metrics_endpoint

    lake_only = "lake: {kafka_bootstrap: '127.0.0.1:9092'}\nmetrics: {port: 0}\n"
    with_proxy = (
        "virtual_clusters:\n  - name: a\n    target: {bootstrap: 'k:1'}\n    gateway: {port: 9}\n"
        + lake_only
    )
    for text, port, serves in (
        (lake_only, None, True),  # the file is the pipeline's own: its metrics: section
        (with_proxy, None, False),  # that section is `bergstream run`'s
        (with_proxy, 0, True),  # --metrics-port
        ("lake: {kafka_bootstrap: '127.0.0.1:9092'}\n", None, False),
    ):
        config = parse_config(text, registry=load_registry())
        lake = pipeline_lake(config, home=tmp_path)
        endpoint = _metrics_endpoint(config, lake, None, port)
        assert (endpoint is not None) == serves, text
        if endpoint is not None:
            assert endpoint.port != 0 and endpoint.url.startswith("http://127.0.0.1:")
            asyncio.run(endpoint.stop())
