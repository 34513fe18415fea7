"""The compiled record batch decoder: malformed bytes give a clear error, never a crash or a
wrong row, and batch boundaries are found without decoding records."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bergstream.core.kafka_wire.record_batch import (
    HEADER_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    write_crc,
    write_field,
)
from bergstream.core.records import BatchInfo, Record, build_batch, read_records
from bergstream.core.typed.row_contract import record_to_row
from bergstream.plugins.isk_gateway.files.batch_decoder import (
    SynthesisError,
    batch_bounds,
    decode_batches,
)


def with_body(batch: bytes, body: bytes) -> bytes:
    """``batch`` with its records replaced by ``body``, length and CRC made right again, so
    only the records can be wrong."""
    out = bytearray(batch[:HEADER_SIZE] + body)
    write_field(out, LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    write_crc(out)
    return bytes(out)


def sample_batch() -> bytes:
    records = [
        Record(0, 10, b"key", b"value", (("h", b"1"), ("h2", None))),
        Record(1, 11, None, None),
        Record(2, 12, b"", b"", (("", b""),)),
    ]
    return build_batch(records, BatchInfo(base_offset=0))


def aiokafka_rows(blob: bytes, partition: int) -> list[dict]:
    """Rows of ``blob`` from aiokafka's own parser, the reference."""
    timestamp_type = DefaultRecordBatch(blob).timestamp_type
    return [record_to_row(partition, record, timestamp_type) for record in read_records(blob)]


def test_a_well_formed_batch_equals_aiokafka_parse() -> None:
    blob = sample_batch()
    assert decode_batches(blob, 4).to_pylist() == aiokafka_rows(blob, 4)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (1, "bytes after its last record|runs past"),
        (5, "runs past"),
    ],
)
def test_a_record_cut_short_is_named(cut: int, message: str) -> None:
    batch = sample_batch()
    body = batch[HEADER_SIZE:-cut]
    with pytest.raises(SynthesisError, match=message):
        decode_batches(with_body(batch, body), 0)


def test_bytes_after_the_last_record_are_an_error() -> None:
    batch = sample_batch()
    with pytest.raises(SynthesisError, match="bytes after its last record"):
        decode_batches(with_body(batch, batch[HEADER_SIZE:] + b"\x00"), 0)


def test_a_key_longer_than_its_record_is_an_error() -> None:
    # length 4, attributes, timestamp delta 0, offset delta 0, key length 2**40 (varint)
    body = bytes([8, 0, 0, 0]) + b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"
    body = bytes([len(body) * 2]) + body[1:]
    batch = build_batch([Record(0, 0, None, b"v")], BatchInfo(base_offset=0))
    with pytest.raises(SynthesisError, match="malformed record batch"):
        decode_batches(with_body(batch, body), 0)


def test_a_header_key_that_is_not_utf8_is_an_error() -> None:
    batch = build_batch([Record(0, 0, None, b"v", (("ab", b"x"),))], BatchInfo(base_offset=0))
    spoiled = batch.replace(b"\x04ab", b"\x04\xff\xfe")  # header key "ab" -> invalid UTF-8
    assert spoiled != batch
    with pytest.raises(SynthesisError, match="not UTF-8"):
        decode_batches(with_body(spoiled, spoiled[HEADER_SIZE:]), 0)


def test_batch_bounds_lists_complete_batches_only() -> None:
    first = build_batch([Record(5, 0, None, b"a")], BatchInfo(base_offset=5))
    second = build_batch([Record(6, 0, None, b"b")], BatchInfo(base_offset=6))
    base_offsets, next_offsets, ends = batch_bounds(first + second + second[:30])
    assert base_offsets.tolist() == [5, 6]
    assert next_offsets.tolist() == [6, 7]
    assert ends.tolist() == [len(first), len(first) + len(second)]


def _varint(body: bytes, pos: int, end: int) -> tuple[int, int]:
    raw = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("varint")
        byte = body[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def _field(body: bytes, pos: int, end: int, nullable: bool = True) -> tuple[bytes | None, int]:
    length, pos = _varint(body, pos, end)
    if length < 0:
        if not nullable:
            raise ValueError("negative length")
        return None, pos
    if pos + length > end:
        raise ValueError("past the record")
    return body[pos : pos + length], pos + length


def spec_rows(body: bytes, count: int) -> list[dict]:
    """The records of a batch body read by the letter of Kafka's record format (attributes are
    one byte, as Java reads them; aiokafka reads them as a varint): an independent oracle."""
    rows, pos = [], 0
    for _ in range(count):
        length, pos = _varint(body, pos, len(body))
        if length < 1 or pos + length > len(body):
            raise ValueError("record length")
        end = pos + length
        delta, pos = _varint(body, pos + 1, end)
        offset, pos = _varint(body, pos, end)
        key, pos = _field(body, pos, end)
        value, pos = _field(body, pos, end)
        header_count, pos = _varint(body, pos, end)
        if header_count < 0:
            raise ValueError("header count")
        headers = []
        for _h in range(header_count):
            name, pos = _field(body, pos, end, nullable=False)
            header_value, pos = _field(body, pos, end)
            headers.append((bytes(name).decode(), header_value))
        if pos != end:
            raise ValueError("record fields do not add up")
        rows.append(record_to_row(0, Record(offset, 10 + delta, key, value, tuple(headers)), 0))
    if pos != len(body):
        raise ValueError("bytes after the last record")
    return rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_spoiled_record_bytes_decode_as_the_record_format_says(data: st.DataObject) -> None:
    """Random edits of the records (CRC fixed so they reach the decoder) never crash the
    process or raise anything but SynthesisError, and give exactly the rows (or the refusal)
    of a plain reading of Kafka's record format."""
    batch = sample_batch()
    body = bytearray(batch[HEADER_SIZE:])
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if kind == "flip" and body:
            body[at] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del body[at : at + data.draw(st.integers(1, 8))]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    blob = with_body(batch, bytes(body))
    try:
        expected = spec_rows(bytes(body), 3)
    except (ValueError, UnicodeDecodeError):
        expected = None
    try:
        table = decode_batches(blob, 0, start_offset=-(2**63))  # spoiled offsets kept too
    except SynthesisError:
        assert expected is None
        return
    assert table.to_pylist() == expected


def test_warm_up_decodes_its_own_batch() -> None:
    from bergstream.plugins.isk_gateway.files.batch_decoder import warm_up

    warm_up()  # raises SynthesisError if its hand-made batch were wrong
