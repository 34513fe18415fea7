"""A small Iceberg REST catalog server for the tests: the REST protocol's table and namespace
routes over PyIceberg's SQL catalog (SQLite, local warehouse), on 127.0.0.1 in a thread.

Enough for Spark (Iceberg's Java RESTCatalog) and PyIceberg to create, load and commit tables.
Iceberg's own REST test server is not published to Maven Central, hence this one.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pydantic import TypeAdapter


class RestError(Exception):
    """An Iceberg REST error response."""

    def __init__(self, status: HTTPStatus, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class RestCatalogServer:
    """The server; ``url`` once started. With ``token``, every request must carry
    ``Authorization: Bearer <token>`` (401 otherwise), as a catalog behind a gateway asks; with
    ``warehouse`` (e.g. ``s3://bucket/prefix``) and its FileIO ``properties`` (``s3.endpoint``,
    keys), tables live there instead of under ``root``."""

    def __init__(
        self,
        root: Path,
        *,
        token: str | None = None,
        warehouse: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        root.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.refused = 0
        self.catalog = SqlCatalog(
            "rest_backend",
            uri=f"sqlite:///{root / 'catalog.db'}",
            warehouse=warehouse or f"file://{root / 'warehouse'}",
            **(properties or {}),
        )
        self.lock = threading.Lock()
        self.commits = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL of the catalog."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Serve in a background thread."""
        self.thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ routes

    def _load_result(self, table: Any) -> dict[str, Any]:
        return {
            "metadata-location": table.metadata_location,
            "metadata": json.loads(table.metadata.model_dump_json()),
            "config": {},
        }

    def _table(self, namespace: str, name: str) -> Any:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table((namespace, name))
        except (NoSuchTableError, NoSuchNamespaceError):
            raise RestError(
                HTTPStatus.NOT_FOUND, "NoSuchTableException", f"no table {namespace}.{name}"
            ) from None

    def _namespace(self, namespace: str) -> dict[str, Any]:
        from pyiceberg.exceptions import NoSuchNamespaceError

        try:
            properties = self.catalog.load_namespace_properties(namespace)
        except NoSuchNamespaceError:
            raise RestError(
                HTTPStatus.NOT_FOUND, "NoSuchNamespaceException", f"no namespace {namespace}"
            ) from None
        return {"namespace": [namespace], "properties": properties}

    def route(self, method: str, parts: list[str], body: Any) -> tuple[int, Any]:
        """Answer one request: (status, JSON body or None)."""
        from pyiceberg.exceptions import CommitFailedException, NamespaceAlreadyExistsError

        match method, parts:
            case "GET", ["v1", "config"]:
                return 200, {"defaults": {}, "overrides": {}}
            case "GET", ["v1", "namespaces"]:
                return 200, {"namespaces": [list(n) for n in self.catalog.list_namespaces()]}
            case "POST", ["v1", "namespaces"]:
                namespace = ".".join(body["namespace"])
                try:
                    self.catalog.create_namespace(namespace, body.get("properties") or {})
                except NamespaceAlreadyExistsError:
                    raise RestError(
                        HTTPStatus.CONFLICT, "AlreadyExistsException", f"{namespace} exists"
                    ) from None
                return 200, {"namespace": body["namespace"], "properties": {}}
            case (("GET" | "HEAD"), ["v1", "namespaces", namespace]):
                found = self._namespace(namespace)
                return (200, found) if method == "GET" else (204, None)
            case "GET", ["v1", "namespaces", namespace, "tables"]:
                names = self.catalog.list_tables(namespace)
                return 200, {
                    "identifiers": [{"namespace": [namespace], "name": n[-1]} for n in names]
                }
            case "POST", ["v1", "namespaces", namespace, "tables"]:
                return 200, self._create(namespace, body)
            case (("GET" | "HEAD"), ["v1", "namespaces", namespace, "tables", name]):
                table = self._table(namespace, name)
                return (200, self._load_result(table)) if method == "GET" else (204, None)
            case "POST", ["v1", "namespaces", namespace, "tables", name]:
                try:
                    return 200, self._commit(namespace, name, body)
                except CommitFailedException as error:
                    raise RestError(
                        HTTPStatus.CONFLICT, "CommitFailedException", str(error)
                    ) from None
            case "DELETE", ["v1", "namespaces", namespace, "tables", name]:
                self._table(namespace, name)
                self.catalog.drop_table((namespace, name))
                return 204, None
            case "POST", ["v1", "namespaces", _, "tables", _, "metrics"]:
                return 204, None
        raise RestError(HTTPStatus.NOT_FOUND, "NotFoundException", f"no route {method} {parts}")

    def _create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        from pyiceberg.partitioning import PartitionSpec
        from pyiceberg.schema import Schema
        from pyiceberg.table.sorting import SortOrder

        kwargs: dict[str, Any] = {
            "schema": Schema.model_validate(body["schema"]),
            "properties": body.get("properties") or {},
        }
        if body.get("location"):
            kwargs["location"] = body["location"]
        if body.get("partition-spec"):
            kwargs["partition_spec"] = PartitionSpec.model_validate(body["partition-spec"])
        if body.get("write-order"):
            kwargs["sort_order"] = SortOrder.model_validate(body["write-order"])
        table = self.catalog.create_table((namespace, body["name"]), **kwargs)
        return self._load_result(table)

    def _commit(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        from pyiceberg.table import TableRequirement, TableUpdate

        requirements = TypeAdapter(list[TableRequirement]).validate_python(
            body.get("requirements") or []
        )
        updates = TypeAdapter(list[TableUpdate]).validate_python(body.get("updates") or [])
        with self.lock:
            table = self._table(namespace, name)
            response = self.catalog.commit_table(table, tuple(requirements), tuple(updates))
            self.commits += 1
        return {
            "metadata-location": response.metadata_location,
            "metadata": json.loads(response.metadata.model_dump_json()),
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = [unquote(p) for p in urlparse(self.path).path.split("/") if p]
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                try:
                    if server.token is not None and (
                        self.headers.get("Authorization") != f"Bearer {server.token}"
                    ):
                        server.refused += 1
                        raise RestError(
                            HTTPStatus.UNAUTHORIZED, "NotAuthorizedException", "bearer token"
                        )
                    status, payload = server.route(self.command, parts, body)
                except RestError as error:
                    status = error.status
                    payload = {
                        "error": {"message": error.message, "type": error.kind, "code": status}
                    }
                except Exception as error:  # surface the cause in the client's exception
                    status = HTTPStatus.INTERNAL_SERVER_ERROR
                    payload = {
                        "error": {"message": repr(error), "type": "ServerError", "code": 500}
                    }
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_HEAD = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
