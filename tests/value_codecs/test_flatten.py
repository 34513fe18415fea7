"""The encoders' flattening honours slices: a sliced array gives the columns of its own entries,
and encodes to the payloads of the same values unsliced."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from bergstream.core.api import RegisteredSchema
from bergstream.plugins.value_codecs.avro.codec import AvroCodec
from bergstream.plugins.value_codecs.shared.flatten import bits, entries, strings


def test_bits_and_strings_of_a_slice() -> None:
    values = pa.array([f"v{i}" if i % 3 else None for i in range(40)], pa.large_string())
    for start, length in ((0, 40), (5, 11), (13, 0), (17, 23)):
        part = values.slice(start, length)
        valid = bits(part.buffers()[0], part.offset, len(part))
        assert valid.tolist() == [int(v is not None) for v in part.to_pylist()]
        offsets, data = strings(part)
        assert offsets[0] == 0 and len(offsets) == max(length, 0) + 1
        texts = [data[offsets[i] : offsets[i + 1]].tobytes().decode() for i in range(length)]
        assert texts == [v if v is not None else "" for v in part.to_pylist()]


def test_entries_of_a_sliced_list_drop_null_entries() -> None:
    lists = pa.array([[1, 2], None, [3], [], [4, 5, 6]], pa.large_list(pa.int64())).slice(1, 4)
    valid = bits(lists.buffers()[0], lists.offset, len(lists))
    offsets, child = entries(lists, valid)
    assert offsets.tolist() == [0, 0, 1, 1, 4]
    assert child.to_pylist() == [3, 4, 5, 6]


def test_sliced_values_encode_like_the_same_values_unsliced() -> None:
    schema = {
        "type": "record",
        "name": "r",
        "fields": [
            {"name": "s", "type": ["null", "string"]},
            {"name": "b", "type": "boolean"},
            {"name": "l", "type": {"type": "array", "items": "long"}},
        ],
    }
    registered = RegisteredSchema(schema_id=1, schema_type="AVRO", schema=json.dumps(schema))
    codec = AvroCodec()
    codec.iceberg_type(registered, None)
    rows = [
        {"s": None if i % 4 == 0 else f"x{i}", "b": i % 3 == 0, "l": list(range(i % 5))}
        for i in range(50)
    ]
    values = pa.array(rows, codec.arrow_type(registered))
    for start, length in ((3, 20), (9, 1), (31, 19)):
        sliced = codec.encode(registered, values.slice(start, length))
        fresh = codec.encode(registered, pa.array(rows[start : start + length], values.type))
        assert sliced.to_pylist() == fresh.to_pylist()
        decoded = codec.decode(registered, sliced).values.to_pylist()
        assert decoded == rows[start : start + length]
    assert np.all(bits(None, 0, 3) == 1)
