"""core.schema_registry against a small Confluent-style registry served on 127.0.0.1: answers,
caches, error mapping (404 codes, 5xx, 429, timeouts, refused connections), basic auth, TLS with
a CA of its own, thread safety, pickling and the async twins."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import pickle
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from bergstream.core.typed.schema_registry import (
    RegisteredSchema,
    RegistryUnavailable,
    SchemaNotFound,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
    SchemaRegistrySettings,
)

PAYMENT = '{"type":"record","name":"Payment","fields":[{"name":"amount","type":"long"}]}'
PAYMENT_V2 = (
    '{"type":"record","name":"Payment","fields":[{"name":"amount","type":"long"},'
    '{"name":"currency","type":["null","string"],"default":null}]}'
)
MONEY = '{"type":"record","name":"Money","namespace":"com.x","fields":[]}'
JSON_SCHEMA = '{"type":"object"}'


@dataclass
class Registry:
    """What the fake registry holds and how it misbehaves; every request path is recorded."""

    prefix: str = ""
    schemas: dict[int, dict[str, Any]] = field(default_factory=dict)
    subjects: dict[str, dict[int, int]] = field(default_factory=dict)  # subject -> version -> id
    listed_order: dict[str, list[int]] = field(default_factory=dict)
    hidden_versions: set[tuple[str, int]] = field(default_factory=set)  # listed, then 404
    fail_with: list[tuple[int, bytes]] = field(default_factory=list)  # next answers, in order
    delay: float = 0.0
    credentials: tuple[str, str] | None = None
    hits: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, path: str) -> int:
        """How many requests asked for ``path``."""
        return sum(1 for hit in self.hits if hit == self.prefix + path)

    def add(self, subject: str, schema_id: int, body: dict[str, Any]) -> None:
        """Register ``body`` under ``schema_id`` as the next version of ``subject``."""
        self.schemas[schema_id] = body
        versions = self.subjects.setdefault(subject, {})
        versions[max(versions, default=0) + 1] = schema_id


def error(code: int, message: str) -> bytes:
    return json.dumps({"error_code": code, "message": message}).encode()


class Handler(BaseHTTPRequestHandler):
    """Answers like the Confluent API from the server's :class:`Registry`."""

    server: Server

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        reg = self.server.registry
        with reg.lock:
            reg.hits.append(self.path)
            failure = reg.fail_with.pop(0) if reg.fail_with else None
        if reg.delay:
            reg.stop.wait(reg.delay)
        if reg.credentials is not None:
            token = base64.b64encode(":".join(reg.credentials).encode()).decode()
            if self.headers.get("Authorization") != f"Basic {token}":
                return self.answer(401, error(401, "Unauthorized"))
        if failure is not None:
            return self.answer(*failure)
        if not self.path.startswith(reg.prefix + "/"):
            return self.answer(404, b"<html>Not Found</html>", "text/html")
        parts = [urllib.parse.unquote(p) for p in self.path[len(reg.prefix) + 1 :].split("/")]
        if len(parts) == 3 and parts[:2] == ["schemas", "ids"]:
            body = reg.schemas.get(int(parts[2]))
            if body is None:
                return self.answer(404, error(40403, f"Schema {parts[2]} not found"))
            return self.answer(200, json.dumps(body).encode())
        if len(parts) >= 3 and parts[0] == "subjects" and parts[2] == "versions":
            versions = reg.subjects.get(parts[1])
            if versions is None:
                return self.answer(404, error(40401, f"Subject '{parts[1]}' not found."))
            if len(parts) == 3:
                order = reg.listed_order.get(parts[1], sorted(versions))
                return self.answer(200, json.dumps(order).encode())
            version = int(parts[3])
            if version not in versions or (parts[1], version) in reg.hidden_versions:
                return self.answer(404, error(40402, f"Version {version} not found."))
            schema_id = versions[version]
            body = {"subject": parts[1], "version": version, "id": schema_id}
            return self.answer(200, json.dumps({**body, **reg.schemas[schema_id]}).encode())
        return self.answer(404, error(404, "HTTP 404 Not Found"))

    def answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, registry: Registry, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.registry = registry
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that give up (timeouts, refused certificates) are part of the tests


def serve(registry: Registry, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    server = Server(registry, tls)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    scheme = "https" if tls is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}{registry.prefix}"
    finally:
        registry.stop.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def registry() -> Registry:
    reg = Registry(prefix="/apis/ccompat/v7")
    reg.add("pay-value", 1, {"schema": PAYMENT})  # Avro: no schemaType
    reg.add("pay-value", 3, {"schema": PAYMENT_V2, "schemaType": "AVRO"})
    reg.add("money", 2, {"schema": MONEY})
    reg.add(
        "ref-value",
        4,
        {
            "schema": '{"type":"record","name":"R","fields":[{"name":"m","type":"com.x.Money"}]}',
            "references": [{"name": "com.x.Money", "subject": "money", "version": 1}],
        },
    )
    reg.add("doc-value", 5, {"schema": JSON_SCHEMA, "schemaType": "JSON"})
    return reg


@pytest.fixture
def url(registry: Registry) -> Iterator[str]:
    yield from serve(registry)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def client(url: str, clock: Clock | None = None, **settings: Any) -> SchemaRegistryClient:
    made = SchemaRegistryClient(SchemaRegistrySettings(url=url, **settings))
    if clock is not None:
        made = SchemaRegistryClient(made.settings, clock=clock)
    return made


# ------------------------------------------------------------------------------- answers


def test_a_schema_by_id_is_read_once_and_avro_is_the_default_type(
    url: str, registry: Registry
) -> None:
    reg = client(url)
    first = reg.schema_by_id(1)
    assert first == RegisteredSchema(schema_id=1, schema_type="AVRO", schema=PAYMENT)
    assert reg.schema_by_id(1) is first
    assert registry.count("/schemas/ids/1") == 1
    assert reg.schema_by_id(5).schema_type == "JSON"


def test_references_are_parsed(url: str) -> None:
    schema = client(url).schema_by_id(4)
    assert schema.references == (SchemaReference(name="com.x.Money", subject="money", version=1),)


def test_an_unknown_id_is_schema_not_found_naming_the_registry(
    url: str, registry: Registry
) -> None:
    clock = Clock()
    reg = client(url, clock, subject_refresh_seconds=30)
    with pytest.raises(SchemaNotFound, match=r"/schemas/ids/77 answered HTTP 404 \(error 40403"):
        reg.schema_by_id(77)
    # Remembered for the refresh time: records with a garbage id do not hammer the registry ...
    with pytest.raises(SchemaNotFound, match=f"schema id 77 is not in the registry at {url}"):
        reg.schema_by_id(77)
    assert registry.count("/schemas/ids/77") == 1
    # ... then asked again, and a schema registered since is found.
    registry.schemas[77] = {"schema": '"string"'}
    clock.now += 31
    assert reg.schema_by_id(77).schema == '"string"'
    with pytest.raises(SchemaNotFound):
        reg.schema_by_id(-3)  # a framing's id read as a negative int32: never a registered id


def test_a_subject_lists_every_version_ascending(url: str, registry: Registry) -> None:
    registry.listed_order["pay-value"] = [2, 1]
    versions = client(url).subject_schemas("pay-value")
    assert versions == [
        RegisteredSchema(1, "AVRO", PAYMENT, subject="pay-value", version=1),
        RegisteredSchema(3, "AVRO", PAYMENT_V2, subject="pay-value", version=2),
    ]


def test_a_missing_subject_is_empty(url: str) -> None:
    assert client(url).subject_schemas("nope-value") == []


def test_subject_names_are_quoted(url: str, registry: Registry) -> None:
    name = "a/b c?d%-value"
    registry.add(name, 9, {"schema": '"int"'})
    (only,) = client(url).subject_schemas(name)
    assert (only.subject, only.schema_id) == (name, 9)
    assert registry.count("/subjects/a%2Fb%20c%3Fd%25-value/versions") == 1


def test_subjects_are_cached_then_refreshed_reading_only_new_versions(
    url: str, registry: Registry
) -> None:
    clock = Clock()
    reg = client(url, clock, subject_refresh_seconds=30)
    assert len(reg.subject_schemas("pay-value")) == 2
    registry.add("pay-value", 6, {"schema": '"long"'})
    clock.now += 29
    assert len(reg.subject_schemas("pay-value")) == 2  # cached
    assert registry.count("/subjects/pay-value/versions") == 1
    clock.now += 2
    assert [s.version for s in reg.subject_schemas("pay-value")] == [1, 2, 3]
    assert registry.count("/subjects/pay-value/versions") == 2
    assert registry.count("/subjects/pay-value/versions/1") == 1  # known versions not re-read
    assert registry.count("/subjects/pay-value/versions/3") == 1
    # A deleted version: the subject may have been rebuilt, so every version is read again.
    del registry.subjects["pay-value"][1]
    clock.now += 31
    assert [s.version for s in reg.subject_schemas("pay-value")] == [2, 3]
    assert registry.count("/subjects/pay-value/versions/2") == 2


def test_a_refresh_time_of_zero_asks_every_time(url: str, registry: Registry) -> None:
    reg = client(url, subject_refresh_seconds=0)
    reg.subject_schemas("money")
    reg.subject_schemas("money")
    assert registry.count("/subjects/money/versions") == 2


def test_a_version_deleted_while_listing_is_left_out(url: str, registry: Registry) -> None:
    registry.hidden_versions.add(("pay-value", 1))
    assert [s.version for s in client(url).subject_schemas("pay-value")] == [2]


def test_versions_read_from_a_subject_fill_the_id_cache(url: str, registry: Registry) -> None:
    reg = client(url)
    reg.subject_schemas("pay-value")
    assert reg.schema_by_id(3) == RegisteredSchema(3, "AVRO", PAYMENT_V2)  # no subject/version
    assert registry.count("/schemas/ids/3") == 0


# --------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_server_errors_and_throttling_are_retriable_and_not_cached(
    url: str, registry: Registry, status: int
) -> None:
    registry.fail_with.append((status, error(50001, "Error in the backend data store")))
    reg = client(url)
    with pytest.raises(RegistryUnavailable, match=f"{url} is unavailable: .*HTTP {status}"):
        reg.schema_by_id(1)
    assert reg.schema_by_id(1).schema == PAYMENT  # the next call asks again
    registry.fail_with.append((status, b"busy"))
    with pytest.raises(RegistryUnavailable, match="busy"):
        reg.subject_schemas("money")
    assert len(reg.subject_schemas("money")) == 1


def test_a_404_without_a_registry_code_is_a_wrong_url_not_a_missing_schema(url: str) -> None:
    wrong = url.removesuffix("/apis/ccompat/v7")
    with pytest.raises(SchemaRegistryError, match="/apis/ccompat/v7") as raised:
        client(wrong).schema_by_id(1)
    assert type(raised.value) is SchemaRegistryError
    with pytest.raises(SchemaRegistryError, match="not the base of a Confluent-compatible API"):
        client(wrong).subject_schemas("pay-value")


def test_an_answer_that_is_not_json_is_an_error(url: str, registry: Registry) -> None:
    registry.fail_with.append((200, b"<html>hello</html>"))
    with pytest.raises(SchemaRegistryError, match="'<html>hello</html>', not JSON"):
        client(url).schema_by_id(1)
    registry.fail_with.append((200, b'{"subject": "x"}'))
    with pytest.raises(SchemaRegistryError, match="not a list of version numbers"):
        client(url).subject_schemas("pay-value")


def test_a_slow_registry_times_out_as_unavailable(url: str, registry: Registry) -> None:
    registry.delay = 5
    with pytest.raises(RegistryUnavailable, match=r"timed out after 0.2 s.*timeout_seconds"):
        client(url, timeout_seconds=0.2).schema_by_id(1)


def test_a_closed_port_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port any more.
    with pytest.raises(RegistryUnavailable, match=f"127.0.0.1:{port} is unavailable.*refused"):
        client(f"http://127.0.0.1:{port}").schema_by_id(1)


def test_basic_auth(url: str, registry: Registry) -> None:
    registry.credentials = ("alice", "s3cr:et")
    with pytest.raises(SchemaRegistryError, match=r"refused.*HTTP 401.*username and password") as e:
        client(url).schema_by_id(1)
    assert not isinstance(e.value, RegistryUnavailable)
    with pytest.raises(SchemaRegistryError, match="HTTP 401"):
        client(url, username="alice", password="wrong").schema_by_id(1)
    assert client(url, username="alice", password="s3cr:et").schema_by_id(1).schema == PAYMENT
    assert "s3cr" not in repr(SchemaRegistrySettings(url=url, username="a", password="s3cr"))


# ------------------------------------------------------------------------------------ TLS


def _certificates(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA file and a server TLS context whose certificate (for 127.0.0.1) that CA signed."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test registry CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = folder / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = folder / "server.pem"
    chain.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return ca_file, context


def test_tls_with_a_ca_file(tmp_path: Path, registry: Registry) -> None:
    ca_file, context = _certificates(tmp_path)
    served = serve(registry, context)
    url = next(served)
    try:
        assert url.startswith("https://")
        assert client(url, ca_file=ca_file).schema_by_id(1).schema == PAYMENT
        with pytest.raises(SchemaRegistryError, match=r"does not verify.*ca_file") as raised:
            client(url).schema_by_id(1)  # the system CAs do not know this one
        assert not isinstance(raised.value, RegistryUnavailable)
    finally:
        next(served, None)


def test_https_to_a_plain_http_registry_says_tls_failed(url: str) -> None:
    with pytest.raises(SchemaRegistryError, match=r"TLS failed.*scheme and port") as raised:
        client(url.replace("http:", "https:")).schema_by_id(1)
    assert not isinstance(raised.value, RegistryUnavailable)


# ------------------------------------------------------------------------------ settings


def test_settings_are_checked(tmp_path: Path) -> None:
    def refused(**values: Any) -> str:
        with pytest.raises(ValidationError) as raised:
            SchemaRegistrySettings(**values)
        return str(raised.value)

    assert "Field required" in refused()
    assert "not an http(s) URL" in refused(url="127.0.0.1:8081")
    assert "move them to username and password" in refused(url="https://u:p@registry:8081")
    assert "both username and password" in refused(url="http://r:1", username="u")
    assert "both username and password" in refused(url="http://r:1", password="p")
    assert "does not exist" in refused(url="https://r:1", ca_file=tmp_path / "nope.pem")
    (tmp_path / "ca.pem").write_text("x")
    assert "not https" in refused(url="http://r:1", ca_file=tmp_path / "ca.pem")
    assert "greater than 0" in refused(url="http://r:1", timeout_seconds=0)
    assert "Extra inputs" in refused(url="http://r:1", timout_seconds=1)
    settings = SchemaRegistrySettings(url="http://r:8081/apis/ccompat/v7/")
    assert settings.url == "http://r:8081/apis/ccompat/v7"
    assert (settings.timeout_seconds, settings.subject_refresh_seconds) == (10, 30)
    # Empty values (a ${VAR:-} whose variable is unset) are unset.
    blank = SchemaRegistrySettings(url="http://r:1", username="", password="", ca_file="")
    assert (blank.username, blank.password, blank.ca_file) == (None, None, None)


# ----------------------------------------------------------- threads, pickling and asyncio


def test_concurrent_callers_share_one_request(url: str, registry: Registry) -> None:
    registry.delay = 0.2
    reg = client(url)
    results: list[Any] = []

    def ask() -> None:
        results.append((reg.schema_by_id(1), len(reg.subject_schemas("pay-value"))))

    threads = [threading.Thread(target=ask) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 12 and len({id(r[0]) for r in results}) == 1
    assert {r[1] for r in results} == {2}
    assert registry.count("/schemas/ids/1") == 1
    assert registry.count("/subjects/pay-value/versions") == 1


def test_a_pickled_client_starts_with_empty_caches(url: str, registry: Registry) -> None:
    reg = client(url, username="u", password="p")
    registry.credentials = ("u", "p")
    reg.schema_by_id(1)
    copy = pickle.loads(pickle.dumps(reg))
    assert copy.settings == reg.settings
    assert copy.schema_by_id(1) == reg.schema_by_id(1)
    assert registry.count("/schemas/ids/1") == 2  # the copy asked again
    assert copy.subject_schemas("money")[0].schema_id == 2


def test_async_twins(url: str, registry: Registry) -> None:
    reg = client(url)

    async def main() -> tuple[list[RegisteredSchema], list[list[RegisteredSchema]]]:
        by_id = await asyncio.gather(*(reg.aschema_by_id(i) for i in (1, 2, 1)))
        subjects = await asyncio.gather(
            reg.asubject_schemas("pay-value"), reg.asubject_schemas("x")
        )
        return list(by_id), list(subjects)

    by_id, (pay, missing) = asyncio.run(main())
    assert [s.schema_id for s in by_id] == [1, 2, 1]
    assert [s.version for s in pay] == [1, 2] and missing == []
    assert registry.count("/schemas/ids/1") == 1

    async def fails() -> None:
        await reg.aschema_by_id(404)

    async def loop_stays_free() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        before = ticks
        await reg.aschema_by_id(5)  # not cached: the request runs in a thread
        ticker.cancel()
        return ticks - before

    registry.delay = 0.3
    assert asyncio.run(loop_stays_free()) > 1

    with pytest.raises(SchemaNotFound):
        asyncio.run(fails())
