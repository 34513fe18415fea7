"""ISK serves each principal only what Kafka lets that principal read, on the secured 3-broker
stack (SASL_SSL, SCRAM-SHA-512, StandardAuthorizer, no ACL means no access).

``bergstream run`` serves two topics to four principals: ``admin`` (the stack's admin), a
``reader`` user created here with READ and DESCRIBE on one topic only, ``noaccess`` (the stack's
user without any ACL) and ``wrongpw`` (the reader with a wrong Kafka password). PyIceberg and
DuckDB check that admin reads both topics, the reader only its own (its LoadTable of the other is
a 404, a direct S3 GET of the other's file signed with its own vended session credentials a
403, and so is the admin's with the credentials of another table), noaccess sees
no table, wrong catalog and Kafka passwords are authentication errors, and ISK stays up."""

from __future__ import annotations

import asyncio
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import KafkaAuthenticationError, KafkaClientSettings, open_kafka_connection
from bergstream.devstack.stack.ports import free_ports
from tests.kits.isk_gateway import duckdb_connection
from tests.support import ProxyProcess, boto_s3, s3_error, start_bergstream_run, wait_until

pytestmark = pytest.mark.slow

ROOT_KEY = "isk-acls"
ROOT_SECRET = "isk-acls-root-secret"
READER_PASSWORD = "reader-" + uuid.uuid4().hex
SECRETS = {
    "admin": "admin-client-secret",
    "reader": "reader-client-secret",
    "noaccess": "noaccess-client-secret",
    "wrongpw": "wrongpw-client-secret",
}
BASIC_PASSWORD = "noaccess-basic-password"
PER_PARTITION = 5
PARTITIONS = 2
COLUMNS = "kafka_partition, kafka_offset, kafka_value"


@dataclass
class Setup:
    """The running gateway, its topics and the reader's Kafka user."""

    process: ProxyProcess
    catalog_url: str
    s3_url: str
    allowed: str
    other: str
    described: str
    reader_user: str


def admin_config(env: dict[str, str]) -> dict[str, str]:
    settings = KafkaClientSettings.model_validate(
        {"properties_file": env["BERGSTREAM_KAFKA_CONFIG"]}
    )
    return {**settings.librdkafka(), "bootstrap.servers": env["BERGSTREAM_KAFKA_BOOTSTRAP"]}


def produce(env: dict[str, str], topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({**admin_config(env), "acks": "all", "linger.ms": 0})
    for partition in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(topic, value=f"{topic}-p{partition}-{i}".encode(), partition=partition)
    assert producer.flush(60) == 0


def expected(topic: str) -> list[tuple[int, int, bytes]]:
    return sorted(
        (p, i, f"{topic}-p{p}-{i}".encode())
        for p in range(PARTITIONS)
        for i in range(PER_PARTITION)
    )


def create_reader(env: dict[str, str], user: str, topic: str, described: str) -> None:
    """A SCRAM-SHA-512 user with READ and DESCRIBE on ``topic`` and only DESCRIBE on
    ``described``, made with Kafka's admin API as the stack's admin (as kafka-configs.sh and
    kafka-acls.sh would)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(admin_config(env))
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), READER_PASSWORD.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=60)
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in (AclOperation.READ, AclOperation.DESCRIBE)
    ]
    bindings.append(
        AclBinding(
            ResourceType.TOPIC,
            described,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            AclOperation.DESCRIBE,
            AclPermissionType.ALLOW,
        )
    )
    for future in admin.create_acls(bindings).values():
        future.result(timeout=60)

    # Credentials reach every broker asynchronously: wait until each accepts the user.
    settings = KafkaClientSettings.model_validate(
        {
            "properties_file": env["BERGSTREAM_KAFKA_CONFIG"],
            "sasl.username": user,
            "sasl.password": READER_PASSWORD,
        }
    )

    async def every_broker_accepts() -> bool:
        for part in env["BERGSTREAM_KAFKA_BOOTSTRAP"].split(","):
            host, _, port = part.rpartition(":")
            try:
                connection = await open_kafka_connection(host, int(port), settings, timeout=10)
            except KafkaAuthenticationError:
                return False
            await connection.close()
        return True

    wait_until(lambda: asyncio.run(every_broker_accepts()), timeout=60, interval=1)


def write_config(env: dict[str, str], workdir: Path, reader: str) -> tuple[Path, int, int]:
    catalog_port, s3_port = free_ports(2)
    config = workdir / "isk.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            services:
              - type: isk
                config:
                  cluster: acls
                  kafka_bootstrap: "{env["BERGSTREAM_KAFKA_BOOTSTRAP"]}"
                  kafka_client:
                    properties_file: "{env["BERGSTREAM_KAFKA_CONFIG"]}"
                  chunk_records: 4
                  index_interval_seconds: 0
                  authorization_cache_seconds: 2
                  http:
                    catalog_port: {catalog_port}
                    s3_port: {s3_port}
                    access_key: {ROOT_KEY}
                    secret_key: {ROOT_SECRET}
                  principals:
                    - name: admin
                      client_id: admin
                      client_secret: {SECRETS["admin"]}
                      kafka_client:
                        properties_file: "{env["BERGSTREAM_KAFKA_CONFIG"]}"
                    - name: reader
                      client_id: reader
                      client_secret: {SECRETS["reader"]}
                      sasl.username: {reader}
                      sasl.password: {READER_PASSWORD}
                    - name: noaccess
                      client_id: noaccess
                      client_secret: {SECRETS["noaccess"]}
                      user: noaccess
                      password: {BASIC_PASSWORD}
                      kafka_client:
                        properties_file: "{env["BERGSTREAM_KAFKA_CONFIG_NOACCESS"]}"
                    - name: wrongpw
                      client_id: wrongpw
                      client_secret: {SECRETS["wrongpw"]}
                      sasl.username: {reader}
                      sasl.password: not-the-{READER_PASSWORD}
                  index: {{type: sqlite, config: {{path: "{workdir / "index.sqlite"}"}}}}
                  cache: {{type: local, config: {{directory: "{workdir / "cache"}"}}}}
            """
        )
    )
    return config, catalog_port, s3_port


@pytest.fixture(scope="module")
def setup(
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    env = secure_stack_env
    allowed = new_secure_topic(partitions=PARTITIONS, prefix="allowed")
    other = new_secure_topic(partitions=PARTITIONS, prefix="other")
    described = new_secure_topic(partitions=PARTITIONS, prefix="described")
    for topic in (allowed, other, described):
        produce(env, topic)
    reader = f"reader-{uuid.uuid4().hex[:8]}"
    create_reader(env, reader, allowed, described)
    workdir = tmp_path_factory.mktemp("isk-acls")
    config, catalog_port, s3_port = write_config(env, workdir, reader)
    process = start_bergstream_run(
        config,
        env["BERGSTREAM_KAFKA_BOOTSTRAP"],
        {"BERGSTREAM_HOME": str(workdir / "home")},
        "the isk service with principals",
    )
    running = Setup(
        process,
        f"http://127.0.0.1:{catalog_port}",
        f"http://127.0.0.1:{s3_port}",
        allowed,
        other,
        described,
        reader,
    )
    try:
        # ACLs reach the brokers asynchronously too: wait until Kafka lets the reader see its
        # topic through ISK.
        wait_until(lambda: ("hotset", allowed) in catalog(running, "reader").list_tables("hotset"))
        yield running
    finally:
        code = process.stop()
        log = process.log()
        (workdir / "isk.log").write_text(log)
        assert code == 0, f"bergstream run exited with {code}:\n{log}"
        secrets = [READER_PASSWORD, ROOT_SECRET, BASIC_PASSWORD, *SECRETS.values()]
        assert not [s for s in secrets if s in log], "a secret is in the log"


def catalog(setup: Setup, principal: str, secret: str | None = None) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    credential = f"{principal}:{secret or SECRETS[principal]}"
    return RestCatalog(f"isk-{principal}", uri=setup.catalog_url, credential=credential)


def rows(table: Any) -> list[tuple[int, int, bytes]]:
    data = table.scan(selected_fields=("kafka_partition", "kafka_offset", "kafka_value"))
    return sorted(
        (r["kafka_partition"], r["kafka_offset"], r["kafka_value"])
        for r in data.to_arrow().to_pylist()
    )


def alive(setup: Setup) -> None:
    assert setup.process.process.poll() is None, setup.process.log()


def test_admin_sees_and_reads_both_topics(setup: Setup) -> None:
    admin = catalog(setup, "admin")
    tables = admin.list_tables("hotset")
    for topic in (setup.allowed, setup.other, setup.described):
        assert ("hotset", topic) in tables
    for topic in (setup.allowed, setup.other):
        assert rows(admin.load_table(f"hotset.{topic}")) == expected(topic)
    connection = duckdb_connection()
    try:
        attach(connection, setup, "admin")
        for topic in (setup.allowed, setup.other):
            got = connection.execute(f'SELECT {COLUMNS} FROM isk.hotset."{topic}"').fetchall()
            assert sorted(got) == expected(topic)
    finally:
        connection.close()
    alive(setup)


def attach(connection: Any, setup: Setup, principal: str) -> None:
    connection.execute(
        f"CREATE SECRET isk_{principal} (TYPE iceberg, CLIENT_ID '{principal}', "
        f"CLIENT_SECRET '{SECRETS[principal]}', "
        f"OAUTH2_SERVER_URI '{setup.catalog_url}/v1/oauth/tokens')"
    )
    connection.execute(
        f"ATTACH '' AS isk (TYPE iceberg, ENDPOINT '{setup.catalog_url}', SECRET isk_{principal})"
    )


def test_the_reader_sees_and_reads_only_its_topic(setup: Setup) -> None:
    from pyiceberg.exceptions import NoSuchTableError

    reader = catalog(setup, "reader")
    names = {name for _, name in reader.list_tables("hotset")}
    assert setup.allowed in names
    assert setup.other not in names and setup.described not in names  # DESCRIBE is not enough
    table = reader.load_table(f"hotset.{setup.allowed}")
    assert rows(table) == expected(setup.allowed)
    for hidden in (setup.other, setup.described):
        with pytest.raises(NoSuchTableError):
            reader.load_table(f"hotset.{hidden}")
        assert reader.table_exists(f"hotset.{hidden}") is False

    connection = duckdb_connection()
    try:
        attach(connection, setup, "reader")
        got = connection.execute(f'SELECT {COLUMNS} FROM isk.hotset."{setup.allowed}"').fetchall()
        assert sorted(got) == expected(setup.allowed)
        with pytest.raises(Exception, match=r"does not exist|not found|NoSuchTable"):
            connection.execute(f'SELECT count(*) FROM isk.hotset."{setup.other}"').fetchall()
    finally:
        connection.close()
    alive(setup)


def s3_client(setup: Setup, key: str, secret: str, token: str | None = None) -> Any:
    """A boto3 client of the setup's S3 gateway."""
    return boto_s3(setup.s3_url, key, secret, token)


def vended_client(setup: Setup, table: Any) -> Any:
    """An S3 client with the session credentials LoadTable vended with ``table``."""
    from pyiceberg.io import S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN

    props = table.io.properties
    return s3_client(
        setup, props[S3_ACCESS_KEY_ID], props[S3_SECRET_ACCESS_KEY], props[S3_SESSION_TOKEN]
    )


def test_the_reader_vended_keys_cannot_fetch_the_other_topic_from_s3(setup: Setup) -> None:
    from pyiceberg.io import S3_ACCESS_KEY_ID

    admin_table = catalog(setup, "admin").load_table(f"hotset.{setup.other}")
    other_file = next(iter(admin_table.scan().plan_files())).file.file_path
    reader_table = catalog(setup, "reader").load_table(f"hotset.{setup.allowed}")
    own_file = next(iter(reader_table.scan().plan_files())).file.file_path
    key_id = reader_table.io.properties[S3_ACCESS_KEY_ID]
    assert key_id.startswith("ASIA") and key_id != ROOT_KEY
    assert key_id != admin_table.io.properties[S3_ACCESS_KEY_ID]
    reader = vended_client(setup, reader_table)
    bucket, _, own_key = own_file.removeprefix("s3://").partition("/")
    assert reader.get_object(Bucket=bucket, Key=own_key)["Body"].read()[:4] == b"PAR1"
    other_key = other_file.removeprefix(f"s3://{bucket}/")
    assert s3_error(lambda: reader.get_object(Bucket=bucket, Key=other_key)) == (
        "AccessDenied",
        403,
    )
    metadata_key = admin_table.metadata_location.removeprefix(f"s3://{bucket}/")
    assert s3_error(lambda: reader.get_object(Bucket=bucket, Key=metadata_key))[1] == 403
    listed = reader.list_objects_v2(Bucket=bucket, Prefix="acls/hotset/")
    topics = {obj["Key"].split("/")[2] for obj in listed.get("Contents", [])}
    assert topics == {setup.allowed}
    # The admin may read both topics, but each table's credentials only that table's files.
    admin = vended_client(setup, admin_table)
    assert admin.get_object(Bucket=bucket, Key=other_key)["Body"].read()[:4] == b"PAR1"
    assert s3_error(lambda: admin.get_object(Bucket=bucket, Key=own_key)) == ("AccessDenied", 403)
    # The configured pair is only the root of the vended ones: S3 refuses it.
    root = s3_client(setup, ROOT_KEY, ROOT_SECRET)
    assert s3_error(lambda: root.get_object(Bucket=bucket, Key=own_key))[1] == 403
    alive(setup)


def test_noaccess_sees_no_table(setup: Setup) -> None:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import NoSuchTableError

    for noaccess in (
        catalog(setup, "noaccess"),
        RestCatalog(
            "isk-basic",
            uri=setup.catalog_url,
            auth={"type": "basic", "basic": {"username": "noaccess", "password": BASIC_PASSWORD}},
        ),
    ):
        for namespace in ("hotset", "merged"):
            if namespace in {n for (n,) in noaccess.list_namespaces()}:
                assert noaccess.list_tables(namespace) == []
        with pytest.raises(NoSuchTableError):
            noaccess.load_table(f"hotset.{setup.allowed}")
    alive(setup)


def test_wrong_passwords_are_authentication_errors_and_isk_stays_up(setup: Setup) -> None:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import OAuthError, UnauthorizedError

    started = time.monotonic()
    with pytest.raises(OAuthError, match="invalid_client"):
        catalog(setup, "reader", secret="wrong-secret")
    with pytest.raises(UnauthorizedError, match="Unknown user or wrong password"):
        RestCatalog(  # its first call, GET /v1/config, is refused
            "isk-bad-basic",
            uri=setup.catalog_url,
            auth={"type": "basic", "basic": {"username": "noaccess", "password": "wrong"}},
        )
    request = urllib.request.Request(f"{setup.catalog_url}/v1/namespaces/hotset/tables")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 401
    assert b'"type":"NotAuthorizedException"' in caught.value.read()
    # The catalog credential is right, the Kafka password configured for it is not.
    wrong_kafka = catalog(setup, "wrongpw")
    for _ in range(2):
        with pytest.raises(UnauthorizedError) as refused:
            wrong_kafka.list_tables("hotset")
        message = str(refused.value)
        assert "refused the credentials configured for principal 'wrongpw'" in message
        assert READER_PASSWORD not in message
    assert time.monotonic() - started < 60
    alive(setup)
    # Everyone else is still served.
    names = {name for _, name in catalog(setup, "reader").list_tables("hotset")}
    assert setup.allowed in names


async def test_kafka_answers_per_principal_and_the_answer_is_kept_for_its_ttl(
    setup: Setup, secure_stack_env: dict[str, str]
) -> None:
    from bergstream.plugins.isk_gateway.http.principals import Principal, PrincipalRefused
    from bergstream.plugins.isk_gateway.kafka.authorization import TopicAuthorizer

    now = [0.0]
    authorizer = TopicAuthorizer(
        secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"], ttl_seconds=5, clock=lambda: now[0]
    )
    base = {"properties_file": secure_stack_env["BERGSTREAM_KAFKA_CONFIG"]}

    def principal(name: str, **kafka: str) -> Principal:
        settings = KafkaClientSettings.model_validate({**base, **kafka})
        return Principal(name, settings)

    admin = await authorizer.readable(principal("admin"))
    assert {setup.allowed, setup.other, setup.described} <= admin
    reader = principal(
        "reader", **{"sasl.username": setup.reader_user, "sasl.password": READER_PASSWORD}
    )
    assert await authorizer.readable(reader) == {setup.allowed}
    noaccess = KafkaClientSettings.model_validate(
        {"properties_file": secure_stack_env["BERGSTREAM_KAFKA_CONFIG_NOACCESS"]}
    )
    assert await authorizer.readable(Principal("noaccess", noaccess)) == frozenset()
    # Within the TTL the answer is kept (the same name with a wrong password is not asked) ...
    wrong = principal("reader", **{"sasl.username": setup.reader_user, "sasl.password": "wrong"})
    now[0] = 4.9
    assert await authorizer.readable(wrong) == {setup.allowed}
    # ... after it, Kafka is asked again, and refuses.
    now[0] = 5.0
    with pytest.raises(PrincipalRefused, match=f"principal 'reader'.*{setup.reader_user}"):
        await authorizer.readable(wrong)
    assert await authorizer.readable(reader) == {setup.allowed}
