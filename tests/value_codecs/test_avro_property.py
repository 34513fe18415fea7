"""Property tests of the Avro codec against fastavro, the reference: generated schemas and values
encoded by fastavro decode to the same values (normalized as :mod:`tests.kits.avro_gen` says), are
all canonical, and encode back to fastavro's bytes; the same values written with the liberties Avro
allows (:mod:`tests.kits.avro_noncanonical`) decode alike with ``keep_bytes`` set exactly when one
was taken; random mutations of the payloads either fail with a cause (null row, bytes kept) or
decode with ``keep_bytes`` exactly when re-encoding differs from the payload.

``AVRO_EXAMPLES`` sets the number of examples (60 by default)."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bergstream.core.api import RegisteredSchema
from bergstream.plugins.value_codecs.avro.codec import AvroCodec
from bergstream.plugins.value_codecs.avro.ops import ERRORS
from bergstream.plugins.value_codecs.avro.schema import parse_avro
from tests.kits.avro_gen import avro_schemas, from_arrow, from_fastavro, values_of
from tests.kits.avro_noncanonical import LiberalWriter

CODEC = AvroCodec()
SETTINGS = settings(
    max_examples=int(__import__("os").environ.get("AVRO_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _fastavro_bytes(schema: dict[str, Any], values: list[Any]) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for value in values:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, value)
        out.append(buffer.getvalue())
    return out


def _fastavro_read(schema: dict[str, Any], payload: bytes) -> Any:
    parsed = fastavro.parse_schema(schema)
    return fastavro.schemaless_reader(io.BytesIO(payload), parsed, None, return_named_type=True)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[RegisteredSchema, dict[str, Any], list[Any]]:
    schema = draw(avro_schemas())
    registered = RegisteredSchema(1, "AVRO", json.dumps(schema))
    node = parse_avro(registered)
    values = draw(st.lists(values_of(node), min_size=1, max_size=6))
    return registered, schema, values


@SETTINGS
@given(_cases())
def test_decodes_like_fastavro_and_encodes_its_bytes(case: tuple) -> None:
    registered, schema, values = case
    node = parse_avro(registered)
    payloads = _fastavro_bytes(schema, values)
    decoded = CODEC.decode(registered, pa.array(payloads, pa.large_binary()))
    decoded.values.validate(full=True)
    assert decoded.values.type == CODEC.arrow_type(registered)
    assert decoded.errors == [None] * len(payloads)
    assert not decoded.keep_bytes.any()
    ours = [from_arrow(node, v) for v in decoded.values.to_pylist()]
    theirs = [from_fastavro(node, _fastavro_read(schema, p)) for p in payloads]
    assert ours == theirs
    encoded = CODEC.encode(registered, decoded.values)
    assert encoded.type == pa.large_binary()
    assert encoded.to_pylist() == payloads


@st.composite
def _mutations(draw: st.DrawFn) -> tuple[RegisteredSchema, list[bytes]]:
    registered, schema, values = draw(_cases())
    payloads = _fastavro_bytes(schema, values)
    mutated = []
    for payload in payloads:
        data = bytearray(payload)
        for _ in range(draw(st.integers(0, 3))):
            action = draw(st.sampled_from(["flip", "insert", "delete", "append", "cut"]))
            at = draw(st.integers(0, len(data)))
            byte = draw(st.integers(0, 255))
            if action == "flip" and at < len(data):
                data[at] = byte
            elif action == "insert":
                data.insert(at, byte)
            elif action == "delete" and at < len(data):
                del data[at]
            elif action == "append":
                data.append(byte)
            elif action == "cut":
                del data[at:]
        mutated.append(bytes(data))
    return registered, mutated + payloads


@SETTINGS
@given(_mutations())
def test_keep_bytes_is_exactly_non_canonical(case: tuple[RegisteredSchema, list[bytes]]) -> None:
    registered, payloads = case
    decoded = CODEC.decode(registered, pa.array(payloads, pa.large_binary()))
    decoded.values.validate(full=True)
    ok = [i for i, error in enumerate(decoded.errors) if error is None]
    for i, error in enumerate(decoded.errors):
        if error is not None:
            assert error in ERRORS.values()
            assert decoded.keep_bytes[i]
            assert not decoded.values[i].is_valid
    if ok:
        encoded = CODEC.encode(registered, decoded.values.take(pa.array(ok))).to_pylist()
        for i, again in zip(ok, encoded, strict=True):
            assert bool(decoded.keep_bytes[i]) == (again != payloads[i]), (i, payloads[i], again)


@st.composite
def _liberal(draw: st.DrawFn) -> tuple[RegisteredSchema, dict[str, Any], list[Any], list]:
    registered, schema, values = draw(_cases())
    node = parse_avro(registered)
    written = []
    for value in values:
        writer = LiberalWriter(draw)
        writer.write(node, value)
        written.append((bytes(writer.out), writer.odd))
    return registered, schema, values, written


@SETTINGS
@given(_liberal())
def test_liberal_encodings_decode_alike_and_keep_their_bytes(case: tuple) -> None:
    registered, schema, values, written = case
    canonical = _fastavro_bytes(schema, values)
    for (payload, odd), expected in zip(written, canonical, strict=True):
        assert odd or payload == expected  # the test's writer agrees with fastavro
    count = len(values)
    payloads = [payload for payload, _ in written] + canonical
    decoded = CODEC.decode(registered, pa.array(payloads, pa.large_binary()))
    decoded.values.validate(full=True)
    assert decoded.errors == [None] * 2 * count
    assert decoded.keep_bytes.tolist() == [odd for _, odd in written] + [False] * count
    liberal, strict = decoded.values.slice(0, count), decoded.values.slice(count)
    assert liberal.to_pylist() == strict.to_pylist()
    assert CODEC.encode(registered, liberal).to_pylist() == canonical
