"""Round trip through real Kafka and real Spark, property-based: generated records are produced,
the pipeline copies them, and the rows read back with Spark and with PyIceberg equal the records
field by field and convert back to the original records."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bergstream.core.lake import ResolvedLake
from bergstream.core.records import Record
from bergstream.core.typed.row_contract import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    RowRecord,
    record_to_row,
)
from bergstream.pipeline.stream import run_pipeline
from tests.kits.lake import (
    Produced,
    consume_all,
    produce,
    records_of,
    table_rows_pyiceberg,
    table_rows_spark,
)
from tests.kits.record_strategies import PARTITIONS, records

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1500)
def test_round_trip_property(
    spark: Any,
    lake: ResolvedLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    @settings(
        max_examples=int(os.environ.get("BERGSTREAM_ROUND_TRIP_EXAMPLES", "50")),
        deadline=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(
        batch=st.lists(records, max_size=12),
        log_append_time=st.booleans(),
    )
    def round_trip(batch: list[Produced], log_append_time: bool) -> None:
        configs = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
        topic = create_topic(PARTITIONS, prefix="rt", **configs)
        produce(kafka_bootstrap, topic, batch)
        truth = consume_all(kafka_bootstrap, topic, PARTITIONS)
        assert len(truth) == len(batch)

        run_pipeline(spark, lake, topic, once=True, report=lambda line: None)

        expected_rows = [record_to_row(r.partition, r.record, r.timestamp_type) for r in truth]
        by_spark = table_rows_spark(spark, lake, topic)
        by_pyiceberg = table_rows_pyiceberg(lake, topic)
        assert len(by_spark) == len(by_pyiceberg) == len(truth)
        for spark_row, iceberg_row, expected, original in zip(
            by_spark, by_pyiceberg, expected_rows, truth, strict=True
        ):
            micros = original.record.timestamp * 1000
            assert spark_row == {**expected, "kafka_timestamp": micros}
            assert iceberg_row == expected
        assert records_of(by_spark) == records_of(by_pyiceberg) == truth

        # Converting the rows back gives the records as they were produced.
        produced_by_partition: dict[int, list[Produced]] = {}
        for record in batch:
            produced_by_partition.setdefault(record.partition, []).append(record)
        for got in records_of(by_pyiceberg):
            original = produced_by_partition[got.partition].pop(0)
            assert got.timestamp_type == (LOG_APPEND_TIME if log_append_time else CREATE_TIME)
            expected_timestamp = got.record.timestamp if log_append_time else original.timestamp
            assert got == RowRecord(
                original.partition,
                got.timestamp_type,
                Record(
                    offset=got.record.offset,
                    timestamp=expected_timestamp,
                    key=original.key,
                    value=original.value,
                    headers=original.headers,
                ),
            )

    round_trip()
