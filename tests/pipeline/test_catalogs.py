"""The catalog and warehouse choices, one round trip each: the SQL catalog with an S3 warehouse on
the stack's S3 (through iceberg-aws-bundle on the JVM and PyArrow's S3 in PyIceberg), Iceberg's
own REST catalog server, and AWS Glue (moto's)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from bergstream.core.lake import ResolvedLake
from bergstream.pipeline.describe import describe_table
from bergstream.pipeline.session import attach_catalog
from bergstream.pipeline.stream import run_pipeline
from tests.kits.lake import (
    Produced,
    consume_all,
    produce,
    records_of,
    s3_settings,
    table_rows_pyiceberg,
    table_rows_spark,
)

pytestmark = pytest.mark.slow


def _quiet(line: str) -> None:
    pass


def _records(count: int) -> list[Produced]:
    return [
        Produced(i % 2, None if i % 5 == 0 else f"k{i}".encode(), b"x" * i, (("h", b"1"),), None)
        for i in range(count)
    ]


def _round_trip(spark: Any, lake: ResolvedLake, bootstrap: str, topic: str) -> None:
    produce(bootstrap, topic, _records(120))
    result = run_pipeline(spark, lake, topic, once=True, report=_quiet)
    truth = consume_all(bootstrap, topic, 2)
    assert result.records == 120
    assert records_of(table_rows_pyiceberg(lake, topic)) == truth
    assert records_of(table_rows_spark(spark, lake, topic)) == truth
    facts = describe_table(lake, topic)
    assert facts["rows"] == 120 and facts["boundary"] == {"0": 60, "1": 60}
    assert run_pipeline(spark, lake, topic, once=True, report=_quiet).records == 0


def test_s3_warehouse(
    spark: Any,
    make_lake: Callable[..., ResolvedLake],
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Any,
) -> None:
    lake = make_lake(
        catalog={
            "name": "lake_s3",
            "uri": f"sqlite:///{tmp_path}/s3-catalog.db",
            "warehouse": "s3://lake-test/warehouse",
        },
        s3=s3_settings(stack_env),
    )
    attach_catalog(spark, lake)
    topic = create_topic(2, prefix="s3")
    _round_trip(spark, lake, kafka_bootstrap, topic)
    assert describe_table(lake, topic)["location"].startswith("s3://lake-test/warehouse/")


def test_rest_catalog(
    spark: Any,
    make_lake: Callable[..., ResolvedLake],
    rest_catalog_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    """Iceberg's own REST catalog server (the stack's ``rest-catalog``), its files on S3."""
    lake = make_lake(
        catalog={
            "name": "lake_rest",
            "type": "rest",
            "uri": rest_catalog_env["BERGSTREAM_REST_CATALOG_URL"],
        },
        s3=s3_settings(rest_catalog_env),
        namespace=f"rest_{uuid.uuid4().hex[:8]}",  # the server is shared by the run's tests
    )
    attach_catalog(spark, lake)
    topic = create_topic(2, prefix="rest")
    _round_trip(spark, lake, kafka_bootstrap, topic)
    warehouse = rest_catalog_env["BERGSTREAM_REST_CATALOG_WAREHOUSE"]
    assert describe_table(lake, topic)["location"].startswith(f"{warehouse}/{lake.namespace}/")


def test_glue_catalog(
    spark: Any,
    make_lake: Callable[..., ResolvedLake],
    moto: Any,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    """AWS Glue (moto's server: Glue and S3 on one port), keys given in the lake's settings."""
    from tests.kits.moto_server import ACCESS_KEY, REGION, SECRET_KEY

    bucket = f"glue-{uuid.uuid4().hex[:10]}"
    moto.client("s3").create_bucket(Bucket=bucket)
    lake = make_lake(
        catalog={
            "name": "lake_glue",
            "type": "glue",
            "warehouse": f"s3://{bucket}/warehouse",
            "glue": {
                "endpoint": moto.url,
                "region": REGION,
                "access_key": ACCESS_KEY,
                "secret_key": SECRET_KEY,
            },
        },
        s3={
            "endpoint": moto.url,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "region": REGION,
        },
        namespace=f"glue_{uuid.uuid4().hex[:8]}",
    )
    attach_catalog(spark, lake)
    topic = create_topic(2, prefix="glue")
    _round_trip(spark, lake, kafka_bootstrap, topic)
    table = moto.client("glue").get_table(DatabaseName=lake.namespace, Name=topic)["Table"]
    assert table["Parameters"]["metadata_location"].startswith(f"s3://{bucket}/warehouse/")
