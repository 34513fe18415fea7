"""The compiled cold batch encoder writes the bytes of the reference builder (one Record at a
time through core.records.build_batch), for generated rows, budgets and batch sizes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bergstream.core.records import split_batches
from bergstream.core.typed.row_contract import CREATE_TIME, LOG_APPEND_TIME, ROW_ARROW_SCHEMA
from bergstream.plugins.ksi_fetch_filter.batch_encoder import encode_cold_batches
from bergstream.plugins.ksi_fetch_filter.batches import (
    build_cold_batches,
    build_cold_batches_reference,
)
from bergstream.plugins.ksi_fetch_filter.coldset import ColdRead
from bergstream.plugins.ksi_fetch_filter.segments import Segment, concat_segments, decode_segment

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BUDGETS = [0, 10, 80, 300, 1_000, 4_000, 20_000, 10**7]
BATCH_MAX_BYTES = [64, 200, 1_024, 4_096, 10**6]
HEADER_KEYS = ["h", "h", "trace-id", "", "ключ", "キー", "é\u0301", "🦀"]


def _row(offset: int, timestamp: int, timestamp_type: int, key: Any, value: Any, headers: Any):
    return {
        "kafka_partition": 0,
        "kafka_offset": offset,
        "kafka_timestamp": EPOCH + timedelta(milliseconds=timestamp),
        "kafka_timestamp_type": timestamp_type,
        "kafka_key": key,
        "kafka_headers": headers,
        "kafka_value": value,
    }


payloads = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=300))
header_lists = st.one_of(
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {
                "key": st.one_of(st.sampled_from(HEADER_KEYS), st.text(max_size=8)),
                "value": st.one_of(st.none(), st.just(b""), st.binary(max_size=40)),
            }
        ),
        max_size=5,
    ),
)
# A few timestamps repeat (LogAppendTime batches group equal ones), others go back in time.
timestamps = st.one_of(
    st.sampled_from([-1, 0, 1_700_000_000_000, 1_700_000_000_001]),
    st.integers(min_value=-1, max_value=253_402_300_799_999),
)


@st.composite
def cold_reads(draw: st.DrawFn) -> ColdRead:
    """A read of generated rows: offsets with gaps, both timestamp types in runs, null and
    empty keys and values, headers with null values, duplicate and non-ASCII keys; the
    segment decoded from a sliced table or joined from two (a chunked payload)."""
    count = draw(st.integers(min_value=1, max_value=60))
    offset = draw(st.integers(min_value=0, max_value=2**40))
    rows = []
    timestamp_type = CREATE_TIME
    for _ in range(count):
        offset += draw(st.sampled_from([1, 1, 1, 2, 7, 1000]))
        if draw(st.integers(0, 5)) == 0:
            timestamp_type = LOG_APPEND_TIME if timestamp_type == CREATE_TIME else CREATE_TIME
        rows.append(
            _row(
                offset, draw(timestamps), timestamp_type, draw(payloads), draw(payloads),
                draw(header_lists),
            )
        )  # fmt: skip
    skipped = draw(st.integers(min_value=0, max_value=3))
    filler = [_row(i, 0, CREATE_TIME, b"x", b"y", []) for i in range(skipped)]
    table = pa.Table.from_pylist(filler + rows, schema=ROW_ARROW_SCHEMA).slice(skipped)
    segment: Segment
    cut = draw(st.integers(min_value=0, max_value=count - 1))
    if cut:
        segment = concat_segments(
            [decode_segment(table.slice(0, cut), 0), decode_segment(table.slice(cut), 0)]
        )
    else:
        segment = decode_segment(table, 0)
    start = draw(st.integers(min_value=0, max_value=count - 1))
    stop = draw(st.integers(min_value=start + 1, max_value=count))
    gap = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=50)))
    tail = None if gap is None else segment.offsets[stop - 1] + gap
    return ColdRead(segment, start, stop, tail)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    read=cold_reads(),
    budget=st.sampled_from(BUDGETS),
    batch_max_bytes=st.sampled_from(BATCH_MAX_BYTES),
    first_in_response=st.booleans(),
)
def test_the_encoder_writes_the_reference_bytes(
    read: ColdRead, budget: int, batch_max_bytes: int, first_in_response: bool
) -> None:
    want = build_cold_batches_reference(
        read, budget, batch_max_bytes, first_in_response=first_in_response
    )
    got = encode_cold_batches(read, budget, batch_max_bytes, first_in_response=first_in_response)
    assert got.data == want.data
    assert (got.next_offset, got.records) == (want.next_offset, want.records)


def _segment(rows: list[dict[str, Any]]) -> Segment:
    return decode_segment(pa.Table.from_pylist(rows, schema=ROW_ARROW_SCHEMA), 0)


def test_many_small_rows_after_big_ones_are_read_in_growing_steps() -> None:
    # Big rows make the bytes-per-row guess small, so the kernel asks for more rows, twice.
    rows = [_row(o, o, CREATE_TIME, None, b"v", None) for o in range(3_000)]
    rows += [_row(3_000 + o, 0, CREATE_TIME, None, b"x" * 100_000, None) for o in range(50)]
    read = ColdRead(_segment(rows), 0, len(rows), None)
    for budget in (20_000, 60_000):
        want = build_cold_batches_reference(read, budget, 4_096, first_in_response=True)
        got = encode_cold_batches(read, budget, 4_096, first_in_response=True)
        assert got.records > 1_000
        assert (got.data, got.next_offset, got.records) == (
            want.data,
            want.next_offset,
            want.records,
        )


def test_a_first_batch_larger_than_the_buffer_guess_is_written_whole() -> None:
    rows = [_row(o, 5, LOG_APPEND_TIME, b"k", b"v" * 300_000, None) for o in range(3)]
    read = ColdRead(_segment(rows), 0, 3, 9)
    for first_in_response in (True, False):
        want = build_cold_batches_reference(read, 10, 10**7, first_in_response=first_in_response)
        got = encode_cold_batches(read, 10, 10**7, first_in_response=first_in_response)
        assert (got.data, got.next_offset, got.records) == (
            want.data,
            want.next_offset,
            want.records,
        )
    assert len(got.data) == 0
    big = encode_cold_batches(read, 10**7, 10**7, first_in_response=True)
    (batch,) = split_batches(big.data)
    assert DefaultRecordBatch(bytes(batch)).validate_crc()
    assert big.records == 3 and big.next_offset == 10


def test_build_cold_batches_returns_the_encoded_batches() -> None:
    headers = [{"key": "h", "value": None}]
    rows = [_row(o * 2, o, CREATE_TIME, b"k", b"v", headers) for o in range(9)]
    read = ColdRead(_segment(rows), 2, 9, None)
    got = build_cold_batches(read, 10**6, 10**6, first_in_response=True)
    assert got.data == encode_cold_batches(read, 10**6, 10**6, first_in_response=True).data
    assert got.records == 7 and got.next_offset == 17
