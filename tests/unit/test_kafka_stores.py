"""Java trust and key stores to PEM files: PEM as is, inline PEM and PKCS12 written owner-only
(the key still encrypted), JKS refused with the keytool command; the results load in Python's
ssl module."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest

from bergstream.core.kafka_properties import ClientFileError
from bergstream.core.kafka_stores import key_files, trust_file
from tests.unit.pki_files import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_a_pem_truststore_is_used_where_it_is(pki: dict[str, Path], tmp_path: Path) -> None:
    props = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki["ca.pem"])}
    assert trust_file(props, "f", tmp_path) == pki["ca.pem"]
    assert trust_file({}, "f", tmp_path) is None


def test_inline_and_pkcs12_truststores_become_owner_only_pem(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    inline = trust_file({"ssl.truststore.certificates": pki["ca.pem"].read_text()}, "f", tmp_path)
    store = trust_file(
        {
            "ssl.truststore.type": "PKCS12",
            "ssl.truststore.location": str(pki["trust.p12"]),
            "ssl.truststore.password": "trustpw",
        },
        "f",
        tmp_path,
    )
    for path in (inline, store):
        assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600
        ssl.create_default_context(cafile=str(path))  # loads
        assert path.read_bytes().strip() == pki["ca.pem"].read_bytes().strip()


def test_a_pkcs12_keystore_becomes_a_chain_and_an_encrypted_key(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    found = key_files(
        {"ssl.keystore.location": str(pki["client.p12"]), "ssl.keystore.password": "keypw"},
        "f",
        tmp_path,
    )
    assert found is not None
    chain, key, password = found
    assert password == "keypw" and b"ENCRYPTED" in key.read_bytes()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    ssl.create_default_context().load_cert_chain(chain, key, password=password)
    assert (
        key_files(
            {"ssl.keystore.location": str(pki["client.p12"]), "ssl.keystore.password": "keypw"},
            "f",
            tmp_path,
        )
        == found
    )  # the same files again


def test_a_pem_keystore_holding_key_and_chain(pki: dict[str, Path], tmp_path: Path) -> None:
    found = key_files(
        {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki["client.pem"])}, "f", tmp_path
    )
    assert found == (pki["client.pem"], pki["client.pem"], None)


@pytest.mark.parametrize(
    ("props", "words"),
    [
        ({"ssl.truststore.location": "JKS_FILE"}, "keytool -importkeystore -srckeystore"),
        (
            {
                "ssl.truststore.type": "PKCS12",
                "ssl.truststore.location": "P12",
                "ssl.truststore.password": "wrong",
            },
            "does not open as PKCS12",
        ),
        ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "P12"}, None),
        ({"ssl.keystore.key": "x"}, "go together"),
        ({"ssl.keystore.type": "BCFKS", "ssl.keystore.location": "P12"}, "none of PEM, PKCS12"),
    ],
)
def test_stores_it_cannot_use_say_why(
    pki: dict[str, Path], tmp_path: Path, props: dict[str, str], words: str | None
) -> None:
    props = {
        k: str(pki["trust.jks"]) if v == "JKS_FILE" else str(pki["trust.p12"]) if v == "P12" else v
        for k, v in props.items()
    }
    if words is None:  # a PEM store is taken as it is (the client reads it)
        assert trust_file(props, "f", tmp_path) == pki["trust.p12"]
        return
    with pytest.raises(ClientFileError, match=words) as caught:
        trust_file(props, "f", tmp_path) if "truststore" in next(iter(props)) else key_files(
            props, "f", tmp_path
        )
    assert "wrong" not in str(caught.value)
