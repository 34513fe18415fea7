"""``bergstream pipeline run --metrics-port``, continuous, on the real Kafka: ``/healthz`` as soon
as it listens, ``/readyz`` once the streaming query runs (Kafka and the catalog probed), and the
pipeline's counters, durations, last commit and source lag following what was produced."""

from __future__ import annotations

import re
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kits.lake import Produced, produce
from tests.metrics.scrape import get_json, scrape, total
from tests.support import BERGSTREAM, wait_until

pytestmark = pytest.mark.slow

PARTITIONS = 2
PIPELINE_RUN = (BERGSTREAM, "pipeline", "run")


def records(start: int, count: int) -> list[Produced]:
    return [
        Produced(i % PARTITIONS, f"k{i}".encode(), f"v{i}".encode(), (), None)
        for i in range(start, start + count)
    ]


@pytest.mark.timeout(600)
def test_a_continuous_run_serves_health_readiness_and_its_metrics(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(PARTITIONS, "pipeline-metrics")
    produce(kafka_bootstrap, topic, records(0, 300))
    home = tmp_path / "home"
    config = tmp_path / "lake.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            lake:
              kafka_bootstrap: "{kafka_bootstrap}"
              catalog:
                uri: sqlite:///{home}/lake/catalog.db
                warehouse: {home}/lake/warehouse
              pipeline:
                trigger_interval_seconds: 0.5
                checkpoint_dir: {home}/lake/checkpoints
                spark_conf: {{spark.driver.memory: 1g}}
            """
        )
    )
    log = tmp_path / "pipeline.log"
    began = time.time()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*PIPELINE_RUN, "-c", str(config), "--topic", topic, "--metrics-port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: b"metrics: http" in log.read_bytes(), timeout=120)
        found = re.search(r"metrics: (http://\S+)/metrics", log.read_text())
        assert found, log.read_text()
        base = found.group(1)
        assert get_json(f"{base}/healthz")[0] == 200

        def ready() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            return get_json(f"{base}/readyz")[0] == 200

        wait_until(ready, timeout=240)
        _, body = get_json(f"{base}/readyz")
        assert [(c["name"], c["ok"]) for c in body["checks"]] == [
            ("kafka", True),
            ("catalog", True),
        ]

        url = f"{base}/metrics"
        copied = lambda: total(scrape(url), "bergstream_pipeline_records_total", topic=topic)  # noqa: E731
        wait_until(lambda: copied() == 300, timeout=120)
        produce(kafka_bootstrap, topic, records(300, 200))
        wait_until(lambda: copied() == 500, timeout=120)

        def caught_up() -> bool:
            seen = dict(lag(url))
            wanted = [(("partition", str(p)), ("topic", topic)) for p in range(PARTITIONS)]
            return all(seen.get(labels) == 0 for labels in wanted)

        try:
            wait_until(caught_up, timeout=60)
        except AssertionError:
            raise AssertionError(f"source lag not 0 per partition: {lag(url)}") from None
        samples = scrape(url)
        assert total(samples, "bergstream_pipeline_written_bytes_total", topic=topic) > 0
        assert total(samples, "bergstream_pipeline_batch_seconds_count", topic=topic) >= 2
        assert total(samples, "bergstream_pipeline_commit_seconds_count", topic=topic) >= 2
        committed = total(samples, "bergstream_pipeline_last_commit_timestamp_seconds", topic=topic)
        assert began < committed <= time.time()
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
    assert code == 0, log.read_text()[-3000:]


def lag(url: str) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    return [
        (labels, value)
        for (name, labels), value in scrape(url).items()
        if name == "bergstream_pipeline_source_lag_offsets"
    ]
