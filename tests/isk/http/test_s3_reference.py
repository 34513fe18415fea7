"""ISK's S3 gateway against moto's S3 (the reference) holding the same objects: each request below,
signed with the same keys, goes to both; status codes, error codes, the headers clients rely on
(``Content-Length``, ``Content-Range``, ``Accept-Ranges``, ``ETag`` and ``Last-Modified`` present
and well formed) and the bytes or the normalized ListObjectsV2 XML must be equal, or differ
exactly as ``docs/reference-servers.md`` lists. Then boto3, PyArrow's S3 filesystem and DuckDB's
httpfs read the same object from both alike. (moto does not check signatures, so the
authentication errors are checked against S3's documented codes.)"""

from __future__ import annotations

import email.utils
import http.client
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.kits.isk_http_fakes import ACCESS_KEY, BUCKET, SECRET_KEY, FakeProvider, RunningService

pytestmark = pytest.mark.slow

BLOB = "/bergstream/hotset/orders/data/blob.bin"
EMPTY = "/bergstream/hotset/orders/data/empty.bin"
ODD = "/bergstream/" + quote("hotset/orders/data/key with space+plus%25=ü.bin")
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"

#: (method, path, headers) sent to both.
REQUESTS: list[tuple[str, str, dict[str, str]]] = [
    ("GET", BLOB, {}),
    ("HEAD", BLOB, {}),
    ("GET", ODD, {}),
    ("GET", BLOB, {"Range": "bytes=0-"}),
    ("GET", BLOB, {"Range": "bytes=-100"}),
    ("GET", BLOB, {"Range": "bytes=10-19"}),
    ("HEAD", BLOB, {"Range": "bytes=10-19"}),
    ("GET", BLOB, {"Range": "bytes=10000-20000"}),  # past the end: cut to the end
    ("GET", BLOB, {"Range": "bytes=20000-"}),  # unsatisfiable
    ("GET", BLOB, {"Range": "bytes=0-1,5-6"}),  # several ranges: the whole object
    ("GET", BLOB, {"Range": "bytes=x"}),
    ("GET", BLOB, {"Range": "bytes=5-1"}),
    ("GET", EMPTY, {"Range": "bytes=0-"}),
    ("GET", BLOB, {"If-Match": '"nope"'}),
    ("GET", BLOB, {"If-None-Match": '"nope"'}),
    ("GET", BLOB, {"If-None-Match": "*"}),
    ("GET", BLOB, {"If-Modified-Since": "Thu, 01 Jan 2037 00:00:00 GMT"}),
    ("GET", BLOB, {"If-Modified-Since": "Thu, 01 Jan 1970 00:00:00 GMT"}),
    ("GET", BLOB, {"If-Unmodified-Since": "Thu, 01 Jan 1970 00:00:00 GMT"}),
    ("GET", BLOB, {"If-Unmodified-Since": "Thu, 01 Jan 2037 00:00:00 GMT"}),
    ("GET", BLOB, {"If-Modified-Since": "not a date"}),
    ("GET", "/bergstream/hotset/nope", {}),
    ("HEAD", "/bergstream/hotset/nope", {}),
    ("GET", "/nobucket/x", {}),
    ("GET", "/bergstream?list-type=2", {}),
    ("GET", "/bergstream?list-type=2&max-keys=2", {}),
    ("GET", "/bergstream?delimiter=%2F&list-type=2&prefix=hotset%2Forders%2F", {}),
    ("GET", "/bergstream?list-type=2&start-after=hotset%2Forders%2Fdata%2Fblob.bin", {}),
    ("GET", "/bergstream?encoding-type=url&list-type=2&prefix=hotset%2Forders%2Fdata%2Fkey", {}),
    ("GET", "/bergstream?list-type=2&prefix=nothing%2F", {}),
    ("PUT", "/bergstream/hotset/written", {}),
    ("DELETE", "/bergstream/hotset/written", {}),
    ("POST", "/bergstream/hotset/written?uploads", {}),
]

#: Requests whose answers differ, and how: (ISK's, moto's) as (status, error code).
DIFFERENCES: dict[tuple[str, str, str], tuple[tuple[int, str | None], tuple[int, str | None]]] = {
    # RFC 9110: If-None-Match: * matches any current object, so a GET is not modified.
    ("GET", BLOB, "If-None-Match: *"): ((304, None), (200, None)),
    # A date that does not parse: RFC 9110 ignores the condition (as S3 does); moto fails.
    ("GET", BLOB, "If-Modified-Since: not a date"): ((200, None), (500, None)),
    # A read-only gateway refuses writes as S3 refuses a principal without write permission;
    # moto writes.
    ("PUT", "/bergstream/hotset/written", ""): ((403, "AccessDenied"), (200, None)),
    ("DELETE", "/bergstream/hotset/written", ""): ((403, "AccessDenied"), (204, None)),
    ("POST", "/bergstream/hotset/written?uploads", ""): ((403, "AccessDenied"), (200, None)),
}


def send(
    base: str,
    method: str,
    path: str,
    headers: dict[str, str],
    *,
    secret: str = SECRET_KEY,
    presign: bool = False,
    expires: int = 300,
    sign: bool = True,
    host: str | None = None,
    payload: str | None = "UNSIGNED-PAYLOAD",
) -> tuple[int, dict[str, str], bytes]:
    """Send ``method path`` to ``base``, SigV4-signed (in headers, or presigned) unless
    ``sign`` is false; ``host`` overrides the Host header (virtual-host style)."""
    url = urlsplit(base)
    target_host = host or url.netloc
    request = AWSRequest(method=method, url=f"http://{target_host}{path}", headers=dict(headers))
    if not presign and payload is not None:
        request.headers["x-amz-content-sha256"] = payload
    if sign:
        credentials = Credentials(ACCESS_KEY, secret)
        if presign:
            S3SigV4QueryAuth(credentials, "s3", "us-east-1", expires=expires).add_auth(request)
        else:
            S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)
    parts = urlsplit(request.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        wire = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        connection.putrequest(
            method, parts.path + (f"?{parts.query}" if parts.query else ""), skip_host=True
        )
        connection.putheader("Host", target_host)
        for name, value in wire.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        connection.close()


def error_code(body: bytes) -> str | None:
    found = re.search(rb"<Code>([^<]+)</Code>", body)
    return found.group(1).decode() if found else None


def listing(body: bytes) -> dict[str, Any]:
    """A ListObjectsV2 result without the values that differ by nature (ETags, dates, owners,
    storage classes, the continuation token's form)."""
    root = ET.fromstring(body)

    def text(name: str) -> str | None:
        node = root.find(f"{_NS}{name}")
        return node.text if node is not None else None

    return {
        "keys": [
            (c.findtext(f"{_NS}Key"), c.findtext(f"{_NS}Size")) for c in root.iter(f"{_NS}Contents")
        ],
        "prefixes": [p.findtext(f"{_NS}Prefix") for p in root.iter(f"{_NS}CommonPrefixes")],
        **{
            name: text(name)
            for name in ("Name", "Prefix", "Delimiter", "MaxKeys", "KeyCount", "IsTruncated")
        },
        "StartAfter": text("StartAfter"),
        "EncodingType": text("EncodingType"),
        "next": text("NextContinuationToken") is not None,
    }


@pytest.fixture(scope="module")
def servers(moto: Any) -> Iterator[tuple[str, str]]:
    """(ISK's S3 URL, moto's URL), both holding the fake provider's files in ``bergstream``."""
    provider = FakeProvider()
    running = RunningService(provider)
    s3 = moto.client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    for key, data in provider.files.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    yield running.s3_url, moto.url
    running.close()


@pytest.mark.parametrize(
    ("method", "path", "headers"), REQUESTS, ids=[f"{m} {p} {h}" for m, p, h in REQUESTS]
)
def test_isk_answers_as_s3(
    servers: tuple[str, str], method: str, path: str, headers: dict[str, str]
) -> None:
    isk, moto = servers
    ours = send(isk, method, path, headers)
    theirs = send(moto, method, path, headers)
    key = (method, path, "; ".join(f"{k}: {v}" for k, v in headers.items()))
    mine, reference = (ours[0], error_code(ours[2])), (theirs[0], error_code(theirs[2]))
    if key in DIFFERENCES:
        assert (mine, reference) == DIFFERENCES[key]
        return
    assert mine == reference, (ours[1], theirs[1])
    status, our_headers, our_body = ours
    _, their_headers, their_body = theirs
    if status in (200, 206) and "list-type" not in path:
        for name in ("content-length", "content-range", "accept-ranges"):
            assert our_headers.get(name) == their_headers.get(name), name
        for name in ("etag", "last-modified"):
            assert (name in our_headers) == (name in their_headers), name
        assert re.fullmatch(r'"[0-9a-f]{32}"', our_headers["etag"])
        assert email.utils.parsedate_to_datetime(our_headers["last-modified"])
        assert our_body == their_body
    elif status == 200:
        assert listing(our_body) == listing(their_body)
    elif status == 304:
        assert "etag" in our_headers and not our_body
    elif status == 416:
        assert our_headers.get("content-range") == f"bytes */{10240 if path == BLOB else 0}"


def test_continuation_tokens_page_the_same_keys(servers: tuple[str, str]) -> None:
    def keys(base: str) -> list[str]:
        found: list[str] = []
        token = ""
        while True:
            query = "list-type=2&max-keys=2" + (
                f"&continuation-token={quote(token, safe='')}" if token else ""
            )
            _, _, body = send(base, "GET", f"/bergstream?{query}", {})
            page = listing(body)
            found += [k for k, _ in page["keys"]]
            if not page["next"]:
                return found
            token = ET.fromstring(body).findtext(f"{_NS}NextContinuationToken") or ""

    isk, moto = servers
    assert keys(isk) == keys(moto)


def test_presigned_and_virtual_host_requests_read_the_same_bytes(servers: tuple[str, str]) -> None:
    isk, moto = servers
    for base in (isk, moto):
        port = urlsplit(base).port
        presigned = send(base, "GET", BLOB, {}, presign=True)
        virtual = send(
            base, "GET", BLOB.removeprefix("/bergstream"), {}, host=f"bergstream.localhost:{port}"
        )
        assert presigned[0] == virtual[0] == 200, (base, presigned[:2], virtual[:2])
        assert presigned[2] == virtual[2] == send(base, "GET", BLOB, {})[2]


def _get_declaring(base: str, path: str, payload: str | None) -> tuple[int, bytes]:
    """A GET signed (with core's SigV4 steps) over an ``x-amz-content-sha256`` of ``payload``
    (None: no such header, the empty body's hash signed). botocore would put its own hash."""
    import datetime as dt

    from bergstream.core.sigv4 import (
        ALGORITHM,
        AMZ_DATE_FORMAT,
        EMPTY_SHA256,
        canonical_request,
        credential_scope,
        signature,
        signed_headers,
        signing_key,
        string_to_sign,
    )

    host = urlsplit(base).netloc
    amz_date = dt.datetime.now(dt.UTC).strftime(AMZ_DATE_FORMAT)
    headers = [("host", host)]
    if payload is not None:
        headers.append(("x-amz-content-sha256", payload))
    headers.append(("x-amz-date", amz_date))
    canonical = canonical_request("GET", path, "", headers, payload or EMPTY_SHA256)
    scope = credential_scope(amz_date[:8], "us-east-1", "s3")
    key = signing_key(SECRET_KEY, amz_date[:8], "us-east-1", "s3")
    proof = signature(key, string_to_sign(amz_date, scope, canonical))
    wire = dict(headers)
    wire["authorization"] = (
        f"{ALGORITHM} Credential={ACCESS_KEY}/{scope}, SignedHeaders={signed_headers(headers)}, "
        f"Signature={proof}"
    )
    connection = http.client.HTTPConnection(
        urlsplit(base).hostname, urlsplit(base).port, timeout=30
    )
    try:
        connection.request("GET", path, headers=wire)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_every_payload_hash_form_reads_the_same_bytes(servers: tuple[str, str]) -> None:
    """``x-amz-content-sha256``: unsigned, the empty body's hash, or absent."""
    from bergstream.core.sigv4 import EMPTY_SHA256

    isk, moto = servers
    for payload in ("UNSIGNED-PAYLOAD", EMPTY_SHA256, None):
        ours, theirs = _get_declaring(isk, BLOB, payload), _get_declaring(moto, BLOB, payload)
        assert ours[0] == theirs[0] == 200, (payload, ours[0], theirs[0])
        assert ours[1] == theirs[1]
    # signed, but not the empty body's hash: S3 answers 400 XAmzContentSHA256Mismatch (moto
    # does not check it)
    status, body = _get_declaring(isk, BLOB, "0" * 64)
    assert (status, error_code(body)) == (400, "XAmzContentSHA256Mismatch")


def test_authentication_errors_have_s3s_codes(servers: tuple[str, str]) -> None:
    isk, _ = servers
    wrong = send(isk, "GET", BLOB, {}, secret="wrong")
    assert (wrong[0], error_code(wrong[2])) == (403, "SignatureDoesNotMatch")
    unsigned = send(isk, "GET", BLOB, {}, sign=False)
    assert (unsigned[0], error_code(unsigned[2])) == (403, "AccessDenied")
    presigned = AWSRequest(method="GET", url=f"{isk}{BLOB}")
    S3SigV4QueryAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1", expires=1).add_auth(
        presigned
    )
    time.sleep(2)  # an expired presigned URL
    parts = urlsplit(presigned.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("GET", f"{parts.path}?{parts.query}")
        answer = connection.getresponse()
        assert (answer.status, error_code(answer.read())) == (403, "AccessDenied")
    finally:
        connection.close()


def test_clients_read_the_same_object_from_both(servers: tuple[str, str]) -> None:
    """boto3, PyArrow's S3 filesystem and DuckDB's httpfs get the same bytes from ISK and S3."""
    import boto3
    import pyarrow.fs as pafs
    from botocore.config import Config

    from bergstream.devstack.quickstart.clients import offline_duckdb

    key = BLOB.removeprefix("/bergstream/")
    results: dict[str, list[bytes]] = {"boto3": [], "pyarrow": [], "duckdb": []}
    for base in servers:
        client = boto3.client(
            "s3",
            endpoint_url=base,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )
        results["boto3"].append(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=base,
            scheme="http",
            region="us-east-1",
            force_virtual_addressing=False,
        )
        with fs.open_input_file(f"{BUCKET}/{key}") as handle:
            results["pyarrow"].append(handle.read())
        connection = offline_duckdb()
        try:
            connection.execute(
                "CREATE SECRET s (TYPE s3, KEY_ID ?, SECRET ?, REGION 'us-east-1', "
                "ENDPOINT ?, URL_STYLE 'path', USE_SSL false)",
                [ACCESS_KEY, SECRET_KEY, urlsplit(base).netloc],
            )
            [(data,)] = connection.execute(
                f"SELECT content FROM read_blob('s3://{BUCKET}/{key}')"
            ).fetchall()
            results["duckdb"].append(bytes(data))
        finally:
            connection.close()
    for client, (ours, theirs) in results.items():
        assert ours == theirs and len(ours) == 10240, client


def test_the_aws_sdk_for_java_reads_the_same_object_from_both(servers: tuple[str, str]) -> None:
    """The AWS SDK for Java that Spark and Trino read with, through Iceberg's ``S3FileIO`` (in
    the worker's Spark JVM, where the pipeline's jars put it): whole object, a ranged read and
    the length, alike from ISK and S3."""
    from tests.kits.worker_spark import worker_spark

    jvm = worker_spark().sparkContext._jvm
    key = BLOB.removeprefix("/bergstream/")
    seen = []
    for base in servers:
        properties = jvm.java.util.HashMap()
        for name, value in {
            "s3.endpoint": base,
            "s3.path-style-access": "true",
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "client.region": "us-east-1",
        }.items():
            properties.put(name, value)
        io = jvm.org.apache.iceberg.aws.s3.S3FileIO()
        io.initialize(properties)
        try:
            source = io.newInputFile(f"s3://{BUCKET}/{key}")
            stream = source.newStream()
            try:
                whole = bytes(stream.readAllBytes())
                stream.seek(100)
                part = bytes(stream.readNBytes(50))
            finally:
                stream.close()
            seen.append((int(source.getLength()), whole, part))
        finally:
            io.close()
    assert seen[0] == seen[1]
    assert seen[0][0] == 10240 and seen[0][2] == seen[0][1][100:150]
