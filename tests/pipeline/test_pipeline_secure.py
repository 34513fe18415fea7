"""The lake pipeline against a secured Kafka (three brokers, SASL_SSL with SCRAM-SHA-512, the
standard authorizer): with ``lake.kafka_client`` read from the stack's properties file it copies
a raw topic (Spark's Kafka source) and a typed topic (the Python workers' own librdkafka reads)
into tables that hold every record exactly once, also over several runs; a user without ACLs
gets an error saying authorization failed for the topic, a wrong password an authentication
error, both at once and without the password."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import VALUE_ERROR_COLUMN, KafkaClientSettings
from bergstream.core.config import parse_config
from bergstream.core.plugins import load_registry
from bergstream.pipeline.session import PipelineSetupError, attach_catalog
from bergstream.pipeline.settings import PipelineLake, pipeline_lake
from bergstream.pipeline.stream import PipelineError, run_pipeline, worker_fetch_settings
from bergstream.pipeline.typed import topic_typing
from tests.kits.avro_registry import typed_context
from tests.kits.worker_spark import worker_spark
from tests.pipeline.typed_kit import coldset, sorted_rows

pytestmark = pytest.mark.slow

PARTS = 3
#: A record as compared: partition, offset, key, value, headers, timestamp (ms).
Seen = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]


def lake_of(env: dict[str, str], home: Path, config_variable: str) -> PipelineLake:
    """The lake of a config file as users write it: ``kafka_client`` from the properties file
    in ``config_variable`` (``${...:-}``: plaintext when unset), a catalog of its own under
    ``home`` (one Spark session holds it next to the other pipeline tests' catalog)."""
    text = textwrap.dedent(
        f"""
        lake:
          kafka_bootstrap: ${{BERGSTREAM_KAFKA_BOOTSTRAP}}
          kafka_client:
            properties_file: ${{{config_variable}:-}}
          namespace: secured
          catalog:
            name: secure_lake
            uri: sqlite:///{home}/catalog.db
            warehouse: {home}/warehouse
          pipeline:
            checkpoint_dir: {home}/checkpoints
        """
    )
    return pipeline_lake(parse_config(text, registry=load_registry(), env=env), home=home)


@pytest.fixture(scope="module")
def secure_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secure-lake")


@pytest.fixture(scope="module")
def secure_lake(secure_stack_env: dict[str, str], secure_home: Path) -> PipelineLake:
    lake = lake_of(secure_stack_env, secure_home, "BERGSTREAM_KAFKA_CONFIG")
    assert lake.config.kafka_client.security_protocol == "SASL_SSL"
    return lake


@pytest.fixture(scope="session")
def secure_spark() -> Any:
    """The worker's Spark session (:func:`~tests.kits.worker_spark.worker_spark`: one local[2]
    session per test process, kept until it exits, never stopped by a fixture: other files of
    the worker use it too), without starting the plaintext stack that the ``spark`` fixture's
    default lake needs."""
    return worker_spark()


@pytest.fixture(scope="module")
def spark(secure_spark: Any, secure_lake: PipelineLake) -> Any:
    attach_catalog(secure_spark, secure_lake)
    return secure_spark


def admin_client(env: dict[str, str]) -> dict[str, str]:
    """librdkafka settings of the admin user."""
    client = KafkaClientSettings.model_validate({"properties_file": env["BERGSTREAM_KAFKA_CONFIG"]})
    return {**client.librdkafka(), "bootstrap.servers": env["BERGSTREAM_KAFKA_BOOTSTRAP"]}


def produce(env: dict[str, str], topic: str, values: list[bytes], first: int) -> None:
    """``values`` as records ``first``.. spread over the partitions, produced as admin with
    confluent-kafka (idempotent: a retry makes no duplicate)."""
    from confluent_kafka import Producer

    producer = Producer({**admin_client(env), "enable.idempotence": True, "linger.ms": 5})
    errors: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    for number, value in enumerate(values, first):
        producer.produce(
            topic,
            value=value,
            key=b"k%d" % number,
            partition=number % PARTS,
            headers=[("n", b"%d" % number)],
            timestamp=1_700_000_000_000 + number,
            on_delivery=delivered,
        )
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors


def consume_all(env: dict[str, str], topic: str) -> list[Seen]:
    """Every record of ``topic``, read as admin with confluent-kafka: the ground truth."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **admin_client(env),
            "group.id": f"truth-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTS)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])
        seen: list[Seen] = []
        positions = dict.fromkeys(range(PARTS), 0)
        deadline = time.monotonic() + 120
        while any(positions[p] < ends[p] for p in range(PARTS)):
            assert time.monotonic() < deadline, f"reading {topic} took over 120 s"
            for message in consumer.consume(500, 1.0):
                assert message.error() is None, message.error()
                seen.append(
                    (
                        message.partition(),
                        message.offset(),
                        message.key(),
                        message.value(),
                        tuple(message.headers() or ()),
                        message.timestamp()[1],
                    )
                )
                positions[message.partition()] = message.offset() + 1
        return sorted(seen)
    finally:
        consumer.close()


def table_seen(
    lake: PipelineLake, topic: str, values: dict[int, bytes] | None = None
) -> list[Seen]:
    """The table's rows as records; a typed table's values (null where they decoded
    canonically) taken from ``values`` by record number (the header ``n``)."""
    out: list[Seen] = []
    for row in sorted_rows(coldset(lake, topic).scan().to_arrow()):
        headers = tuple((h["key"], h["value"]) for h in row["kafka_headers"])
        value = row["kafka_value"]
        if values is not None and value is None:
            value = values[int(dict(headers)["n"])]
        out.append(
            (
                row["kafka_partition"],
                row["kafka_offset"],
                row["kafka_key"],
                value,
                headers,
                round(row["kafka_timestamp"].timestamp() * 1000),
            )
        )
    return out


def quiet(line: str) -> None:
    pass


def test_a_raw_topic_is_copied_exactly_once(
    spark: Any,
    secure_lake: PipelineLake,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
) -> None:
    topic = new_secure_topic(PARTS, prefix="lake-raw")
    produce(secure_stack_env, topic, [b"raw-%d" % n for n in range(150)], 0)
    first = run_pipeline(spark, secure_lake, topic, once=True, report=quiet)
    assert first.records == 150
    again = run_pipeline(spark, secure_lake, topic, once=True, report=quiet)
    assert again.records == 0 and again.batches == 0
    produce(secure_stack_env, topic, [b"raw-%d" % n for n in range(150, 240)], 150)
    later = run_pipeline(spark, secure_lake, topic, once=True, report=quiet)
    assert later.records == 90
    truth = consume_all(secure_stack_env, topic)
    assert len(truth) == 240
    assert table_seen(secure_lake, topic) == truth
    assert later.boundary == {p: 80 for p in range(PARTS)}


def test_a_typed_topic_is_read_by_the_workers_over_sasl_ssl(
    spark: Any,
    secure_lake: PipelineLake,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    # The kafka_client block does not send typed batches through Spark's source: the workers
    # read them themselves, with the block's librdkafka settings.
    fetch = worker_fetch_settings(secure_lake, "t")
    assert fetch is not None and fetch.client["security.protocol"] == "SASL_SSL"
    topic = new_secure_topic(PARTS, prefix="lake-typed")
    codecs = {"topics": [{"match": topic, "value": "json"}]}  # no registry
    typing = topic_typing(typed_context(tmp_path, codecs), topic)
    assert typing is not None
    values = {
        n: json.dumps({"id": n, "name": f"order {n}"}, separators=(",", ":")).encode()
        for n in range(120)
    }
    produce(secure_stack_env, topic, [values[n] for n in range(90)], 0)
    first = run_pipeline(spark, secure_lake, topic, once=True, report=quiet, codecs=typing)
    assert first.records == 90
    produce(secure_stack_env, topic, [values[n] for n in range(90, 120)], 90)
    second = run_pipeline(spark, secure_lake, topic, once=True, report=quiet, codecs=typing)
    assert second.records == 30

    truth = consume_all(secure_stack_env, topic)
    assert len(truth) == 120
    assert table_seen(secure_lake, topic, values) == truth
    rows = sorted_rows(coldset(secure_lake, topic).scan().to_arrow())
    assert all(row[VALUE_ERROR_COLUMN] is None for row in rows)
    assert sorted((row["id"], row["name"]) for row in rows) == [
        (n, f"order {n}") for n in range(120)
    ]


def test_a_user_without_acls_gets_an_authorization_error(
    spark: Any,
    secure_stack_env: dict[str, str],
    secure_home: Path,
    new_secure_topic: Callable[..., str],
) -> None:
    topic = new_secure_topic(PARTS, prefix="lake-denied")
    produce(secure_stack_env, topic, [b"x"], 0)
    lake = lake_of(secure_stack_env, secure_home, "BERGSTREAM_KAFKA_CONFIG_NOACCESS")
    assert lake.config.kafka_client.sasl_username == "noaccess"
    began = time.monotonic()
    with pytest.raises(PipelineSetupError) as error:
        run_pipeline(spark, lake, topic, once=True, report=quiet)
    assert time.monotonic() - began < 60
    message = str(error.value)
    assert f"authorization failed for topic '{topic}'" in message, message
    assert "user 'noaccess'" in message and "lake.kafka_client" in message, message


def test_a_wrong_password_gets_an_authentication_error(
    spark: Any,
    secure_stack_env: dict[str, str],
    secure_home: Path,
    new_secure_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = new_secure_topic(PARTS, prefix="lake-badpw")
    wrong = "not-the-Password-42"
    source = Path(secure_stack_env["BERGSTREAM_KAFKA_CONFIG"]).read_text()
    lines = [
        f"sasl.password={wrong}" if line.startswith("sasl.password=") else line
        for line in source.splitlines()
    ]
    assert f"sasl.password={wrong}" in lines
    properties = tmp_path / "wrong.properties"
    properties.write_text("\n".join(lines) + "\n")
    env = {**secure_stack_env, "WRONG_CONFIG": str(properties)}
    lake = lake_of(env, secure_home, "WRONG_CONFIG")
    began = time.monotonic()
    with pytest.raises(PipelineSetupError) as error:
        run_pipeline(spark, lake, topic, once=True, report=quiet)
    assert time.monotonic() - began < 60
    message = str(error.value)
    assert "authentication failed" in message.lower(), message
    assert "sasl.password" in message, message
    assert wrong not in message


@pytest.mark.parametrize("typed", [False, True], ids=["spark-source", "workers"])
def test_a_user_who_may_describe_but_not_read_gets_an_authorization_error(
    typed: bool,
    spark: Any,
    secure_stack_env: dict[str, str],
    secure_home: Path,
    new_secure_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    topic = new_secure_topic(PARTS, prefix="lake-noread")
    produce(secure_stack_env, topic, [b'{"id":1}', b'{"id":2}'], 0)
    admin = AdminClient(admin_client(secure_stack_env))
    describe = AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:noaccess", "*",
        AclOperation.DESCRIBE, AclPermissionType.ALLOW,
    )  # fmt: skip
    for future in admin.create_acls([describe]).values():
        future.result(timeout=30)
    lake = lake_of(secure_stack_env, secure_home, "BERGSTREAM_KAFKA_CONFIG_NOACCESS")
    codecs = None
    if typed:
        rules = {"topics": [{"match": topic, "value": "json"}]}
        codecs = topic_typing(typed_context(tmp_path, rules), topic)
    began = time.monotonic()
    with pytest.raises(PipelineError) as error:
        run_pipeline(spark, lake, topic, once=True, report=quiet, codecs=codecs)
    assert time.monotonic() - began < 120
    message = str(error.value)
    assert f"authorization failed for topic '{topic}'" in message, message
    assert "user 'noaccess'" in message, message


def java_client_file(env: dict[str, str], folder: Path) -> Path:
    """The stack's admin identity as a Java ``client.properties`` as people have one: its JAAS
    line, a PKCS12 trust store of the stack's CA, and a client setting of the clients' own."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, pkcs12

    stack = KafkaClientSettings.model_validate({"properties_file": env["BERGSTREAM_KAFKA_CONFIG"]})
    assert stack.ssl_ca_location is not None and stack.sasl_password is not None
    cas = x509.load_pem_x509_certificates(stack.ssl_ca_location.read_bytes())
    store = folder / "truststore.p12"
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(
            None, None, None, cas, BestAvailableEncryption(b"changeit")
        )
    )
    module = (
        "plain.PlainLoginModule" if stack.sasl_mechanism == "PLAIN" else "scram.ScramLoginModule"
    )
    path = folder / "client.properties"
    path.write_text(
        textwrap.dedent(
            f"""\
            # A Java client file: JAAS line, PKCS12 trust store, a key of the clients' own
            security.protocol: SASL_SSL
            sasl.mechanism: {stack.sasl_mechanism}
            sasl.jaas.config=org.apache.kafka.common.security.{module} required \\
                username="{stack.sasl_username}" \\
                password="{stack.sasl_password.get_secret_value()}";
            ssl.truststore.type=PKCS12
            ssl.truststore.location={store}
            ssl.truststore.password=changeit
            client.id=java-file-client
            """
        )
    )
    return path


def test_a_java_client_properties_file_copies_a_typed_topic(
    spark: Any,
    secure_stack_env: dict[str, str],
    secure_home: Path,
    new_secure_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    path = java_client_file(secure_stack_env, tmp_path)
    lake = lake_of(
        {**secure_stack_env, "JAVA_CLIENT_FILE": str(path)}, secure_home, "JAVA_CLIENT_FILE"
    )
    client = lake.config.kafka_client
    assert client.client_properties == {"client.id": "java-file-client"}
    assert client.java()["client.id"] == "java-file-client"
    fetch = worker_fetch_settings(lake, "t")
    assert fetch is not None and fetch.client["client.id"] == "java-file-client"
    topic = new_secure_topic(PARTS, prefix="lake-java-file")
    typing = topic_typing(
        typed_context(tmp_path, {"topics": [{"match": topic, "value": "json"}]}), topic
    )
    values = {n: json.dumps({"id": n}).encode() for n in range(60)}
    produce(secure_stack_env, topic, list(values.values()), 0)
    # Spark's Kafka source (Java: the JAAS line, the PKCS12 store) plans the batches, the
    # workers (librdkafka: the PEM written from it) read them.
    result = run_pipeline(spark, lake, topic, once=True, report=quiet, codecs=typing)
    assert result.records == 60
    assert table_seen(lake, topic, values) == consume_all(secure_stack_env, topic)
