"""AWS Signature Version 4 verification for the S3 gateway (header and presigned-query forms).

The canonical request is rebuilt from what arrived on the wire: the path exactly as sent (S3 keys
arrive percent-encoded and S3 signers do not normalise or double-encode them), the query
re-encoded per the SigV4 rules, the signed headers, and the payload hash the client declared
(``x-amz-content-sha256``; presigned URLs use ``UNSIGNED-PAYLOAD``). The gateway is read-only,
so no request body is ever consumed and the declared hash is taken as signed. The signing steps
themselves (canonical request, string to sign, key derivation) are core's ``sigv4`` primitives.
"""

from __future__ import annotations

import datetime as dt
import hmac
import re
from collections.abc import Mapping
from urllib.parse import quote, unquote

from bergstream.core.api import sigv4

__all__ = ["MAX_CLOCK_SKEW", "SigV4Error", "verify_sigv4"]

MAX_CLOCK_SKEW = dt.timedelta(minutes=15)
MAX_PRESIGN_EXPIRES = 7 * 24 * 3600

_AUTH_PARAM = re.compile(r"(\w+)=([^,]*)")


class SigV4Error(Exception):
    """The request is not signed, or not signed with the configured key; ``code`` is the S3
    error code S3 answers it with (``AccessDenied``, ``SignatureDoesNotMatch``,
    ``InvalidAccessKeyId``, ``RequestTimeTooSkewed``)."""

    def __init__(self, message: str, code: str = "AccessDenied") -> None:
        super().__init__(message)
        self.code = code


def verify_sigv4(
    *,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    access_key: str | None = None,
    secret_key: str | None = None,
    keys: Mapping[str, str] | None = None,
    now: dt.datetime | None = None,
) -> str:
    """The access key id of the request; :class:`SigV4Error` unless it carries a valid SigV4
    signature made with that key's secret.

    The accepted keys are ``keys`` (access key id -> secret key) when given, else the one pair
    ``access_key`` / ``secret_key``. ``raw_path`` and ``raw_query`` are as received (still
    percent-encoded); ``headers`` is case-insensitive (aiohttp's ``CIMultiDictProxy``) or has
    lower-case keys.
    """
    now = now or dt.datetime.now(dt.UTC)
    params = _parse_query(raw_query)
    authorization = _header(headers, "authorization")
    if authorization is not None:
        credential, signed_headers, signature, amz_date = _from_header(authorization, headers)
        payload_hash = _header(headers, "x-amz-content-sha256") or sigv4.EMPTY_SHA256
        expires = None
    else:
        query = dict(params)
        if query.get("X-Amz-Algorithm") != sigv4.ALGORITHM:
            raise SigV4Error("missing or unsupported signature")
        try:
            credential = query["X-Amz-Credential"]
            signed_headers = query["X-Amz-SignedHeaders"]
            signature = query["X-Amz-Signature"]
            amz_date = query["X-Amz-Date"]
            expires = int(query.get("X-Amz-Expires", "900"))
        except (KeyError, ValueError) as exc:
            raise SigV4Error("incomplete presigned query") from exc
        params = [(k, v) for k, v in params if k != "X-Amz-Signature"]
        payload_hash = _header(headers, "x-amz-content-sha256") or sigv4.UNSIGNED_PAYLOAD

    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or parts[3] != "s3":
        raise SigV4Error("malformed credential scope")
    key_id, date_stamp, region, service, _ = parts
    secret_key = _secret_of(key_id, access_key, secret_key, keys)
    try:
        signed_at = dt.datetime.strptime(amz_date, sigv4.AMZ_DATE_FORMAT).replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise SigV4Error("malformed X-Amz-Date") from exc
    if amz_date[:8] != date_stamp:
        raise SigV4Error("credential date does not match X-Amz-Date")
    if expires is None:
        if abs(now - signed_at) > MAX_CLOCK_SKEW:
            raise SigV4Error("request time too skewed", "RequestTimeTooSkewed")
    else:
        if not 0 < expires <= MAX_PRESIGN_EXPIRES:
            raise SigV4Error("bad X-Amz-Expires")
        if now < signed_at - MAX_CLOCK_SKEW or now > signed_at + dt.timedelta(seconds=expires):
            raise SigV4Error("presigned URL expired or not yet valid")

    names = signed_headers.split(";")
    if "host" not in names:
        raise SigV4Error("host is not signed")
    signed: list[tuple[str, str]] = []
    for name in names:
        value = _header(headers, name)
        if value is None:
            raise SigV4Error(f"signed header {name} missing")
        signed.append((name, value))
    canonical_query = "&".join(
        f"{k}={v}" for k, v in sorted((_encode(k), _encode(v)) for k, v in params)
    )
    canonical = sigv4.canonical_request(method, raw_path, canonical_query, signed, payload_hash)
    to_sign = sigv4.string_to_sign(
        amz_date, sigv4.credential_scope(date_stamp, region, service), canonical
    )
    key = sigv4.signing_key(secret_key, date_stamp, region, service)
    expected = sigv4.signature(key, to_sign)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise SigV4Error("signature does not match", "SignatureDoesNotMatch")
    return key_id


def _secret_of(
    key_id: str,
    access_key: str | None,
    secret_key: str | None,
    keys: Mapping[str, str] | None,
) -> str:
    """The secret of ``key_id`` among the accepted keys; :class:`SigV4Error` if it is unknown."""
    if keys is not None:
        found = keys.get(key_id)
        if found is None:
            raise SigV4Error("unknown access key", "InvalidAccessKeyId")
        return found
    if access_key is None or secret_key is None:
        raise TypeError("verify_sigv4 needs keys, or access_key and secret_key")
    if not hmac.compare_digest(key_id.encode(), access_key.encode()):
        raise SigV4Error("unknown access key", "InvalidAccessKeyId")
    return secret_key


def _from_header(authorization: str, headers: Mapping[str, str]) -> tuple[str, str, str, str]:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != sigv4.ALGORITHM:
        raise SigV4Error("unsupported authorization scheme")
    fields = {k: v.strip() for k, v in _AUTH_PARAM.findall(rest)}
    try:
        credential = fields["Credential"]
        signed_headers = fields["SignedHeaders"]
        signature = fields["Signature"]
    except KeyError as exc:
        raise SigV4Error("malformed Authorization header") from exc
    amz_date = _header(headers, "x-amz-date")
    if amz_date is None:
        raise SigV4Error("missing X-Amz-Date")
    return credential, signed_headers, signature, amz_date


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and name != name.lower():
        value = headers.get(name.lower())
    return value


def _parse_query(raw_query: str) -> list[tuple[str, str]]:
    pairs = []
    for item in raw_query.split("&"):
        if not item:
            continue
        key, _, value = item.partition("=")
        pairs.append((unquote(key), unquote(value)))
    return pairs


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")
