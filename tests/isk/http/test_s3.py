"""The S3 gateway with real clients: boto3 (signed, path-style) and pyarrow's S3FileSystem."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any
from urllib.parse import unquote

import boto3
import pyarrow.parquet as pq
import pytest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from pyarrow import fs

from tests.isk.http.raw_s3 import raw_signed_get
from tests.kits.isk_http_fakes import (
    ACCESS_KEY,
    BLOB,
    BUCKET,
    PARQUET_KEY,
    PARQUET_TABLE,
    SECRET_KEY,
    SPECIAL_KEY,
    FakeProvider,
    RunningService,
)

BLOB_KEY = "hotset/orders/data/blob.bin"


def client(isk: RunningService, secret: str = SECRET_KEY, **config: Any) -> BaseClient:
    return boto3.client(
        "s3",
        endpoint_url=isk.s3_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config),
    )


@pytest.fixture(scope="module")
def s3(isk: RunningService) -> BaseClient:
    return client(isk)


def code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response: Any = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_head_and_get(s3: BaseClient) -> None:
    head = s3.head_object(Bucket=BUCKET, Key=BLOB_KEY)
    got = s3.get_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert got["Body"].read() == BLOB
    assert head["ContentLength"] == got["ContentLength"] == len(BLOB)
    assert head["ETag"] == got["ETag"] and head["ETag"].startswith('"')
    assert head["LastModified"] == got["LastModified"]
    headers = got["ResponseMetadata"]["HTTPHeaders"]
    assert headers["accept-ranges"] == "bytes"
    assert "transfer-encoding" not in headers
    assert not any(h.startswith("x-amz-checksum") for h in headers)


@pytest.mark.parametrize(
    ("spec", "start", "end"),
    [
        ("bytes=10-19", 10, 20),
        ("bytes=10000-", 10000, 10240),
        ("bytes=-100", 10140, 10240),
        ("bytes=10200-99999", 10200, 10240),
        ("bytes=-99999", 0, 10240),
        ("bytes=0-0", 0, 1),
    ],
)
def test_ranges(s3: BaseClient, spec: str, start: int, end: int) -> None:
    got = s3.get_object(Bucket=BUCKET, Key=BLOB_KEY, Range=spec)
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["Body"].read() == BLOB[start:end]
    assert got["ContentLength"] == end - start
    assert got["ContentRange"] == f"bytes {start}-{end - 1}/{len(BLOB)}"


def test_unsatisfiable_range(s3: BaseClient, isk: RunningService) -> None:
    for spec in ("bytes=10240-", "bytes=20000-20010", "bytes=-0"):
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket=BUCKET, Key=BLOB_KEY, Range=spec)
        assert code(exc) == ("InvalidRange", 416)
        headers = exc.value.response["ResponseMetadata"]["HTTPHeaders"]
        assert headers["content-range"] == f"bytes */{len(BLOB)}"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key="hotset/orders/data/empty.bin", Range="bytes=0-")
    assert code(exc) == ("InvalidRange", 416)
    assert s3.get_object(Bucket=BUCKET, Key="hotset/orders/data/empty.bin")["Body"].read() == b""


def test_if_match(s3: BaseClient) -> None:
    etag = s3.head_object(Bucket=BUCKET, Key=BLOB_KEY)["ETag"]
    assert s3.get_object(Bucket=BUCKET, Key=BLOB_KEY, IfMatch=etag)["Body"].read() == BLOB
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key=BLOB_KEY, IfMatch='"0123"')
    assert code(exc) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key=BLOB_KEY, IfNoneMatch=etag)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304


def test_missing_keys_and_buckets(s3: BaseClient) -> None:
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key="hotset/orders/nope")
    assert code(exc) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=BUCKET, Key="hotset/orders/nope")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert exc.value.response["ResponseMetadata"]["HTTPHeaders"]["content-length"] == "0"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="other", Key=BLOB_KEY)
    assert code(exc) == ("NoSuchBucket", 404)
    s3.head_bucket(Bucket=BUCKET)


@pytest.mark.parametrize("key", ["hotset/../../etc/passwd", "/etc/passwd", "a/./b", "a\0b"])
def test_escaping_keys_are_denied(s3: BaseClient, key: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key=key)
    assert code(exc)[1] in (403, 404)


def test_percent_encoded_key(s3: BaseClient) -> None:
    got = s3.get_object(Bucket=BUCKET, Key=SPECIAL_KEY)
    assert got["Body"].read() == b"special bytes"
    assert s3.head_object(Bucket=BUCKET, Key=SPECIAL_KEY)["ContentLength"] == 13


def test_list_objects_v2(s3: BaseClient, provider: FakeProvider) -> None:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="hotset/orders/")
    keys = sorted(k for k in provider.files if k.startswith("hotset/orders/"))
    assert [o["Key"] for o in listed["Contents"]] == keys
    blob = next(o for o in listed["Contents"] if o["Key"] == BLOB_KEY)
    head = s3.head_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert (blob["ETag"], blob["Size"]) == (head["ETag"], len(BLOB))
    assert blob["LastModified"] == head["LastModified"]
    # pagination with continuation tokens
    seen: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix="hotset/", PaginationConfig={"PageSize": 2}
    ):
        assert page["KeyCount"] <= 2
        seen += [o["Key"] for o in page.get("Contents", [])]
    assert seen == sorted(k for k in provider.files if k.startswith("hotset/"))
    # delimiter
    top = s3.list_objects_v2(Bucket=BUCKET, Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["hotset/", "merged/"]
    assert "Contents" not in top
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="nothing/")["KeyCount"] == 0
    # special characters: boto3 asks for encoding-type=url itself and decodes the keys...
    special = s3.list_objects_v2(Bucket=BUCKET, Prefix="hotset/orders/data/key ")
    assert [o["Key"] for o in special["Contents"]] == [SPECIAL_KEY]
    # ...but leaves them encoded when the caller asked for it
    special = s3.list_objects_v2(
        Bucket=BUCKET, Prefix="hotset/orders/data/key ", EncodingType="url"
    )
    assert [unquote(o["Key"]) for o in special["Contents"]] == [SPECIAL_KEY]


def test_wrong_secret_and_unsigned_are_denied(isk: RunningService) -> None:
    with pytest.raises(ClientError) as exc:
        client(isk, secret="wrong").get_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert code(exc) == ("SignatureDoesNotMatch", 403)  # S3's code for a wrong secret
    with pytest.raises(ClientError) as exc:
        client(isk, secret="wrong").head_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(f"{isk.s3_url}/{BUCKET}/{BLOB_KEY}", timeout=10)
    assert http.value.code == 403 and b"<Code>AccessDenied</Code>" in http.value.read()


def test_writes_are_denied(s3: BaseClient) -> None:
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=BUCKET, Key="hotset/x", Body=b"x")
    assert code(exc) == ("AccessDenied", 403)
    with pytest.raises(ClientError) as exc:
        s3.delete_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert code(exc) == ("AccessDenied", 403)


def test_presigned_url(isk: RunningService) -> None:
    s3 = client(isk, signature_version="s3v4")  # boto3 presigns with SigV2 unless told
    url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": SPECIAL_KEY})
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == b"special bytes"


def test_provider_unavailable_is_slowdown(s3: BaseClient, outage: FakeProvider) -> None:
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=BUCKET, Key=BLOB_KEY)
    assert code(exc) == ("SlowDown", 503)


def test_pyarrow_s3filesystem(isk: RunningService) -> None:
    host = isk.s3_url.removeprefix("http://")
    s3fs = fs.S3FileSystem(
        endpoint_override=host,
        scheme="http",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region="us-east-1",
        allow_bucket_creation=False,
        allow_bucket_deletion=False,
    )
    info = s3fs.get_file_info(f"{BUCKET}/{BLOB_KEY}")
    assert info.type == fs.FileType.File and info.size == len(BLOB)
    with s3fs.open_input_file(f"{BUCKET}/{BLOB_KEY}") as f:
        f.seek(1000)
        assert f.read(24) == BLOB[1000:1024]
    assert pq.read_table(f"{BUCKET}/{PARQUET_KEY}", filesystem=s3fs).equals(PARQUET_TABLE)
    assert s3fs.get_file_info(f"{BUCKET}/hotset/orders/nope").type == fs.FileType.NotFound
    assert s3fs.get_file_info(f"{BUCKET}/hotset/orders").type == fs.FileType.Directory
    selector = fs.FileSelector(f"{BUCKET}/hotset/orders/data")
    names = {i.path for i in s3fs.get_file_info(selector)}
    assert f"{BUCKET}/{PARQUET_KEY}" in names
    assert f"{BUCKET}/{SPECIAL_KEY}" in names


@pytest.mark.parametrize(
    "raw_key", ["hotset/../../etc/passwd", "hotset/%2E%2E/merged/x", "%2Fetc%2Fpasswd", "a%00b"]
)
def test_raw_escaping_paths_are_denied(isk: RunningService, raw_key: str) -> None:
    """Paths sent exactly as written (no client-side normalisation), correctly signed."""
    host = isk.s3_url.removeprefix("http://")
    status, body = raw_signed_get(host, f"/{BUCKET}/{raw_key}", Credentials(ACCESS_KEY, SECRET_KEY))
    assert status == 403, body
    assert b"<Code>AccessDenied</Code>" in body
    assert b"invalid key" in body, body  # signature was valid; the key was refused


def test_large_bodies_are_streamed_whole_and_ranged(s3: BaseClient, provider: Any) -> None:
    import os

    big = os.urandom(5 * 1024 * 1024 + 17)  # over the 1 MiB slice size, not a multiple of it
    key = "hotset/orders/data/large.bin"
    provider.files[key] = big
    try:
        whole = s3.get_object(Bucket=BUCKET, Key=key)
        assert whole["ContentLength"] == len(big)
        assert whole["Body"].read() == big
        part = s3.get_object(Bucket=BUCKET, Key=key, Range="bytes=1048570-3145740")
        assert part["ContentRange"] == f"bytes 1048570-3145740/{len(big)}"
        assert part["Body"].read() == big[1048570:3145741]
        tail = s3.get_object(Bucket=BUCKET, Key=key, Range="bytes=-1048583")
        assert tail["Body"].read() == big[-1048583:]
    finally:
        del provider.files[key]
