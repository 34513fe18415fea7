"""``rejected.<topic>`` of an append topic: the records whose value did not decode (a plain JSON
topic with values that are not JSON objects), from the coldset the pipeline wrote and from
Kafka beyond it, each with its reason; the log keeps them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.kits.isk_gateway import Gateway, produce, start_gateway, stop_gateway
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once

pytestmark = pytest.mark.slow

RULES = """
codecs:
  topics:
    - match: "*"
      value: json
"""


@pytest.fixture(scope="module")
def gateway(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("isk-rejected")
    extra = lake_yaml(workdir / "home", kafka_bootstrap) + RULES
    running = start_gateway(kafka_bootstrap, workdir, chunk_records=10, extra=extra)
    try:
        yield running
    finally:
        stop_gateway(running)


def test_undecodable_values_are_listed_with_their_reason(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)

    def batch(tag: str) -> list[dict[str, object]]:
        good = [{"partition": 0, "value": json.dumps({"n": i}).encode()} for i in range(20)]
        bad = [{"partition": 0, "value": f"[{tag}]".encode()}, {"partition": 0, "value": b"oops"}]
        return good[:10] + bad + good[10:]

    produce(kafka_bootstrap, topic, batch("cold"))
    assert run_pipeline_once(gateway.process.config_path, topic)["records"] == 22
    produce(kafka_bootstrap, topic, batch("hot"))
    catalog = gateway.catalog()
    rows = catalog.load_table(("rejected", topic)).scan().to_arrow().to_pylist()
    assert [(r["kafka_offset"], r["kafka_value"]) for r in rows] == [
        (10, b"[cold]"), (11, b"oops"), (32, b"[hot]"), (33, b"oops"),
    ]  # fmt: skip
    assert all("did not decode" in r["reason"] for r in rows)
    assert ("rejected", topic) in catalog.list_tables("rejected")
    merged = catalog.load_table(("merged", topic)).scan().to_arrow()
    assert merged.num_rows == 44  # the log keeps them
