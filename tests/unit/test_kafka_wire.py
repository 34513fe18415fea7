"""Kafka's wire format as core.kafka_wire writes it down, checked against sources that do not
share its code: kio's schema index for the API keys, aiokafka's record batch codec and the
header format of Kafka's protocol guide for the batch layout, and the standard check value
for CRC-32C."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.index import api_key_map

from bergstream.core.kafka_wire import record_batch as rb
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.kafka_wire.crc import crc32c

#: The v2 header as Kafka's protocol guide lists it, field by field (base_offset ... records_count).
GUIDE_HEADER = struct.Struct(">qiibIhiqqqhii")
#: Header fields in order, as (offset, length) pairs of the module under test.
FIELDS = [
    (rb.BASE_OFFSET_OFFSET, rb.BASE_OFFSET_LENGTH),
    (rb.LENGTH_OFFSET, rb.LENGTH_LENGTH),
    (rb.PARTITION_LEADER_EPOCH_OFFSET, rb.PARTITION_LEADER_EPOCH_LENGTH),
    (rb.MAGIC_OFFSET, rb.MAGIC_LENGTH),
    (rb.CRC_OFFSET, rb.CRC_LENGTH),
    (rb.ATTRIBUTES_OFFSET, rb.ATTRIBUTES_LENGTH),
    (rb.LAST_OFFSET_DELTA_OFFSET, rb.LAST_OFFSET_DELTA_LENGTH),
    (rb.BASE_TIMESTAMP_OFFSET, rb.BASE_TIMESTAMP_LENGTH),
    (rb.MAX_TIMESTAMP_OFFSET, rb.MAX_TIMESTAMP_LENGTH),
    (rb.PRODUCER_ID_OFFSET, rb.PRODUCER_ID_LENGTH),
    (rb.PRODUCER_EPOCH_OFFSET, rb.PRODUCER_EPOCH_LENGTH),
    (rb.BASE_SEQUENCE_OFFSET, rb.BASE_SEQUENCE_LENGTH),
    (rb.RECORDS_COUNT_OFFSET, rb.RECORDS_COUNT_LENGTH),
]


def aiokafka_batch(compression: int = 0) -> bytearray:
    """A transactional batch of three records built by aiokafka, distinct values in every
    header field, base offset 1000 and leader epoch 9 written by hand."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=1,
        producer_id=123_456_789_012,
        producer_epoch=7,
        base_sequence=42,
        batch_size=2**31 - 1,
    )
    builder.append(0, timestamp=1_000, key=b"k", value=b"v", headers=[])
    builder.append(2, timestamp=900, key=None, value=b"w", headers=[("h", b"x")])
    builder.append(5, timestamp=1_500, key=b"k2", value=None, headers=[])
    out = builder.build()
    struct.pack_into(">q", out, 0, 1_000)  # base offset: aiokafka always writes 0
    struct.pack_into(">i", out, 12, 9)  # partition leader epoch: aiokafka always writes -1
    return out


def test_api_keys_are_kios_apis_with_kafkas_names() -> None:
    assert {key.value: key.name.lower() for key in ApiKey} == dict(api_key_map)
    # The ids of the Kafka protocol guide, independent of kio.
    assert (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA) == (0, 1, 2, 3)
    assert (ApiKey.FIND_COORDINATOR, ApiKey.API_VERSIONS, ApiKey.DESCRIBE_CLUSTER) == (10, 18, 60)
    assert struct.pack(">h", ApiKey.FETCH) == b"\x00\x01"
    assert {ApiKey.METADATA: "m"}.get(3) == "m"  # a raw key finds an enum-keyed entry


def test_the_header_fields_follow_each_other_as_the_protocol_guide_lists_them() -> None:
    sizes = [struct.calcsize(">" + code) for code in "qiibIhiqqqhii"]
    assert [length for _, length in FIELDS] == sizes
    assert [offset for offset, _ in FIELDS] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert rb.HEADER_SIZE == GUIDE_HEADER.size == 61
    assert (rb.LOG_OVERHEAD, rb.MIN_LENGTH, rb.CRC_START, rb.MAGIC_V2) == (12, 49, 21, 2)


def test_read_field_reads_what_aiokafka_wrote() -> None:
    batch = aiokafka_batch()
    values = [rb.read_field(batch, offset) for offset, _ in FIELDS]
    assert values == list(GUIDE_HEADER.unpack_from(batch))
    parsed = DefaultRecordBatch(bytes(batch))
    assert rb.read_field(batch, rb.BASE_OFFSET_OFFSET) == parsed.base_offset == 1_000
    assert rb.read_field(batch, rb.LENGTH_OFFSET) + rb.LOG_OVERHEAD == len(batch)
    assert rb.read_field(batch, rb.PARTITION_LEADER_EPOCH_OFFSET) == 9
    assert rb.read_field(batch, rb.MAGIC_OFFSET) == parsed.magic == rb.MAGIC_V2
    assert rb.read_field(batch, rb.CRC_OFFSET) == parsed.crc
    assert rb.read_field(batch, rb.ATTRIBUTES_OFFSET) == parsed.attributes
    assert rb.read_field(batch, rb.LAST_OFFSET_DELTA_OFFSET) == parsed.last_offset_delta == 5
    assert rb.read_field(batch, rb.BASE_TIMESTAMP_OFFSET) == parsed.first_timestamp == 1_000
    assert rb.read_field(batch, rb.MAX_TIMESTAMP_OFFSET) == parsed.max_timestamp == 1_500
    assert rb.read_field(batch, rb.PRODUCER_ID_OFFSET) == parsed.producer_id == 123_456_789_012
    assert rb.read_field(batch, rb.PRODUCER_EPOCH_OFFSET) == parsed.producer_epoch == 7
    assert rb.read_field(batch, rb.BASE_SEQUENCE_OFFSET) == parsed.base_sequence == 42
    assert rb.read_field(batch, rb.RECORDS_COUNT_OFFSET) == 3
    second = bytes(8) + batch  # a batch further into a blob
    assert rb.read_field(second, rb.PRODUCER_ID_OFFSET, 8) == 123_456_789_012


def test_attribute_bits_mean_what_aiokafka_reads_from_them() -> None:
    assert rb.CompressionType.NONE == DefaultRecordBatch.CODEC_NONE
    assert rb.CompressionType.GZIP == DefaultRecordBatch.CODEC_GZIP
    assert rb.CompressionType.SNAPPY == DefaultRecordBatch.CODEC_SNAPPY
    assert rb.CompressionType.LZ4 == DefaultRecordBatch.CODEC_LZ4
    assert rb.CompressionType.ZSTD == DefaultRecordBatch.CODEC_ZSTD
    assert rb.COMPRESSION_CODEC_MASK == DefaultRecordBatch.CODEC_MASK
    batch = aiokafka_batch(compression=rb.CompressionType.GZIP)
    attributes = rb.read_field(batch, rb.ATTRIBUTES_OFFSET)
    assert attributes & rb.COMPRESSION_CODEC_MASK == rb.CompressionType.GZIP
    assert attributes & rb.TRANSACTIONAL_FLAG_MASK
    assert not attributes & (rb.TIMESTAMP_TYPE_MASK | rb.CONTROL_FLAG_MASK)
    rb.write_field(
        batch, rb.ATTRIBUTES_OFFSET, attributes | rb.TIMESTAMP_TYPE_MASK | rb.CONTROL_FLAG_MASK
    )
    parsed = DefaultRecordBatch(bytes(batch))
    assert parsed.timestamp_type == 1 and parsed.is_control_batch and parsed.is_transactional
    assert parsed.compression_type == rb.CompressionType.GZIP


@pytest.mark.parametrize(("offset", "length"), FIELDS)
def test_write_field_round_trips_the_extremes_of_its_width(offset: int, length: int) -> None:
    batch = bytearray(rb.HEADER_SIZE + 4)
    bits = 8 * length
    signed = offset != rb.CRC_OFFSET  # the CRC alone is unsigned
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    for value in (low, high):
        rb.write_field(batch, offset, value, position=4)
        assert rb.read_field(batch, offset, position=4) == value
        assert batch[:4] == bytes(4)  # nothing before the batch's position is touched
    with pytest.raises(struct.error):
        rb.write_field(batch, offset, high + 1)


def test_write_crc_seals_an_edited_batch() -> None:
    batch = aiokafka_batch()
    assert DefaultRecordBatch(bytes(batch)).validate_crc()
    rb.write_field(batch, rb.LAST_OFFSET_DELTA_OFFSET, 7)
    assert not DefaultRecordBatch(bytes(batch)).validate_crc()
    rb.write_crc(batch)
    assert DefaultRecordBatch(bytes(batch)).validate_crc()
    larger = bytearray(b"ab" + batch + b"yz")
    view = memoryview(larger)[2:-2]  # a batch inside a larger buffer, edited in place
    rb.write_field(view, rb.LAST_OFFSET_DELTA_OFFSET, 8)
    rb.write_crc(view)
    assert DefaultRecordBatch(bytes(larger[2:-2])).validate_crc()
    assert larger[:2] == b"ab" and larger[-2:] == b"yz"


def test_batch_end_finds_complete_batches_only() -> None:
    batch = bytes(aiokafka_batch())
    blob = batch + batch + batch[:40]
    assert rb.batch_end(blob) == len(batch)
    assert rb.batch_end(blob, len(batch)) == 2 * len(batch)
    assert rb.batch_end(blob, 2 * len(batch)) is None  # cut mid-batch, as fetches may be
    assert rb.batch_end(batch[:16]) is None  # not even a magic byte
    assert rb.batch_end(batch, len(batch)) is None
    too_short = bytearray(batch)
    rb.write_field(too_short, rb.LENGTH_OFFSET, rb.MIN_LENGTH - 1)
    assert rb.batch_end(too_short) is None
    header_only = bytearray(batch[: rb.HEADER_SIZE])
    rb.write_field(header_only, rb.LENGTH_OFFSET, rb.MIN_LENGTH)
    assert rb.batch_end(header_only) == rb.HEADER_SIZE


def test_control_record_keys() -> None:
    assert rb.control_record_key(rb.ControlRecordType.ABORT) == b"\x00\x00\x00\x00"
    assert rb.control_record_key(rb.ControlRecordType.COMMIT) == b"\x00\x00\x00\x01"
    assert rb.control_record_type(b"\x00\x00\x00\x01") == rb.ControlRecordType.COMMIT
    assert rb.control_record_type(b"\x00\x01\x00\x00extra") == rb.ControlRecordType.ABORT
    assert rb.control_record_type(b"\x00\x00\x00") is None
    assert rb.control_record_type(None) is None


def test_crc32c_has_the_standard_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C (Castagnoli)


@given(st.binary(max_size=3000), st.integers(0, 50))
def test_crc32c_agrees_with_aiokafka_on_any_buffer(data: bytes, skip: int) -> None:
    expected = calc_crc32c(data[skip:])
    assert crc32c(data[skip:]) == expected
    assert crc32c(memoryview(data)[skip:]) == expected
    assert crc32c(bytearray(data)[skip:]) == expected
    assert crc32c(np.frombuffer(data, dtype=np.uint8)[skip:]) == expected
