"""A SigV4-signed S3 GET sent exactly as written (no client-side path normalisation)."""

from __future__ import annotations

import http.client

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def raw_signed_get(
    host: str, path: str, credentials: Credentials, token_after_signing: str | None = None
) -> tuple[int, bytes]:
    """GET ``path`` from ``host`` signed with ``credentials``; ``token_after_signing`` replaces
    the session token header once the request is signed. The status and the body."""
    request = AWSRequest(method="GET", url=f"http://{host}{path}")
    request.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)
    if token_after_signing is not None:
        request.headers.replace_header("X-Amz-Security-Token", token_after_signing)
    connection = http.client.HTTPConnection(host, timeout=10)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        for name, value in request.headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()
