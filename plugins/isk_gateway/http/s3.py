"""The S3 gateway: one read-only bucket whose objects are the files a :class:`TableProvider` serves.

Path-style (``/{bucket}/{key}``) and virtual-host-style (``Host: {bucket}.{host}``, path
``/{key}``) addressing. Every request must be SigV4-signed, with
the temporary credentials LoadTable vends (:mod:`.credentials`: the session token in
``X-Amz-Security-Token``, header or presigned query) or, without principals, with the configured
root pair itself (the operator's key for engines set up by hand; never vended). A session token
that this service's root did not issue answers 400 ``InvalidToken``, an expired one 400
``ExpiredToken``, a signature not made with the token's own secret 403 ``AccessDenied``. Session
credentials read, and list, only the objects under their table's prefix: any other key answers
403 ``AccessDenied`` under a valid signature. With principals (:mod:`.principals`) the token
names the principal it was vended to (the root pair is refused), and the principal reads only
the objects of tables whose topic Kafka lets it DESCRIBE and READ, checked on every request. The
files themselves are built with the gateway's own Kafka connection, only after those checks:
they are the same bytes for everyone who may read them, and cached so.

Objects: GET/HEAD with single ``Range`` forms (``bytes=a-b``, ``bytes=a-``,
``bytes=-N``), ``If-Match``/``If-None-Match``/``If-Modified-Since``/``If-Unmodified-Since``
(RFC 9110's order); bucket: HEAD, ``?location``, ListObjectsV2. Authentication failures carry
S3's codes (``SignatureDoesNotMatch``, ``InvalidAccessKeyId``, ``RequestTimeTooSkewed``,
``AccessDenied``). How the answers compare with S3 (moto's): ``docs/reference-servers.md``.
ETags derive from key and size (a key encodes everything needed to rebuild its file, so the
same key always has the same bytes); Last-Modified is the gateway's start time, stable per key.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import hashlib
import logging
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote
from xml.sax.saxutils import escape

from aiohttp import web

from bergstream.core.api import sigv4
from bergstream.plugins.isk_gateway.http.credentials import (
    CredentialKeys,
    SessionCredentials,
    TokenExpired,
    TokenInvalid,
)
from bergstream.plugins.isk_gateway.http.logfields import client_fields
from bergstream.plugins.isk_gateway.http.principals import (
    Principal,
    PrincipalDirectory,
    PrincipalRefused,
)
from bergstream.plugins.isk_gateway.http.sigv4 import SigV4Error, verify_sigv4
from bergstream.plugins.isk_gateway.tables.paths import NAMESPACES
from bergstream.plugins.isk_gateway.tables.provider import (
    NoSuchFile,
    ProviderUnavailable,
    TableProvider,
)

__all__ = ["S3Gateway", "object_etag"]

log = logging.getLogger(__name__)

MAX_KEYS = 1000
#: Bodies larger than this are written in slices of this size.
_STREAM_CHUNK = 1 << 20
_XML_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_STATUS = {
    "AccessDenied": 403,
    "SignatureDoesNotMatch": 403,
    "InvalidAccessKeyId": 403,
    "RequestTimeTooSkewed": 403,
    "ExpiredToken": 400,
    "InvalidToken": 400,
    "NoSuchKey": 404,
    "NoSuchBucket": 404,
    "InvalidRange": 416,
    "PreconditionFailed": 412,
    "InvalidArgument": 400,
    "XAmzContentSHA256Mismatch": 400,
    "SlowDown": 503,
    "InternalError": 500,
}


#: S3's message of an authentication error code (followed by what was wrong).
_MESSAGES = {
    "SignatureDoesNotMatch": "The request signature we calculated does not match the signature "
    "you provided",
    "InvalidAccessKeyId": "The AWS access key Id you provided does not exist in our records",
    "RequestTimeTooSkewed": "The difference between the request time and the current time is "
    "too large",
}


class S3Error(Exception):
    """An S3 error response (``code`` as in S3's XML)."""

    def __init__(self, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}


def object_etag(key: str, size: int) -> str:
    """The quoted ETag of ``key``: the same in HEAD, GET and ListObjectsV2."""
    return '"' + hashlib.md5(f"{key}\0{size}".encode(), usedforsecurity=False).hexdigest() + '"'


@dataclass(frozen=True)
class _Caller:
    """Who signed a request: the principal (None without principals) and, for session
    credentials, what they may read (None: the root pair, everything)."""

    principal: Principal | None
    session: SessionCredentials | None


class S3Gateway:
    """aiohttp application serving one bucket from a :class:`TableProvider`."""

    def __init__(
        self,
        provider: TableProvider,
        *,
        bucket: str,
        access_key: str,
        secret_key: str,
        region: str,
        principals: PrincipalDirectory | None = None,
    ) -> None:
        self.provider = provider
        self.principals = principals
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.credentials = CredentialKeys(access_key, secret_key)
        started = dt.datetime.now(dt.UTC).replace(microsecond=0)
        self.last_modified = started
        self.last_modified_http = email.utils.format_datetime(started, usegmt=True)
        self.last_modified_iso = started.strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        head = request.method == "HEAD"
        raw_path, raw_query = _raw_target(request)
        try:
            caller = self._authenticate(request, raw_path, raw_query)
            if request.method not in ("GET", "HEAD"):
                raise S3Error("AccessDenied", "This gateway is read-only")
            _check_payload_hash(request)
            if self._virtual_host(request, raw_path):  # <bucket>.<host>: the path is the key
                bucket, raw_key = self.bucket, raw_path.lstrip("/")
            else:
                bucket, _, raw_key = raw_path.lstrip("/").partition("/")
                bucket = unquote(bucket)
            if not bucket:
                return self._list_buckets()
            if bucket != self.bucket:
                raise S3Error("NoSuchBucket", "The specified bucket does not exist")
            if not raw_key:
                return await self._bucket(raw_query, head, caller)
            key = _checked_key(unquote(raw_key))
            if caller.session is not None and not caller.session.allows(key):
                raise S3Error(
                    "AccessDenied", "Access Denied: the credentials are for another table"
                )
            # With principals, a key that names no readable table is refused (one that names
            # no table at all is no file the gateway serves).
            principal = caller.principal
            if principal is not None and _key_topic(key) not in await self._readable(principal):
                raise S3Error("AccessDenied", "Access Denied")
            return await self._object(request, key, head)
        except S3Error as exc:
            return self._error(exc, raw_path, head)
        except PrincipalRefused as exc:
            log.warning("S3 gateway: %s", exc, extra=client_fields(request))
            return self._error(S3Error("AccessDenied", f"Access Denied: {exc}"), raw_path, head)
        except ProviderUnavailable as exc:
            return self._error(
                S3Error("SlowDown", f"Please reduce your request rate: {exc}"), raw_path, head
            )
        except Exception:
            log.exception(
                "S3 gateway failed on %s %s", request.method, raw_path, extra=client_fields(request)
            )
            return self._error(S3Error("InternalError", "Internal error"), raw_path, head)

    def _virtual_host(self, request: web.Request, raw_path: str) -> bool:
        """Whether ``request`` addresses the bucket virtual-host style (``Host:
        <bucket>.<endpoint host>``, as S3 clients do by default): the host names the bucket and
        the path does not start with it (so a path-style request to a gateway whose own host
        name starts with the bucket's stays path-style)."""
        host = (request.headers.get("Host") or "").lower()
        first = raw_path.lstrip("/").partition("/")[0]
        return host.startswith(f"{self.bucket}.") and unquote(first) != self.bucket

    def _authenticate(self, request: web.Request, raw_path: str, raw_query: str) -> _Caller:
        """Who signed the request; InvalidToken or ExpiredToken for a session token that is
        not this service's or has expired, AccessDenied unless the signature is valid."""
        token = request.headers.get("x-amz-security-token")
        if token is None:
            token = _query_param(raw_query, "X-Amz-Security-Token")
        if token is None:
            if self.principals is not None:
                raise S3Error(
                    "AccessDenied",
                    "Access Denied: sign with the temporary credentials LoadTable vends "
                    "(access key, secret and session token)",
                )
            self._verify(request, raw_path, raw_query, self.access_key, self.secret_key)
            return _Caller(None, None)
        try:
            session = self.credentials.verify(token)
        except TokenExpired as exc:
            raise S3Error(
                "ExpiredToken",
                "The provided token has expired: load the table again, or GET its "
                "credentials, for new ones",
            ) from exc
        except TokenInvalid as exc:
            raise S3Error(
                "InvalidToken", f"The provided token is malformed or otherwise invalid: {exc}"
            ) from exc
        self._verify(request, raw_path, raw_query, session.access_key, session.secret_key)
        if self.principals is None:
            if session.principal is not None:  # issued by an instance configured otherwise
                raise S3Error(
                    "AccessDenied",
                    f"Access Denied: the credentials name principal {session.principal!r}, "
                    "and this gateway has no principals",
                )
            return _Caller(None, session)
        principal = (
            self.principals.by_name(session.principal) if session.principal is not None else None
        )
        if principal is None:
            raise S3Error(
                "AccessDenied", "Access Denied: the credentials name no configured principal"
            )
        return _Caller(principal, session)

    def _verify(
        self,
        request: web.Request,
        raw_path: str,
        raw_query: str,
        access_key: str,
        secret_key: str,
    ) -> None:
        """AccessDenied unless the request is SigV4-signed by ``access_key``'s secret."""
        try:
            verify_sigv4(
                method=request.method,
                raw_path=raw_path,
                raw_query=raw_query,
                headers=request.headers,
                access_key=access_key,
                secret_key=secret_key,
            )
        except SigV4Error as exc:
            raise S3Error(exc.code, f"{_MESSAGES.get(exc.code, 'Access Denied')}: {exc}") from exc

    async def _readable(self, principal: Principal) -> frozenset[str]:
        assert self.principals is not None
        return await self.principals.readable(principal)

    async def _object(self, request: web.Request, key: str, head: bool) -> web.StreamResponse:
        range_header = request.headers.get("Range")
        try:
            if head or range_header is not None:
                size = await self.provider.file_size(key)
                data = b""
            else:
                data = await self.provider.read_file(key)
                size = len(data)
        except NoSuchFile as exc:
            raise S3Error("NoSuchKey", "The specified key does not exist.") from exc
        etag = object_etag(key, size)
        headers = {
            "ETag": etag,
            "Last-Modified": self.last_modified_http,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        # RFC 9110 13.2.2: If-Match, else If-Unmodified-Since; If-None-Match, else
        # If-Modified-Since (a date that does not parse is ignored).
        if_match = request.headers.get("If-Match")
        unmodified_since = _http_date(request.headers.get("If-Unmodified-Since"))
        if (if_match is not None and not _etag_matches(if_match, etag)) or (
            if_match is None
            and unmodified_since is not None
            and self.last_modified > unmodified_since
        ):
            raise S3Error(
                "PreconditionFailed",
                "At least one of the pre-conditions you specified did not hold",
            )
        if_none_match = request.headers.get("If-None-Match")
        modified_since = _http_date(request.headers.get("If-Modified-Since"))
        if (if_none_match is not None and _etag_matches(if_none_match, etag)) or (
            if_none_match is None
            and modified_since is not None
            and self.last_modified <= modified_since
        ):
            return web.Response(status=304, headers=headers)
        status = 200
        start, end = 0, size
        if range_header is not None:
            parsed = _parse_range(range_header, size)
            if parsed is not None:
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        headers["Content-Length"] = str(end - start)
        if head:
            return web.Response(status=status, headers=headers)
        try:
            if status == 206:
                body = await self.provider.read_range(key, start, end)
            elif range_header is not None:  # an ignored Range header: the whole object
                body = await self.provider.read_file(key)
            else:
                body = data
        except NoSuchFile as exc:
            raise S3Error("NoSuchKey", "The specified key does not exist.") from exc
        if len(body) != end - start:
            log.error(
                "S3 gateway: %s has %d bytes, %d expected",
                key,
                len(body),
                end - start,
                extra=client_fields(request),
            )
            raise S3Error("InternalError", "The object changed while it was read")
        if len(body) <= _STREAM_CHUNK:
            return web.Response(status=status, headers=headers, body=body)
        # A large body goes out in slices, each awaited: handed to the transport at once, it
        # would sit in one buffer that is shifted after every socket send (quadratic copying).
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        view = memoryview(body)
        for offset in range(0, len(view), _STREAM_CHUNK):
            await response.write(view[offset : offset + _STREAM_CHUNK])
        await response.write_eof()
        return response

    async def _bucket(self, raw_query: str, head: bool, caller: _Caller) -> web.StreamResponse:
        if head:
            return web.Response(status=200, headers={"x-amz-bucket-region": self.region})
        query = dict(parse_qsl(raw_query, keep_blank_values=True))
        if "location" in query:
            body = (
                f'<LocationConstraint xmlns="{_XML_NS}">{escape(self.region)}</LocationConstraint>'
            )
            return _xml(body)
        return await self._list_objects_v2(query, caller)

    async def _list_objects_v2(self, query: dict[str, str], caller: _Caller) -> web.Response:
        prefix = query.get("prefix", "")
        session = caller.session
        if session is not None and not session.allows_listing(prefix):
            raise S3Error("AccessDenied", "Access Denied: the credentials are for another table")
        delimiter = query.get("delimiter", "")
        try:
            max_keys = min(int(query.get("max-keys", MAX_KEYS)), MAX_KEYS)
        except ValueError as exc:
            raise S3Error("InvalidArgument", "max-keys must be an integer") from exc
        if max_keys < 0:
            raise S3Error("InvalidArgument", "max-keys must not be negative")
        token = query.get("continuation-token")
        after = query.get("start-after", "")
        if token:
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except ValueError as exc:
                raise S3Error("InvalidArgument", "The continuation token is invalid") from exc

        contents: list[tuple[str, int]] = []
        prefixes: list[str] = []
        truncated = False
        last = ""
        limit = max(2 * max_keys, 64)
        principal = caller.principal
        readable = await self._readable(principal) if principal is not None else None
        # A listing under a prefix of the scope lists the scope: nothing outside it shows.
        listed = prefix
        if session is not None and not session.allows(prefix):
            listed = session.scope + "/"
        while True:
            keys = await self.provider.list_keys(listed, limit)
            visible = [
                k
                for k in keys
                if (session is None or session.allows(k[0]))
                and (readable is None or _key_topic(k[0]) in readable)
            ]
            contents, prefixes, truncated, last = _page(visible, prefix, delimiter, after, max_keys)
            if truncated or len(keys) < limit:
                break
            limit *= 4

        url = query.get("encoding-type") == "url"

        def out(text: str) -> str:
            return escape(quote(text, safe="/~") if url else text)

        items = []
        for key, size in contents:
            items.append(
                f"<Contents><Key>{out(key)}</Key>"
                f"<LastModified>{self.last_modified_iso}</LastModified>"
                f"<ETag>{escape(object_etag(key, size))}</ETag><Size>{size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        items.extend(
            f"<CommonPrefixes><Prefix>{out(p)}</Prefix></CommonPrefixes>" for p in prefixes
        )
        extra = "<EncodingType>url</EncodingType>" if url else ""
        if token:
            extra += f"<ContinuationToken>{escape(token)}</ContinuationToken>"
        if "start-after" in query:
            extra += f"<StartAfter>{out(query['start-after'])}</StartAfter>"
        if delimiter:
            extra += f"<Delimiter>{out(delimiter)}</Delimiter>"
        if truncated:
            next_token = base64.urlsafe_b64encode(last.encode()).decode()
            extra += f"<NextContinuationToken>{next_token}</NextContinuationToken>"
        body = (
            f'<ListBucketResult xmlns="{_XML_NS}"><Name>{escape(self.bucket)}</Name>'
            f"<Prefix>{out(prefix)}</Prefix>{extra}"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount>"
            f"<MaxKeys>{max_keys}</MaxKeys>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
            + "".join(items)
            + "</ListBucketResult>"
        )
        return _xml(body)

    def _list_buckets(self) -> web.Response:
        body = (
            f'<ListAllMyBucketsResult xmlns="{_XML_NS}">'
            "<Owner><ID>bergstream</ID><DisplayName>bergstream</DisplayName></Owner>"
            f"<Buckets><Bucket><Name>{escape(self.bucket)}</Name>"
            f"<CreationDate>{self.last_modified_iso}</CreationDate></Bucket></Buckets>"
            "</ListAllMyBucketsResult>"
        )
        return _xml(body)

    def _error(self, exc: S3Error, resource: str, head: bool) -> web.Response:
        status = _STATUS.get(exc.code, 400)
        headers = dict(exc.headers)
        if head:
            return web.Response(status=status, headers={**headers, "Content-Length": "0"})
        body = (
            f"<Error><Code>{exc.code}</Code><Message>{escape(exc.message)}</Message>"
            f"<Resource>{escape(resource)}</Resource><RequestId>0</RequestId></Error>"
        )
        return _xml(body, status=status, headers=headers)


def _raw_target(request: web.Request) -> tuple[str, str]:
    """Path and query exactly as sent on the request line (what the client signed)."""
    target = request.raw_path
    if not target.startswith("/"):  # absolute-form target
        return request.rel_url.raw_path, request.rel_url.raw_query_string
    path, _, query = target.partition("?")
    return path, query


def _query_param(raw_query: str, name: str) -> str | None:
    """The (decoded) value of query parameter ``name``; None if absent."""
    for item in raw_query.split("&"):
        key, _, value = item.partition("=")
        if unquote(key) == name:
            return unquote(value)
    return None


def _page(
    keys: list[tuple[str, int]], prefix: str, delimiter: str, after: str, max_keys: int
) -> tuple[list[tuple[str, int]], list[str], bool, str]:
    """One ListObjectsV2 page: (contents, common prefixes, truncated, last entry returned)."""
    contents: list[tuple[str, int]] = []
    prefixes: list[str] = []
    count = 0
    last = ""
    for key, size in keys:
        if not key.startswith(prefix):
            continue
        entry = key
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            if cut >= 0:
                entry = key[: cut + len(delimiter)]
        if entry <= after or (prefixes and prefixes[-1] == entry):
            continue
        if count == max_keys:
            return contents, prefixes, True, last
        if entry == key:
            contents.append((key, size))
        else:
            prefixes.append(entry)
        count += 1
        last = entry
    return contents, prefixes, False, last


def _key_topic(key: str) -> str | None:
    """The topic of a key under ``<cluster>/<namespace>/<topic>/``; None for any other key
    (which names no table, so no file either)."""
    parts = key.split("/", 3)
    if len(parts) < 4 or parts[1] not in NAMESPACES or not parts[2]:
        return None
    return unquote(parts[2])


def _checked_key(key: str) -> str:
    """``key`` if it stays inside the bucket; AccessDenied otherwise."""
    if (
        not key
        or key.startswith("/")
        or "\0" in key
        or "\\" in key
        or any(part in ("..", ".") for part in key.split("/"))
    ):
        raise S3Error("AccessDenied", "Access Denied: invalid key")
    return key


def _check_payload_hash(request: web.Request) -> None:
    """A read carries no body: a declared ``x-amz-content-sha256`` other than the empty body's
    hash or ``UNSIGNED-PAYLOAD`` does not match it (S3: 400 ``XAmzContentSHA256Mismatch``)."""
    declared = request.headers.get("x-amz-content-sha256")
    if declared is None or declared in (sigv4.EMPTY_SHA256, sigv4.UNSIGNED_PAYLOAD):
        return
    if declared.startswith("STREAMING-"):
        return  # a chunked upload's marker (SDKs' writes), not a hash of this request's body
    if request.content_length:
        return  # a body we do not read: the read-only refusal came first for writes
    raise S3Error(
        "XAmzContentSHA256Mismatch",
        "The provided 'x-amz-content-sha256' header does not match what was computed.",
    )


def _http_date(value: str | None) -> dt.datetime | None:
    """An HTTP date header's instant (None: absent or not a date)."""
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _etag_matches(header: str, etag: str) -> bool:
    candidates = [c.strip() for c in header.split(",")]
    bare = etag.strip('"')
    return any(c == "*" or c.removeprefix("W/").strip('"') == bare for c in candidates)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end-exclusive) for a single byte range; None to serve the whole object."""
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if not first:
            suffix = int(last)
            if suffix <= 0 or size == 0:
                raise _unsatisfiable(size)
            return max(size - suffix, 0), size
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if last and end <= start:
        return None  # syntactically invalid (last < first): serve the whole object
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(end, size)


def _unsatisfiable(size: int) -> S3Error:
    return S3Error(
        "InvalidRange",
        "The requested range is not satisfiable",
        headers={"Content-Range": f"bytes */{size}"},
    )


def _xml(body: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        headers=headers,
        body=('<?xml version="1.0" encoding="UTF-8"?>\n' + body).encode(),
        content_type="application/xml",
    )
