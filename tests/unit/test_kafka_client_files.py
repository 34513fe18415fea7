"""``kafka_client.properties_file`` with a client file as people have it: Java's
``client.properties`` (its JAAS line and PKCS12 trust store translated) or librdkafka's; the
clients' own keys reach each client that knows them; keys bergstream sets itself are refused
with the reason; secrets stay masked."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bergstream.core.kafka_client import (
    KafkaClientSettings,
    KafkaSettingsError,
    librdkafka_keys,
)
from tests.unit.pki_files import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


def settings(tmp_path: Path, text: str) -> KafkaClientSettings:
    path = tmp_path / "client.properties"
    path.write_text(textwrap.dedent(text))
    return KafkaClientSettings.model_validate({"properties_file": str(path)})


def test_a_java_client_file_as_it_is(
    tmp_path: Path, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BERGSTREAM_CACHE", str(tmp_path / "cache"))
    kafka = settings(
        tmp_path,
        f"""\
        bootstrap.servers=b1:9093
        security.protocol=SASL_SSL
        sasl.mechanism=SCRAM-SHA-512
        sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
            username="alice" password="wonder;land";
        ssl.truststore.type=PKCS12
        ssl.truststore.location={pki["trust.p12"]}
        ssl.truststore.password=trustpw
        ssl.endpoint.identification.algorithm=
        client.id=orders-reader
        request.timeout.ms=45000
        metadata.max.idle.ms=60000
        """,
    )
    assert kafka.bootstrap == "b1:9093" and kafka.sasl_username == "alice"
    assert kafka.sasl_password is not None
    assert kafka.sasl_password.get_secret_value() == "wonder;land"
    assert kafka.ssl_endpoint_identification_algorithm == "none"
    assert kafka.ssl_ca_location is not None
    assert kafka.ssl_ca_location.read_bytes().strip() == pki["ca.pem"].read_bytes().strip()
    assert kafka.client_properties == {
        "client.id": "orders-reader",
        "request.timeout.ms": "45000",
        "metadata.max.idle.ms": "60000",
    }
    java = kafka.java()
    assert java["client.id"] == "orders-reader" and java["metadata.max.idle.ms"] == "60000"
    assert 'username="alice"' in java["sasl.jaas.config"]
    rdkafka = kafka.librdkafka()
    known = librdkafka_keys(tuple(sorted(kafka.client_properties.items())))
    assert {"client.id", "request.timeout.ms"} <= known and "metadata.max.idle.ms" not in known
    assert {k for k in kafka.client_properties if k in rdkafka} == known
    aio = kafka.aiokafka()
    assert aio["client_id"] == "orders-reader" and aio["request_timeout_ms"] == 45000
    assert "wonder" not in repr(kafka) and "wonder" not in str(kafka.redacted())


def test_a_pkcs12_key_store_becomes_the_client_certificate(
    tmp_path: Path, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BERGSTREAM_CACHE", str(tmp_path / "cache"))
    kafka = settings(
        tmp_path,
        f"""\
        security.protocol=SSL
        ssl.truststore.type=PEM
        ssl.truststore.location={pki["ca.pem"]}
        ssl.keystore.type=PKCS12
        ssl.keystore.location={pki["client.p12"]}
        ssl.keystore.password=keypw
        """,
    )
    assert kafka.ssl_ca_location == pki["ca.pem"]
    assert kafka.ssl_key_password is not None
    context = kafka.ssl_context()  # loads the chain and the (encrypted) key
    assert context is not None


def test_a_librdkafka_file_reads_as_before(tmp_path: Path) -> None:
    kafka = settings(
        tmp_path,
        """\
        bootstrap.servers=127.0.0.1:9092
        security.protocol=SASL_PLAINTEXT
        sasl.mechanisms=PLAIN
        sasl.username=bob
        sasl.password=builder
        statistics.interval.ms=0
        """,
    )
    assert kafka.sasl_mechanism == "PLAIN" and kafka.client_properties == {
        "statistics.interval.ms": "0"
    }
    assert kafka.librdkafka()["statistics.interval.ms"] == "0"


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("group.id=my-group", "group.id cannot be set here: bergstream reads by offsets"),
        (
            "value.deserializer=org.apache.kafka.common.serialization.StringDeserializer",
            "bergstream reads records' bytes itself",
        ),
        ("isolation.level=read_uncommitted", "reads committed records only"),
    ],
)
def test_keys_bergstream_sets_itself_are_refused_with_the_reason(
    tmp_path: Path, line: str, words: str
) -> None:
    with pytest.raises(ValueError, match=words) as caught:
        settings(tmp_path, f"security.protocol=PLAINTEXT\n{line}\n")
    assert "line 2" in str(caught.value) and "remove it from the file" in str(caught.value)


def test_a_java_oidc_login_becomes_the_oauth_client(tmp_path: Path) -> None:
    kafka = settings(
        tmp_path,
        """\
        security.protocol=SASL_SSL
        sasl.mechanism=OAUTHBEARER
        sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler
        sasl.oauthbearer.token.endpoint.url=https://idp.example/realms/k/protocol/openid-connect/token
        sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule \\
          required clientId="app" clientSecret="hush" scope="kafka" ext_logicalCluster="lkc-1";
        """,
    )
    assert kafka.sasl_mechanism == "OAUTHBEARER"
    assert kafka.sasl_oauthbearer_client_id == "app"
    assert kafka.sasl_oauthbearer_scope == "kafka"
    assert kafka.sasl_oauthbearer_extensions == "logicalCluster=lkc-1"
    librdkafka = kafka.librdkafka()
    assert librdkafka["sasl.oauthbearer.method"] == "oidc"
    assert librdkafka["sasl.oauthbearer.client.secret"] == "hush"
    java = kafka.java()
    assert java["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'clientId="app" clientSecret="hush" scope="kafka" ext_logicalCluster="lkc-1";'
    )
    assert "hush" not in repr(kafka) and "hush" not in str(kafka.redacted())


def test_a_java_kerberos_login_becomes_the_principal_and_keytab(tmp_path: Path) -> None:
    keytab = tmp_path / "app.keytab"
    keytab.write_bytes(b"\x05\x02")
    kafka = settings(
        tmp_path,
        f"""\
        security.protocol=SASL_SSL
        sasl.mechanism=GSSAPI
        sasl.kerberos.service.name=kafka
        sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required \\
          useKeyTab=true storeKey=true keyTab="{keytab}" principal="app@EXAMPLE.COM";
        """,
    )
    assert (kafka.sasl_kerberos_principal, kafka.sasl_kerberos_keytab) == (
        "app@EXAMPLE.COM",
        keytab,
    )
    assert kafka.java()["sasl.jaas.config"] == (
        "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true "
        f'keyTab="{keytab}" principal="app@EXAMPLE.COM";'
    )
    assert kafka.librdkafka()["sasl.kerberos.keytab"] == str(keytab)


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        (
            "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
            ' required unsecuredLoginStringClaim_sub="me";',
            "unsecured tokens",
        ),
        (
            "sasl.login.callback.handler.class=software.amazon.msk.auth.iam.IAMClientCallbackHandler",
            "is Java code bergstream's clients cannot run",
        ),
        (
            "sasl.jaas.config=org.example.OtherLoginModule required x=1;",
            "OtherLoginModule, a login module bergstream does not know",
        ),
        ("sasl.oauthbearer.method=default", "makes up unsecured tokens"),
    ],
)
def test_logins_bergstream_cannot_do_are_named(tmp_path: Path, lines: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        settings(tmp_path, f"security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n{lines}\n")


def test_a_secret_key_of_the_clients_is_masked(tmp_path: Path) -> None:
    kafka = settings(tmp_path, "security.protocol=PLAINTEXT\nmy.app.credential=zz\n")
    assert kafka.redacted()["my.app.credential"] == "***"
    assert "zz" not in repr(kafka)


def test_the_error_type_is_the_settings_error() -> None:
    assert issubclass(KafkaSettingsError, ValueError)
