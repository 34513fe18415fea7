"""Cold rows rebuilt into record batches: original fields, byte budgets, LogAppendTime."""

from __future__ import annotations

from pathlib import Path

from aiokafka.record.default_records import DefaultRecordBatch

from bergstream.core.records import batch_info, read_records, split_batches
from bergstream.core.typed.row_contract import CREATE_TIME, LOG_APPEND_TIME
from bergstream.plugins.ksi_fetch_filter.batches import build_cold_batches
from bergstream.plugins.ksi_fetch_filter.coldset import ColdRead
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from tests.kits.coldset_tables import ColdRow, make_lake, make_record, write_cold


def _read(tmp_path: Path, rows: list[ColdRow], boundary: int, offset: int = 0) -> ColdRead:
    lake = make_lake(tmp_path)
    write_cold(lake, "t", rows, {0: boundary}, rows_per_file=1000)
    cold = ColdStore(lake, KsiConfig(topics=["t"])).table("t")
    assert cold is not None
    read = cold.read(0, offset)
    assert read is not None
    return read


def test_batches_carry_the_original_records(tmp_path: Path) -> None:
    rows = [(0, CREATE_TIME, make_record(o, size=100)) for o in range(10, 300)]
    read = _read(tmp_path, rows, 300)
    out = build_cold_batches(read, 10**9, 4096, first_in_response=True)
    batches = list(split_batches(out.data))
    assert len(batches) > 5  # split at the batch target size
    got = [record for batch in batches for record in read_records(batch)]
    assert got == [record for _, _, record in rows]
    assert all(DefaultRecordBatch(bytes(b)).validate_crc() for b in batches)
    assert out.next_offset == 300 and out.records == 290


def test_the_budget_is_respected_but_a_first_batch_always_comes(tmp_path: Path) -> None:
    rows = [(0, CREATE_TIME, make_record(o, size=1000)) for o in range(100)]
    read = _read(tmp_path, rows, 100)
    out = build_cold_batches(read, 20_000, 4096, first_in_response=True)
    assert 0 < len(out.data) <= 20_000
    tiny = build_cold_batches(read, 10, 4096, first_in_response=True)
    assert tiny.records >= 1 and tiny.next_offset == tiny.records
    none = build_cold_batches(read, 10, 4096, first_in_response=False)
    assert none.data == b"" and none.records == 0


def test_log_append_time_batches_share_one_timestamp(tmp_path: Path) -> None:
    rows = [(0, LOG_APPEND_TIME, make_record(o, timestamp=1_000 + o // 4)) for o in range(40)]
    read = _read(tmp_path, rows, 40)
    out = build_cold_batches(read, 10**9, 10**6, first_in_response=True)
    batches = list(split_batches(out.data))
    assert len(batches) == 10
    for batch in batches:
        assert batch_info(batch).timestamp_type == LOG_APPEND_TIME
        assert len({r.timestamp for r in read_records(batch)}) == 1
    parsed = [r for b in batches for r in DefaultRecordBatch(bytes(b))]
    assert [r.timestamp for r in parsed] == [1_000 + o // 4 for o in range(40)]


def test_the_last_batch_claims_the_gap_before_the_boundary(tmp_path: Path) -> None:
    rows = [(0, CREATE_TIME, make_record(o)) for o in range(20)]
    read = _read(tmp_path, rows, 25)
    out = build_cold_batches(read, 10**9, 10**6, first_in_response=True)
    (batch,) = split_batches(out.data)
    parsed = DefaultRecordBatch(bytes(batch))
    assert parsed.validate_crc()
    assert parsed.next_offset == 25 and out.next_offset == 25
    assert [r.offset for r in read_records(batch)] == list(range(20))
