"""The pipeline's Spark master setting without a cluster: which values ``lake.pipeline.master``
takes, how it meets ``spark_conf``'s ``spark.master``, the driver's address it implies, and the
warnings a cluster run gives about what executors elsewhere could not reach."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bergstream.core.config import ConfigError, parse_config
from bergstream.core.lake import LakeCatalogConfig, LakeConfig, LakeS3Config
from bergstream.core.plugins import load_registry
from bergstream.pipeline.session import session_conf
from bergstream.pipeline.settings import (
    LakePipelineConfig,
    check_master,
    cluster_warnings,
    is_local_master,
    resolve_pipeline_lake,
)


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[2]",
        "local[*]",
        "local[4,3]",
        "local[*,2]",
        "local-cluster[2,1,1024]",
        "spark://10.0.0.5:7077",
        "spark://m1:7077,m2:7077",
        "yarn",
        "k8s://https://kube.example:6443",
        "custom://anything",  # a plugged-in cluster manager: Spark decides
    ],
)
def test_masters_spark_accepts_pass(master: str) -> None:
    assert LakePipelineConfig(master=master).spark_master == master


@pytest.mark.parametrize(
    ("master", "says"),
    [
        ("", "blank or has spaces"),
        (" local[2]", "blank or has spaces"),
        ("spark://host", "must be host:port"),
        ("spark://host:seven", "must be host:port"),
        ("spark://a:7077,:7078", "must be host:port"),
        ("spark://host:70777", "must be host:port"),
        ("k8s://", "names no Kubernetes API server"),
        ("locl[2]", "is not one Spark knows"),
        ("local[two]", "is not one Spark knows"),
        ("host:7077", "is not one Spark knows"),
    ],
)
def test_wrong_masters_are_refused_saying_why(master: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_master(master)
    with pytest.raises(ValidationError, match=says):
        LakePipelineConfig(master=master)


def test_master_and_spark_conf() -> None:
    assert LakePipelineConfig().spark_master == "local[2]"
    only_conf = LakePipelineConfig(spark_conf={"spark.master": "spark://h:7077"})
    assert only_conf.spark_master == "spark://h:7077"
    same = LakePipelineConfig(master="yarn", spark_conf={"spark.master": "yarn"})
    assert same.spark_master == "yarn"
    with pytest.raises(ValidationError, match=r"two Spark masters.*set it once"):
        LakePipelineConfig(master="yarn", spark_conf={"spark.master": "local[2]"})
    with pytest.raises(ValidationError, match="must be host:port"):
        LakePipelineConfig(spark_conf={"spark.master": "spark://h"})


def test_config_file_names_the_bad_master_and_its_line() -> None:
    text = "lake:\n  kafka_bootstrap: k:9092\n  pipeline:\n    master: spark://k\n"
    with pytest.raises(ConfigError) as error:
        parse_config(text, source="lake.yaml", registry=load_registry(), env={})
    [problem] = error.value.problems
    assert (problem.path, problem.line) == ("lake.pipeline.master", 4)
    assert "must be host:port" in problem.message
    good = parse_config(text.replace("spark://k", "spark://k:7077"), registry=load_registry())
    assert good.sections["lake.pipeline"].spark_master == "spark://k:7077"


def test_driver_address_local_and_on_a_cluster() -> None:
    local = session_conf()
    assert local["spark.master"] == "local[2]"
    assert local["spark.driver.host"] == local["spark.driver.bindAddress"] == "127.0.0.1"
    # Executors elsewhere connect back to the driver: Spark picks its address.
    cluster = session_conf({"spark.executor.memory": "4g"}, "spark://m:7077")
    assert cluster["spark.master"] == "spark://m:7077"
    assert "spark.driver.host" not in cluster and "spark.driver.bindAddress" not in cluster
    assert cluster["spark.jars.packages"] == local["spark.jars.packages"]
    assert cluster["spark.executor.memory"] == "4g"
    chosen = session_conf({"spark.driver.host": "10.1.2.3"}, "yarn")
    assert chosen["spark.driver.host"] == "10.1.2.3"
    assert session_conf({"spark.master": "local[1]"}, "spark://m:7077")["spark.driver.host"]
    assert is_local_master("local[*]") and not is_local_master("local-cluster[2,1,1024]")


def test_cluster_warnings_name_what_executors_elsewhere_cannot_reach(tmp_path: Path) -> None:
    local_lake = resolve_pipeline_lake(
        LakeConfig(
            kafka_bootstrap="localhost:9092,kafka2:9092",
            s3=LakeS3Config(endpoint="http://127.0.0.1:8333", access_key="a", secret_key="s"),
        ),
        home=tmp_path,
    )
    assert cluster_warnings(local_lake, "local[2]") == []
    warnings = cluster_warnings(local_lake, "spark://m:7077")
    assert len(warnings) == 3, warnings
    warehouse, kafka, s3 = warnings
    assert "is a local directory" in warehouse and "spark://m:7077" in warehouse
    assert "localhost:9092 is a loopback address" in kafka and "kafka2" not in kafka
    assert "http://127.0.0.1:8333 is a loopback address" in s3
    shared = resolve_pipeline_lake(
        LakeConfig(
            kafka_bootstrap="kafka1:9092,[::1]:9092",
            catalog=LakeCatalogConfig(warehouse="s3://bucket/lake"),
            s3=LakeS3Config(endpoint="https://s3.example", access_key="a", secret_key="s"),
        ),
        home=tmp_path,
    )
    [only] = cluster_warnings(shared, "yarn")
    assert "[::1]:9092 is a loopback address" in only
