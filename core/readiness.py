"""The readiness checks of what a config file names: a Kafka cluster, a lake's catalog and S3
store, a Schema Registry. Services build theirs from these (:mod:`bergstream.core.health` runs
them)."""

from __future__ import annotations

import base64
import ssl
import urllib.parse
from typing import TYPE_CHECKING

from bergstream.core.health import (
    Probe,
    ProbeFailed,
    ReadinessCheck,
    http_probe,
    kafka_probe,
    sqlite_probe,
)

if TYPE_CHECKING:
    from bergstream.core.lake import ResolvedLake
    from bergstream.core.typed.schema_registry import SchemaRegistrySettings

__all__ = ["kafka_check", "lake_checks", "registry_check"]


def kafka_check(bootstrap: str) -> ReadinessCheck:
    """Kafka answers at one of the bootstrap brokers."""
    return ReadinessCheck("kafka", bootstrap, kafka_probe(bootstrap))


def lake_checks(lake: ResolvedLake) -> list[ReadinessCheck]:
    """The lake's catalog (its SQLite file, or the REST server's ``/v1/config``) and, with an
    ``s3://`` warehouse, its bucket."""
    checks = []
    if lake.sqlite_path is not None:
        checks.append(
            ReadinessCheck("catalog", str(lake.sqlite_path), sqlite_probe(lake.sqlite_path))
        )
    else:
        url = lake.catalog_uri.rstrip("/") + "/v1/config"
        token = lake.config.catalog.properties.get("token")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        checks.append(ReadinessCheck("catalog", url, http_probe(url, headers=headers)))
    if lake.warehouse and lake.warehouse.startswith("s3://"):
        bucket = urllib.parse.urlsplit(lake.warehouse).netloc
        endpoint = (lake.s3.endpoint if lake.s3 else None) or "AWS S3"
        checks.append(
            ReadinessCheck("s3", f"{endpoint} bucket {bucket}", _bucket_probe(lake, bucket))
        )
    return checks


def _bucket_probe(lake: ResolvedLake, bucket: str) -> Probe:
    """HEAD the bucket with the lake's credentials (so a refused key fails too)."""

    def probe(timeout: float) -> None:
        import boto3
        import botocore.config
        import botocore.exceptions

        s3 = lake.s3
        client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint if s3 else None,
            aws_access_key_id=s3.access_key if s3 else None,
            aws_secret_access_key=s3.secret_key if s3 else None,
            region_name=s3.region if s3 else None,
            config=botocore.config.Config(
                connect_timeout=timeout,
                read_timeout=timeout,
                retries={"max_attempts": 1},
                s3={"addressing_style": "path" if (s3 is None or s3.path_style) else "auto"},
            ),
        )
        try:
            client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as error:
            code = error.response.get("Error", {}).get("Code", "?")
            raise ProbeFailed(f"bucket {bucket}: {code}") from None
        except botocore.exceptions.BotoCoreError as error:
            raise ProbeFailed(str(error)) from None

    return probe


def registry_check(settings: SchemaRegistrySettings) -> ReadinessCheck:
    """The Schema Registry lists its subjects (with its credentials and CA)."""
    url = settings.url.rstrip("/") + "/subjects"
    headers = {}
    if settings.username is not None:
        pair = f"{settings.username}:{settings.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    context = None
    if settings.ca_file is not None:
        context = ssl.create_default_context(cafile=str(settings.ca_file))
    return ReadinessCheck(
        "schema registry", settings.url, http_probe(url, headers=headers, context=context)
    )
