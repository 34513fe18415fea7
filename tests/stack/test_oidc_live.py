"""The stack's OIDC provider (``oidc``: Keycloak) alone in a temporary home, with a short token
lifespan: its environment and secrets file, client-credentials tokens for ``admin`` and
``noaccess`` (the claims Kafka's brokers read, the signature checked against the JWKS), wrong
credentials refused, listeners on 127.0.0.1 only, and nothing left running after ``stack down``.

The tests run in file order and share one Keycloak (module fixture); the last one stops it.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from bergstream.devstack.stack import StackEnv, stack_down, stack_status, stack_up
from bergstream.devstack.stack.launchers import LAUNCHERS
from bergstream.devstack.stack.oidc_provider import (
    AUDIENCE,
    TOKEN_LIFESPAN_ENV,
    load_oidc_clients,
    oidc_endpoints,
)
from bergstream.devstack.stack.ports import port_is_open
from bergstream.devstack.stack.procs import find_strays, pid_alive

pytestmark = pytest.mark.slow

#: A short access token lifespan (seconds), as token-refresh tests use.
LIFESPAN = 60


@dataclass
class Oidc:
    home: Path
    env: dict[str, str]
    pid: int
    port: int
    up_seconds: float


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oidc]:
    home = tmp_path_factory.mktemp("oidc") / "home"
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(TOKEN_LIFESPAN_ENV, str(LIFESPAN))
            t0 = time.monotonic()
            env: StackEnv = stack_up(home, {"oidc"})
            up_seconds = time.monotonic() - t0
        status = stack_status(home)["oidc"]
        print(f"\nstack up oidc: {up_seconds:.1f} s (ready {status['ready_seconds']} s)")
        yield Oidc(home, env.as_dict(), status["pid"], status["ports"]["http"], up_seconds)
    finally:
        stack_down(home)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        yield client


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _token(http: httpx.Client, env: dict[str, str], client_id: str, secret: str) -> httpx.Response:
    form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
    return http.post(env["BERGSTREAM_OIDC_TOKEN_ENDPOINT"], data=form)


def _verified_claims(http: httpx.Client, env: dict[str, str], token: str) -> dict[str, Any]:
    """The claims of ``token``, its RS256 signature checked with the JWKS key of its ``kid``."""
    header, payload, signature = token.split(".")
    kid = json.loads(_b64(header))["kid"]
    keys = http.get(env["BERGSTREAM_OIDC_JWKS_URL"]).json()["keys"]
    jwk = next(k for k in keys if k["kid"] == kid)
    numbers = rsa.RSAPublicNumbers(
        int.from_bytes(_b64(jwk["e"]), "big"), int.from_bytes(_b64(jwk["n"]), "big")
    )
    numbers.public_key().verify(
        _b64(signature), f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256()
    )
    return json.loads(_b64(payload))


def test_environment_and_secrets(oidc: Oidc) -> None:
    env = oidc.env
    issuer = f"http://127.0.0.1:{oidc.port}/realms/bergstream"
    token_endpoint, jwks_url = oidc_endpoints(issuer)
    clients = load_oidc_clients(oidc.home)
    assert env["BERGSTREAM_OIDC_ISSUER"] == issuer
    assert env["BERGSTREAM_OIDC_TOKEN_ENDPOINT"] == token_endpoint
    assert env["BERGSTREAM_OIDC_JWKS_URL"] == jwks_url
    assert env["BERGSTREAM_OIDC_CLIENT_ID"] == "admin"
    assert env["BERGSTREAM_OIDC_CLIENT_SECRET"] == clients["admin"]
    assert env["BERGSTREAM_OIDC_NOACCESS_CLIENT_ID"] == "noaccess"
    assert env["BERGSTREAM_OIDC_NOACCESS_CLIENT_SECRET"] == clients["noaccess"]
    assert clients["admin"] != clients["noaccess"]
    assert "BERGSTREAM_KAFKA_BOOTSTRAP" not in env
    secrets_file = oidc.home / "security" / "oidc.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    status = stack_status(oidc.home)["oidc"]
    assert status["running"] and status["address"] == issuer
    assert status["version"] == "26.7.3"


def test_discovery_document(oidc: Oidc, http: httpx.Client) -> None:
    issuer = oidc.env["BERGSTREAM_OIDC_ISSUER"]
    doc = http.get(f"{issuer}/.well-known/openid-configuration").json()
    assert doc["issuer"] == issuer
    assert doc["token_endpoint"] == oidc.env["BERGSTREAM_OIDC_TOKEN_ENDPOINT"]
    assert doc["jwks_uri"] == oidc.env["BERGSTREAM_OIDC_JWKS_URL"]
    assert "client_credentials" in doc["grant_types_supported"]


@pytest.mark.parametrize("client", ["admin", "noaccess"])
def test_client_credentials_token(oidc: Oidc, http: httpx.Client, client: str) -> None:
    env = oidc.env
    prefix = "BERGSTREAM_OIDC_" if client == "admin" else "BERGSTREAM_OIDC_NOACCESS_"
    assert env[f"{prefix}CLIENT_ID"] == client
    response = _token(http, env, client, env[f"{prefix}CLIENT_SECRET"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["token_type"].lower() == "bearer"
    # exp minus the current second: one less if a second ticked while the token was made.
    assert LIFESPAN - 2 <= body["expires_in"] <= LIFESPAN
    assert "refresh_token" not in body
    claims = _verified_claims(http, env, body["access_token"])
    # The principal Kafka takes (sasl.oauthbearer.sub.claim.name=sub) is the client id.
    assert claims["sub"] == client
    assert claims["azp"] == client
    assert claims["aud"] == AUDIENCE
    assert claims["iss"] == env["BERGSTREAM_OIDC_ISSUER"]
    assert claims["exp"] - claims["iat"] == LIFESPAN
    assert abs(claims["iat"] - time.time()) < 30
    assert claims["scope"] == "kafka"


def test_wrong_credentials_refused(oidc: Oidc, http: httpx.Client) -> None:
    env = oidc.env
    wrong = _token(http, env, "admin", env["BERGSTREAM_OIDC_NOACCESS_CLIENT_SECRET"])
    assert wrong.status_code == 401
    assert wrong.json()["error"] == "unauthorized_client"
    assert _token(http, env, "nobody", "x").status_code == 401


def test_jwks_has_the_signing_key(oidc: Oidc, http: httpx.Client) -> None:
    keys = http.get(oidc.env["BERGSTREAM_OIDC_JWKS_URL"]).json()["keys"]
    signing = [k for k in keys if k.get("use") == "sig"]
    assert [(k["kty"], k["alg"]) for k in signing] == [("RSA", "RS256")]


def _listening(pids: list[int]) -> list[str]:
    """The local addresses (hex, as in /proc/net/tcp*) of the TCP listeners of ``pids``."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1].split(":")[0])
    return found


def test_listens_on_loopback_only(oidc: Oidc) -> None:
    pids = find_strays(oidc.home / "oidc", LAUNCHERS["oidc"].comms)
    addresses = _listening(pids)
    assert addresses, "no listener found"
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    assert set(addresses) <= loopback, addresses


def test_stack_down_leaves_nothing_running(oidc: Oidc) -> None:
    assert stack_down(oidc.home) == ["oidc"]
    assert not pid_alive(oidc.pid)
    assert find_strays(oidc.home / "oidc", LAUNCHERS["oidc"].comms) == []
    assert not port_is_open(oidc.port)
    assert not stack_status(oidc.home)["oidc"]["running"]
