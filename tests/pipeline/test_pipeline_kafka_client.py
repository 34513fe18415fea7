"""``lake.kafka_client``: what the pipeline's Kafka clients get from it (Spark's Kafka source and
admin client in Java names, the typed batches' librdkafka reads), ``lake.pipeline.kafka_options``
over it, errors naming the key, and no password in any output. Fast: no Kafka, no Spark."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bergstream.core.config import ConfigError, load_config, parse_config
from bergstream.core.plugins import load_registry
from bergstream.devstack.stack import kafka_security
from bergstream.pipeline.kafka import kafka_client_properties
from bergstream.pipeline.settings import PipelineLake, pipeline_lake
from bergstream.pipeline.stream import worker_fetch_settings
from tests.support import BERGSTREAM

PASSWORD = "pipe-s3cr3t-Pa55"
BOOTSTRAP = "127.0.0.1:19092,127.0.0.1:19093"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> kafka_security.SecurityFiles:
    """A CA and client certificates, as the secured stack makes them."""
    return kafka_security.ensure_security_files(tmp_path_factory.mktemp("lake-kc") / "home")


def properties_file(
    directory: Path, files: kafka_security.SecurityFiles, password: str | None = PASSWORD
) -> Path:
    """A librdkafka properties file like ``BERGSTREAM_KAFKA_CONFIG`` (SCRAM over TLS)."""
    lines = [
        "bootstrap.servers=127.0.0.1:1",  # not the lake's: lake.kafka_bootstrap wins
        "security.protocol=SASL_SSL",
        "sasl.mechanisms=SCRAM-SHA-512",
        "sasl.username=admin",
        f"ssl.ca.location={files.ca_cert}",
    ]
    if password is not None:
        lines.append(f"sasl.password={password}")
    path = directory / "client.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def lake_text(client: str, pipeline: str = "") -> str:
    """A config file with a ``lake:`` section holding ``client`` (the lines under
    ``kafka_client:``) and ``pipeline`` (lines under ``pipeline:``)."""
    text = (
        "lake:\n"
        "  kafka_bootstrap: ${BOOT}\n"
        "  catalog: {uri: 'sqlite:///${HOME_DIR}/catalog.db', warehouse: '${HOME_DIR}/wh'}\n"
        "  kafka_client:\n" + client
    )
    if pipeline:
        text += "  pipeline:\n" + pipeline
    return text


def load_lake(text: str, home: Path, **env: str) -> PipelineLake:
    """``text`` loaded as ``bergstream pipeline run`` loads it (every plugin installed)."""
    config = parse_config(
        text, registry=load_registry(), env={"BOOT": BOOTSTRAP, "HOME_DIR": str(home), **env}
    )
    return pipeline_lake(config, home=home)


def test_a_properties_file_gives_spark_the_java_security_settings(
    tmp_path: Path, files: kafka_security.SecurityFiles
) -> None:
    path = properties_file(tmp_path, files)
    lake = load_lake(lake_text("    properties_file: ${CONF:-}\n"), tmp_path, CONF=str(path))
    props = kafka_client_properties(lake.config, lake.pipeline.kafka_options)
    assert props["bootstrap.servers"] == BOOTSTRAP
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    jaas = props["sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.scram.ScramLoginModule required ")
    assert 'username="admin"' in jaas and f'password="{PASSWORD}"' in jaas
    assert props["ssl.truststore.type"] == "PEM"
    assert props["ssl.truststore.location"] == str(files.ca_cert)
    assert props["ssl.endpoint.identification.algorithm"] == "https"
    # No librdkafka-only names reach the Java client (it would warn about unknown configs).
    assert not {"ssl.ca.location", "sasl.password", "sasl.username"} & set(props)


def test_the_typed_workers_read_with_the_librdkafka_settings(
    tmp_path: Path, files: kafka_security.SecurityFiles
) -> None:
    path = properties_file(tmp_path, files)
    lake = load_lake(lake_text(f"    properties_file: '{path}'\n"), tmp_path)
    fetch = worker_fetch_settings(lake, "orders")
    # A kafka_client block alone does not send typed batches through Spark's source.
    assert fetch is not None
    consumer = fetch.consumer_config()
    assert consumer["bootstrap.servers"] == BOOTSTRAP
    assert consumer["security.protocol"] == "SASL_SSL"
    assert consumer["sasl.mechanism"] == "SCRAM-SHA-512"
    assert consumer["sasl.username"] == "admin" and consumer["sasl.password"] == PASSWORD
    assert consumer["ssl.ca.location"] == str(files.ca_cert)
    assert consumer["isolation.level"] == "read_committed"
    assert PASSWORD not in repr(fetch)


def test_mutual_tls_gives_spark_an_inline_pem_key_store(
    tmp_path: Path, files: kafka_security.SecurityFiles
) -> None:
    client = (
        "    security.protocol: SSL\n"
        f"    ssl.ca.location: '{files.ca_cert}'\n"
        f"    ssl.certificate.location: '{files.user_cert('admin')}'\n"
        f"    ssl.key.location: '{files.user_key('admin')}'\n"
    )
    lake = load_lake(lake_text(client), tmp_path)
    props = kafka_client_properties(lake.config, lake.pipeline.kafka_options)
    assert props["security.protocol"] == "SSL" and "sasl.jaas.config" not in props
    assert props["ssl.keystore.type"] == "PEM"
    assert props["ssl.keystore.certificate.chain"] == files.user_cert("admin").read_text()
    assert props["ssl.keystore.key"] == files.user_key("admin").read_text()
    fetch = worker_fetch_settings(lake, "orders")
    assert fetch is not None
    assert fetch.client["ssl.certificate.location"] == str(files.user_cert("admin"))
    assert fetch.client["ssl.key.location"] == str(files.user_key("admin"))


def test_kafka_options_override_the_kafka_client_block(
    tmp_path: Path, files: kafka_security.SecurityFiles
) -> None:
    path = properties_file(tmp_path, files)
    pipeline = (
        "    kafka_options:\n"
        "      ssl.endpoint.identification.algorithm: ''\n"
        "      client.id: lake-copier\n"
    )
    lake = load_lake(lake_text(f"    properties_file: '{path}'\n", pipeline), tmp_path)
    props = kafka_client_properties(lake.config, lake.pipeline.kafka_options)
    assert props["ssl.endpoint.identification.algorithm"] == ""
    assert props["client.id"] == "lake-copier"
    assert props["security.protocol"] == "SASL_SSL"  # the block's, where no option overrides
    # kafka_options are Java names: typed batches then come from Spark's source, as before.
    assert worker_fetch_settings(lake, "orders") is None


def test_an_empty_properties_file_means_plaintext(tmp_path: Path) -> None:
    lake = load_lake(lake_text("    properties_file: ${UNSET_KAFKA_CONFIG:-}\n"), tmp_path)
    assert kafka_client_properties(lake.config, {}) == {
        "bootstrap.servers": BOOTSTRAP,
        "security.protocol": "PLAINTEXT",
    }
    fetch = worker_fetch_settings(lake, "t")
    assert fetch is not None
    assert dict(fetch.client) == {"bootstrap.servers": BOOTSTRAP, "security.protocol": "PLAINTEXT"}
    # And without any kafka_client block (every lake written before it existed).
    bare = parse_config(
        f"lake: {{kafka_bootstrap: '{BOOTSTRAP}'}}\n", registry=load_registry(), env={}
    )
    assert bare.lake is not None and bare.lake.kafka_client.security_protocol == "PLAINTEXT"


def problems(text: str, home: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as error:
        load_lake(text, home)
    return {p.path: p.message for p in error.value.problems}


def test_a_bad_block_names_the_key(tmp_path: Path, files: kafka_security.SecurityFiles) -> None:
    missing = problems(
        lake_text(
            "    security.protocol: SASL_SSL\n    sasl.mechanism: SCRAM-SHA-512\n"
            f"    sasl.username: admin\n    ssl.ca.location: '{files.ca_cert}'\n"
        ),
        tmp_path,
    )
    assert list(missing) == ["lake.kafka_client"]
    assert "SCRAM-SHA-512 needs sasl.password" in missing["lake.kafka_client"]

    typo = problems(lake_text(f"    sasl.pasword: {PASSWORD}\n"), tmp_path)
    assert typo == {
        "lake.kafka_client.sasl.pasword": "unknown key: remove it or check its spelling"
    }

    mechanism = problems(lake_text("    security.protocol: SASL_SSL\n    sasl.mechanism: MD5\n"),
                         tmp_path)  # fmt: skip
    assert "unknown sasl.mechanism 'MD5'" in mechanism["lake.kafka_client.sasl.mechanism"]

    nowhere = tmp_path / "nope.properties"
    file = problems(lake_text(f"    properties_file: '{nowhere}'\n"), tmp_path)
    assert "properties_file" in next(iter(file.values())) and str(nowhere) in str(file)

    contradiction = problems(
        lake_text(f"    security.protocol: PLAINTEXT\n    sasl.password: {PASSWORD}\n"), tmp_path
    )
    assert "security.protocol is PLAINTEXT" in contradiction["lake.kafka_client"]
    assert PASSWORD not in str(missing) + str(typo) + str(contradiction)


def config_check(path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERGSTREAM_")}
    return subprocess.run(
        [BERGSTREAM, "config", "check", str(path)],
        capture_output=True,
        text=True,
        env={**env, "BERGSTREAM_HOME": str(home), "BOOT": BOOTSTRAP, "HOME_DIR": str(home)},
        timeout=60,
    )


def test_config_check_never_shows_the_password(
    tmp_path: Path, files: kafka_security.SecurityFiles
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(lake_text(f"    properties_file: '{properties_file(tmp_path, files)}'\n"))
    done = config_check(good, tmp_path)
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        lake_text(
            "    security.protocol: SSL\n    sasl.mechanism: PLAIN\n"
            f"    sasl.username: admin\n    sasl.password: {PASSWORD}\n"
        )
    )
    done = config_check(bad, tmp_path)
    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert "lake.kafka_client" in output and "security.protocol is SSL" in output
    assert PASSWORD not in output


@pytest.mark.parametrize("example", ["lake.yaml", "ksi.yaml", "isk.yaml"])
def test_the_examples_read_the_stack_properties_file(
    example: str, tmp_path: Path, files: kafka_security.SecurityFiles
) -> None:
    path = properties_file(tmp_path, files)
    env = {
        "BERGSTREAM_KAFKA_BOOTSTRAP": BOOTSTRAP,
        "BERGSTREAM_HOME": str(tmp_path),
        "BERGSTREAM_SCHEMA_REGISTRY_URL": "http://127.0.0.1:1",
        "BERGSTREAM_REDIS_URL": "redis://127.0.0.1:1",
        "BERGSTREAM_S3_ENDPOINT": "http://127.0.0.1:1",
        "BERGSTREAM_S3_ACCESS_KEY": "a",
        "BERGSTREAM_S3_SECRET_KEY": "b",
        "BERGSTREAM_S3_REGION": "us-east-1",
    }
    registry = load_registry()
    secured = load_config(
        REPO / "examples" / example,
        registry=registry,
        env={**env, "BERGSTREAM_KAFKA_CONFIG": str(path)},
    )
    assert secured.lake is not None
    assert secured.lake.kafka_client.security_protocol == "SASL_SSL"
    assert secured.lake.kafka_client.sasl_username == "admin"
    plain = load_config(REPO / "examples" / example, registry=registry, env=env)
    assert plain.lake is not None and plain.lake.kafka_client.security_protocol == "PLAINTEXT"


def test_spark_redacts_the_kafka_sources_secrets() -> None:
    """Spark hides option values whose key or value matches ``spark.redaction.regex`` in plans,
    logs and its UI: the JAAS line and an inline private key must match."""
    import re

    from bergstream.pipeline.session import session_conf

    pattern = re.compile(session_conf()["spark.redaction.regex"])
    for key in ("kafka.sasl.jaas.config", "kafka.ssl.keystore.key", "kafka.ssl.key.password"):
        assert pattern.search(key), key
    assert not pattern.search("kafka.bootstrap.servers")
