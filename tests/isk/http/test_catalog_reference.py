"""ISK's REST catalog against Iceberg's own REST catalog server (``iceberg-open-api``, the
reference) holding the same namespaces and tables: each request below goes to both, and their
status codes and error types must be equal, or differ exactly as ``docs/reference-servers.md``
lists (each difference with its reason). Write operations ISK refuses as a read-only catalog
(403 ``ForbiddenException``), never with a 500."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kits.isk_http_fakes import FakeProvider, RunningService

pytestmark = pytest.mark.slow

#: What an answer is compared by: its status, and its error type (None: not an error body).
Answer = tuple[int, str | None]

#: Requests whose answers differ, and how: (ISK's, the reference's). docs/reference-servers.md
#: gives each reason.
DIFFERENCES: dict[tuple[str, str], tuple[Answer, Answer]] = {
    # The spec's HEAD answers are 204; the reference sends 200.
    ("HEAD", "/v1/namespaces/hotset"): ((204, None), (200, None)),
    ("HEAD", "/v1/namespaces/hotset/tables/orders"): ((204, None), (200, None)),
    # pageSize below the spec's minimum of 1, or not a number: the reference ignores the first
    # and fails with a 500 on the second; a token ISK did not give is refused too.
    ("GET", "/v1/namespaces?pageSize=0"): ((400, "BadRequestException"), (200, None)),
    ("GET", "/v1/namespaces?pageSize=x"): (
        (400, "BadRequestException"),
        (500, "NumberFormatException"),
    ),
    ("GET", "/v1/namespaces?pageToken=%25%25"): ((400, "BadRequestException"), (200, None)),
    # The reference (1.10) has no credentials route; ISK vends credentials there.
    ("GET", "/v1/namespaces/hotset/tables/orders/credentials"): (
        (200, None),
        (400, "BadRequestException"),
    ),
    ("GET", "/v1/namespaces/hotset/tables/nope/credentials"): (
        (404, "NoSuchTableException"),
        (400, "BadRequestException"),
    ),
    # A metrics report: the reference's servlet fails on it (HTML 500); ISK takes it (204).
    ("POST", "/v1/namespaces/hotset/tables/orders/metrics"): ((204, None), (500, None)),
    # No such route: the reference says 400, ISK 404 (no such resource).
    ("GET", "/v1/nothing"): ((404, "NotFoundException"), (400, "BadRequestException")),
    ("GET", "/v2/config"): ((404, "NotFoundException"), (400, "BadRequestException")),
    # A method the REST API does not have: ISK answers 405 with the spec's error body; the
    # reference 405 without a body, or Jetty's 501 for a method it does not know.
    ("PUT", "/v1/namespaces"): ((405, "MethodNotAllowedException"), (405, None)),
    ("PATCH", "/v1/namespaces/hotset"): ((405, "MethodNotAllowedException"), (501, None)),
    # Writes: the reference performs them (or checks the table first); ISK is read-only.
    ("POST", "/v1/namespaces"): ((403, "ForbiddenException"), (200, None)),
    ("DELETE", "/v1/namespaces/hotset/tables/nope"): (
        (403, "ForbiddenException"),
        (404, "NoSuchTableException"),
    ),
}

#: (method, path, body) sent to both servers.
REQUESTS: list[tuple[str, str, bytes | None]] = [
    ("GET", "/v1/config", None),
    ("GET", "/v1/namespaces", None),
    ("GET", "/v1/namespaces?pageSize=1&pageToken=", None),
    ("GET", "/v1/namespaces?pageSize=0", None),
    ("GET", "/v1/namespaces?pageSize=x", None),
    ("GET", "/v1/namespaces?pageToken=%25%25", None),
    ("GET", "/v1/namespaces/hotset", None),
    ("HEAD", "/v1/namespaces/hotset", None),
    ("HEAD", "/v1/namespaces/nope", None),
    ("GET", "/v1/namespaces/nope", None),
    ("GET", "/v1/namespaces/nope/tables", None),
    ("GET", "/v1/namespaces/hotset/tables", None),
    ("GET", "/v1/namespaces/hotset/tables?pageSize=1&pageToken=", None),
    ("GET", "/v1/namespaces/hotset/views", None),
    ("HEAD", "/v1/namespaces/hotset/tables/orders", None),
    ("HEAD", "/v1/namespaces/hotset/tables/nope", None),
    ("GET", "/v1/namespaces/hotset/tables/orders?snapshots=all", None),
    ("GET", "/v1/namespaces/hotset/tables/orders?snapshots=refs", None),
    ("GET", "/v1/namespaces/hotset/tables/nope", None),
    ("GET", "/v1/namespaces/nope/tables/orders", None),
    ("GET", "/v1/namespaces/hot%1Fset/tables", None),
    ("GET", "/v1/namespaces/hotset/tables/orders/credentials", None),
    ("GET", "/v1/namespaces/hotset/tables/nope/credentials", None),
    ("POST", "/v1/namespaces/hotset/tables/orders/metrics", b'{"report-type": "scan-report"}'),
    ("PUT", "/v1/namespaces", b"{}"),
    ("PATCH", "/v1/namespaces/hotset", b"{}"),
    ("GET", "/v1/nothing", None),
    ("GET", "/v2/config", None),
    ("POST", "/v1/namespaces", b'{"namespace": ["created"]}'),
    ("DELETE", "/v1/namespaces/hotset/tables/nope", None),
]


def call(base: str, method: str, path: str, body: bytes | None) -> tuple[Answer, Any]:
    """``(status, error type)`` of the answer, and its JSON body (None: none, or not JSON)."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return (status, kind), parsed


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Iceberg's REST catalog server of its own (a local warehouse), holding ISK's namespaces
    and the hotset tables the fake provider serves."""
    import pyarrow as pa
    from pyiceberg.catalog.rest import RestCatalog

    from bergstream.devstack.stack.kafka_broker import find_java
    from bergstream.devstack.stack.rest_catalog import running_rest_catalog

    work: Path = tmp_path_factory.mktemp("reference")
    properties = {"uri": f"jdbc:sqlite:{work}/catalog.db", "warehouse": f"file://{work}/wh"}
    with running_rest_catalog(find_java(), properties, work) as url:
        catalog = RestCatalog("reference", uri=url)
        for namespace in ("coldset", "hotset", "merged"):
            catalog.create_namespace(namespace)
        for table in ("orders", "payments"):
            catalog.create_table(f"hotset.{table}", schema=pa.schema([("a", pa.int64())]))
        yield url


@pytest.fixture(scope="module")
def isk() -> Iterator[RunningService]:
    running = RunningService(FakeProvider())
    yield running
    running.close()


@pytest.mark.parametrize(
    ("method", "path", "body"), REQUESTS, ids=[f"{m} {p}" for m, p, _ in REQUESTS]
)
def test_isk_answers_as_the_reference(
    reference: str, isk: RunningService, method: str, path: str, body: bytes | None
) -> None:
    ours, our_body = call(isk.catalog_url, method, path, body)
    theirs, their_body = call(reference, method, path, body)
    expected = DIFFERENCES.get((method, path))
    if expected is None:
        assert ours == theirs, (ours, theirs)
    else:
        assert (ours, theirs) == expected
    assert ours[0] != 500, our_body
    if ours[0] >= 400 and method != "HEAD":
        # the spec's error body: message, type and code (the reference adds its stack)
        assert set(our_body["error"]) == {"message", "type", "code"}, our_body
        assert our_body["error"]["code"] == ours[0]
        if theirs[1] is not None:
            assert set(their_body["error"]) >= {"message", "type", "code"}
    if ours == theirs and ours[0] == 200 and isinstance(our_body, dict):
        # the same fields, ISK's LoadTable adding its vended config and credentials
        extra = set(our_body) - set(their_body)
        assert extra <= {"config", "storage-credentials"}, extra
        assert set(their_body) - set(our_body) <= {"next-page-token"}


def test_paging_lists_the_same_names(reference: str, isk: RunningService) -> None:
    """Both servers, paged one name at a time from an empty token, give the same names (the
    reference lists in creation order, ISK sorted; the reference also holds the namespace the
    write request above created)."""

    def names(base: str, path: str, key: str) -> list[Any]:
        found, token = [], ""
        while True:
            _, body = call(base, "GET", f"{path}?pageSize=1&pageToken={token}", None)
            found += body[key]
            token = body.get("next-page-token")
            if not token:
                return found

    for path, key in (
        ("/v1/namespaces", "namespaces"),
        ("/v1/namespaces/hotset/tables", "identifiers"),
    ):
        ours = names(isk.catalog_url, path, key)
        theirs = [name for name in names(reference, path, key) if name != ["created"]]
        assert ours == sorted(theirs, key=json.dumps), (ours, theirs)
