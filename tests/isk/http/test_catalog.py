"""The Iceberg REST catalog: plain HTTP and PyIceberg's RestCatalog against a fake provider."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, OAuthError

from tests.kits.isk_http_fakes import ACCESS_KEY, BUCKET, SECRET_KEY, FakeProvider, RunningService


def call(
    url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def call_json(url: str, **kwargs: Any) -> tuple[int, Any]:
    status, _, body = call(url, **kwargs)
    return status, json.loads(body) if body else None


def error_type(url: str, **kwargs: Any) -> tuple[int, str]:
    status, body = call_json(url, **kwargs)
    assert set(body["error"]) == {"message", "type", "code"}
    assert body["error"]["code"] == status
    return status, body["error"]["type"]


def test_config_advertises_endpoints(isk: RunningService) -> None:
    status, body = call_json(f"{isk.catalog_url}/v1/config?warehouse=x")
    assert status == 200
    assert body["defaults"] == {} and body["overrides"] == {}
    assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in body["endpoints"]
    assert "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics" in body["endpoints"]


def test_namespaces_and_tables(isk: RunningService) -> None:
    base = f"{isk.catalog_url}/v1"
    assert call_json(f"{base}/namespaces?pageToken=") == (
        200,
        {"namespaces": [["coldset"], ["hotset"], ["merged"]]},
    )
    assert call_json(f"{base}/namespaces/hotset") == (
        200,
        {"namespace": ["hotset"], "properties": {}},
    )
    assert call(f"{base}/namespaces/hotset", method="HEAD")[0] == 204
    assert call(f"{base}/namespaces/nope", method="HEAD")[0] == 404
    status, body = call_json(f"{base}/namespaces/hotset/tables")
    assert status == 200
    assert body == {
        "identifiers": [
            {"namespace": ["hotset"], "name": "orders"},
            {"namespace": ["hotset"], "name": "payments"},
        ]
    }


def _pages(url: str, key: str, size: int) -> list[list[Any]]:
    """Every page of a list endpoint, following ``next-page-token`` from an empty token."""
    pages, token = [], ""
    while True:
        status, body = call_json(f"{url}?pageSize={size}&pageToken={token}")
        assert status == 200, body
        pages.append(body[key])
        if "next-page-token" not in body:
            return pages
        token = body["next-page-token"]


def test_lists_page_as_the_spec_says(isk: RunningService) -> None:
    base = f"{isk.catalog_url}/v1/namespaces"
    assert _pages(base, "namespaces", 1) == [[["coldset"]], [["hotset"]], [["merged"]]]
    assert _pages(base, "namespaces", 2) == [[["coldset"], ["hotset"]], [["merged"]]]
    assert _pages(base, "namespaces", 3) == [[["coldset"], ["hotset"], ["merged"]]]
    tables = _pages(f"{base}/hotset/tables", "identifiers", 1)
    assert [[t["name"] for t in page] for page in tables] == [["orders"], ["payments"]]
    for bad in ("pageSize=0", "pageSize=-1", "pageSize=x", "pageToken=%25%25%25"):
        status, body = call_json(f"{base}?{bad}")
        assert status == 400 and body["error"]["type"] == "BadRequestException", (bad, body)


def test_load_table_vends_s3_config_and_etag(isk: RunningService, provider: FakeProvider) -> None:
    url = f"{isk.catalog_url}/v1/namespaces/merged/tables/orders?snapshots=all"
    status, headers, raw = call(url, headers={"Authorization": "Bearer None"})
    assert status == 200
    body = json.loads(raw)
    loaded = provider.tables["merged", "orders"]
    assert body["metadata-location"] == loaded.metadata_location
    assert body["metadata"] == loaded.metadata
    config = body["config"]
    # Temporary credentials for this table: all three keys (Trino needs them), never the root.
    vended = {"s3.access-key-id", "s3.secret-access-key", "s3.session-token"}
    expires_ms = int(config["s3.session-token-expires-at-ms"])
    assert {k: v for k, v in config.items() if k not in vended} == {
        "s3.endpoint": isk.s3_url,
        "s3.path-style-access": "true",
        "s3.session-token-expires-at-ms": str(expires_ms),
        "s3.region": "us-east-1",
        "client.region": "us-east-1",
    }
    assert abs(expires_ms / 1000 - time.time() - 3600) < 60
    assert config["s3.access-key-id"].startswith("ASIA") and len(config["s3.access-key-id"]) == 20
    assert config["s3.access-key-id"] != ACCESS_KEY and SECRET_KEY not in raw.decode()
    location = loaded.metadata["location"]
    assert body["storage-credentials"] == [{"prefix": location, "config": config}]
    assert headers["Cache-Control"] == "no-store"
    etag = headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"')
    assert call(url, headers={"If-None-Match": etag})[0] == 304
    assert call(url, headers={"If-None-Match": '"other"'})[0] == 200
    assert call(url, method="HEAD")[0] == 204
    status, body = call_json(f"{url.split('?')[0]}/credentials")
    assert status == 200
    [credential] = body["storage-credentials"]
    assert credential["prefix"] == location == f"s3://{BUCKET}/merged/orders"
    assert credential["config"]["s3.endpoint"] == isk.s3_url
    # Refreshed: a new token (another expiry or the same second: then the same credentials).
    assert set(credential["config"]) == set(config)
    assert credential["config"]["s3.session-token"].startswith("isks1.")
    status, _, raw = call(
        f"{url.split('?')[0]}/metrics",
        method="POST",
        body=b'{"report": 1}',
        headers={"Content-Type": "application/json"},
    )
    assert (status, raw) == (204, b"")


def test_not_found_types(isk: RunningService) -> None:
    base = f"{isk.catalog_url}/v1/namespaces"
    assert error_type(f"{base}/nope") == (404, "NoSuchNamespaceException")
    assert error_type(f"{base}/nope/tables") == (404, "NoSuchNamespaceException")
    assert error_type(f"{base}/hotset/tables/nope") == (404, "NoSuchTableException")
    assert error_type(f"{base}/nope/tables/orders") == (404, "NoSuchTableException")
    assert error_type(f"{base}/hotset/tables/nope/credentials") == (404, "NoSuchTableException")
    # Spark's metadata tables and unknown sub-routes under a table
    assert error_type(f"{base}/hotset/tables/orders/snapshots") == (404, "NoSuchTableException")
    assert error_type(f"{base}/hotset/tables/orders.snapshots") == (404, "NoSuchTableException")
    assert call(f"{base}/hotset/tables/nope", method="HEAD")[:1] == (404,)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/namespaces"),
        ("DELETE", "/v1/namespaces/hotset"),
        ("POST", "/v1/namespaces/hotset/properties"),
        ("POST", "/v1/namespaces/hotset/tables"),
        ("POST", "/v1/namespaces/hotset/tables/orders"),
        ("DELETE", "/v1/namespaces/hotset/tables/orders"),
        ("POST", "/v1/namespaces/hotset/register"),
        ("POST", "/v1/tables/rename"),
        ("POST", "/v1/transactions/commit"),
    ],
)
def test_writes_are_refused(isk: RunningService, method: str, path: str) -> None:
    status, type_ = error_type(
        f"{isk.catalog_url}{path}",
        method=method,
        body=b"{}",
        headers={"Content-Type": "application/json"},
    )
    assert status == 403 and type_ == "ForbiddenException"


def test_provider_unavailable_is_503(isk: RunningService, outage: FakeProvider) -> None:
    base = f"{isk.catalog_url}/v1/namespaces"
    assert error_type(base) == (503, "ServiceUnavailableException")
    assert error_type(f"{base}/hotset/tables/orders") == (503, "ServiceUnavailableException")


def test_table_not_servable_is_500_with_the_reason_logged_with_the_client(
    isk: RunningService, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    provider.not_servable = True
    try:
        with caplog.at_level("WARNING", logger="bergstream.isk"):
            status, body = call_json(f"{isk.catalog_url}/v1/namespaces/hotset/tables/orders")
    finally:
        provider.not_servable = False
    assert status == 500
    assert body["error"]["type"] == "ServiceFailureException"
    assert "delete files" in body["error"]["message"]
    (record,) = [r for r in caplog.records if "delete files" in r.getMessage()]
    assert record.component == "isk"  # type: ignore[attr-defined]
    assert record.client.startswith("127.0.0.1:")  # type: ignore[attr-defined]


def test_prefix_routes(make_isk: Any) -> None:
    isk = make_isk(prefix="wh")
    assert call_json(f"{isk.catalog_url}/v1/config")[1]["overrides"] == {"prefix": "wh"}
    assert call_json(f"{isk.catalog_url}/v1/wh/namespaces")[0] == 200
    assert call_json(f"{isk.catalog_url}/v1/namespaces")[0] == 200
    assert call_json(f"{isk.catalog_url}/v1/wh/namespaces/hotset/tables/orders")[0] == 200
    catalog = RestCatalog("isk", uri=f"{isk.catalog_url}/")
    assert ("hotset", "orders") in catalog.list_tables("hotset")
    assert catalog.load_table("hotset.orders").metadata.location.endswith("hotset/orders")


def test_oauth(make_isk: Any) -> None:
    isk = make_isk(client_id="cid", client_secret="csecret")
    base = f"{isk.catalog_url}/v1"
    assert error_type(f"{base}/config") == (401, "NotAuthorizedException")
    assert error_type(f"{base}/namespaces", headers={"Authorization": "Bearer None"}) == (
        401,
        "NotAuthorizedException",
    )
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, token = call_json(
        f"{base}/oauth/tokens",
        method="POST",
        headers=form,
        body=b"grant_type=client_credentials&client_id=cid&client_secret=csecret&scope=catalog",
    )
    assert status == 200 and token["token_type"] == "bearer"
    assert (
        call_json(
            f"{base}/namespaces", headers={"Authorization": f"Bearer {token['access_token']}"}
        )[0]
        == 200
    )
    # DuckDB: client credentials as HTTP Basic
    basic = base64.b64encode(b"cid:csecret").decode()
    status, token2 = call_json(
        f"{base}/oauth/tokens",
        method="POST",
        headers={**form, "Authorization": f"Basic {basic}"},
        body=b"grant_type=client_credentials",
    )
    assert status == 200 and token2["access_token"]
    status, err = call_json(
        f"{base}/oauth/tokens",
        method="POST",
        headers=form,
        body=b"grant_type=client_credentials&client_id=cid&client_secret=wrong",
    )
    assert status == 401 and err["error"] == "invalid_client"
    forged = {"Authorization": "Bearer 9999999999.bad"}
    assert error_type(f"{base}/namespaces", headers=forged)[0] == 401

    oauth_uri = {"oauth2-server-uri": f"{base}/oauth/tokens"}
    catalog = RestCatalog("isk", uri=f"{isk.catalog_url}/", credential="cid:csecret", **oauth_uri)
    assert catalog.list_namespaces() == [("coldset",), ("hotset",), ("merged",)]
    assert catalog.load_table("merged.orders").metadata.location.endswith("merged/orders")
    with pytest.raises(OAuthError):
        RestCatalog("isk", uri=f"{isk.catalog_url}/", credential="cid:wrong", **oauth_uri)


def test_oauth_off_has_no_token_route(isk: RunningService) -> None:
    status, _, _ = call(
        f"{isk.catalog_url}/v1/oauth/tokens", method="POST", body=b"grant_type=client_credentials"
    )
    assert status == 404


def test_pyiceberg_rest_catalog(isk: RunningService, provider: FakeProvider) -> None:
    catalog = RestCatalog("isk", uri=f"{isk.catalog_url}/")
    assert catalog.list_namespaces() == [("coldset",), ("hotset",), ("merged",)]
    assert catalog.list_tables("hotset") == [("hotset", "orders"), ("hotset", "payments")]
    assert catalog.namespace_exists("merged") and not catalog.namespace_exists("nope")
    assert catalog.table_exists("hotset.orders") and not catalog.table_exists("hotset.nope")
    table = catalog.load_table("hotset.orders")
    loaded = provider.tables["hotset", "orders"]
    assert table.metadata_location == loaded.metadata_location
    assert table.schema().as_struct() == table.metadata.schema().as_struct()
    assert [f.name for f in table.schema().fields][:2] == ["kafka_partition", "kafka_offset"]
    # The FileIO built from the vended config reads through the S3 gateway (signed, path-style).
    with table.io.new_input(loaded.metadata_location).open() as stream:
        assert json.loads(stream.read()) == loaded.metadata
    assert table.scan().to_arrow().num_rows == 0
    with pytest.raises(NoSuchTableError):
        catalog.load_table("hotset.nope")
    with pytest.raises(NoSuchNamespaceError):
        catalog.list_tables("nope")


def test_oauth_token_exchange_refresh(make_isk: Any) -> None:
    isk = make_isk(client_id="cid", client_secret="csecret", token_ttl_seconds=60)
    url = f"{isk.catalog_url}/v1/oauth/tokens"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    _, first = call_json(
        url,
        method="POST",
        headers=form,
        body=b"grant_type=client_credentials&client_id=cid&client_secret=csecret",
    )
    assert first["expires_in"] == 60
    body = (
        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange"
        f"&subject_token={first['access_token']}"
        "&subject_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Aaccess_token"
    ).encode()
    status, second = call_json(url, method="POST", headers=form, body=body)
    assert status == 200 and second["token_type"] == "bearer"
    status, err = call_json(
        url, method="POST", headers=form, body=body.replace(b"subject_token=", b"subject_token=x")
    )
    assert status == 400 and err["error"] == "invalid_grant"
