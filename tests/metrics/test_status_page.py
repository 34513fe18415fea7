"""The status page of ``bergstream run`` (an ISK gateway with a lake) in a real browser: Debian's
headless Chromium loads ``GET /`` against the running stack, the figures it shows match Kafka, the
lake's catalog and the process's metrics, and the test keeps a screenshot
(``$BERGSTREAM_TEST_ARTIFACTS``, default ``tests/.artifacts/``)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.core.lake import LakeConfig, load_catalog
from bergstream.pipeline.settings import resolve_pipeline_lake
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once
from tests.kits.lake import Produced, produce
from tests.metrics.isk_config import isk_yaml
from tests.metrics.scrape import get_json, scrape, total
from tests.support import start_bergstream_run, wait_until

pytestmark = pytest.mark.slow

ARTIFACTS = Path(
    os.environ.get("BERGSTREAM_TEST_ARTIFACTS")
    or Path(__file__).resolve().parents[1] / ".artifacts"
)
PARTITIONS = 2


def records(start: int, count: int) -> list[Produced]:
    return [
        Produced(i % PARTITIONS, f"k{i}".encode(), f"v{i}".encode(), (), None)
        for i in range(start, start + count)
    ]


def chromium(*arguments: str) -> subprocess.CompletedProcess[str]:
    """Debian's Chromium, headless (as root it needs --no-sandbox)."""
    binary = shutil.which("chromium")
    assert binary, "chromium is missing: apt-get install chromium (scripts/setup does)"
    return subprocess.run(
        [
            binary,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


@pytest.mark.timeout(600)
def test_the_status_page_in_a_browser_matches_the_catalog_and_the_metrics(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    from pyiceberg.catalog.rest import RestCatalog

    topic = new_topic(PARTITIONS, "status-page")
    produce(kafka_bootstrap, topic, records(0, 300))
    home = tmp_path / "home"
    config = tmp_path / "isk.yaml"
    config.write_text(
        isk_yaml(tmp_path, kafka_bootstrap, "status", chunk_records=64, index_interval_seconds=0.5)
        + lake_yaml(home, kafka_bootstrap)
    )
    assert run_pipeline_once(config, topic)["records"] == 300  # the coldset: offsets 0-149 each
    produce(kafka_bootstrap, topic, records(300, 50))  # and 25 hot offsets per partition

    running = start_bergstream_run(config, "isk", {"BERGSTREAM_HOME": str(home)}, "isk")
    try:
        found = re.search(r"; metrics: (http://\S+)/metrics", running.log())
        assert found, running.log()
        base = found.group(1)
        catalog_url = re.search(r"isk: catalog (http://\S+),", running.log())
        assert catalog_url, running.log()
        rest = RestCatalog("isk", uri=catalog_url.group(1))
        for _ in range(2):  # two loads: the second one's files come from the cache
            assert rest.load_table(f"merged.{topic}").scan().to_arrow().num_rows == 350
        wait_until(  # the background indexer keeps the lag the chart draws
            lambda: (
                total(scrape(f"{base}/metrics"), "bergstream_pipeline_lag_offsets", topic=topic)
                == 50
            )
        )

        status, page = get_json(f"{base}/status.json")
        assert status == 200
        (section,) = page["sections"]
        tables = {table["title"]: table for table in section["tables"]}
        (row,) = [r for r in tables["Topics"]["rows"] if r[0] == topic]
        assert row == [topic, "append", "raw (bytes)", PARTITIONS, 350, 300, 50, 50, 0, None]
        partitions = [r for r in tables["Partitions"]["rows"] if r[0] == topic]
        assert partitions == [[topic, p, 0, 150, 175, 25, 25] for p in range(PARTITIONS)]

        lake = resolve_pipeline_lake(LakeConfig(kafka_bootstrap=kafka_bootstrap), home=home)
        table = load_catalog(lake).load_table(("coldset", topic))
        ids = [str(s.snapshot_id) for s in sorted(table.snapshots(), key=lambda s: -s.timestamp_ms)]
        shown = [r for r in tables["Coldset snapshots (latest first)"]["rows"] if r[0] == topic]
        assert [r[2] for r in shown] == ids[:5]
        assert shown[0][5] == 300 and shown[0][6] == "0:150 1:150"
        charts = {chart["title"]: chart for chart in section["charts"]}
        lag_series = charts["Pipeline lag, last hour"]["series"]
        assert lag_series.get(topic, [[0, None]])[-1][1] == 50, charts
        assert charts["Query rate, last hour"]["series"]["LoadTable"][-1][1] > 0

        samples = scrape(f"{base}/metrics")
        hits = total(samples, "bergstream_cache_requests_total", backend="local", result="hit")
        misses = total(samples, "bergstream_cache_requests_total", backend="local", result="miss")
        assert hits + misses > 0  # the files of the first load were looked up in the cache
        rate = f"{hits / (hits + misses):.0%}"
        assert section["facts"]["cache"] == f"local, hit rate {rate}"

        # The page as a browser renders it.
        dom = chromium("--dump-dom", f"{base}/").stdout
        text = html.unescape(re.sub(r"<[^>]+>", " ", dom))
        assert "ISK status" in text and f"hit rate {rate}" in text  # cluster "status"
        cells = re.findall(r"<tr>(.*?)</tr>", dom)
        topic_cells = [re.findall(r"<td[^>]*>(.*?)</td>", c) for c in cells if f">{topic}<" in c]
        assert [topic, "append", "raw (bytes)", "2", "350", "300", "50", "50", "0", "-"] in [
            [html.unescape(v) for v in c] for c in topic_cells
        ]
        assert ids[0] in dom, dom[-3000:]  # the latest snapshot
        assert "<svg" in dom, dom[:3000]  # the charts
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        screenshot = ARTIFACTS / "status-page.png"
        screenshot.unlink(missing_ok=True)
        chromium(f"--screenshot={screenshot}", "--window-size=1280,1600", f"{base}/")
        png = screenshot.read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, len(png)
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert (width, height) == (1280, 1600)
        print(f"status page screenshot: {screenshot}")
        with urllib.request.urlopen(f"{base}/", timeout=30) as response:
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    finally:
        running.stop()
