"""OAUTHBEARER (Keycloak's client-credentials tokens) and GSSAPI (MIT Kerberos keytabs) on the
secured three-broker stack, for every bergstream client: the pipeline (Spark's Kafka source),
ISK (aiokafka for its own reads, raw connections for each principal's READ check) and KSI (its
own requests, and clients' logins passed through the proxy).

Per mechanism, only the environment changes: ``BERGSTREAM_KAFKA_CONFIG`` names the stack's
properties file of that mechanism's ``admin`` (``kafka-admin-<mechanism>.properties``, written
by ``stack up --sasl-mechanism``), exactly as a user switches clusters. The admin's principal
(``User:admin``, from the token's client-id claim or the Kerberos principal) is a super user; the
``noaccess`` principal has no ACL, and is refused by the broker everywhere, through KSI too."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode
from pydantic import SecretStr

from bergstream.core.api import (
    ApiKey,
    KafkaAuthenticationError,
    KafkaClientSettings,
    kafka_request,
    open_kafka_connection,
    sasl_reauthenticate,
)
from bergstream.core.kafka_client import read_properties_file
from bergstream.core.oauth_tokens import OAuthTokenError, OidcTokenSource
from bergstream.core.proxy.codec import build_request
from bergstream.devstack.stack.ports import free_port_block, free_ports
from tests.kits.ksi_stack import fetch_partition, run_pipeline_once
from tests.support import (
    BERGSTREAM,
    ProxyProcess,
    admin_librdkafka,
    secure_lake_yaml,
    start_bergstream_run,
    wait_until,
    write_proxy_config,
)

pytestmark = pytest.mark.slow

MECHANISMS = ("oauthbearer", "gssapi")
PARTITIONS = 2
RECORDS = 200
DELETED_BELOW = 40
ISK_SECRET = "isk-logins-root-secret"
CLIENT_SECRETS = {"admin": "admin-catalog-secret", "noaccess": "noaccess-catalog-secret"}
WRONG = "not-the-secret-" + uuid.uuid4().hex


def login_file(env: dict[str, str], user: str, mechanism: str) -> str:
    """The stack's librdkafka properties file of ``user`` logging in with ``mechanism``."""
    return str(Path(env["BERGSTREAM_HOME"]) / "security" / f"kafka-{user}-{mechanism}.properties")


def login_settings(env: dict[str, str], user: str, mechanism: str) -> KafkaClientSettings:
    return KafkaClientSettings.model_validate({"properties_file": login_file(env, user, mechanism)})


def values(topic: str) -> list[bytes]:
    return [f"{topic}-{n}".encode() for n in range(RECORDS)]


def produce(env: dict[str, str], topic: str) -> None:
    producer = Producer({**admin_librdkafka(env), "enable.idempotence": True, "linger.ms": 5})
    for n, value in enumerate(values(topic)):
        producer.produce(topic, value=value, partition=n % PARTITIONS)
    assert producer.flush(60) == 0


@dataclass
class World:
    mechanism: str
    topic: str
    env: dict[str, str]
    home: Path
    proxy: ProxyProcess
    isk: ProxyProcess
    catalog_url: str


@pytest.fixture(scope="module")
def kerberos_config(secure_stack_env: dict[str, str]) -> Iterator[None]:
    """This process's Kerberos clients (the test's own, Spark's JVM) read the stack's
    ``krb5.conf``, as ``stack env`` exports it for a ``gssapi`` stack."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KRB5_CONFIG", secure_stack_env["BERGSTREAM_KRB5_CONFIG"])
        yield


def isk_config(env: dict[str, str], mechanism: str, workdir: Path) -> tuple[Path, int]:
    """ISK as the mechanism's admin (its own aiokafka reads), with the principals ``admin`` and
    ``noaccess`` logging in to Kafka with the mechanism (each principal's READ check)."""
    catalog_port, s3_port = free_ports(2)
    principals = "".join(
        f"\n          - name: {user}\n            client_id: {user}\n"
        f"            client_secret: {secret}\n            kafka_client:\n"
        f'              properties_file: "{login_file(env, user, mechanism)}"'
        for user, secret in CLIENT_SECRETS.items()
    )
    config = workdir / "isk.yaml"
    config.write_text(
        f"""
services:
  - type: isk
    config:
      cluster: logins
      kafka_bootstrap: ${{BERGSTREAM_KAFKA_BOOTSTRAP}}
      kafka_client:
        properties_file: ${{BERGSTREAM_KAFKA_CONFIG}}
      chunk_records: 50
      index_interval_seconds: 0
      http:
        catalog_port: {catalog_port}
        s3_port: {s3_port}
        access_key: isk-logins
        secret_key: {ISK_SECRET}
      principals:{principals}
      index: {{type: sqlite, config: {{path: "{workdir / "index.sqlite"}"}}}}
      cache: {{type: local, config: {{directory: "{workdir / "cache"}"}}}}
"""
    )
    return config, catalog_port


@pytest.fixture(scope="module", params=MECHANISMS)
def world(
    request: pytest.FixtureRequest,
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
    kerberos_config: None,
) -> Iterator[World]:
    mechanism: str = request.param
    home = tmp_path_factory.mktemp(f"logins-{mechanism}")
    topic = new_secure_topic(partitions=PARTITIONS, prefix=f"login-{mechanism}")
    produce(secure_stack_env, topic)
    # Only the environment changes: the mechanism's admin file instead of the SCRAM one.
    env = {
        **secure_stack_env,
        "BERGSTREAM_KAFKA_CONFIG": login_file(secure_stack_env, "admin", mechanism),
        "KRB5_CONFIG": secure_stack_env["BERGSTREAM_KRB5_CONFIG"],
    }
    lake = secure_lake_yaml(home)
    pipeline_config = home / "lake.yaml"
    pipeline_config.write_text(lake)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        summary = run_pipeline_once(pipeline_config, topic)
    assert summary["records"] == RECORDS, summary
    admin = AdminClient(admin_librdkafka(secure_stack_env))
    futures = admin.delete_records(
        [TopicPartition(topic, p, DELETED_BELOW) for p in range(PARTITIONS)]
    )
    for future in futures.values():
        assert future.result(timeout=60).low_watermark == DELETED_BELOW
    port = free_port_block(5)
    proxy_config = write_proxy_config(
        home / "ksi.yaml", "ksi", port, f'[{{type: ksi, config: {{topics: ["{topic}"]}}}}]', lake
    )
    proxy = start_bergstream_run(proxy_config, f"127.0.0.1:{port}", env, "the ksi proxy")
    config, catalog_port = isk_config(secure_stack_env, mechanism, home)
    isk = start_bergstream_run(
        config, env["BERGSTREAM_KAFKA_BOOTSTRAP"], {**env, "BERGSTREAM_HOME": str(home)}, "isk"
    )
    try:
        yield World(mechanism, topic, env, home, proxy, isk, f"http://127.0.0.1:{catalog_port}")
    finally:
        for process in (proxy, isk):
            code = process.stop()
            log = process.log()
            assert code == 0, log
            secrets = [ISK_SECRET, *CLIENT_SECRETS.values()]
            assert not [s for s in secrets if s in log], "a secret is in the log"


def test_the_pipeline_copied_every_record_as_the_mechanisms_admin(world: World) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        "bergstream",
        uri=f"sqlite:///{world.home}/lake/catalog.db",
        warehouse=f"{world.home}/lake/warehouse",
    )
    table = catalog.load_table(("coldset", world.topic))
    rows = table.scan(selected_fields=("kafka_value",)).to_arrow()["kafka_value"].to_pylist()
    assert sorted(rows) == sorted(values(world.topic))


def test_the_pipeline_as_noaccess_is_refused_naming_the_principal(
    world: World, tmp_path: Path
) -> None:
    config = tmp_path / "lake.yaml"
    config.write_text(secure_lake_yaml(tmp_path))
    env = {
        **world.env,
        "BERGSTREAM_KAFKA_CONFIG": login_file(world.env, "noaccess", world.mechanism),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    done = subprocess.run(
        [BERGSTREAM, "pipeline", "run", "-c", str(config), "--topic", world.topic, "--once"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    assert done.returncode != 0
    assert f"authorization failed for topic '{world.topic}'" in done.stderr, done.stderr[-3000:]
    principal = "noaccess" if world.mechanism == "oauthbearer" else "noaccess@BERGSTREAM.LOCAL"
    assert f"'{principal}', {world.mechanism.upper()}" in done.stderr, done.stderr[-3000:]


def catalog(world: World, principal: str) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    credential = f"{principal}:{CLIENT_SECRETS[principal]}"
    return RestCatalog(f"isk-{principal}", uri=world.catalog_url, credential=credential)


def test_isk_serves_the_admin_and_hides_the_topic_from_noaccess(world: World) -> None:
    admin = catalog(world, "admin")
    wait_until(lambda: ("hotset", world.topic) in admin.list_tables("hotset"), timeout=60)
    table = admin.load_table(f"hotset.{world.topic}")
    got = table.scan(selected_fields=("kafka_value",)).to_arrow()["kafka_value"].to_pylist()
    # The hotset is what Kafka still holds: every record from DELETED_BELOW on.
    kept = [v for n, v in enumerate(values(world.topic)) if n // PARTITIONS >= DELETED_BELOW]
    assert sorted(got) == sorted(kept)
    assert ("hotset", world.topic) not in catalog(world, "noaccess").list_tables("hotset")
    assert world.isk.process.poll() is None, world.isk.log()


def proxy_login(world: World, user: str) -> KafkaClientSettings:
    """``user``'s login with the world's mechanism toward the proxy (SASL over plain TCP)."""
    own = read_properties_file(Path(login_file(world.env, user, world.mechanism)))
    login = {k: v for k, v in own.items() if k.startswith("sasl.")}
    return KafkaClientSettings.model_validate({"security.protocol": "SASL_PLAINTEXT", **login})


async def partition_leader(world: World) -> tuple[str, int]:
    """The proxy's address of partition 0's leader, asked as the admin (noaccess may not
    describe the topic)."""
    host, port = world.proxy.bootstrap.split(":")
    connection = await open_kafka_connection(host, int(port), proxy_login(world, "admin"))
    try:
        metadata = await kafka_request(
            connection.reader,
            connection.writer,
            build_request(
                ApiKey.METADATA,
                12,
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            correlation_id=3,
            client_id="t",
        )
    finally:
        await connection.close()
    topics = {t.name: t for t in metadata.topics}
    assert world.topic in topics, (list(topics), metadata)
    leader = next(p.leader_id for p in topics[world.topic].partitions if p.partition_index == 0)
    broker = next(b for b in metadata.brokers if b.node_id == leader)
    return broker.host, broker.port


async def fetch_through_proxy(world: World, user: str, offset: int) -> tuple[int, int]:
    """Fetch partition 0 at ``offset`` through KSI as ``user``, logging in with the world's
    mechanism over the proxy's plain TCP: (error code, bytes of records)."""
    settings = proxy_login(world, user)
    host, port = await partition_leader(world)
    connection = await open_kafka_connection(host, port, settings)
    try:
        return await fetch_partition(connection, world.topic, 0, offset)
    finally:
        await connection.close()


def test_ksi_serves_cold_offsets_to_the_admin_and_the_broker_refuses_noaccess(
    world: World,
) -> None:
    code, size = asyncio.run(fetch_through_proxy(world, "admin", 0))
    assert (code, size > 0) == (0, True), world.proxy.log()[-3000:]
    code, size = asyncio.run(fetch_through_proxy(world, "noaccess", 0))
    assert code == ErrorCode.topic_authorization_failed and size == 0
    assert world.proxy.process.poll() is None, world.proxy.log()


def test_a_session_is_reauthenticated_with_the_mechanism(world: World) -> None:
    settings = login_settings(world.env, "admin", world.mechanism)
    host, port = world.env["BERGSTREAM_KAFKA_BOOTSTRAP"].split(",")[0].split(":")

    async def reauthenticate() -> tuple[int, int]:
        connection = await open_kafka_connection(host, int(port), settings)
        try:
            assert connection.session is not None
            first = connection.session.session_lifetime_ms
            again = await sasl_reauthenticate(
                connection.reader, connection.writer, settings, host=host
            )
            return first, again.session_lifetime_ms
        finally:
            await connection.close()

    first, again = asyncio.run(reauthenticate())
    # The stack's brokers re-authenticate sessions (connections.max.reauth.ms is set).
    assert first > 0 and again > 0


def test_a_wrong_login_is_an_authentication_error_naming_the_principal(world: World) -> None:
    settings = login_settings(world.env, "admin", world.mechanism)
    if world.mechanism == "oauthbearer":
        wrong = settings.model_copy(update={"sasl_oauthbearer_client_secret": SecretStr(WRONG)})
        words = "client id 'admin'"
    else:
        wrong = settings.model_copy(update={"sasl_kerberos_principal": "nobody@BERGSTREAM.LOCAL"})
        words = "nobody@BERGSTREAM.LOCAL"
    host, port = world.env["BERGSTREAM_KAFKA_BOOTSTRAP"].split(",")[0].split(":")
    with pytest.raises(KafkaAuthenticationError) as error:
        asyncio.run(open_kafka_connection(host, int(port), wrong, timeout=30))
    assert words in str(error.value), str(error.value)
    assert WRONG not in str(error.value)


def test_tokens_are_fetched_once_and_again_after_most_of_their_lifetime(
    secure_stack_env: dict[str, str],
) -> None:
    settings = login_settings(secure_stack_env, "admin", "oauthbearer")
    now = [1_000_000.0]
    assert settings.sasl_oauthbearer_token_endpoint_url and settings.sasl_oauthbearer_client_id
    assert settings.sasl_oauthbearer_client_secret is not None
    source = OidcTokenSource(
        settings.sasl_oauthbearer_token_endpoint_url,
        settings.sasl_oauthbearer_client_id,
        settings.sasl_oauthbearer_client_secret.get_secret_value(),
        clock=lambda: now[0],
    )
    first = source.token()
    assert first.principal == "admin" and first.lifetime > 0
    assert source.token() is first and source.fetches == 1
    now[0] += 0.79 * first.lifetime
    assert source.token() is first
    now[0] += 0.02 * first.lifetime
    second = source.token()
    assert second is not first and source.fetches == 2
    wrong = OidcTokenSource(settings.sasl_oauthbearer_token_endpoint_url, "admin", WRONG)
    with pytest.raises(OAuthTokenError) as error:
        wrong.token()
    assert "HTTP 401" in str(error.value) and "client id 'admin'" in str(error.value)
    assert WRONG not in str(error.value)


def test_the_stacks_librdkafka_files_work_with_confluent_kafka_and_kcat(world: World) -> None:
    """``BERGSTREAM_KAFKA_CONFIG`` of a ``--sasl-mechanism`` stack, as ``stack env`` exports it:
    confluent-kafka takes the OAUTHBEARER file's keys as they are (its wheels have no GSSAPI:
    the error says so), Debian's kcat (``-F``; its librdkafka 2.0.2 has Cyrus SASL) the GSSAPI
    one (measured: it is built without OIDC, "OAuth/OIDC depends on libcurl")."""
    admin_file = login_file(world.env, "admin", world.mechanism)
    own = read_properties_file(Path(admin_file))
    if world.mechanism == "oauthbearer":
        listed = AdminClient(own).list_topics(timeout=30).topics
        assert world.topic in listed
        hidden = AdminClient(
            read_properties_file(Path(login_file(world.env, "noaccess", "oauthbearer")))
        )
        assert world.topic not in hidden.list_topics(timeout=30).topics
        return
    with pytest.raises(KafkaException, match="GSSAPI"):
        AdminClient(own)
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (scripts/setup installs it)")
    done = subprocess.run(
        [kcat, "-F", admin_file, "-L", "-t", world.topic],
        capture_output=True,
        text=True,
        timeout=60,
        # kcat's librdkafka runs kinit with the keytab into the default ticket cache: a private one.
        env={
            **os.environ,
            "KRB5_CONFIG": world.env["KRB5_CONFIG"],
            "KRB5CCNAME": f"FILE:{world.home / 'kcat.ccache'}",
        },
    )
    assert done.returncode == 0 and f'topic "{world.topic}"' in done.stdout, done.stderr


def test_a_token_the_broker_refuses_is_an_error_with_its_words(
    secure_stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token whose signature does not verify: the broker answers the RFC 7628 error challenge,
    the client ends the exchange, and the error carries the broker's status."""
    settings = login_settings(secure_stack_env, "admin", "oauthbearer")
    source = settings.oauth_token_source()
    real = source.token()
    head, claims, signature = real.value.split(".")
    forged = replace(real, value=f"{head}.{claims}.{signature[::-1]}")
    monkeypatch.setattr(source, "token", lambda: forged)
    host, port = secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"].split(",")[0].split(":")
    with pytest.raises(KafkaAuthenticationError) as error:
        asyncio.run(open_kafka_connection(host, int(port), settings, timeout=30))
    assert "status invalid_token" in str(error.value), str(error.value)
