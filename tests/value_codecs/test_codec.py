"""The codecs as the pipeline, ISK and KSI use them: registration, pickling, batches that
outgrow the first guess of their size, sliced and chunked inputs, the raw codec."""

from __future__ import annotations

import io
import json
import pickle
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from bergstream.core.api import (
    EmptyConfig,
    RegisteredSchema,
    SchemaNotExpressible,
    SchemaReference,
    ServiceContext,
)
from bergstream.core.plugins import load_registry
from bergstream.plugins.value_codecs import plugin
from bergstream.plugins.value_codecs.avro.codec import AvroCodec
from bergstream.plugins.value_codecs.raw import RawCodec

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"]},
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [
                        {"name": "sku", "type": "string"},
                        {"name": "tags", "type": {"type": "map", "values": "string"}},
                    ],
                },
            },
        },
    ],
}
REGISTERED = RegisteredSchema(11, "AVRO", json.dumps(SCHEMA))


def _orders(count: int, seed: int = 5) -> tuple[list[dict[str, Any]], list[bytes]]:
    rnd = random.Random(seed)
    parsed = fastavro.parse_schema(SCHEMA)
    values, payloads = [], []
    for i in range(count):
        value = {
            "id": i,
            "note": None if i % 3 else "n" * rnd.randint(0, 3000),
            "lines": [
                {
                    "sku": f"sku-{j}" * rnd.randint(1, 50),
                    "tags": {f"t{k}": "v" * k for k in range(rnd.randint(0, 6))},
                }
                for j in range(rnd.randint(0, 12))
            ],
        }
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, value)
        values.append(value)
        payloads.append(buffer.getvalue())
    return values, payloads


def _as_python(value: dict[str, Any]) -> dict[str, Any]:
    lines = [{"sku": line["sku"], "tags": dict(line["tags"])} for line in value["lines"]]
    return {"id": value["id"], "note": value["note"], "lines": lines}


def test_plugin_registers_raw_and_avro(tmp_path: Path) -> None:
    registry = load_registry([plugin], entry_points=False)
    context = ServiceContext(config=None, plugins=registry, home=tmp_path)  # type: ignore[arg-type]
    for name, kind, types in (("raw", RawCodec, ()), ("avro", AvroCodec, ("AVRO",))):
        registration = registry.get("value codec", name)
        assert registration.config_model is EmptyConfig
        codec = registration.factory(EmptyConfig(), context)
        assert isinstance(codec, kind) and codec.schema_types == types


def test_batches_outgrowing_their_first_guess() -> None:
    codec = AvroCodec()
    for seed, count in ((1, 50), (2, 3000), (3, 10)):
        values, payloads = _orders(count, seed)
        decoded = codec.decode(REGISTERED, pa.array(payloads, pa.large_binary()))
        decoded.values.validate(full=True)
        assert not decoded.keep_bytes.any() and decoded.errors == [None] * count
        assert [_as_python(v) for v in decoded.values.to_pylist()] == values
        assert codec.encode(REGISTERED, decoded.values).to_pylist() == payloads


def test_sliced_chunked_and_small_binary_inputs() -> None:
    codec = AvroCodec()
    values, payloads = _orders(40)
    whole = pa.array(payloads, pa.binary())  # not large: cast by the codec
    sliced = whole.slice(7, 20)
    decoded = codec.decode(REGISTERED, sliced)
    assert [_as_python(v) for v in decoded.values.to_pylist()] == values[7:27]
    chunked = pa.chunked_array([whole.slice(0, 10), whole.slice(10)])
    assert len(codec.decode(REGISTERED, chunked).values) == 40
    all_values = codec.decode(REGISTERED, whole).values
    encoded = codec.encode(REGISTERED, all_values.slice(13, 9))
    assert encoded.to_pylist() == payloads[13:22]
    parts = pa.chunked_array([all_values.slice(0, 5), all_values.slice(5)])
    assert codec.encode(REGISTERED, parts).to_pylist() == payloads
    with pytest.raises(ValueError, match="must not be null"):
        codec.decode(REGISTERED, pa.array([payloads[0], None], pa.large_binary()))


def test_encode_ignores_elements_under_null_lists() -> None:
    # Arrow lets a null list entry span elements; they are not part of the value.
    type_ = ["null", {"type": "array", "items": "long"}]
    record = {"type": "record", "name": "W", "fields": [{"name": "v", "type": type_}]}
    schema = RegisteredSchema(3, "AVRO", json.dumps(record))
    codec = AvroCodec()
    field = codec.arrow_type(schema).field(0)
    offsets = pa.array([0, 2, 3], pa.int64())
    lists = pa.LargeListArray.from_arrays(
        offsets, pa.array([1, 2, 3], pa.int64()), type=field.type, mask=pa.array([True, False])
    )
    rows = pa.StructArray.from_arrays([lists], fields=[field])
    assert codec.encode(schema, rows).to_pylist() == [b"\x00", b"\x02\x02\x06\x00"]
    # A value whose schema is nullable may itself be null.
    nullable = RegisteredSchema(2, "AVRO", json.dumps(type_))
    assert codec.encode(nullable, lists).to_pylist() == [b"\x00", b"\x02\x02\x06\x00"]
    with pytest.raises(ValueError, match="must not be null"):
        codec.encode(schema, pa.array([None, {"v": None}], codec.arrow_type(schema)))


def test_pickled_codec_decodes_with_resolved_references() -> None:
    currency = {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}
    registry = {("currency", 1): RegisteredSchema(3, "AVRO", json.dumps(currency))}
    payment = {
        "type": "record",
        "name": "Payment",
        "fields": [{"name": "amount", "type": "long"}, {"name": "c", "type": "Currency"}],
    }
    schema = RegisteredSchema(
        9, "AVRO", json.dumps(payment), (SchemaReference("Currency", "currency", 1),)
    )
    codec = AvroCodec()
    codec.iceberg_type(schema, lambda ref: registry[(ref.subject, ref.version)])
    clone = pickle.loads(pickle.dumps(codec))
    assert clone._schemas._compiled == {}  # compiled programs are not shipped
    payloads = pa.array([b"\x02\x02", b"\x04\x00"], pa.large_binary())
    decoded = clone.decode(schema, payloads)
    assert decoded.values.to_pylist() == [{"amount": 1, "c": "USD"}, {"amount": 2, "c": "EUR"}]
    assert clone.encode(schema, decoded.values).to_pylist() == [b"\x02\x02", b"\x04\x00"]
    with pytest.raises(SchemaNotExpressible, match="no resolver"):
        AvroCodec().decode(schema, payloads)


def test_raw_codec_is_the_identity() -> None:
    raw = RawCodec()
    with pytest.raises(SchemaNotExpressible):
        raw.iceberg_type(REGISTERED, lambda ref: REGISTERED)
    payloads = pa.array([b"a", b"", b"\x00\x01"], pa.large_binary()).slice(1)
    decoded = raw.decode(REGISTERED, payloads)
    assert decoded.values.to_pylist() == [b"", b"\x00\x01"]
    assert decoded.keep_bytes.tolist() == [False, False] and decoded.errors == [None, None]
    assert raw.encode(REGISTERED, decoded.values).to_pylist() == [b"", b"\x00\x01"]
    assert pickle.loads(pickle.dumps(raw)).schema_types == ()


def test_keep_bytes_is_a_bool_array() -> None:
    decoded = AvroCodec().decode(REGISTERED, pa.array([b"\x00"], pa.large_binary()))
    assert decoded.keep_bytes.dtype == np.bool_


def test_threads_share_one_codec() -> None:
    codec = AvroCodec()
    _, payloads = _orders(300)
    batch = pa.array(payloads, pa.large_binary())
    expected = codec.decode(REGISTERED, batch).values
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: codec.decode(REGISTERED, batch).values, range(8)))
    assert all(result.equals(expected) for result in results)
