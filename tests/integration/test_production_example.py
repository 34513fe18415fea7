"""``examples/production.yaml`` as it is in the repository, run against the secured stack with only
environment variables set, as README.md's "Run against your own cluster" tells a user to:

- Kafka: the three SASL_SSL brokers, logged in to with the stack's *Java* client properties file
  of the admin's OAUTHBEARER login (Keycloak's client credentials), read as it is;
- the coldset: Iceberg's own REST catalog server (the stack's ``rest-catalog``) behind a gateway
  that refuses requests without its bearer token, its warehouse on the stack's S3 server
  (SeaweedFS);
- the Schema Registry: the stack's (Apicurio);
- ISK over HTTPS (the brokers' certificate, signed by the stack's CA), metrics on.

``config check`` passes; ``pipeline run --once`` copies a topic into the REST catalog's S3
warehouse; ``bergstream run`` serves it as ``merged`` over HTTPS to PyIceberg, and its
``/readyz`` and ``/metrics`` answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from bergstream.devstack.stack.ports import free_ports
from tests.kits.ksi_stack import run_pipeline_once
from tests.kits.token_gateway import TokenGateway
from tests.support import (
    BERGSTREAM,
    ProxyProcess,
    admin_librdkafka,
    start_bergstream_run,
)

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "production.yaml"
TOKEN = "catalog-token-" + uuid.uuid4().hex
ISK_SECRET = "isk-production-secret-" + uuid.uuid4().hex
RECORDS = 120


@dataclass
class Production:
    env: dict[str, str]
    topic: str
    rest: TokenGateway
    ca: Path
    home: Path


def produce(env: dict[str, str], topic: str) -> list[bytes]:
    producer = Producer(admin_librdkafka(env))
    values = [f"{topic}-{n}".encode() for n in range(RECORDS)]
    for n, value in enumerate(values):
        producer.produce(topic, value=value, partition=n % 2)
    assert producer.flush(60) == 0
    return values


@pytest.fixture(scope="module")
def production(
    secure_stack_env: dict[str, str],
    rest_catalog_env: dict[str, str],
    new_secure_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Production]:
    home = tmp_path_factory.mktemp("production")
    rest = TokenGateway(rest_catalog_env["BERGSTREAM_REST_CATALOG_URL"], TOKEN)
    rest.start()
    security = Path(secure_stack_env["BERGSTREAM_HOME"]) / "security"
    catalog_port, s3_port, metrics_port = free_ports(3)
    env = {
        "BERGSTREAM_HOME": str(home),
        "KAFKA_BOOTSTRAP_SERVERS": secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"],
        "KAFKA_CLIENT_PROPERTIES": str(security / "kafka-admin-oauthbearer-java.properties"),
        "ICEBERG_REST_URI": rest.url,
        "ICEBERG_WAREHOUSE": rest_catalog_env["BERGSTREAM_REST_CATALOG_WAREHOUSE"],
        "ICEBERG_REST_TOKEN": TOKEN,
        "S3_ENDPOINT": rest_catalog_env["BERGSTREAM_S3_ENDPOINT"],
        "AWS_ACCESS_KEY_ID": rest_catalog_env["BERGSTREAM_S3_ACCESS_KEY"],
        "AWS_SECRET_ACCESS_KEY": rest_catalog_env["BERGSTREAM_S3_SECRET_KEY"],
        "AWS_REGION": rest_catalog_env["BERGSTREAM_S3_REGION"],
        "BERGSTREAM_CHECKPOINT_DIR": str(home / "checkpoints"),
        "SCHEMA_REGISTRY_URL": rest_catalog_env["BERGSTREAM_SCHEMA_REGISTRY_URL"],
        "VALUE_CODEC": "raw",
        "ISK_HOST": "127.0.0.1",
        "ISK_CATALOG_PORT": str(catalog_port),
        "ISK_S3_PORT": str(s3_port),
        "ISK_ACCESS_KEY": "isk-production",
        "ISK_SECRET_KEY": ISK_SECRET,
        # The brokers' key and certificate chain (127.0.0.1 in its names), one PEM file.
        "ISK_TLS_CERT_FILE": str(security / "broker.pem"),
        "ISK_TLS_KEY_FILE": str(security / "broker.pem"),
        "BERGSTREAM_METRICS_HOST": "127.0.0.1",
        "BERGSTREAM_METRICS_PORT": str(metrics_port),
    }
    topic = new_secure_topic(partitions=2, prefix="production")
    produce(secure_stack_env, topic)
    try:
        yield Production(env, topic, rest, security / "ca.pem", home)
    finally:
        rest.stop()


def bergstream(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BERGSTREAM, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_config_check_passes_and_show_masks_the_secrets(production: Production) -> None:
    checked = bergstream(production.env, "config", "check", str(EXAMPLE))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shown = bergstream(production.env, "config", "show", str(EXAMPLE))
    assert shown.returncode == 0, shown.stderr
    for secret in (TOKEN, ISK_SECRET, production.env["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in shown.stdout


# Run in a process of its own: the AWS SDK reads SSL_CERT_FILE once per process.
MERGED_OVER_HTTPS = """
import json, sys
from pyiceberg.catalog.rest import RestCatalog
catalog_url, ca, topic = sys.argv[1:4]
table = RestCatalog("isk", uri=catalog_url, ssl={"cabundle": ca}).load_table(f"merged.{topic}")
values = table.scan(selected_fields=("kafka_value",)).to_arrow()["kafka_value"].to_pylist()
print(json.dumps({"values": sorted(v.decode() for v in values)}))
"""


def test_the_pipeline_copies_and_isk_serves_it_over_https(
    production: Production, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in production.env.items():
        monkeypatch.setenv(name, value)
    refused = production.rest.refused
    summary = run_pipeline_once(EXAMPLE, production.topic)
    assert summary["records"] == RECORDS, summary
    assert production.rest.commits > 0 and production.rest.refused == refused
    isk: ProxyProcess = start_bergstream_run(
        EXAMPLE, production.env["KAFKA_BOOTSTRAP_SERVERS"], production.env, "production ISK"
    )
    try:
        url = f"https://127.0.0.1:{production.env['ISK_CATALOG_PORT']}"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE")
        }
        done = subprocess.run(
            [sys.executable, "-c", MERGED_OVER_HTTPS, url, str(production.ca), production.topic],
            capture_output=True,
            text=True,
            env={**env, "SSL_CERT_FILE": str(production.ca)},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:] + isk.log()[-3000:]
        values = json.loads(done.stdout.splitlines()[-1])["values"]
        assert values == sorted(f"{production.topic}-{n}" for n in range(RECORDS))
        metrics = f"http://127.0.0.1:{production.env['BERGSTREAM_METRICS_PORT']}"
        with urllib.request.urlopen(f"{metrics}/readyz", timeout=30) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"{metrics}/metrics", timeout=30) as answer:
            assert b"bergstream_ready 1.0" in answer.read()
    finally:
        assert isk.stop() == 0, isk.log()
    log = isk.log()
    assert TOKEN not in log and ISK_SECRET not in log
