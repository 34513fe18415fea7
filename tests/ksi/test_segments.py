"""Decoded segments: one partition's rows, sorted by offset, one row per offset, with or without
a payload encoder."""

from __future__ import annotations

import pyarrow as pa

from bergstream.core.api import ROW_ARROW_SCHEMA, Record
from bergstream.core.typed.row_contract import record_to_row
from bergstream.plugins.ksi_fetch_filter.segments import PAYLOAD_COLUMNS, decode_segment
from tests.kits.coldset_tables import make_record


def _table(rows: list[tuple[int, Record]]) -> pa.Table:
    return pa.Table.from_pylist(
        [record_to_row(partition, record, 0) for partition, record in rows], schema=ROW_ARROW_SCHEMA
    )


def test_rows_are_filtered_sorted_and_deduplicated_keeping_the_first() -> None:
    first_of_7 = make_record(7)
    again_7 = Record(offset=7, timestamp=1, key=b"later", value=b"later", headers=())
    rows = [(0, make_record(9)), (1, make_record(8)), (0, first_of_7), (0, make_record(3))]
    rows += [(0, again_7), (1, make_record(2))]
    segment = decode_segment(_table(rows), 0)
    assert segment.offsets.tolist() == [3, 7, 9]
    assert [r for _, r in segment.records(0, 3)] == [make_record(3), first_of_7, make_record(9)]


def test_rows_already_in_order_come_through_unchanged() -> None:
    rows = [(2, make_record(o)) for o in range(10, 20)]
    segment = decode_segment(_table(rows), 2)
    assert segment.offsets.tolist() == list(range(10, 20))
    assert [r for _, r in segment.records(0, 10)] == [r for _, r in rows]
    assert decode_segment(_table(rows), 1).offsets.tolist() == []


def test_the_encoder_sees_only_the_kept_rows_in_order() -> None:
    seen: list[list[int]] = []

    def encode(rows: pa.Table) -> pa.Table:
        seen.append(rows.column("kafka_offset").to_pylist())
        return rows.select(list(PAYLOAD_COLUMNS))

    rows = [(0, make_record(o)) for o in (5, 1, 5, 3)] + [(1, make_record(2))]
    segment = decode_segment(_table(rows), 0, encode)
    assert seen == [] and segment.offsets.tolist() == [1, 3, 5]  # encoded on first use, not before
    assert segment.payload.num_rows == 3 and segment.payload.num_rows == 3
    assert seen == [[1, 3, 5]]  # once
