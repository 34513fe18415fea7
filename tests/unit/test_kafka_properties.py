"""Reading client properties files (Java's and librdkafka's syntax) and JAAS lines."""

from __future__ import annotations

import pytest

from bergstream.core.kafka_properties import JaasSyntaxError, parse_jaas_config, parse_properties

JAVA = r"""
# A client.properties as people have it
bootstrap.servers=b1:9093,b2:9093
security.protocol = SASL_SSL
sasl.mechanism: SCRAM-SHA-512
! a bang comment
client.id    my-app
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="alice" \
    password="s3cr=t;";
ssl.truststore.location=C\:\\certs\\trust.p12
with\ space=x
unicode=caf\u00e9
empty=
"""


def test_java_properties_syntax() -> None:
    props = {key: value for key, (_, value) in parse_properties(JAVA).items()}
    assert props == {
        "bootstrap.servers": "b1:9093,b2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "client.id": "my-app",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="s3cr=t;";',
        "ssl.truststore.location": "C:\\certs\\trust.p12",
        "with space": "x",
        "unicode": "café",
        "empty": "",
    }
    assert parse_properties(JAVA)["sasl.jaas.config"][0] == 8  # the line it starts on


def test_librdkafka_files_read_the_same() -> None:
    text = "bootstrap.servers=127.0.0.1:9092\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\n"
    assert {k: v for k, (_, v) in parse_properties(text).items()} == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
    }


def test_a_key_given_twice_keeps_the_last_value_and_a_dangling_backslash_ends_the_file() -> None:
    assert parse_properties("a=1\na=2\nb=x\\")["a"] == (2, "2")
    assert parse_properties("a=1\na=2\nb=x\\")["b"] == (3, "x")


def test_jaas_lines() -> None:
    jaas = parse_jaas_config(
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="a b" '
        'password="p\\"q;";'
    )
    assert jaas.module_name == "PlainLoginModule" and jaas.flag == "required"
    assert jaas.options == {"username": "a b", "password": 'p"q;'}
    kerberos = parse_jaas_config(
        "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true "
        'keyTab="/etc/kafka/app.keytab" principal="app@EXAMPLE.COM";'
    )
    assert kerberos.options["keyTab"] == "/etc/kafka/app.keytab"
    assert kerberos.options["useKeyTab"] == "true"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('PlainLoginModule username="a";', "control flag"),
        ('PlainLoginModule required username="a"', "must end with ';'"),
        ("PlainLoginModule required username;", "key=value pairs"),
        ('PlainLoginModule required username="hunter2" password;', "key=value pairs"),
        (";", "login module class"),
    ],
)
def test_bad_jaas_lines_say_why_without_values(value: str, words: str) -> None:
    with pytest.raises(JaasSyntaxError, match=words) as caught:
        parse_jaas_config(value)
    assert "hunter2" not in str(caught.value)
