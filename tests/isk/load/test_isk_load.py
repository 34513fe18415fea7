"""ISK under load: 16 concurrent DuckDB and PyIceberg clients query the ``merged`` tables of 4
topics while records are produced (the machinery is ``bench/isk_load.py``'s, in a shorter run):
every answer holds each partition's offsets once and without gaps, at least every record acked
before the query started, no query fails, no file is read from Kafka twice, and ISK's resident
memory stays within a stated bound."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bergstream.devstack.stack.ports import free_ports
from tests.support import ProxyProcess, start_bergstream_run

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import isk_load  # bench/ is not a package: the bench and this test share this module

pytestmark = pytest.mark.slow

TOPICS = 4
PRELOAD = 3000  # records per topic before the load
CHUNK_RECORDS = 500
RATE = 200  # records/s produced during the load, over all topics
SINGLE_SECONDS = 8
CONCURRENT_SECONDS = 30
CLIENTS = 16
#: ISK's peak resident memory may exceed its resident memory after the first loads by at most
#: this much. What the load adds should be small: the tables' files are about 2 MB here (the
#: file store's in-memory files, the one part of ISK's memory meant to grow with use, stay far
#: below their 1 GiB bound), Arrow and Parquet buffers of the files built at once a few MB, 16
#: HTTP responses in flight at most one file each. Measured on 2 cores: +30 MB with Arrow on the
#: system allocator (what ``bergstream run`` uses), +260 to +670 MB with Arrow's bundled
#: mimalloc, which keeps freed memory per thread; a leak per request (thousands of requests
#: here) or going back to that allocator crosses the bound.
RSS_GROWTH_BOUND = 192 * 2**20


@dataclass
class Stage:
    """The running ISK, its catalog URL and metrics port, the topics and their counts."""

    isk: ProxyProcess
    catalog_url: str
    metrics_port: int
    topics: list[str]
    acks: isk_load.Acks


@pytest.fixture(scope="module")
def stage(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stage]:
    """The module's 4 topics of 3 partitions, each holding ``PRELOAD`` records, and an ISK with
    a ``lake:`` section (so ``merged`` is served; its coldset is empty) and a metrics port."""
    workdir = tmp_path_factory.mktemp("isk-load")
    topics = [new_topic(partitions=3, prefix="load") for _ in range(TOPICS)]
    acks = isk_load.Acks.of(topics)
    producer = isk_load.Producer(kafka_bootstrap, topics, acks, RATE)
    for topic in topics:
        producer.produce(topic, PRELOAD)
    producer.close()
    ports = free_ports(3)
    cache = f'{{type: local, config: {{directory: "{workdir / "cache"}"}}}}'
    config = workdir / "isk.yaml"
    config.write_text(isk_load.isk_yaml(kafka_bootstrap, workdir, ports, CHUNK_RECORDS, cache))
    isk = start_bergstream_run(
        config, kafka_bootstrap, {"BERGSTREAM_HOME": str(workdir / "home")}, "the isk service"
    )
    try:
        yield Stage(isk, f"http://127.0.0.1:{ports[0]}", ports[2], topics, acks)
    finally:
        code = isk.stop()
        print(isk.log()[-5000:], file=sys.stderr)
        assert code == 0, f"bergstream run exited with {code}"


def test_sixteen_clients_while_producing(stage: Stage, kafka_bootstrap: str) -> None:
    first_s = isk_load.first_loads(stage.catalog_url, stage.topics)
    pid = stage.isk.process.pid
    baseline = isk_load.proc_status(pid)["VmRSS"]
    before = isk_load.scrape(stage.metrics_port)
    producer = isk_load.Producer(kafka_bootstrap, stage.topics, stage.acks, RATE)
    with isk_load.RssSampler(pid) as rss, producer:
        single = isk_load.run_clients(
            stage.catalog_url, stage.topics, stage.acks, 1, SINGLE_SECONDS
        )
        many = isk_load.run_clients(
            stage.catalog_url, stage.topics, stage.acks, CLIENTS, CONCURRENT_SECONDS
        )
    reads = isk_load.kafka_reads(before, isk_load.scrape(stage.metrics_port))
    peak = max(isk_load.proc_status(pid)["VmHWM"], rss.peak)
    load_bytes = isk_load.load_table_bytes(stage.catalog_url, stage.topics[0])
    produced = sum(stage.acks.acked.values()) - TOPICS * PRELOAD
    figures = {
        "first_loads_s": round(first_s, 2),
        "produced_during_load": produced,
        "single": single | {"errors": len(single["errors"])},
        "concurrent": many | {"errors": len(many["errors"])},
        "kafka_reads": reads,
        "load_table_bytes_at_end": load_bytes,
        "isk_rss_mb": {"baseline": round(baseline / 2**20), "peak": round(peak / 2**20)},
    }
    print(json.dumps(figures))
    assert not stage.acks.failures, stage.acks.failures[:5]
    assert produced >= RATE * CONCURRENT_SECONDS // 2  # records were produced all along
    assert single["queries"] >= 2 and many["queries"] >= CLIENTS
    assert many["duckdb"]["queries"] >= CLIENTS // 2 and many["pyiceberg"]["queries"] >= 1
    # Every new record made new files during the load, and none was read from Kafka twice.
    assert reads["range_reads"] > 0
    assert reads["repeated_ranges"] == 0, reads
    assert peak - baseline < RSS_GROWTH_BOUND, figures["isk_rss_mb"]
    assert not single["errors"] and not many["errors"], (single["errors"] + many["errors"])[:10]
