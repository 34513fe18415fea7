"""The ksi filter counts the Fetch partitions and records it serves from the coldset, and only
those; in-process against a PyIceberg-written coldset and a fake upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bergstream.core.api import FakeFilterContext
from bergstream.core.proxy.api import Forward, ShortCircuit
from bergstream.core.proxy.codec import decode_response, encode_response
from bergstream.plugins.ksi_fetch_filter.filter import KsiFilter
from bergstream.plugins.ksi_fetch_filter.metrics import KSI_COLD_FETCHES, KSI_COLD_RECORDS
from tests.kits.coldset_tables import make_lake, make_record, write_cold
from tests.kits.ksi_filter import (
    BOUNDARY,
    TOPIC,
    fake_upstream,
    fetch_request,
    ksi_factory,
    records_in,
)


def counted() -> tuple[float, float]:
    labels = {"virtual_cluster": "test", "topic": TOPIC}
    return (
        KSI_COLD_FETCHES.labels(**labels)._value.get(),
        KSI_COLD_RECORDS.labels(**labels)._value.get(),
    )


async def test_cold_partitions_and_their_records_are_counted(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    rows = [(p, 0, make_record(o)) for p in (0, 1) for o in range(BOUNDARY)]
    write_cold(lake, TOPIC, rows, {0: BOUNDARY, 1: BOUNDARY}, rows_per_file=250)
    factory = ksi_factory(lake)
    await factory.start()
    try:
        fetches, records = counted()
        header, request = fetch_request(12, {0: 0, 1: 300})
        action: Any = await KsiFilter(factory).on_request(
            header, request, FakeFilterContext(upstream=fake_upstream)
        )
        assert isinstance(action, ShortCircuit)
        _, response = decode_response(1, 12, encode_response(11, action.response)[4:])
        served = sum(len(records_in(p)) for p in response.responses[0].partitions)
        assert served > 0
        assert counted() == (fetches + 2, records + served)

        # Hot partitions (at or above the boundary) go to Kafka and are not counted.
        header, request = fetch_request(12, {0: BOUNDARY, 1: BOUNDARY + 10})
        action = await KsiFilter(factory).on_request(
            header, request, FakeFilterContext(upstream=fake_upstream)
        )
        assert isinstance(action, Forward)
        assert counted() == (fetches + 2, records + served)
    finally:
        await factory.close()
