"""S3 requests signed by botocore's own SigV4 signers (with AWS's example key), as the S3 gateway
receives them."""

from __future__ import annotations

from urllib.parse import urlsplit

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from multidict import CIMultiDict

from bergstream.core.sigv4 import EMPTY_SHA256

KEY, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
URL = "http://127.0.0.1:19000/bergstream/hotset/t/data/a%20b%2Bc%25d%3D%C3%BC.bin"


def signed(
    url: str = URL,
    *,
    secret: str = SECRET,
    payload: str | None = EMPTY_SHA256,
    presign: bool = False,
    headers: dict[str, str] | None = None,
) -> tuple[str, str, str, CIMultiDict[str]]:
    """A GET of ``url`` signed by botocore's own signers (in headers, or presigned), as ISK
    receives it: method, raw path, raw query and headers (with ``Host``)."""
    request = AWSRequest(method="GET", url=url, headers=dict(headers or {}))
    if payload is not None:
        request.headers["x-amz-content-sha256"] = payload
    credentials = Credentials(KEY, secret)
    if presign:
        S3SigV4QueryAuth(credentials, "s3", "us-east-1", expires=300).add_auth(request)
    else:
        S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)
    parts = urlsplit(request.url)
    wire = CIMultiDict({"Host": parts.netloc})
    wire.update(request.headers.items())
    return request.method, parts.path, parts.query, wire
