"""ISK's REST catalog and S3 gateway under generated requests (hypothesis), sent as raw bytes to a
``bergstream run`` process over the real Kafka: odd methods, paths, encodings and query strings,
oversized and odd headers, malformed bodies and lengths, truncated and slowly sent requests; on
the S3 gateway a share of them signed with ISK's keys so they reach past authentication. Every
answer comes within a bound and is never a 500; afterwards the process is up, its memory within
a bound, and a regular client reads the same table as before."""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.kits.isk_gateway import ACCESS_KEY, SECRET_KEY, Gateway, mixed_records, produce

pytestmark = pytest.mark.slow

#: Generated requests per interface (the issue asks for at least 500 in CI).
EXAMPLES = int(os.environ.get("BERGSTREAM_FUZZ_EXAMPLES", "500"))
#: Longest an answer may take (a slowly sent request included).
ANSWER_SECONDS = 15.0
#: How much ISK's resident memory may grow over the whole run.
MEMORY_GROWTH_BYTES = 256 * 1024 * 1024

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.generate],
)

#: Methods, GET weighted so that a share of requests reaches a handler and is served.
METHODS = ["GET"] * 6 + [
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "PATCH",
    "OPTIONS",
    "TRACE",
    "get",
    "BREW",
]
CATALOG_WORDS = [
    *("v1", "v2", "config", "namespaces", "tables", "views", "credentials", "metrics"),
    *("oauth", "tokens", "hotset", "coldset", "merged", "current", "..", ".", ""),
]
S3_WORDS = [
    *("bergstream", "e2e", "hotset", "merged", "coldset", "metadata", "data", "files"),
    *("p=0", "day=-", "0-8.parquet", "snap-1-0.avro", "..", "", "%2F"),
]
QUERY_KEYS = [
    *("pageSize", "pageToken", "snapshots", "warehouse", "parent", "list-type", "prefix"),
    *("delimiter", "max-keys", "continuation-token", "start-after", "encoding-type"),
    *("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature", "X-Amz-Expires", "partNumber"),
]
HEADER_NAMES = [
    *("Content-Type", "Authorization", "Range", "If-None-Match", "If-Match"),
    *("If-Modified-Since", "If-Unmodified-Since", "x-amz-content-sha256", "x-amz-date"),
    *("x-amz-security-token", "Expect", "Accept-Encoding", "X-Forwarded-For", "Cookie"),
]

segment = st.one_of(
    st.sampled_from(CATALOG_WORDS + S3_WORDS),
    st.text(max_size=12).map(lambda s: quote(s, safe="")),
    st.sampled_from(["%00", "%zz", "%", "%2e%2e", "%C3%28", "a%20b", "~", "x" * 300]),
)
query = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(QUERY_KEYS), st.text(max_size=8).map(quote)),
        st.one_of(
            st.sampled_from(["", "0", "-1", "1", "x", "all", "refs", "2", "%zz", "9" * 30]),
            st.text(max_size=16).map(quote),
        ),
    ),
    max_size=4,
).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))
header_value = st.one_of(
    st.sampled_from(
        [
            *("bytes=0-", "bytes=-5", "bytes=5-1", "bytes=0-1,3-4", "bytes=x", "Bearer x"),
            *("AWS4-HMAC-SHA256 Credential=/", "*", '"etag"', "Thu, 01 Jan 1970 00:00:00 GMT"),
            *("UNSIGNED-PAYLOAD", "100-continue", "chunked", "application/json"),
        ]
    ),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=64),
    st.integers(0, 20_000).map(lambda n: "v" * n),  # up to oversized
)
headers = st.lists(
    st.tuples(
        st.one_of(
            st.sampled_from(HEADER_NAMES),
            st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True),
        ),
        header_value,
    ),
    max_size=6,
)
body = st.one_of(
    st.just(b""),
    st.binary(max_size=512),
    st.sampled_from([b"{}", b"{", b"[]", b'{"namespace": ["x"]}', b"null", b"\x00\xff" * 64]),
    st.integers(1, 300_000).map(lambda n: b"x" * n),  # oversized
)
#: How the body's length is told: right, too short (extra bytes follow), too long (truncated),
#: or chunked with a bad chunk.
framing = st.sampled_from(["right", "right", "right", "short", "long", "chunked-bad", "none"])
#: How the request is sent: at once, or slowly in pieces.
pace = st.sampled_from(["fast"] * 19 + ["slow"])


@dataclass
class Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    framing: str
    pace: str

    def wire(self, host: str) -> bytes:
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {host}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        if self.framing == "right":
            lines.append(f"Content-Length: {len(self.body)}")
        elif self.framing == "short":
            lines.append(f"Content-Length: {max(0, len(self.body) // 2)}")
        elif self.framing == "long":
            lines.append(f"Content-Length: {len(self.body) + 1000}")
        elif self.framing == "chunked-bad":
            lines.append("Transfer-Encoding: chunked")
        lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        payload = self.body
        if self.framing == "chunked-bad":
            payload = b"zz\r\n" + self.body + b"\r\n"
        return head + payload


def requests(words: list[str], prefix: str, known: list[str]) -> st.SearchStrategy[Request]:
    """Requests whose path is one of the ``known`` routes (a share well formed, so they reach a
    handler) or ``prefix`` and generated segments, with a generated query."""
    generated = st.lists(st.one_of(st.sampled_from(words), segment), max_size=6).map(
        lambda segments: prefix + "/".join(segments)
    )
    optional_query = st.one_of(st.just(""), st.just(""), query)
    path = st.tuples(st.one_of(st.sampled_from(known), generated), optional_query).map(
        lambda parts: parts[0] + (("&" if "?" in parts[0] else "?") + parts[1] if parts[1] else "")
    )
    return st.builds(
        Request,
        method=st.sampled_from(METHODS),
        path=path,
        headers=headers,
        body=body,
        framing=framing,
        pace=pace,
    )


def exchange(url: str, request: Request, sign: bool = False) -> int | None:
    """Send ``request`` to ``url``'s host; the answer's status (None: the server closed the
    connection without one, which a malformed request may get). Fails if no answer or close
    comes within :data:`ANSWER_SECONDS`."""
    parts = urlsplit(url)
    host = parts.netloc
    if sign:
        request = _signed(url, request)
    data = request.wire(host)
    began = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port), timeout=ANSWER_SECONDS) as conn:
        try:
            if request.pace == "slow":
                step = max(1, len(data) // 3)
                for start in range(0, len(data), step):
                    conn.sendall(data[start : start + step])
                    time.sleep(0.1)
            else:
                conn.sendall(data)
            if request.framing == "long":
                # a body cut short: the end of the stream tells the server no more comes (an
                # answer may be lost then: aiohttp closes a half-closed connection)
                conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed before reading everything: fine
        answer = b""
        try:
            while len(answer) < 64 * 1024:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"no answer within {ANSWER_SECONDS} s to {data[:300]!r}")
    assert time.monotonic() - began < ANSWER_SECONDS + 1
    if not answer:
        return None
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), answer[:200]
    return int(status_line.split()[1])


def _signed(url: str, request: Request) -> Request:
    """``request`` with a valid SigV4 signature of ISK's keys over its method, path, query and
    its own headers (botocore's signer), so it reaches past authentication."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    method = request.method if request.method.isupper() and request.method.isalpha() else "GET"
    kept = [(k, v) for k, v in request.headers if k.lower() not in ("authorization", "host")]
    aws = AWSRequest(method=method, url=url.rstrip("/") + request.path, headers=dict(kept))
    aws.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    try:
        S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(aws)
    except Exception:
        return request  # a URL botocore cannot sign: send it as generated
    signed_headers = [(k, v) for k, v in aws.headers.items() if k.lower() != "host"]
    return Request(
        method, request.path, signed_headers, request.body, request.framing, request.pace
    )


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def watched(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> tuple[Gateway, str, str]:
    """A topic with records, and the metadata location a regular client loads for it."""
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(20))
    location = gateway.catalog().load_table(f"hotset.{topic}").metadata_location
    return gateway, topic, location


def _still_serving(gateway: Gateway, topic: str, location: str, rss_before: int) -> None:
    assert gateway.process.process.poll() is None, gateway.process.log()[-3000:]
    table = gateway.catalog().load_table(f"hotset.{topic}")
    assert table.metadata_location == location  # what other clients see did not change
    assert table.scan().to_arrow().num_rows == 20
    growth = _rss(gateway.process.process.pid) - rss_before
    assert growth < MEMORY_GROWTH_BYTES, f"ISK's memory grew by {growth / 2**20:.0f} MiB"


def _fuzz(
    watched: tuple[Gateway, str, str], url: str, strategy: st.SearchStrategy[Request], signs: bool
) -> None:
    """Send :data:`EXAMPLES` generated requests to ``url`` (a share signed when ``signs``):
    none answers a 500 (503, 501: a dependency down, a method S3 has not, are allowed), some
    are served; then the gateway still serves everyone as before."""
    gateway, topic, location = watched
    rss_before = _rss(gateway.process.process.pid)
    statuses: list[int | None] = []

    @FUZZ_SETTINGS
    @given(request=strategy, sign=st.sampled_from([True, True, True, False] if signs else [False]))
    def fuzz(request: Request, sign: bool) -> None:
        status = exchange(url, request, sign=sign)
        statuses.append(status)
        assert status is None or status < 500 or status in (501, 503), (status, request)

    fuzz()
    assert len(statuses) >= min(EXAMPLES, 500)
    served = statuses.count(200) + statuses.count(206)
    assert served >= max(1, EXAMPLES // 200), Counter(statuses)  # some reached a handler
    _still_serving(gateway, topic, location, rss_before)


def test_the_catalog_answers_every_generated_request(watched: tuple[Gateway, str, str]) -> None:
    gateway, topic, _ = watched
    known = [
        "/v1/config",
        "/v1/namespaces",
        "/v1/namespaces/hotset",
        "/v1/namespaces/hotset/tables",
        f"/v1/namespaces/hotset/tables/{topic}",
        f"/v1/namespaces/merged/tables/{topic}",
        f"/v1/namespaces/hotset/tables/{topic}/credentials",
    ]
    _fuzz(watched, gateway.catalog_url, requests([*CATALOG_WORDS, topic], "/", known), False)


def test_the_s3_gateway_answers_every_generated_request(
    watched: tuple[Gateway, str, str],
) -> None:
    gateway, topic, location = watched
    known = [
        "/bergstream",
        "/bergstream?list-type=2",
        f"/bergstream?list-type=2&prefix=e2e/hotset/{topic}/",
        f"/bergstream/{location.split('/', 3)[3]}",  # the table's metadata file
        "/",
    ]
    strategy = requests([*S3_WORDS, topic], "/bergstream/e2e/", known)
    _fuzz(watched, gateway.s3_url, strategy, True)
