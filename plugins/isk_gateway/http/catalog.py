"""The Iceberg REST catalog (read-only) over a :class:`TableProvider`.

Routes, under ``/v1/`` and, when a prefix is configured, ``/v1/{prefix}/``: ``GET /v1/config``,
namespaces GET/HEAD, table listing, table GET/HEAD (``If-None-Match`` -> 304), ``credentials``,
``metrics`` (-> 204), an empty view listing (no view exists) and, when OAuth client credentials
are configured, ``POST /v1/oauth/tokens`` (then a bearer token is required everywhere else).
Lists page as the spec says (``pageSize``, ``pageToken``, ``next-page-token``). Every write is
refused with 403 and an ``IcebergErrorResponse``; a method the REST API does not have answers 405.
How the answers compare with Iceberg's own REST catalog server: ``docs/reference-servers.md``.

With principals (:mod:`.principals`), every request but the token endpoint runs as one: a bearer
token issued for its OAuth client, or HTTP Basic credentials; none or wrong ones answer 401. It
lists, loads and vends credentials only for the tables whose topic Kafka lets the principal
DESCRIBE and READ; any other table answers 404 ``NoSuchTableException``, as if it did not exist
(clients treat it as absent: PyIceberg's ``table_exists`` is False, ``load_table`` raises
``NoSuchTableError``; a 403 would tell that the topic exists, and make ``table_exists`` raise).

LoadTable and ``credentials`` vend temporary S3 credentials (:mod:`.credentials`): an access
key id, a secret and an ``s3.session-token``, valid for that table's files only, until
``credentials_ttl_seconds`` from now, and for the principal they were vended to. They are in the
response's ``config`` (Trino uses vended credentials only when all three keys are there) and in
its ``storage-credentials``, prefixed with the table's location. The configured key pair is only
their root and is never vended.

Paths are parsed by hand so that every answer, including unknown routes, has the error type
clients expect (``NoSuchTableException`` for anything under ``/tables/{t}``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

from aiohttp import web

from bergstream.plugins.isk_gateway.http.credentials import CredentialKeys
from bergstream.plugins.isk_gateway.http.logfields import client_fields
from bergstream.plugins.isk_gateway.http.principals import (
    Principal,
    PrincipalDirectory,
    PrincipalRefused,
)
from bergstream.plugins.isk_gateway.tables.paths import key_from_uri
from bergstream.plugins.isk_gateway.tables.provider import (
    LoadedTable,
    NoSuchFile,
    NoSuchNamespace,
    NoSuchTable,
    ProviderUnavailable,
    TableNotServable,
    TableProvider,
)

__all__ = ["ENDPOINTS", "CatalogSettings", "RestCatalogApp"]

#: The HTTP methods of the Iceberg REST API; any other answers 405.
_METHODS = ("GET", "HEAD", "POST", "DELETE")

log = logging.getLogger(__name__)

ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
]
_ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
_TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


@dataclass(frozen=True)
class CatalogSettings:
    """What the catalog needs beyond the provider (built by the service from its config)."""

    bucket: str
    s3_endpoint: str
    access_key: str
    secret_key: str
    region: str
    prefix: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    token_ttl_seconds: int = 3600
    #: Lifetime of the temporary S3 credentials LoadTable vends.
    credentials_ttl_seconds: int = 3600
    #: With principals: who may use the catalog, and what each may see.
    principals: PrincipalDirectory | None = None


class _Error(Exception):
    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message


class RestCatalogApp:
    """aiohttp application serving the Iceberg REST catalog API."""

    def __init__(self, provider: TableProvider, settings: CatalogSettings) -> None:
        self.provider = provider
        self.settings = settings
        self.principals = settings.principals
        self.credentials = CredentialKeys(settings.access_key, settings.secret_key)
        self.auth = self.principals is not None or (
            settings.client_id is not None and settings.client_secret is not None
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    # -- dispatch ---------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        head = request.method == "HEAD"
        segments = [unquote(s) for s in request.rel_url.raw_path.strip("/").split("/")]
        try:
            if request.method not in _METHODS:
                raise _Error(
                    405,
                    "MethodNotAllowedException",
                    f"{request.method} is not an Iceberg REST method",
                )
            if segments[:1] != ["v1"]:
                raise _Error(404, "NotFoundException", "No route for this path")
            rest = segments[1:]
            if rest == ["oauth", "tokens"]:
                return await self._tokens(request)
            principal = self._authorize(request)
            if rest == ["config"]:
                _only(request, "GET")
                return self._config()
            prefix = self.settings.prefix
            if prefix is not None and rest[:1] == [prefix] and rest[1:2] == ["namespaces"]:
                rest = rest[1:]
            if rest[:1] != ["namespaces"]:
                if request.method not in ("GET", "HEAD"):
                    raise _Error(403, "ForbiddenException", "This catalog is read-only")
                raise _Error(404, "NotFoundException", "No route for this path")
            return await self._namespaces(request, rest[1:], head, principal)
        except _Error as exc:
            return _error(exc, head)
        except PrincipalRefused as exc:
            log.warning("REST catalog: %s", exc, extra=client_fields(request))
            return _error(_Error(401, "NotAuthorizedException", str(exc)), head)
        except TableNotServable as exc:
            log.warning("REST catalog: %s", exc, extra=client_fields(request))
            return _error(_Error(500, "ServiceFailureException", str(exc)), head)
        except ProviderUnavailable as exc:
            return _error(
                _Error(
                    503,
                    "ServiceUnavailableException",
                    str(exc) or "Service unavailable, retry later",
                ),
                head,
            )
        except Exception:
            log.exception(
                "REST catalog failed on %s %s",
                request.method,
                request.rel_url,
                extra=client_fields(request),
            )
            return _error(_Error(500, "InternalServerError", "Internal server error"), head)

    async def _namespaces(
        self, request: web.Request, rest: list[str], head: bool, principal: Principal | None
    ) -> web.StreamResponse:
        method = request.method
        if not rest:
            _only(request, "GET")
            if request.query.get("parent"):
                return _json({"namespaces": []})
            names = await self.provider.list_namespaces()
            page, token = _page(sorted(names), request.query)
            return _json({"namespaces": [[n] for n in page], **token})
        namespace = rest[0]
        if len(rest) == 1:
            _only(request, "GET", "HEAD")
            await self._check_namespace(namespace)
            if head:
                return web.Response(status=204)
            return _json({"namespace": [namespace], "properties": {}})
        if rest[1] == "views" and method in ("GET", "HEAD"):
            # No views here: an empty list, and no view by any name.
            await self._check_namespace(namespace)
            if len(rest) == 2:
                _only(request, "GET")
                return _json({"identifiers": []})
            view = ".".join(rest[2:])
            raise _Error(404, "NoSuchViewException", f"View does not exist: {namespace}.{view}")
        if rest[1] != "tables":
            if method not in ("GET", "HEAD"):
                raise _Error(403, "ForbiddenException", "This catalog is read-only")
            raise _Error(404, "NotFoundException", "No route for this path")
        if len(rest) == 2:
            _only(request, "GET")
            try:
                tables = await self.provider.list_tables(namespace)
            except NoSuchNamespace as exc:
                raise _no_namespace(namespace) from exc
            if principal is not None:
                readable = await self._readable(principal)
                tables = [t for t in tables if t in readable]
            page, token = _page(sorted(tables), request.query)
            identifiers = [{"namespace": [namespace], "name": t} for t in page]
            return _json({"identifiers": identifiers, **token})
        table = rest[2]
        tail = rest[3:]
        try:
            if principal is not None and table not in await self._readable(principal):
                if method not in ("GET", "HEAD", "POST"):
                    raise _Error(403, "ForbiddenException", "This catalog is read-only")
                # As if absent: whether the topic exists is not the principal's to know.
                raise _Error(
                    404, "NoSuchTableException", f"Table does not exist: {namespace}.{table}"
                )
            if not tail:
                _only(request, "GET", "HEAD")
                return await self._load(request, namespace, table, head, principal)
            if tail == ["credentials"]:
                _only(request, "GET")
                loaded = await self._loaded(namespace, table)
                _config, storage_credentials = self._vend(loaded, principal)
                return _json(
                    {"storage-credentials": storage_credentials},
                    headers={"Cache-Control": "no-store"},
                )
            if tail == ["metrics"]:
                _only(request, "POST")
                await request.read()
                return web.Response(status=204)
            if method not in ("GET", "HEAD"):
                raise _Error(403, "ForbiddenException", "This catalog is read-only")
            raise _Error(404, "NoSuchTableException", f"No such route for table {table}")
        except _Error as exc:
            if exc.status == 404:
                exc.type = "NoSuchTableException"
            raise

    # -- handlers ---------------------------------------------------------------------------

    def _config(self) -> web.Response:
        overrides = {"prefix": self.settings.prefix} if self.settings.prefix else {}
        return _json({"defaults": {}, "overrides": overrides, "endpoints": ENDPOINTS})

    async def _load(
        self,
        request: web.Request,
        namespace: str,
        table: str,
        head: bool,
        principal: Principal | None,
    ) -> web.StreamResponse:
        loaded = await self._loaded(namespace, table)
        etag = _table_etag(loaded.metadata_location)
        if_none_match = request.headers.get("If-None-Match")
        if if_none_match is not None:
            wanted = {c.strip().removeprefix("W/").strip('"') for c in if_none_match.split(",")}
            if etag.strip('"') in wanted or loaded.metadata_location in wanted:
                return web.Response(status=304, headers={"ETag": etag})
        if head:
            return web.Response(status=204, headers={"ETag": etag})
        config, storage_credentials = self._vend(loaded, principal)
        body = {
            "metadata-location": loaded.metadata_location,
            "metadata": loaded.metadata,
            "config": config,
            "storage-credentials": storage_credentials,
        }
        return _json(body, headers={"ETag": etag, "Cache-Control": "no-store"})

    async def _loaded(self, namespace: str, table: str) -> LoadedTable:
        try:
            return await self.provider.load_table(namespace, table)
        except (NoSuchTable, NoSuchNamespace) as exc:
            # The provider's reason (an internal topic, an append topic's current table) tells
            # the user what to do instead.
            raise _Error(
                404, "NoSuchTableException", f"Table does not exist: {namespace}.{table}: {exc}"
            ) from exc

    async def _check_namespace(self, namespace: str) -> None:
        try:
            await self.provider.list_tables(namespace)
        except NoSuchNamespace as exc:
            raise _no_namespace(namespace) from exc

    async def _readable(self, principal: Principal) -> frozenset[str]:
        assert self.principals is not None
        return await self.principals.readable(principal)

    def _vend(
        self, loaded: LoadedTable, principal: Principal | None
    ) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """The S3 config of a LoadTable response (fresh temporary credentials for the table's
        files) and its ``storage-credentials``: the same config, prefixed with the table's
        location."""
        s = self.settings
        location = str(loaded.metadata.get("location", "")).rstrip("/")
        try:
            scope = key_from_uri(s.bucket, location)
        except NoSuchFile as exc:
            raise TableNotServable(
                f"the table's location {location!r} is not in the gateway bucket {s.bucket!r}: "
                "no credentials can be vended for it"
            ) from exc
        vended = self.credentials.issue(
            scope, principal.name if principal is not None else None, s.credentials_ttl_seconds
        )
        config = {
            "s3.endpoint": s.s3_endpoint,
            "s3.path-style-access": "true",
            "s3.access-key-id": vended.access_key,
            "s3.secret-access-key": vended.secret_key,
            "s3.session-token": vended.session_token,
            "s3.session-token-expires-at-ms": str(vended.expires_at * 1000),
            "s3.region": s.region,
            "client.region": s.region,
        }
        return config, [{"prefix": location, "config": dict(config)}]

    # -- OAuth ------------------------------------------------------------------------------

    async def _tokens(self, request: web.Request) -> web.Response:
        if not self.auth:
            raise _Error(404, "NotFoundException", "OAuth is not enabled on this catalog")
        if request.method != "POST":
            raise _Error(405, "MethodNotAllowedException", "Use POST")
        form = dict(parse_qsl((await request.read()).decode("utf-8", "replace")))
        grant = form.get("grant_type", "")
        if self.principals is not None:
            return self._principal_token(request, form, self.principals)
        if grant == _TOKEN_EXCHANGE:
            if not self._token_valid(form.get("subject_token", "")):
                return _oauth_error("invalid_grant", "The subject token is invalid or expired")
        elif grant == "client_credentials":
            try:
                client_id, client_secret = _client_credentials(request, form)
            except ValueError:
                return _oauth_error("invalid_client", "Malformed Basic credentials")
            assert self.settings.client_id is not None and self.settings.client_secret is not None
            if not (
                client_id is not None
                and client_secret is not None
                and hmac.compare_digest(client_id.encode(), self.settings.client_id.encode())
                and hmac.compare_digest(
                    client_secret.encode(), self.settings.client_secret.encode()
                )
            ):
                return _oauth_error("invalid_client", "Unknown client or wrong secret")
        else:
            return _oauth_error("unsupported_grant_type", f"Unsupported grant_type {grant!r}")
        return _json(
            {
                "access_token": self._issue_token(),
                "token_type": "bearer",
                "expires_in": self.settings.token_ttl_seconds,
                "issued_token_type": _ACCESS_TOKEN_TYPE,
            }
        )

    def _principal_token(
        self, request: web.Request, form: dict[str, str], principals: PrincipalDirectory
    ) -> web.Response:
        """``client_credentials`` for a principal's OAuth client, or ``token-exchange`` of a
        valid token (a refresh): a token naming the principal."""
        grant = form.get("grant_type", "")
        principal: Principal | None
        if grant == _TOKEN_EXCHANGE:
            principal = principals.token_principal(form.get("subject_token", ""))
            if principal is None:
                return _oauth_error("invalid_grant", "The subject token is invalid or expired")
        elif grant == "client_credentials":
            try:
                client_id, client_secret = _client_credentials(request, form)
            except ValueError:
                return _oauth_error("invalid_client", "Malformed Basic credentials")
            principal = (
                principals.client(client_id, client_secret)
                if client_id is not None and client_secret is not None
                else None
            )
            if principal is None:
                log.info(
                    "REST catalog: refused client credentials for client %r",
                    client_id,
                    extra=client_fields(request),
                )
                return _oauth_error("invalid_client", "Unknown client or wrong secret")
        else:
            return _oauth_error("unsupported_grant_type", f"Unsupported grant_type {grant!r}")
        return _json(
            {
                "access_token": principals.issue_token(principal),
                "token_type": "bearer",
                "expires_in": principals.token_ttl_seconds,
                "issued_token_type": _ACCESS_TOKEN_TYPE,
            }
        )

    def _issue_token(self) -> str:
        expiry = str(int(time.time()) + self.settings.token_ttl_seconds)
        return f"{expiry}.{self._mac(expiry)}"

    def _mac(self, expiry: str) -> str:
        key = (self.settings.client_secret or "").encode()
        return hmac.new(key, b"bergstream-isk:" + expiry.encode(), hashlib.sha256).hexdigest()

    def _token_valid(self, token: str) -> bool:
        expiry, _, mac = token.partition(".")
        if not expiry.isdigit() or int(expiry) < time.time():
            return False
        return hmac.compare_digest(mac.encode(), self._mac(expiry).encode())

    def _authorize(self, request: web.Request) -> Principal | None:
        """The principal the request runs as (None without principals); 401 when it is not
        authenticated as the catalog requires."""
        try:
            return self.authorize_header(request.headers.get("Authorization", ""))
        except _Error as error:
            if error.message == "Unknown user or wrong password":
                log.info(
                    "REST catalog: refused Basic credentials for user %r",
                    _basic(request.headers.get("Authorization", "").partition(" ")[2])[0],
                    extra=client_fields(request),
                )
            raise

    def authorize_header(self, header: str) -> Principal | None:
        """The principal an ``Authorization`` header names (None without principals, or when
        the catalog needs no authentication); :class:`_Error` 401 when it does not authenticate
        as the catalog requires. The status page asks the same."""
        if not self.auth:
            return None
        scheme, _, token = header.partition(" ")
        if self.principals is None:
            if scheme.lower() != "bearer" or not self._token_valid(token.strip()):
                raise _Error(401, "NotAuthorizedException", "Missing or invalid bearer token")
            return None
        principal: Principal | None = None
        if scheme.lower() == "bearer":
            principal = self.principals.token_principal(token.strip())
            if principal is None:
                raise _Error(
                    401, "NotAuthorizedException", "Invalid or expired bearer token: get a new one"
                )
        elif scheme.lower() == "basic":
            user, password = _basic(token)
            if user is not None and password is not None:
                principal = self.principals.basic(user, password)
            if principal is None:
                raise _Error(401, "NotAuthorizedException", "Unknown user or wrong password")
        else:
            raise _Error(
                401,
                "NotAuthorizedException",
                "Authentication required: a bearer token from POST /v1/oauth/tokens "
                "(client credentials) or HTTP Basic credentials",
            )
        return principal


def _basic(encoded: str) -> tuple[str | None, str | None]:
    """``user, password`` of HTTP Basic credentials; ``None, None`` when malformed."""
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else (None, None)


def _client_credentials(
    request: web.Request, form: dict[str, str]
) -> tuple[str | None, str | None]:
    """The client id and secret of a ``client_credentials`` grant: from HTTP Basic (RFC 6749
    2.3.1, form-encoded parts), else the form (an ``id:secret`` secret split when the id is
    missing); ``ValueError`` for malformed Basic credentials."""
    client_id, client_secret = form.get("client_id"), form.get("client_secret")
    basic = request.headers.get("Authorization", "")
    if basic.lower().startswith("basic "):
        user, password = _basic(basic[6:])
        if user is None or password is None:
            raise ValueError("malformed Basic credentials")
        client_id, client_secret = unquote(user), unquote(password)
    if client_id is None and client_secret and ":" in client_secret:
        client_id, _, client_secret = client_secret.partition(":")
    return client_id, client_secret


def _only(request: web.Request, *methods: str) -> None:
    if request.method in methods:
        return
    if request.method in ("GET", "HEAD"):
        raise _Error(405, "MethodNotAllowedException", f"{request.method} is not supported here")
    raise _Error(403, "ForbiddenException", "This catalog is read-only")


def _page(names: list[str], query: Any) -> tuple[list[str], dict[str, str]]:
    """One page of the sorted ``names`` as the REST spec pages lists: ``pageSize`` bounds it
    (absent: the rest of the list), ``pageToken`` (absent or empty: the start) is the opaque
    token of an earlier page; ``next-page-token`` when more names follow. The token names the
    last name returned, so a page stays right while tables come and go."""
    size_text = query.get("pageSize")
    token_text = query.get("pageToken")
    start = 0
    if token_text:
        try:
            raw = base64.b64decode(token_text.encode("ascii"), altchars=b"-_", validate=True)
            after = raw.decode("utf-8")
        except (ValueError, UnicodeError):
            raise _Error(
                400, "BadRequestException", f"pageToken {token_text!r} is not one this catalog gave"
            ) from None
        start = next((i for i, name in enumerate(names) if name > after), len(names))
    if size_text is None:
        return names[start:], {}
    if not size_text.isdigit() or int(size_text) < 1:
        raise _Error(
            400, "BadRequestException", f"pageSize must be a positive integer, not {size_text!r}"
        )
    end = start + int(size_text)
    if end >= len(names):
        return names[start:], {}
    token = base64.urlsafe_b64encode(names[end - 1].encode("utf-8")).decode("ascii")
    return names[start:end], {"next-page-token": token}


def _no_namespace(namespace: str) -> _Error:
    return _Error(404, "NoSuchNamespaceException", f"Namespace does not exist: {namespace}")


def _table_etag(metadata_location: str) -> str:
    return '"' + hashlib.sha256(metadata_location.encode()).hexdigest()[:32] + '"'


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        headers=headers,
        body=json.dumps(body, separators=(",", ":")).encode(),
        content_type="application/json",
    )


def _error(exc: _Error, head: bool) -> web.Response:
    if head:
        return web.Response(status=exc.status)
    return _json(
        {"error": {"message": exc.message, "type": exc.type, "code": exc.status}},
        status=exc.status,
    )


def _oauth_error(error: str, description: str) -> web.Response:
    status = 400 if error in ("unsupported_grant_type", "invalid_grant") else 401
    return _json({"error": error, "error_description": description}, status=status)
