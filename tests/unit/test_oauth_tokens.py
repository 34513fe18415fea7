"""The pure parts of OAUTHBEARER: extensions, JWT claims, the client's first message, refusals.

Fetching and refreshing tokens is tested against a real identity provider (Keycloak) in
tests/secure/test_oauthbearer.py."""

from __future__ import annotations

import base64
import json

import pytest

from bergstream.core.kafka_oauth import client_first_message, refusal_text
from bergstream.core.oauth_tokens import parse_extensions, token_claims


def jwt(claims: dict[str, object]) -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


def test_extensions_are_key_value_pairs() -> None:
    assert parse_extensions("logicalCluster=lkc-1, identityPoolId=pool-2") == {
        "logicalCluster": "lkc-1",
        "identityPoolId": "pool-2",
    }
    assert parse_extensions("") == {} == parse_extensions(None)


@pytest.mark.parametrize("text", ["novalue", "=x", "auth=Bearer", "a-b=1"])
def test_a_malformed_extension_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="is no key=value"):
        parse_extensions(text)


def test_claims_are_read_from_a_jwt_and_nothing_from_other_tokens() -> None:
    assert token_claims(jwt({"sub": "admin", "exp": 10}))["sub"] == "admin"
    assert token_claims("opaque-token") == {}
    assert token_claims("a.!!!.c") == {}


def test_the_first_message_carries_the_token_and_extensions() -> None:
    message = client_first_message("T0K", {"logicalCluster": "lkc-1"})
    assert message == b"n,,\x01auth=Bearer T0K\x01logicalCluster=lkc-1\x01\x01"
    assert client_first_message("T", {}) == b"n,,\x01auth=Bearer T\x01\x01"


def test_a_refusal_is_read_from_the_brokers_json() -> None:
    said = refusal_text(b'{"status":"invalid_token","scope":"kafka"}')
    assert said == "status invalid_token, scope kafka"
    assert refusal_text(b"not json") == "not json"
