"""A real Prometheus scraping ``bergstream run`` (an ISK gateway with a lake) and ``bergstream
pipeline run --metrics-port``, with deploy/'s alert rules (their ``for:`` and thresholds scaled
down to seconds) and every dashboard query; faults injected on a Kafka of the test's own: the
pipeline stopped while producers go on (the pipeline's lag grows, its process is down), then Kafka
stopped (readiness fails, naming Kafka)."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from bergstream.devstack.stack.testing import running_stack, stop_session_stack
from tests.kits.ksi_stack import lake_yaml
from tests.kits.lake import Produced, produce
from tests.metrics.deploy_files import RULES, dashboard_exprs
from tests.metrics.isk_config import isk_yaml
from tests.metrics.prometheus_server import Prometheus, scaled_rules
from tests.support import BERGSTREAM, start_bergstream_run, wait_until

pytestmark = pytest.mark.slow

PIPELINE_RUN = (BERGSTREAM, "pipeline", "run")


def records(start: int, count: int) -> list[Produced]:
    return [
        Produced(0, f"k{i}".encode(), f"v{i}".encode(), (), None)
        for i in range(start, start + count)
    ]


def host_port(url: str) -> str:
    return url.removeprefix("http://").split("/", 1)[0]


def alert_firing(prometheus: Prometheus, name: str, **labels: str) -> bool:
    return any(
        alert["labels"].get("alertname") == name
        and all(alert["labels"].get(k) == v for k, v in labels.items())
        for alert in prometheus.firing()
    )


@pytest.mark.timeout(900)
def test_prometheus_scrapes_bergstream_and_the_rules_fire_on_faults(tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    stack_home = tmp_path / "stack"
    with running_stack(stack_home, {"kafka"}) as env:  # a Kafka of this test's own: stopped below
        assert env.kafka_bootstrap is not None
        bootstrap = env.kafka_bootstrap
        topic = "prometheus-orders"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=60)
        produce(bootstrap, topic, records(0, 100))
        home = tmp_path / "home"
        config = tmp_path / "isk.yaml"
        config.write_text(
            isk_yaml(tmp_path, bootstrap, "prometheus", index_interval_seconds=0.5)
            + lake_yaml(home, bootstrap).replace(
                "  pipeline:\n", "  pipeline:\n    trigger_interval_seconds: 0.5\n"
            )
        )
        log = tmp_path / "pipeline.log"
        with open(log, "wb") as out:
            pipeline = subprocess.Popen(
                [*PIPELINE_RUN, "-c", str(config), "--topic", topic, "--metrics-port", "0"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        prometheus: Prometheus | None = None
        isk = None
        stop_producing = threading.Event()
        try:
            wait_until(lambda: b"metrics: http" in log.read_bytes(), timeout=120)
            found = re.search(r"metrics: (http://\S+)", log.read_text())
            assert found, log.read_text()
            pipeline_url = found.group(1)
            wait_until(lambda: b"batch " in log.read_bytes(), timeout=240)  # the table exists
            isk = start_bergstream_run(config, "isk", {"BERGSTREAM_HOME": str(home)}, "isk")
            isk_url = re.search(r"; metrics: (http://\S+)", isk.log())
            assert isk_url, isk.log()

            prometheus = Prometheus(
                tmp_path / "prometheus",
                {
                    "bergstream-isk": [host_port(isk_url.group(1))],
                    "bergstream-pipeline": [host_port(pipeline_url)],
                },
                [scaled_rules(RULES, tmp_path / "rules.yaml")],
            )
            prometheus.start()

            def scraped() -> bool:
                ready = {
                    r["metric"]["job"]: r["value"][1] for r in prometheus.query("bergstream_ready")
                }
                copied = prometheus.query(f'bergstream_pipeline_records_total{{topic="{topic}"}}')
                lag = prometheus.query(f'bergstream_pipeline_lag_offsets{{topic="{topic}"}}')
                return (
                    ready == {"bergstream-isk": "1", "bergstream-pipeline": "1"}
                    and bool(copied)
                    and float(copied[0]["value"][1]) == 100
                    and bool(lag)
                )

            wait_until(scraped, timeout=120)
            for expr in dashboard_exprs():
                prometheus.query(expr)  # every panel's query is valid PromQL on live data
            assert prometheus.firing() == [], prometheus.firing()

            # Fault 1: the pipeline stops while producers go on.
            pipeline.send_signal(signal.SIGTERM)
            assert pipeline.wait(timeout=120) == 0, log.read_text()[-3000:]

            def keep_producing() -> None:
                sent = 100
                while not stop_producing.wait(0.5):
                    produce(bootstrap, topic, records(sent, 20))
                    sent += 20

            producer = threading.Thread(target=keep_producing, daemon=True)
            producer.start()
            wait_until(
                lambda: (
                    alert_firing(prometheus, "BergstreamProcessDown", job="bergstream-pipeline")
                    and alert_firing(prometheus, "BergstreamPipelineLagGrowing", topic=topic)
                ),
                timeout=120,
            )
            assert not alert_firing(prometheus, "BergstreamNotReady", job="bergstream-isk")
            stop_producing.set()
            producer.join(timeout=30)

            # Fault 2: Kafka stops.
            stop_session_stack(stack_home)
            wait_until(
                lambda: (
                    alert_firing(
                        prometheus,
                        "BergstreamDependencyDown",
                        job="bergstream-isk",
                        dependency="kafka",
                    )
                    and alert_firing(prometheus, "BergstreamNotReady", job="bergstream-isk")
                ),
                timeout=120,
            )
            catalog = prometheus.query('bergstream_dependency_up{dependency="catalog"}')
            assert [r["value"][1] for r in catalog] == ["1"]  # only Kafka is down
        finally:
            stop_producing.set()
            if pipeline.poll() is None:
                pipeline.kill()
                pipeline.wait()
            if isk is not None:
                isk.stop()
            if prometheus is not None:
                prometheus.stop()
