"""Temporary, table-scoped S3 credentials: the token itself, and the catalog and the S3 gateway
(real aiohttp apps) vending and checking them."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from bergstream.plugins.isk_gateway.http.credentials import (
    CredentialKeys,
    SessionCredentials,
    TokenExpired,
    TokenInvalid,
)
from tests.isk.http.raw_s3 import raw_signed_get
from tests.kits.isk_http_fakes import ACCESS_KEY, BLOB, BUCKET, SECRET_KEY, RunningService

BLOB_KEY = "hotset/orders/data/blob.bin"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------ the token


def test_issue_and_verify_round_trip() -> None:
    keys = CredentialKeys(ACCESS_KEY, SECRET_KEY, clock=Clock())
    vended = keys.issue("c/hotset/orders", "reader", 60)
    assert vended.access_key.startswith("ASIA") and len(vended.access_key) == 20
    assert vended.access_key.isalnum() and vended.access_key.isupper()
    assert vended.expires_at == 1_800_000_060
    assert (vended.scope, vended.principal) == ("c/hotset/orders", "reader")
    assert vended.secret_key != SECRET_KEY and SECRET_KEY not in vended.session_token
    assert vended.secret_key not in vended.session_token
    assert vended.secret_key not in repr(vended) and vended.session_token not in repr(vended)
    assert keys.verify(vended.session_token) == vended
    # Stateless: another instance with the same root pair accepts it, and derives the same.
    assert CredentialKeys(ACCESS_KEY, SECRET_KEY, clock=Clock()).verify(vended.session_token) == (
        vended
    )
    # Each issue for another table, principal or expiry is another key pair.
    others = [
        keys.issue("c/hotset/payments", "reader", 60),
        keys.issue("c/merged/orders", "reader", 60),
        keys.issue("c/hotset/orders", "admin", 60),
        keys.issue("c/hotset/orders", None, 60),
        keys.issue("c/hotset/orders", "reader", 61),
    ]
    assert len({o.access_key for o in [vended, *others]}) == 6
    assert len({o.secret_key for o in [vended, *others]}) == 6
    with pytest.raises(ValueError, match="key prefix"):
        keys.issue("/", None, 60)


def test_tokens_expire() -> None:
    clock = Clock()
    keys = CredentialKeys(ACCESS_KEY, SECRET_KEY, clock=clock)
    vended = keys.issue("c/hotset/orders", None, 60)
    clock.now += 59.9
    assert keys.verify(vended.session_token) == vended
    clock.now += 0.1
    with pytest.raises(TokenExpired):
        keys.verify(vended.session_token)


def _parts(token: str) -> tuple[str, dict[str, Any], str]:
    version, payload, mac = token.split(".")
    return version, json.loads(base64.urlsafe_b64decode(payload + "==")), mac


def _encode(payload: dict[str, Any]) -> str:
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_tampered_and_foreign_tokens_are_invalid() -> None:
    clock = Clock()
    keys = CredentialKeys(ACCESS_KEY, SECRET_KEY, clock=clock)
    token = keys.issue("c/hotset/orders", "reader", 60).session_token
    version, payload, mac = _parts(token)
    forged = [
        f"{version}.{_encode({**payload, 's': 'c/hotset/payments'})}.{mac}",  # other table
        f"{version}.{_encode({**payload, 'p': 'admin'})}.{mac}",  # other principal
        f"{version}.{_encode({**payload, 'p': None})}.{mac}",  # no principal
        f"{version}.{_encode({**payload, 'e': payload['e'] + 3600})}.{mac}",  # later expiry
        f"{version}.{_encode(payload)}.{'A' * len(mac)}",
        f"isks2.{_encode(payload)}.{mac}",
        token + "x",
        token.rsplit(".", 1)[0],
        "",
        "garbage",
        "isks1..",
    ]
    for bad in forged:
        with pytest.raises(TokenInvalid):
            keys.verify(bad)
    # The same token under another root (secret or access key) is not that root's.
    for other in (
        CredentialKeys(ACCESS_KEY, "another-secret", clock=clock),
        CredentialKeys("another-key", SECRET_KEY, clock=clock),
    ):
        with pytest.raises(TokenInvalid):
            other.verify(token)
    # A forged token is invalid even when its claimed expiry is past: never "expired".
    clock.now += 3600
    with pytest.raises(TokenInvalid):
        keys.verify(forged[0])


def test_the_scope_is_the_table_prefix() -> None:
    vended = CredentialKeys(ACCESS_KEY, SECRET_KEY).issue("c/hotset/orders", None, 60)
    assert vended.allows("c/hotset/orders/data/p=0/day=-/0-1.parquet")
    assert vended.allows("c/hotset/orders/metadata/1.metadata.json")
    for key in ("c/hotset/orders", "c/hotset/orders2/data/x", "c/merged/orders/x", "d/hotset/x"):
        assert not vended.allows(key)
    for prefix in ("", "c/", "c/hotset/", "c/hotset/orders", "c/hotset/orders/", "c/hotset/o"):
        assert vended.allows_listing(prefix), prefix
    for prefix in ("c/hotset/orders2", "c/hotset/p", "c/merged/", "d/"):
        assert not vended.allows_listing(prefix), prefix


# --------------------------------------------------------------- catalog and gateway


def load_table(isk: RunningService, namespace: str, table: str) -> dict[str, Any]:
    url = f"{isk.catalog_url}/v1/namespaces/{namespace}/tables/{table}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


def credentials(isk: RunningService, namespace: str, table: str) -> dict[str, str]:
    url = f"{isk.catalog_url}/v1/namespaces/{namespace}/tables/{table}/credentials"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    [credential] = body["storage-credentials"]
    assert credential["prefix"] == f"s3://{BUCKET}/{namespace}/{table}"
    config: dict[str, str] = credential["config"]
    return config


def session_client(isk: RunningService, config: dict[str, str], **changes: str) -> BaseClient:
    """A boto3 client with vended ``config`` (``changes`` replace some of its values)."""
    config = {**config, **changes}
    return boto3.client(
        "s3",
        endpoint_url=config["s3.endpoint"],
        aws_access_key_id=config["s3.access-key-id"],
        aws_secret_access_key=config["s3.secret-access-key"],
        aws_session_token=config["s3.session-token"],
        region_name=config["s3.region"],
        config=Config(
            s3={"addressing_style": "path"}, retries={"max_attempts": 1}, signature_version="s3v4"
        ),
    )


def vended_config(vended: SessionCredentials, isk: RunningService) -> dict[str, str]:
    return {
        "s3.endpoint": isk.s3_url,
        "s3.region": "us-east-1",
        "s3.access-key-id": vended.access_key,
        "s3.secret-access-key": vended.secret_key,
        "s3.session-token": vended.session_token,
    }


def code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response: Any = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_vended_credentials_read_only_their_table(isk: RunningService) -> None:
    config = load_table(isk, "hotset", "orders")["config"]
    assert config["s3.access-key-id"] != ACCESS_KEY
    s3 = session_client(isk, config)
    assert s3.get_object(Bucket=BUCKET, Key=BLOB_KEY)["Body"].read() == BLOB
    assert s3.head_object(Bucket=BUCKET, Key=BLOB_KEY)["ContentLength"] == len(BLOB)
    others = [
        key
        for key in isk.provider.files
        if key.startswith(("hotset/payments/", "merged/orders/"))  # other table; same name
    ]
    assert len(others) == 2
    root = boto3.client(
        "s3",
        endpoint_url=isk.s3_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    for key in others:
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=BUCKET, Key=key)
        assert code(exc) == ("AccessDenied", 403)
        assert "another table" in exc.value.response["Error"]["Message"]
        with pytest.raises(ClientError) as exc:
            s3.head_object(Bucket=BUCKET, Key=key)
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        # The root pair (the operator's key, never vended) still reads it: the refusal is
        # the session's scope.
        assert root.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    # With a session token, the token's secret signs: the root secret is no use.
    with_root = session_client(
        isk, config, **{"s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY}
    )
    with pytest.raises(ClientError) as exc:
        with_root.get_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert code(exc) == ("InvalidAccessKeyId", 403)  # not the key the token was issued with


def test_listing_stays_within_the_table(isk: RunningService) -> None:
    s3 = session_client(isk, load_table(isk, "hotset", "orders")["config"])
    for prefix in ("", "hotset/", "hotset/orders/"):
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        keys = [o["Key"] for o in listed["Contents"]]
        assert keys and all(k.startswith("hotset/orders/") for k in keys), prefix
    tops = s3.list_objects_v2(Bucket=BUCKET, Delimiter="/")
    assert [p["Prefix"] for p in tops["CommonPrefixes"]] == ["hotset/"]
    for prefix in ("hotset/payments/", "merged/", "hotset/orders2"):
        with pytest.raises(ClientError) as exc:
            s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        assert code(exc) == ("AccessDenied", 403)


def test_a_wrong_secret_or_another_tokens_key_is_denied(isk: RunningService) -> None:
    orders = load_table(isk, "hotset", "orders")["config"]
    payments = load_table(isk, "hotset", "payments")["config"]
    for changes in (
        {"s3.secret-access-key": "wrong"},
        {"s3.secret-access-key": SECRET_KEY},  # the root secret is not the session's
        {"s3.secret-access-key": payments["s3.secret-access-key"]},
        {"s3.access-key-id": payments["s3.access-key-id"]},
        {
            "s3.access-key-id": payments["s3.access-key-id"],
            "s3.secret-access-key": payments["s3.secret-access-key"],
        },
    ):
        with pytest.raises(ClientError) as exc:
            session_client(isk, orders, **changes).get_object(Bucket=BUCKET, Key=BLOB_KEY)
        # S3's codes: a secret that is not the key's, a key the token was not issued with
        refusals = {("SignatureDoesNotMatch", 403), ("InvalidAccessKeyId", 403)}
        assert code(exc) in refusals, changes


def test_expired_and_foreign_tokens_are_refused(isk: RunningService) -> None:
    past = Clock(time.time() - 7200)
    expired = CredentialKeys(ACCESS_KEY, SECRET_KEY, clock=past).issue("hotset/orders", None, 60)
    with pytest.raises(ClientError) as exc:
        session_client(isk, vended_config(expired, isk)).get_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert code(exc) == ("ExpiredToken", 400)
    with pytest.raises(ClientError) as exc:
        session_client(isk, vended_config(expired, isk)).head_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    # Issued by a gateway with another root: not this gateway's token.
    foreign = CredentialKeys(ACCESS_KEY, "other-root").issue("hotset/orders", None, 60)
    with pytest.raises(ClientError) as exc:
        session_client(isk, vended_config(foreign, isk)).get_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert code(exc) == ("InvalidToken", 400)
    # A token naming a principal, on a gateway without principals.
    named = CredentialKeys(ACCESS_KEY, SECRET_KEY).issue("hotset/orders", "reader", 60)
    with pytest.raises(ClientError) as exc:
        session_client(isk, vended_config(named, isk)).get_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert code(exc) == ("AccessDenied", 403)


def test_presigned_urls_carry_the_token(isk: RunningService) -> None:
    s3 = session_client(isk, load_table(isk, "hotset", "orders")["config"])
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": BLOB_KEY})
    assert "X-Amz-Security-Token=" in url
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == BLOB
    other = next(k for k in isk.provider.files if k.startswith("hotset/payments/"))
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": other})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 403 and b"<Code>AccessDenied</Code>" in refused.value.read()


def test_an_unsigned_token_header_is_still_bound_by_the_signature(isk: RunningService) -> None:
    """The token's secret checks the signature, so a token swapped in after signing (or sent
    without signing it) is of no use."""
    orders = load_table(isk, "hotset", "orders")["config"]
    payments = load_table(isk, "hotset", "payments")["config"]
    host = isk.s3_url.removeprefix("http://")
    other = next(k for k in isk.provider.files if k.startswith("hotset/payments/"))
    credentials = Credentials(
        orders["s3.access-key-id"], orders["s3.secret-access-key"], orders["s3.session-token"]
    )
    status, body = raw_signed_get(
        host, f"/{BUCKET}/{other}", credentials, payments["s3.session-token"]
    )
    assert status == 403 and b"<Code>InvalidAccessKeyId</Code>" in body, body


def test_the_credentials_endpoint_refreshes(make_isk: Any) -> None:
    isk = make_isk(credentials_ttl_seconds=120)
    first = load_table(isk, "hotset", "orders")["config"]
    assert abs(int(first["s3.session-token-expires-at-ms"]) / 1000 - time.time() - 120) < 30
    time.sleep(1.1)  # expiries are whole seconds: a later second gives a new token
    fresh = credentials(isk, "hotset", "orders")
    assert fresh["s3.session-token"] != first["s3.session-token"]
    assert fresh["s3.access-key-id"] != first["s3.access-key-id"]
    assert int(fresh["s3.session-token-expires-at-ms"]) > int(
        first["s3.session-token-expires-at-ms"]
    )
    for config in (first, fresh):
        assert session_client(isk, config).get_object(Bucket=BUCKET, Key=BLOB_KEY)["Body"].read()
    # Another instance sharing the root pair accepts what this one vended.
    twin = make_isk()
    s3 = session_client(twin, fresh, **{"s3.endpoint": twin.s3_url})
    assert s3.get_object(Bucket=BUCKET, Key=BLOB_KEY)["Body"].read() == BLOB


@pytest.mark.parametrize("ttl", [0, -1, 43201])
def test_the_credentials_lifetime_is_bounded(ttl: int) -> None:
    from pydantic import ValidationError

    from bergstream.plugins.isk_gateway.http.config import IskHttpConfig

    with pytest.raises(ValidationError, match="credentials_ttl_seconds"):
        IskHttpConfig(access_key="k", secret_key="s", credentials_ttl_seconds=ttl)
