"""AWS Signature Version 4 primitives, shared by whoever signs S3 requests and whoever checks
them (the dev stack's S3 probe, ISK's S3 gateway).

A signature is computed in four steps, each one function here: the canonical request
(:func:`canonical_request`), the string to sign over it and the credential scope
(:func:`string_to_sign`, :func:`credential_scope`), the signing key derived from the secret key
for one day, region and service (:func:`signing_key`), and the HMAC of the string to sign with
that key (:func:`signature`). Building the canonical query and reading a request's
``Authorization`` header are left to the caller, which knows how its requests arrive.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence

__all__ = [
    "ALGORITHM",
    "AMZ_DATE_FORMAT",
    "EMPTY_SHA256",
    "UNSIGNED_PAYLOAD",
    "canonical_request",
    "credential_scope",
    "signature",
    "signed_headers",
    "signing_key",
    "string_to_sign",
]

#: The signing algorithm named in ``Authorization`` headers and presigned queries.
ALGORITHM = "AWS4-HMAC-SHA256"
#: ``X-Amz-Date``'s format (UTC); its first 8 characters are the scope's date stamp.
AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
#: The payload hash of an empty body.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
#: The payload hash a presigned URL (or a client not hashing its body) declares.
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"

_TERMINATOR = "aws4_request"
_SPACES = re.compile(r"\s+")


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def credential_scope(date_stamp: str, region: str, service: str) -> str:
    """``<yyyymmdd>/<region>/<service>/aws4_request``."""
    return f"{date_stamp}/{region}/{service}/{_TERMINATOR}"


def signed_headers(headers: Sequence[tuple[str, str]]) -> str:
    """``SignedHeaders``: the (lower-case) names of ``headers``, in order, joined by ``;``."""
    return ";".join(name for name, _value in headers)


def canonical_request(
    method: str,
    path: str,
    query: str,
    headers: Sequence[tuple[str, str]],
    payload_hash: str,
) -> str:
    """The canonical request of a request whose ``path`` and ``query`` are already in their
    canonical (encoded) form, signing ``headers`` (lower-case name, value) in the given order:
    each value is trimmed and its inner runs of whitespace become one space."""
    canonical_headers = "".join(
        f"{name}:{_SPACES.sub(' ', value.strip())}\n" for name, value in headers
    )
    return "\n".join(
        [
            method.upper(),
            path or "/",
            query,
            canonical_headers,
            signed_headers(headers),
            payload_hash,
        ]
    )


def string_to_sign(amz_date: str, scope: str, canonical: str) -> str:
    """What is signed: the algorithm, the request time (``X-Amz-Date``), the credential scope
    and the SHA-256 of the canonical request."""
    return "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])


def signing_key(secret_key: str, date_stamp: str, region: str, service: str) -> bytes:
    """The key derived from ``secret_key`` for one day (``yyyymmdd``), region and service."""
    key = _hmac(("AWS4" + secret_key).encode(), date_stamp)
    for part in (region, service, _TERMINATOR):
        key = _hmac(key, part)
    return key


def signature(key: bytes, to_sign: str) -> str:
    """The signature (hex) of ``to_sign`` with a key from :func:`signing_key`."""
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
