"""Hotset synthesis: record batches -> contract rows -> Parquet with field ids and stats."""

from __future__ import annotations

import datetime as dt
import io
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bergstream.core.kafka_wire.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    MAGIC_OFFSET,
    ControlRecordType,
    control_record_key,
    read_field,
    write_crc,
    write_field,
)
from bergstream.core.records import BatchInfo, Record, build_batch
from bergstream.core.typed.row_contract import (
    PARTITION_SPEC,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    SORT_ORDER,
    record_to_row,
)
from bergstream.plugins.isk_gateway.files.synthesis import (
    SynthesisError,
    parquet_bytes,
    records_to_table,
    synthesize_data_file,
)

_DAY_MS = 86_400_000


def control_batch(offset: int, producer_id: int, abort: bool, timestamp: int = 0) -> bytes:
    """A transaction marker batch (ABORT or COMMIT) of ``producer_id`` at ``offset``."""
    key = control_record_key(ControlRecordType.ABORT if abort else ControlRecordType.COMMIT)
    value = struct.pack(">hi", 0, 0)
    info = BatchInfo(
        base_offset=offset, is_transactional=True, producer_id=producer_id, producer_epoch=0
    )
    out = bytearray(build_batch([Record(offset, timestamp, key, value)], info))
    write_field(out, ATTRIBUTES_OFFSET, read_field(out, ATTRIBUTES_OFFSET) | CONTROL_FLAG_MASK)
    write_crc(out)
    return bytes(out)


def txn_batch(offset: int, producer_id: int, count: int = 2) -> bytes:
    records = [Record(offset + i, 5, b"k", b"v%d" % i) for i in range(count)]
    info = BatchInfo(
        base_offset=offset, is_transactional=True, producer_id=producer_id, producer_epoch=0
    )
    return build_batch(records, info)


def plain_batch(offset: int, count: int = 2, timestamp: int = 7) -> bytes:
    records = [Record(offset + i, timestamp + i, None, b"x") for i in range(count)]
    return build_batch(records, BatchInfo(base_offset=offset))


# --------------------------------------------------------------------------- property test

headers = st.lists(
    st.tuples(
        st.sampled_from(["a", "a", "é", "ключ", "", "🙂"]) | st.text(max_size=8),
        st.none() | st.binary(max_size=12),
    ),
    max_size=20,
)
record_fields = st.tuples(
    st.integers(0, 2**41),  # timestamp ms, 0 included
    st.none() | st.binary(max_size=16),  # key: null, empty or bytes
    st.none() | st.binary(max_size=64),  # value: null is a tombstone
    headers,
)
batch_specs = st.lists(
    st.tuples(
        st.lists(record_fields, min_size=1, max_size=8),
        st.sampled_from([0, 1, 2, 3, 4]),  # compression: none, gzip, snappy, lz4, zstd
        st.sampled_from([0, 1]),  # timestamp type
        st.integers(0, 3),  # offset gap before the batch
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=batch_specs, partition=st.integers(0, 2**31 - 1), data=st.data())
def test_rows_equal_record_to_row_of_each_record(specs, partition, data) -> None:
    blob = bytearray()
    expected = []
    offset = 0
    for fields, compression, timestamp_type, gap in specs:
        offset += gap
        records = [
            Record(offset + i, ts, key, value, tuple(hs))
            for i, (ts, key, value, hs) in enumerate(fields)
        ]
        offset += len(records)
        info = BatchInfo(
            base_offset=records[0].offset,
            compression_type=compression,
            timestamp_type=timestamp_type,
        )
        blob += build_batch(records, info)
        max_ts = max(r.timestamp for r in records)
        for record in records:
            if timestamp_type == 1:  # LogAppendTime: the batch's max timestamp
                record = Record(record.offset, max_ts, record.key, record.value, record.headers)
            expected.append(record_to_row(partition, record, timestamp_type))
    start = data.draw(st.integers(0, offset + 1), label="start_offset")
    end = data.draw(st.none() | st.integers(start, offset + 1), label="end_offset")
    expected = [
        row
        for row in expected
        if start <= row["kafka_offset"] and (end is None or row["kafka_offset"] < end)
    ]
    table = records_to_table(bytes(blob), partition, start, end)
    assert table.schema.equals(ROW_ARROW_SCHEMA, check_metadata=True)
    rows = table.to_pylist()
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        for column in want:
            assert row[column] == want[column], column


# --------------------------------------------------------------------------- semantics


def test_offset_range_and_partial_trailing_batch() -> None:
    blob = plain_batch(0, 5) + plain_batch(5, 5) + plain_batch(10, 5)
    table = records_to_table(blob[:-3], 0, start_offset=3, end_offset=8)
    assert table.column("kafka_offset").to_pylist() == [3, 4, 5, 6, 7]
    whole = records_to_table(blob[:-3], 0)
    assert whole.num_rows == 10  # the cut batch is ignored


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_every_kafka_compression_codec_decodes(codec: int) -> None:
    records = [
        Record(
            offset=7 + i,
            timestamp=1_700_000_000_000 + i,
            key=b"k%d" % i,
            value=b"v" * (200 + i),
            headers=(("h", b"x"),),
        )
        for i in range(50)
    ]
    blob = build_batch(records, BatchInfo(base_offset=7, compression_type=codec))
    table = records_to_table(blob, 2)
    assert table.to_pylist() == [record_to_row(2, r, 0) for r in records]


def test_empty_input_gives_an_empty_table_in_the_contract() -> None:
    table = records_to_table(b"", 1)
    assert table.num_rows == 0 and table.schema.equals(ROW_ARROW_SCHEMA, check_metadata=True)


def test_aborted_transactions_and_control_batches_are_skipped() -> None:
    blob = (
        plain_batch(0, 2)  # 0, 1
        + txn_batch(2, producer_id=7)  # 2, 3: aborted
        + txn_batch(4, producer_id=8)  # 4, 5: committed
        + control_batch(6, producer_id=7, abort=True)
        + control_batch(7, producer_id=8, abort=False)
        + txn_batch(8, producer_id=7)  # 8, 9: a later, committed transaction of 7
        + control_batch(10, producer_id=7, abort=False)
        + plain_batch(11, 1)
    )
    table = records_to_table(blob, 0, aborted_transactions=[(7, 2)])
    assert table.column("kafka_offset").to_pylist() == [0, 1, 4, 5, 8, 9, 11]
    uncommitted = records_to_table(blob, 0)  # no aborted list: control batches still skipped
    assert uncommitted.column("kafka_offset").to_pylist() == [0, 1, 2, 3, 4, 5, 8, 9, 11]


def test_log_append_time_uses_the_batch_max_timestamp() -> None:
    records = [Record(0, 10, None, b"a"), Record(1, 30, None, b"b"), Record(2, 20, None, b"c")]
    blob = build_batch(records, BatchInfo(timestamp_type=1))
    table = records_to_table(blob, 0)
    assert table.column("kafka_timestamp_type").to_pylist() == [1, 1, 1]
    stamp = dt.datetime(1970, 1, 1, 0, 0, 0, 30_000, tzinfo=dt.UTC)
    assert table.column("kafka_timestamp").to_pylist() == [stamp] * 3


def test_a_corrupt_batch_is_an_error() -> None:
    blob = bytearray(plain_batch(0, 3))
    blob[-1] ^= 0xFF
    with pytest.raises(SynthesisError, match="CRC"):
        records_to_table(bytes(blob), 0)


def test_a_v1_batch_is_an_error() -> None:
    blob = bytearray(plain_batch(0, 1))
    blob[MAGIC_OFFSET] = 1
    with pytest.raises(SynthesisError, match="magic 2"):
        records_to_table(bytes(blob), 0)


# --------------------------------------------------------------------------- Parquet + DataFile


def test_parquet_keeps_field_ids_and_reads_back_equal() -> None:
    blob = plain_batch(0, 4) + plain_batch(4, 4)
    table = records_to_table(blob, 2)
    data = parquet_bytes(table)
    arrow = pq.read_table(io.BytesIO(data))  # no stored Arrow schema: ids come from Parquet
    for name in ROW_ARROW_SCHEMA.names:
        field_id = arrow.schema.field(name).metadata[b"PARQUET:field_id"]
        assert field_id == ROW_ARROW_SCHEMA.field(name).metadata[b"PARQUET:field_id"]
    element = arrow.schema.field("kafka_headers").type.value_field
    assert element.metadata[b"PARQUET:field_id"] == b"8"
    assert element.type.field("key").metadata[b"PARQUET:field_id"] == b"9"
    assert element.type.field("value").metadata[b"PARQUET:field_id"] == b"10"
    assert arrow.cast(ROW_ARROW_SCHEMA).equals(table)


def test_hotset_layout_cuts_row_groups_by_row_count_alike_for_a_slice_and_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bergstream.plugins.isk_gateway.files import hotset_layout

    monkeypatch.setattr(hotset_layout, "ROW_GROUP_ROWS", 4)
    blob = b"".join(plain_batch(base, 5) for base in range(0, 30, 5))
    wide = records_to_table(blob, 1)
    sliced = wide.slice(0, 10)  # what the indexer writes: a cut of a wider fetch
    fresh = records_to_table(blob, 1, 0, 10)  # what a rebuild from the key decodes
    written = hotset_layout.parquet_layout(sliced)
    assert bytes(written) == bytes(hotset_layout.parquet_layout(fresh))
    metadata = pq.ParquetFile(io.BytesIO(written)).metadata
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [4, 4, 2]
    assert pq.read_table(io.BytesIO(written)).cast(ROW_ARROW_SCHEMA).equals(fresh)


def _payload_rows(values: list[bytes], first: int = 0, slice_from: int | None = None) -> pa.Table:
    """Rows whose keys and values are ``values``, decoded from record batches from offset
    ``first`` on; or, with ``slice_from``, all decoded and then sliced from there (a slice of
    a wider decode, as the indexer writes)."""
    records = [
        Record(i, 7 + i, value[:16], value, (("h", b"v"),)) for i, value in enumerate(values)
    ]
    blob = build_batch(records, BatchInfo(base_offset=0))
    if slice_from is not None:
        return records_to_table(blob, 0).slice(slice_from)
    return records_to_table(blob, 0, first, len(values))


def _codecs(data: bytes | memoryview) -> dict[str, str]:
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    return {
        metadata.column(i).path_in_schema: metadata.column(i).compression
        for i in range(metadata.num_columns)
    }


def test_values_the_codec_cannot_shrink_are_written_uncompressed() -> None:
    import os

    random_values = [os.urandom(1024) for _ in range(300)]
    table = _payload_rows(random_values)
    codecs = _codecs(parquet_bytes(table, "snappy"))
    assert codecs["kafka_value"] == "UNCOMPRESSED"
    assert codecs["kafka_key"] == "UNCOMPRESSED"  # 16 random bytes each
    assert {codecs[c] for c in codecs if c not in ("kafka_value", "kafka_key")} == {"SNAPPY"}
    assert (
        pq.read_table(io.BytesIO(parquet_bytes(table, "zstd"))).cast(ROW_ARROW_SCHEMA).equals(table)
    )
    # Compressible values keep the codec; a table too small to judge keeps it too.
    text = [b"order %d shipped to warehouse north, status ok; " % i * 20 for i in range(300)]
    assert set(_codecs(parquet_bytes(_payload_rows(text), "zstd")).values()) == {"ZSTD"}
    assert set(_codecs(parquet_bytes(_payload_rows(random_values[:2]), "snappy")).values()) == {
        "SNAPPY"
    }
    assert set(_codecs(parquet_bytes(table, "none")).values()) == {"UNCOMPRESSED"}


def test_the_codec_choice_depends_on_the_rows_alone() -> None:
    import os

    from bergstream.plugins.isk_gateway.files.hotset_layout import parquet_layout

    values = [b"a" * 900] * 400 + [os.urandom(900) for _ in range(400)]
    whole = _payload_rows(values)
    sliced = _payload_rows(values, slice_from=400)  # the sample starts where the rows do
    rebuilt = _payload_rows(values, first=400)  # what a rebuild from the key decodes
    assert _codecs(parquet_layout(whole))["kafka_value"] == "SNAPPY"
    assert bytes(parquet_layout(sliced)) == bytes(parquet_layout(rebuilt))
    assert _codecs(parquet_layout(sliced))["kafka_value"] == "UNCOMPRESSED"


def test_data_file_stats_bounds_partition_and_size() -> None:
    day = 20_000
    records = [Record(100 + i, day * _DAY_MS + i * 1000, b"k", b"v") for i in range(10)]
    blob = build_batch(records, BatchInfo(base_offset=100))
    synthesized = synthesize_data_file("s3://b/t/p.parquet", blob, 4, 102, 108)
    data_file = synthesized.data_file
    assert data_file.record_count == 6
    assert data_file.file_size_in_bytes == len(synthesized.parquet)
    assert data_file.file_path == "s3://b/t/p.parquet"
    assert struct.unpack("<q", data_file.lower_bounds[2])[0] == 102
    assert struct.unpack("<q", data_file.upper_bounds[2])[0] == 107
    ts_low = struct.unpack("<q", data_file.lower_bounds[3])[0]
    assert ts_low == (day * _DAY_MS + 2000) * 1000
    assert data_file.partition[0] == 4 and data_file.partition[1] == day
    assert data_file.null_value_counts[7] == 0
    assert data_file.sort_order_id == 1 and data_file.spec_id == 0


def test_rows_of_several_days_need_a_day() -> None:
    records = [Record(0, 0, None, b"a"), Record(1, _DAY_MS + 5, None, b"b")]
    blob = build_batch(records, BatchInfo())
    with pytest.raises(SynthesisError, match="span days"):
        synthesize_data_file("p", blob, 0)
    second = synthesize_data_file("p", blob, 0, day=1)
    assert second.data_file.record_count == 1 and second.data_file.partition[1] == 1
    table = pq.read_table(io.BytesIO(second.parquet))
    assert table.column("kafka_offset").to_pylist() == [1]


# --------------------------------------------------------------------------- read by PyIceberg


def test_pyiceberg_reads_a_synthesized_file_through_its_data_file(tmp_path: Path) -> None:
    """The DataFile as synthesized (no re-scan) goes into a real table: scans return the rows,
    and an offset filter prunes the file by its stats."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.expressions import GreaterThanOrEqual

    catalog = SqlCatalog(
        "isk", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path}"
    )
    catalog.create_namespace("hot")
    table = catalog.create_table(
        "hot.t", ROW_SCHEMA, partition_spec=PARTITION_SPEC, sort_order=SORT_ORDER
    )
    day = 20_000
    records = [Record(i, day * _DAY_MS + i, b"k%d" % i, b"v", (("h", None),)) for i in range(20)]
    blob = build_batch(records, BatchInfo(compression_type=1))
    path = f"file://{tmp_path}/data/t-0-0-20.parquet"
    synthesized = synthesize_data_file(path, blob, 0)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t-0-0-20.parquet").write_bytes(synthesized.parquet)
    with (
        table.transaction() as transaction,
        transaction.update_snapshot().fast_append() as append,
    ):
        append.append_data_file(synthesized.data_file)
    table = catalog.load_table("hot.t")
    rows = table.scan().to_arrow().sort_by("kafka_offset").to_pylist()
    assert rows == [record_to_row(0, record, 0) for record in records]
    assert (
        len(list(table.scan(row_filter=GreaterThanOrEqual("kafka_offset", 20)).plan_files())) == 0
    )
    assert (
        len(list(table.scan(row_filter=GreaterThanOrEqual("kafka_offset", 19)).plan_files())) == 1
    )
