"""KafkaClientSettings: keys, validation, properties files, client mappings and redaction."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from bergstream.core.config import interpolate
from bergstream.core.kafka_client import KafkaClientSettings, read_properties_file
from bergstream.core.problems import Problem, pydantic_problems
from bergstream.devstack.stack import kafka_security
from bergstream.devstack.stack.env import StackEnv

SECRET = "s3cr3t-Pa55"
KEY_SECRET = "k3y-Pa55"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> kafka_security.SecurityFiles:
    return kafka_security.ensure_security_files(tmp_path_factory.mktemp("kc") / "home")


def settings(**data: Any) -> KafkaClientSettings:
    """Settings from keys with dots written as double underscores (``security__protocol``)."""
    return KafkaClientSettings.model_validate(
        {key.replace("__", "."): value for key, value in data.items()}
    )


def sasl_ssl(files: kafka_security.SecurityFiles, **extra: Any) -> KafkaClientSettings:
    return KafkaClientSettings.model_validate(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": SECRET,
            "ssl.ca.location": str(files.ca_cert),
            **extra,
        }
    )


def mtls(files: kafka_security.SecurityFiles, **extra: Any) -> KafkaClientSettings:
    return KafkaClientSettings.model_validate(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(files.ca_cert),
            "ssl.certificate.location": str(files.user_cert("admin")),
            "ssl.key.location": str(files.user_key("admin")),
            **extra,
        }
    )


def problems(data: dict[str, Any]) -> list[Problem]:
    with pytest.raises(ValidationError) as caught:
        KafkaClientSettings.model_validate(data)
    return pydantic_problems(caught.value)


def one_problem(data: dict[str, Any]) -> tuple[str, str]:
    found = problems(data)
    assert len(found) == 1, found
    loc, message = found[0]
    return ".".join(map(str, loc)), message


# ---------------------------------------------------------------------------------------------
# Keys and defaults


def test_nothing_set_is_plaintext() -> None:
    plain = KafkaClientSettings()
    assert plain.security_protocol == "PLAINTEXT"
    assert (plain.uses_tls, plain.uses_sasl, plain.bootstrap) == (False, False, None)
    assert plain.librdkafka() == {"security.protocol": "PLAINTEXT"}
    assert plain.java() == {"security.protocol": "PLAINTEXT"}
    assert plain.aiokafka() == {"security_protocol": "PLAINTEXT"}
    assert plain.ssl_context() is None
    assert plain.redacted() == {"security.protocol": "PLAINTEXT"}


def test_names_are_case_insensitive(files: kafka_security.SecurityFiles) -> None:
    s = sasl_ssl(
        files,
        **{
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "scram-sha-256",
            "ssl.endpoint.identification.algorithm": "NONE",
        },
    )
    assert s.security_protocol == "SASL_SSL"
    assert s.sasl_mechanism == "SCRAM-SHA-256"
    assert s.ssl_endpoint_identification_algorithm == "none"


def test_librdkafka_plural_mechanism_is_accepted(files: kafka_security.SecurityFiles) -> None:
    s = sasl_ssl(files, **{"sasl.mechanism": "", "sasl.mechanisms": "PLAIN"})
    assert s.sasl_mechanism == "PLAIN"
    _, message = one_problem(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )
    assert "sasl.mechanism 'PLAIN' and sasl.mechanisms 'SCRAM-SHA-512' disagree" in message


def test_python_names_are_not_yaml_keys() -> None:
    where, message = one_problem({"security_protocol": "SSL"})
    assert where == "security_protocol" and "unknown key" in message


def test_empty_values_are_unset_so_one_block_serves_every_stack(
    files: kafka_security.SecurityFiles,
) -> None:
    block = yaml.safe_load(
        """
        security.protocol: ${BERGSTREAM_KAFKA_SECURITY_PROTOCOL:-PLAINTEXT}
        sasl.mechanism: ${BERGSTREAM_KAFKA_SASL_MECHANISM:-}
        sasl.username: ${BERGSTREAM_KAFKA_SASL_USERNAME:-}
        sasl.password: ${BERGSTREAM_KAFKA_SASL_PASSWORD:-}
        ssl.ca.location: ${BERGSTREAM_KAFKA_SSL_CA_LOCATION:-}
        ssl.certificate.location: ${BERGSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION:-}
        ssl.key.location: ${BERGSTREAM_KAFKA_SSL_KEY_LOCATION:-}
        """
    )

    def load(env: dict[str, str]) -> KafkaClientSettings:
        found: list[Problem] = []
        data = interpolate(block, env, (), found)
        assert found == []
        return KafkaClientSettings.model_validate(data)

    assert load({}) == KafkaClientSettings()
    secured = {
        "BERGSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "BERGSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "BERGSTREAM_KAFKA_SASL_USERNAME": "admin",
        "BERGSTREAM_KAFKA_SASL_PASSWORD": SECRET,
        "BERGSTREAM_KAFKA_SSL_CA_LOCATION": str(files.ca_cert),
    }
    assert load(secured) == sasl_ssl(files)
    mutual = {
        "BERGSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
        "BERGSTREAM_KAFKA_SSL_CA_LOCATION": str(files.ca_cert),
        "BERGSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION": str(files.user_cert("admin")),
        "BERGSTREAM_KAFKA_SSL_KEY_LOCATION": str(files.user_key("admin")),
    }
    assert load(mutual) == mtls(files)


def test_from_env_reads_what_stack_env_exports(files: kafka_security.SecurityFiles) -> None:
    assert KafkaClientSettings.from_env({}) == KafkaClientSettings()
    for mode, expected in (("sasl_ssl", sasl_ssl), ("ssl", mtls)):
        security = kafka_security.client_security(files, mode)
        env = StackEnv(Path("/h"), kafka_bootstrap="127.0.0.1:1", kafka_security=security)
        loaded = KafkaClientSettings.from_env(env.as_dict())
        if mode == "sasl_ssl":
            assert loaded == sasl_ssl(files, **{"sasl.password": files.passwords["admin"]})
        else:
            assert loaded == expected(files)


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    ("data", "needs"),
    [
        ({"security.protocol": "SASL_SSL"}, "security.protocol SASL_SSL needs sasl.mechanism"),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
            },
            "sasl.mechanism PLAIN needs sasl.password",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": SECRET},
            "security.protocol SASL_SSL needs sasl.mechanism",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
            "sasl.mechanism OAUTHBEARER needs sasl.oauthbearer.client.id, "
            "sasl.oauthbearer.client.secret, sasl.oauthbearer.token.endpoint.url",
        ),
    ],
)
def test_sasl_needs_mechanism_and_its_login(data: dict[str, Any], needs: str) -> None:
    _, message = one_problem(data)
    assert needs in message
    assert SECRET not in message


def test_password_keys_with_oauthbearer_are_refused() -> None:
    _, message = one_problem(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "oauthbearer",
            "sasl.oauthbearer.client.id": "c",
            "sasl.oauthbearer.client.secret": SECRET,
            "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
            "sasl.username": "u",
            "sasl.password": SECRET,
        }
    )
    assert "sasl.password, sasl.username set but sasl.mechanism OAUTHBEARER" in message
    assert SECRET not in message


def test_unknown_values_name_the_choices() -> None:
    where, message = one_problem({"security.protocol": "TLS"})
    assert where == "security.protocol"
    assert "unknown security.protocol 'TLS'" in message and "SASL_SSL" in message
    where, message = one_problem({"ssl.endpoint.identification.algorithm": "yes"})
    assert where == "ssl.endpoint.identification.algorithm" and "'https'" in message


def test_certificate_and_key_go_together(files: kafka_security.SecurityFiles) -> None:
    base = {"security.protocol": "SSL", "ssl.ca.location": str(files.ca_cert)}
    _, message = one_problem({**base, "ssl.certificate.location": str(files.user_cert("admin"))})
    assert "ssl.certificate.location is set but ssl.key.location is not" in message
    _, message = one_problem({**base, "ssl.key.location": str(files.user_key("admin"))})
    assert "ssl.key.location is set but ssl.certificate.location is not" in message
    _, message = one_problem({**base, "ssl.key.password": KEY_SECRET})
    assert "ssl.key.password is set but ssl.key.location is not" in message


@pytest.mark.parametrize("key", ["ssl.ca.location", "ssl.certificate.location", "ssl.key.location"])
def test_missing_files_are_named(files: kafka_security.SecurityFiles, key: str) -> None:
    data = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(files.ca_cert),
        "ssl.certificate.location": str(files.user_cert("admin")),
        "ssl.key.location": str(files.user_key("admin")),
        key: "/nowhere/x.pem",
    }
    where, message = one_problem(data)
    assert where == key
    assert f"{key}: file /nowhere/x.pem does not exist" in message


def test_sasl_or_tls_keys_without_that_protocol_are_refused(
    files: kafka_security.SecurityFiles,
) -> None:
    _, message = one_problem({"sasl.username": "u", "sasl.password": SECRET})
    assert "sasl.username, sasl.password set but security.protocol is PLAINTEXT" in message
    assert "choose security.protocol SASL_PLAINTEXT" in message
    _, message = one_problem(
        {"security.protocol": "SSL", "sasl.mechanism": "PLAIN", "ssl.ca.location": ""}
    )
    assert "choose security.protocol SASL_SSL" in message
    _, message = one_problem({"ssl.ca.location": str(files.ca_cert)})
    assert "ssl.ca.location set but security.protocol is PLAINTEXT" in message
    assert "choose security.protocol SSL" in message


# ---------------------------------------------------------------------------------------------
# Properties files


def test_the_stacks_librdkafka_file_is_read_whole(
    files: kafka_security.SecurityFiles, tmp_path: Path
) -> None:
    path = tmp_path / "admin.properties"
    path.write_text(kafka_security.client_properties(files, "sasl_ssl", "admin", "127.0.0.1:9"))
    s = KafkaClientSettings.model_validate({"properties_file": str(path)})
    assert s.bootstrap == "127.0.0.1:9"
    expected_settings = sasl_ssl(files, **{"sasl.password": files.passwords["admin"]})
    assert s.model_dump() == {**expected_settings.model_dump(), "properties_file": path}
    rd = s.librdkafka()
    expected = read_properties_file(path)
    expected["sasl.mechanism"] = expected.pop("sasl.mechanisms")
    assert {k: v for k, v in rd.items() if k != "ssl.endpoint.identification.algorithm"} == (
        expected
    )
    assert rd["ssl.endpoint.identification.algorithm"] == "https"
    assert s.java()["bootstrap.servers"] == "127.0.0.1:9"
    assert s.redacted()["bootstrap.servers"] == "127.0.0.1:9"
    assert "bootstrap" not in s.aiokafka()

    mutual = tmp_path / "mtls.properties"
    mutual.write_text(kafka_security.client_properties(files, "ssl", "admin", "127.0.0.1:9"))
    from_file = KafkaClientSettings.model_validate({"properties_file": str(mutual)})
    assert from_file.model_dump() == {**mtls(files).model_dump(), "properties_file": mutual}


def test_explicit_keys_win_over_the_file_and_empty_ones_do_not(
    files: kafka_security.SecurityFiles, tmp_path: Path
) -> None:
    path = tmp_path / "admin.properties"
    path.write_text(kafka_security.client_properties(files, "sasl_ssl", "admin", "h:1"))
    s = KafkaClientSettings.model_validate(
        {
            "properties_file": str(path),
            "sasl.mechanism": "PLAIN",  # wins over the file's sasl.mechanisms
            "sasl.username": "other",
            "sasl.password": "",  # empty: the file's
            "ssl.ca.location": "",
        }
    )
    assert (s.sasl_mechanism, s.sasl_username) == ("PLAIN", "other")
    assert s.sasl_password is not None
    assert s.sasl_password.get_secret_value() == files.passwords["admin"]
    assert s.ssl_ca_location == files.ca_cert
    empty = KafkaClientSettings.model_validate({"properties_file": ""})
    assert empty == KafkaClientSettings()


def test_the_clients_keys_of_the_file_pass_and_near_misses_are_named(tmp_path: Path) -> None:
    path = tmp_path / "x.properties"
    path.write_text("# comment\n\nsecurity.protocol=SSL\nsocket.timeout.ms = 100\n")
    settings = KafkaClientSettings.model_validate({"properties_file": str(path)})
    assert settings.client_properties == {"socket.timeout.ms": "100"}
    path.write_text("security.protocol=SSL\nssl.ca.locaton=/etc/ca.pem\n")
    _, message = one_problem({"properties_file": str(path)})
    assert "line 2: ssl.ca.locaton is no key a client knows; did you mean ssl.ca.location?" in (
        message
    )
    path.write_text("properties_file=/etc/passwd\n")
    assert "cannot name another one" in one_problem({"properties_file": str(path)})[1]


def test_bad_lines_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "x.properties"
    path.write_text(f"security.protocol=SASL_SSL\n{SECRET}\n")
    _, message = one_problem({"properties_file": str(path)})
    assert f"properties_file {path} line 2: expected key=value" in message
    assert SECRET not in message  # the line may hold a password: it is not quoted
    _, message = one_problem({"properties_file": str(tmp_path / "none.properties")})
    assert "does not exist" in message and "none.properties" in message


def test_the_file_is_read_with_spaces_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "x.properties"
    path.write_text("! bang comment\n  bootstrap.servers = a:1,b:2 \n#x=y\nsasl.password=a=b\n")
    assert read_properties_file(path) == {"bootstrap.servers": "a:1,b:2", "sasl.password": "a=b"}


# ---------------------------------------------------------------------------------------------
# Client mappings


def test_librdkafka_of_sasl_ssl(files: kafka_security.SecurityFiles) -> None:
    assert sasl_ssl(files).librdkafka() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": SECRET,
        "ssl.ca.location": str(files.ca_cert),
        "ssl.endpoint.identification.algorithm": "https",
    }


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-256", "org.apache.kafka.common.security.scram.ScramLoginModule"),
        ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
    ],
)
def test_java_sasl_uses_the_mechanisms_login_module(
    files: kafka_security.SecurityFiles, mechanism: str, module: str
) -> None:
    java = sasl_ssl(files, **{"sasl.mechanism": mechanism}).java()
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": f'{module} required username="admin" password="{SECRET}";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_cert),
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_java_matches_the_stacks_java_file(files: kafka_security.SecurityFiles) -> None:
    stack = dict(
        line.split("=", 1)
        for line in kafka_security.java_client_properties(
            files, "sasl_ssl", "admin", "h:1"
        ).splitlines()
        if not line.startswith("#")
    )
    java = sasl_ssl(files, **{"sasl.password": files.passwords["admin"]}).java()
    for key in (
        "security.protocol",
        "sasl.mechanism",
        "sasl.jaas.config",
        "ssl.truststore.type",
        "ssl.truststore.location",
    ):
        assert java[key] == stack[key], key


def test_java_quotes_jaas_values(files: kafka_security.SecurityFiles) -> None:
    java = sasl_ssl(files, **{"sasl.username": 'a"b', "sasl.password": "c\\d"}).java()
    assert 'username="a\\"b" password="c\\\\d";' in java["sasl.jaas.config"]


def test_java_mutual_tls_has_the_pem_inline(files: kafka_security.SecurityFiles) -> None:
    java = mtls(files, **{"ssl.endpoint.identification.algorithm": "none"}).java()
    assert java == {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_cert),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": files.user_cert("admin").read_text(),
        "ssl.keystore.key": files.user_key("admin").read_text(),
        "ssl.endpoint.identification.algorithm": "",
    }
    text = mtls(files).java_properties_text()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert all("=" in line for line in lines)  # PEM line breaks are escaped
    chain = next(line for line in lines if line.startswith("ssl.keystore.certificate.chain="))
    assert chain.split("=", 1)[1].replace("\\n", "\n") == files.user_cert("admin").read_text()


def test_aiokafka_kwargs(files: kafka_security.SecurityFiles) -> None:
    kwargs = sasl_ssl(files).aiokafka()
    context = kwargs.pop("ssl_context")
    assert isinstance(context, ssl.SSLContext)
    assert kwargs == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": SECRET,
    }
    plain_sasl = settings(
        security__protocol="SASL_PLAINTEXT",
        sasl__mechanism="PLAIN",
        sasl__username="u",
        sasl__password="p",
    ).aiokafka()
    assert "ssl_context" not in plain_sasl
    assert mtls(files).aiokafka()["security_protocol"] == "SSL"


def test_ssl_context(files: kafka_security.SecurityFiles) -> None:
    context = sasl_ssl(files).ssl_context()
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "bergstream local stack CA"),),)
    ]
    loose = mtls(files, **{"ssl.endpoint.identification.algorithm": "none"}).ssl_context()
    assert loose is not None
    assert loose.verify_mode == ssl.CERT_REQUIRED and not loose.check_hostname


def test_ssl_context_with_an_encrypted_key(
    files: kafka_security.SecurityFiles, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(files.user_key("admin").read_bytes(), None)
    encrypted = tmp_path / "key.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(KEY_SECRET.encode()),
        )
    )
    good = mtls(files, **{"ssl.key.location": str(encrypted), "ssl.key.password": KEY_SECRET})
    assert good.ssl_context() is not None
    assert good.librdkafka()["ssl.key.password"] == KEY_SECRET
    assert good.java()["ssl.key.password"] == KEY_SECRET
    bad = mtls(files, **{"ssl.key.location": str(encrypted), "ssl.key.password": "wrong"})
    with pytest.raises(ValueError, match="cannot load the client certificate") as caught:
        bad.ssl_context()
    assert "wrong" not in str(caught.value).replace("a wrong ssl.key.password", "")


# ---------------------------------------------------------------------------------------------
# Secrets never shown


def test_secrets_never_show(files: kafka_security.SecurityFiles, tmp_path: Path) -> None:
    encrypted_key = files.user_key("admin")
    s = KafkaClientSettings.model_validate(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": SECRET,
            "ssl.ca.location": str(files.ca_cert),
            "ssl.certificate.location": str(files.user_cert("admin")),
            "ssl.key.location": str(encrypted_key),
            "ssl.key.password": KEY_SECRET,
        }
    )
    shown = [
        repr(s),
        str(s),
        json.dumps(s.redacted()),
        s.model_dump_json(),
        json.dumps(s.model_dump(mode="json")),
        f"{s}",
        f"{s!r}",
        repr([s]),
    ]
    for text in shown:
        assert SECRET not in text and KEY_SECRET not in text, text
    assert s.redacted()["sasl.password"] == "***"
    assert s.redacted()["ssl.key.password"] == "***"
    assert s.redacted()["sasl.username"] == "admin"


def test_secrets_never_show_in_errors(tmp_path: Path) -> None:
    cases: list[dict[str, Any]] = [
        {"security.protocol": "SASL_SSL", "sasl.password": SECRET},  # model-level error
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "X", "sasl.password": SECRET},
        {"sasl.password": SECRET, "ssl.key.password": SECRET},
        {"sasl.password": SECRET, "bogus": 1},
        {"security.protocol": "SASL_SSL", "sasl.pasword": SECRET},  # misspelt
    ]
    path = tmp_path / "x.properties"
    path.write_text(f"sasl.password={SECRET}\nsecurity.protocol=SASL_SSL\n")
    cases.append({"properties_file": str(path)})
    cases.append({"properties_file": str(path), "sasl.username": "u", "sasl.mechanism": "MD5"})
    for data in cases:
        with pytest.raises(ValidationError) as caught:
            KafkaClientSettings.model_validate(data)
        assert SECRET not in str(caught.value), data
        assert SECRET not in repr(caught.value.errors()), data
        assert SECRET not in repr(pydantic_problems(caught.value)), data


@pytest.mark.parametrize("url", ["idp.example/token", "ftp://idp.example/token", "https://"])
def test_a_token_endpoint_that_is_no_http_url_is_named(url: str) -> None:
    where, message = one_problem(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.client.id": "c",
            "sasl.oauthbearer.client.secret": SECRET,
            "sasl.oauthbearer.token.endpoint.url": url,
        }
    )
    assert where == "sasl.oauthbearer.token.endpoint.url"
    assert "is no http or https URL" in message and SECRET not in message
