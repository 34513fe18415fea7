"""Property: records produced to Kafka (the pipeline tests' generators: null/empty/large keys and
values, duplicate and odd headers, any timestamp, CreateTime or LogAppendTime), read through ISK's
``hotset`` by PyIceberg's RestCatalog via the S3 gateway, equal the records as rows in the row
contract, and convert back to the records a consumer sees."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bergstream.core.typed.row_contract import record_to_row
from tests.kits.isk_gateway import Gateway, start_gateway
from tests.kits.lake import (
    TOPIC_CONFIG,
    Produced,
    consume_all,
    produce,
    records_of,
)
from tests.kits.record_strategies import PARTITIONS
from tests.kits.record_strategies import records as record_strategy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gateway(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    running = start_gateway(kafka_bootstrap, tmp_path_factory.mktemp("isk-prop"), chunk_records=5)
    try:
        yield running
    finally:
        assert running.process.stop() == 0, running.process.log()


@pytest.mark.timeout(1500)
def test_hotset_rows_equal_the_records(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    @settings(
        max_examples=int(os.environ.get("BERGSTREAM_ISK_PROPERTY_EXAMPLES", "40")),
        deadline=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(batch=st.lists(record_strategy, max_size=14), log_append_time=st.booleans())
    def hotset_round_trip(batch: list[Produced], log_append_time: bool) -> None:
        configs = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
        topic = new_topic(PARTITIONS, prefix="iskp", **TOPIC_CONFIG, **configs)
        produce(kafka_bootstrap, topic, batch)
        truth = consume_all(kafka_bootstrap, topic, PARTITIONS)
        assert len(truth) == len(batch)
        table = gateway.catalog().load_table(f"hotset.{topic}")
        rows = sorted(
            table.scan().to_arrow().to_pylist(),
            key=lambda r: (r["kafka_partition"], r["kafka_offset"]),
        )
        assert rows == [record_to_row(r.partition, r.record, r.timestamp_type) for r in truth]
        assert records_of(rows) == truth

    hotset_round_trip()
