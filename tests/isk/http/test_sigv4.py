"""SigV4 verification against signatures made by botocore's own signers, AWS's published S3
example and the dev stack's S3 probe."""

from __future__ import annotations

import datetime as dt

import pytest
from multidict import CIMultiDict

from bergstream.core.sigv4 import EMPTY_SHA256
from bergstream.plugins.isk_gateway.http.sigv4 import SigV4Error, verify_sigv4
from tests.kits.sigv4 import KEY, SECRET, signed


def check(method: str, path: str, query: str, headers: CIMultiDict[str], **kw: object) -> None:
    verify_sigv4(
        method=method,
        raw_path=path,
        raw_query=query,
        headers=headers,
        access_key=KEY,
        secret_key=SECRET,
        **kw,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", [EMPTY_SHA256, "UNSIGNED-PAYLOAD"])
def test_header_signature_verifies(payload: str) -> None:
    check(*signed(payload=payload))


def test_query_string_is_canonicalised() -> None:
    url = "http://127.0.0.1:19000/bergstream?list-type=2&prefix=hotset%2Fa%20b&max-keys=5"
    check(*signed(url))


def test_presigned_url_verifies_and_expires() -> None:
    method, path, query, headers = signed(presign=True, payload=None)
    assert "X-Amz-Signature" in query
    check(method, path, query, headers)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)
    with pytest.raises(SigV4Error):
        check(method, path, query, headers, now=later)


def test_tampering_fails() -> None:
    method, path, query, headers = signed()
    with pytest.raises(SigV4Error):
        check(method, path.replace("a%20b", "a%20c"), query, headers)
    with pytest.raises(SigV4Error):
        check("HEAD", path, query, headers)
    with pytest.raises(SigV4Error):
        check(method, path, "x=1", headers)
    with pytest.raises(SigV4Error):
        check(*signed(secret="wrong"))
    forged = headers.copy()
    forged["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    with pytest.raises(SigV4Error):
        check(method, path, query, forged)
    with pytest.raises(SigV4Error):
        verify_sigv4(
            method=method,
            raw_path=path,
            raw_query=query,
            headers=headers,
            access_key="OTHER",
            secret_key=SECRET,
        )


def test_unsigned_and_foreign_schemes_fail() -> None:
    with pytest.raises(SigV4Error):
        check("GET", "/bergstream/x", "", CIMultiDict({"Host": "h"}))
    with pytest.raises(SigV4Error):
        check("GET", "/bergstream/x", "", CIMultiDict({"Host": "h", "Authorization": "AWS k:s"}))


def test_clock_skew_limit() -> None:
    method, path, query, headers = signed()
    check(method, path, query, headers, now=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=14))
    with pytest.raises(SigV4Error):
        check(method, path, query, headers, now=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=16))


def test_the_aws_s3_get_object_example_verifies() -> None:
    """The GET Object example of AWS's S3 SigV4 documentation (header form, empty payload)."""
    headers = CIMultiDict(
        {
            "Host": "examplebucket.s3.amazonaws.com",
            "Range": "bytes=0-9",
            "x-amz-content-sha256": EMPTY_SHA256,
            "x-amz-date": "20130524T000000Z",
            "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/"
            "us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;"
            "x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
        }
    )
    arguments = {
        "method": "GET",
        "raw_path": "/test.txt",
        "raw_query": "",
        "access_key": "AKIAIOSFODNN7EXAMPLE",
        "secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "now": dt.datetime(2013, 5, 24, 0, 5, tzinfo=dt.UTC),
    }
    verify_sigv4(headers=headers, **arguments)  # type: ignore[arg-type]
    headers["Range"] = "bytes=0-10"
    with pytest.raises(SigV4Error, match="signature does not match"):
        verify_sigv4(headers=headers, **arguments)  # type: ignore[arg-type]


def test_the_dev_stack_probe_signature_verifies() -> None:
    """The dev stack signs its S3 readiness probe with the same primitives ISK checks with."""
    from bergstream.devstack.stack.env import S3_REGION
    from bergstream.devstack.stack.s3_server import _sigv4_headers

    assert S3_REGION == "us-east-1"
    headers = CIMultiDict(_sigv4_headers("127.0.0.1:8333", KEY, SECRET))
    check("GET", "/", "", headers)
    with pytest.raises(SigV4Error, match="signature does not match"):
        verify_sigv4(
            method="GET",
            raw_path="/",
            raw_query="",
            headers=headers,
            access_key=KEY,
            secret_key=SECRET + "x",
        )
