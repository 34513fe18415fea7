"""``lake.catalog.type: glue``: what the settings resolve to for PyIceberg's and Spark's Glue
catalogs, and the mistakes the config check names."""

from __future__ import annotations

from pathlib import Path

import pytest

from bergstream.core.lake import (
    LakeConfig,
    LakeConfigError,
    pyiceberg_catalog_properties,
    resolve_lake,
)
from bergstream.pipeline.session import catalog_conf, lake_system_properties


def _lake(tmp_path: Path, **catalog: object) -> LakeConfig:
    return LakeConfig.model_validate(
        {
            "kafka_bootstrap": "127.0.0.1:9092",
            "catalog": {"type": "glue", "name": "aws", "warehouse": "s3://bucket/wh", **catalog},
            "s3": {"region": "eu-west-1", "path_style": False},
        }
    )


def test_glue_settings_reach_pyiceberg_and_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    glue = {"endpoint": "http://127.0.0.1:5000", "catalog_id": "123456789012"}
    lake = resolve_lake(_lake(tmp_path, glue=glue), home=tmp_path)
    assert lake.catalog_type == "glue" and lake.catalog_uri == ""
    props = pyiceberg_catalog_properties(lake)
    assert props["type"] == "glue" and "uri" not in props
    assert props["glue.endpoint"] == "http://127.0.0.1:5000"
    assert props["glue.id"] == "123456789012"
    assert props["glue.region"] == "eu-west-1"  # from lake.s3, no AWS_REGION set
    assert props["warehouse"] == "s3://bucket/wh"
    assert not any(key.startswith("glue.access") for key in props)  # the AWS default chain
    conf = catalog_conf(lake)
    prefix = "spark.sql.catalog.aws"
    assert conf[f"{prefix}.type"] == "glue"
    assert conf[f"{prefix}.glue.endpoint"] == "http://127.0.0.1:5000"
    assert conf[f"{prefix}.glue.id"] == "123456789012"
    assert conf[f"{prefix}.client.region"] == "eu-west-1"
    assert conf[f"{prefix}.glue.skip-name-validation"] == "true"
    assert conf[f"{prefix}.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert lake_system_properties(lake) == {}
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert pyiceberg_catalog_properties(lake)["glue.region"] == "us-west-2"


def test_glue_keys_go_to_pyiceberg_and_to_the_jvm(tmp_path: Path) -> None:
    glue = {"region": "ap-south-1", "access_key": "AK", "secret_key": "SK", "session_token": "T"}
    lake = resolve_lake(_lake(tmp_path, glue=glue), home=tmp_path)
    props = pyiceberg_catalog_properties(lake)
    assert props["glue.access-key-id"] == "AK" and props["glue.secret-access-key"] == "SK"
    assert props["glue.session-token"] == "T" and props["glue.region"] == "ap-south-1"
    assert lake_system_properties(lake) == {
        "aws.accessKeyId": "AK",
        "aws.secretAccessKey": "SK",
        "aws.sessionToken": "T",
    }
    assert "AK" not in str(catalog_conf(lake))  # keys never land in Spark's conf


def test_empty_glue_values_are_unset(tmp_path: Path) -> None:
    glue = {"endpoint": "", "catalog_id": "", "access_key": "", "secret_key": ""}
    lake = resolve_lake(_lake(tmp_path, glue=glue), home=tmp_path)
    props = pyiceberg_catalog_properties(lake)
    assert "glue.endpoint" not in props and "glue.id" not in props
    assert "glue.access-key-id" not in props


@pytest.mark.parametrize(
    ("catalog", "message"),
    [
        ({"warehouse": None}, "s3://BUCKET/PREFIX"),
        ({"warehouse": "/tmp/wh"}, "s3://BUCKET/PREFIX"),
        ({"uri": "http://glue"}, "lake.catalog.glue.endpoint"),
    ],
)
def test_glue_mistakes_are_named(tmp_path: Path, catalog: dict[str, object], message: str) -> None:
    with pytest.raises(LakeConfigError, match=message.replace(".", r"\.")):
        resolve_lake(_lake(tmp_path, **catalog), home=tmp_path)


def test_glue_keys_come_in_pairs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="access_key and secret_key together"):
        _lake(tmp_path, glue={"access_key": "AK"})
    with pytest.raises(ValueError, match="session_token needs"):
        _lake(tmp_path, glue={"session_token": "T"})
