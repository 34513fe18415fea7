"""The status page's drawing and serving, with sections of a test's own: text is escaped,
numbers are grouped, charts are inline SVG over the last hour, a source that refuses the
credentials makes a 401 with a Basic challenge, and one that fails shows as unavailable."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from bergstream.core.config import MetricsConfig
from bergstream.core.metrics_http import MetricsServer
from bergstream.core.status_page import (
    StatusChart,
    StatusSection,
    StatusTable,
    StatusUnauthorized,
    render_page,
)
from tests.metrics.scrape import get_json

SECTION = StatusSection(
    "ISK <main>",
    {"topics": 1234, "lake": None},
    [StatusTable("Topics", ("topic", "lag"), [("a&b", 1500000), ("c", None)], note="n<1>")],
    [StatusChart("Lag", "offsets", {"a&b": [(1000.0, 5.0), (1600.0, 10.0)]})],
)


def test_the_page_escapes_groups_and_draws() -> None:
    page = render_page("bergstream", [SECTION], 1700000000.0).decode()
    assert "ISK &lt;main&gt;" in page and "<td>a&amp;b</td>" in page
    assert '<td class="n">1,500,000</td>' in page and "<dd>1,234</dd>" in page
    assert "<dd>-</dd>" in page and "<td>-</td>" in page and "n&lt;1&gt;" in page
    assert page.count("<svg") == 1 and "<polyline" in page and "-60 min" in page
    assert "2023-11-14 22:13:20 UTC" in page
    assert "<script" not in page  # nothing to run, nothing else to fetch


def test_an_empty_chart_and_no_sections() -> None:
    empty = StatusSection("x", charts=[StatusChart("Lag", "offsets", {})])
    assert "no samples yet" in render_page("b", [empty], 0).decode()
    assert "no service that reports a status" in render_page("b", [], 0).decode()


async def test_refused_credentials_and_a_failing_source() -> None:
    server = MetricsServer(MetricsConfig(port=0))
    seen: list[str | None] = []

    async def guarded(authorization: str | None) -> list[StatusSection]:
        seen.append(authorization)
        if authorization != "Basic dTpw":
            raise StatusUnauthorized("Unknown user or wrong password")
        return [SECTION]

    server.add_status_source(guarded)
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        status, body = await asyncio.to_thread(get_json, f"{base}/status.json")
        assert status == 401 and body == {"error": "Unknown user or wrong password"}

        def challenge() -> str:
            try:
                urllib.request.urlopen(f"{base}/", timeout=10)
            except urllib.error.HTTPError as error:
                return str(error.headers["WWW-Authenticate"])
            raise AssertionError("no 401")

        assert await asyncio.to_thread(challenge) == 'Basic realm="bergstream", charset="UTF-8"'
        request = urllib.request.Request(
            f"{base}/status.json", headers={"Authorization": "Basic dTpw"}
        )
        page = await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=10).read())
        assert b'"title": "ISK <main>"' in page and seen[-1] == "Basic dTpw"

        async def broken(authorization: str | None) -> list[StatusSection]:
            raise RuntimeError("the catalog is gone")

        server._status_sources = [broken]
        status, body = await asyncio.to_thread(get_json, f"{base}/status.json")
        assert status == 200
        assert body["sections"][0]["facts"] == {"error": "RuntimeError: the catalog is gone"}
    finally:
        await server.stop()
