"""An API gateway in front of a REST catalog, for the tests of catalogs that want a token: every
request must carry ``Authorization: Bearer <token>`` (else 401 with an Iceberg error body); the
others go to the upstream catalog (Iceberg's own REST server, the stack's ``rest-catalog``) and
its answers come back unchanged. It counts what it refused and the commits it passed on."""

from __future__ import annotations

import http.client
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

# Hop-by-hop headers a proxy must not pass on (RFC 9110 7.6.1), and Host (set per connection).
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
}
#: A table commit: POST /v1/{prefix}/namespaces/{namespace}/tables/{table}.
_COMMIT = re.compile(r"^/v1/(?:[^/]+/)?namespaces/[^/]+/tables/[^/]+$")


class TokenGateway:
    """The gateway on 127.0.0.1 (``url`` once started) in front of ``upstream``."""

    def __init__(self, upstream: str, token: str) -> None:
        parsed = urlparse(upstream)
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"upstream {upstream!r} needs a host and a port")
        self.upstream = (parsed.hostname, parsed.port)
        self.token = token
        self.refused = 0
        self.commits = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def start(self) -> None:
        """Listen on a free port, serving in a daemon thread."""
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.headers.get("Authorization") != f"Bearer {gateway.token}":
                    with gateway._lock:
                        gateway.refused += 1
                    error = {
                        "error": {
                            "message": "this catalog wants a bearer token",
                            "type": "NotAuthorizedException",
                            "code": 401,
                        }
                    }
                    self._answer(401, [("Content-Type", "application/json")], json.dumps(error))
                    return
                if self.command == "POST" and _COMMIT.match(urlparse(self.path).path):
                    with gateway._lock:
                        gateway.commits += 1
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                connection = http.client.HTTPConnection(*gateway.upstream, timeout=120)
                try:
                    connection.request(self.command, self.path, body=body, headers=headers)
                    answer = connection.getresponse()
                    data = answer.read()
                    passed = [
                        (k, v)
                        for k, v in answer.getheaders()
                        if k.lower() not in _HOP_HEADERS and k.lower() != "content-length"
                    ]
                finally:
                    connection.close()
                self._answer(answer.status, passed, data)

            def _answer(
                self, status: int, headers: list[tuple[str, str]], data: str | bytes
            ) -> None:
                raw = data.encode() if isinstance(data, str) else data
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(raw)

            do_GET = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
