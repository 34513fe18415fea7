"""The ``avro`` codec's vectorized decoder and encoder against fastavro per record, on the same
20-field records of about 300 bytes (7 strings, 6 longs, 4 doubles, a timestamp-millis, a
decimal(12, 2) and a nullable string), all in one run.

Speeds are MB of Avro payload per CPU second (``time.process_time``, so other load on the
machine does not count), best of ``--repeat`` runs; ``x fastavro`` is the ratio to fastavro's
``schemaless_reader`` (or ``schemaless_writer``) called once per record. The numba kernels are
compiled (or loaded from their cache) before timing.

    .venv/bin/python bench/avro_decode.py [--records 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import io
import json
import random
import time
from collections.abc import Callable
from typing import Any

import fastavro
import pyarrow as pa

from bergstream.core.api import RegisteredSchema
from bergstream.plugins.value_codecs.avro.codec import AvroCodec

FIELDS: list[dict[str, Any]] = (
    [{"name": f"text{i}", "type": "string"} for i in range(7)]
    + [{"name": f"count{i}", "type": "long"} for i in range(6)]
    + [{"name": f"ratio{i}", "type": "double"} for i in range(4)]
    + [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ]
)
SCHEMA = {"type": "record", "name": "Payment", "namespace": "bench", "fields": FIELDS}
EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)


def records(count: int, seed: int = 13) -> list[dict[str, Any]]:
    """``count`` random values of :data:`SCHEMA` (about 300 bytes encoded)."""
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    out = []
    for i in range(count):
        value: dict[str, Any] = {
            f"text{k}": "".join(rnd.choices(letters, k=rnd.randint(20, 40))) for k in range(7)
        }
        value.update({f"count{k}": rnd.randint(-(10**12), 10**12) for k in range(6)})
        value.update({f"ratio{k}": rnd.random() * 1000 for k in range(4)})
        value["at"] = EPOCH + datetime.timedelta(milliseconds=rnd.randint(0, 10**10))
        value["amount"] = decimal.Decimal(rnd.randint(-(10**9), 10**9)).scaleb(-2)
        value["note"] = None if i % 3 else "a note of moderate length"
        out.append(value)
    return out


def best_cpu_seconds(run: Callable[[], object], repeat: int) -> float:
    """The least CPU time of ``repeat`` calls of ``run``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    """Print the speeds and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fastavro-records", type=int, default=20_000)
    args = parser.parse_args()

    parsed = fastavro.parse_schema(SCHEMA)
    values = records(args.fastavro_records)
    payloads = []
    for value in values:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, value)
        payloads.append(buffer.getvalue())
    sample_bytes = sum(map(len, payloads))
    copies = -(-args.records // len(payloads))
    batch = pa.array((payloads * copies)[: args.records], pa.large_binary())
    batch_bytes = batch.buffers()[2].size

    codec = AvroCodec()
    schema = RegisteredSchema(1, "AVRO", json.dumps(SCHEMA))
    decoded = codec.decode(schema, batch.slice(0, 1000))  # compile or load the kernels
    codec.encode(schema, decoded.values)
    decoded = codec.decode(schema, batch)
    assert decoded.errors == [None] * len(batch) and not decoded.keep_bytes.any()
    assert codec.encode(schema, decoded.values).equals(batch)

    ours = batch_bytes / best_cpu_seconds(lambda: codec.decode(schema, batch), args.repeat)
    ours_out = batch_bytes / best_cpu_seconds(
        lambda: codec.encode(schema, decoded.values), args.repeat
    )

    def read_all() -> None:
        for payload in payloads:
            fastavro.schemaless_reader(io.BytesIO(payload), parsed, None)

    def write_all() -> None:
        for value in values:
            fastavro.schemaless_writer(io.BytesIO(), parsed, value)

    theirs = sample_bytes / best_cpu_seconds(read_all, max(1, args.repeat // 2))
    theirs_out = sample_bytes / best_cpu_seconds(write_all, max(1, args.repeat // 2))

    print(f"records: {len(batch)} x {batch_bytes / len(batch):.0f} bytes, 20 fields")
    print(f"{'':24}{'MB/s per CPU s':>16}{'x fastavro':>12}")
    rows = [
        ("decode  avro codec", ours, ours / theirs),
        ("decode  fastavro/record", theirs, 1.0),
        ("encode  avro codec", ours_out, ours_out / theirs_out),
        ("encode  fastavro/record", theirs_out, 1.0),
    ]
    for name, speed, ratio in rows:
        print(f"{name:24}{speed / 1e6:>16.1f}{ratio:>12.1f}")


if __name__ == "__main__":
    main()
