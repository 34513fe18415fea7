"""The ``connect-json`` codec against the ``json`` codec on the same Debezium-like envelopes
(``JsonConverter`` with ``schemas.enable=true``): a change event of a table of a dozen columns
(int32, int64, strings, a Decimal, a double, a boolean, a MicroTimestamp, a ZonedTimestamp, a
Date, a Uuid, an optional string), with ``before`` (half the events), ``after``, Debezium's
``source`` block, ``op`` and ``ts_ms``, about 4.5 KB each (the schema is most of it).

Both are timed as a pipeline worker runs them: ``TypedRows.decode`` of a batch of row-contract
rows, with a layout folded from the batch beforehand (not timed). Speeds are records per CPU
second (``time.process_time``), best of ``--repeat`` runs; ``x json`` is the ratio to the
``json`` codec in the same run. The ``connect-json`` codec's own two steps (finding each row's
schema; decoding the payloads) are shown too. The numba kernels of the ``json`` codec are
compiled (or loaded from their cache) before timing.

    .venv/bin/python bench/connect_json.py [--records 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from bergstream.core.api import (
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedRows,
    build_layout_of_shapes,
)
from bergstream.plugins.value_codecs.connect_json.codec import ConnectJsonCodec
from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec


def _field(field: str, type_: str, optional: bool = True, **more: Any) -> dict[str, Any]:
    return {"type": type_, "optional": optional, **more, "field": field}


ROW_FIELDS = [
    _field("id", "int32", optional=False),
    _field("customer_id", "int64"),
    _field("name", "string"),
    _field("email", "string"),
    _field(
        "price",
        "bytes",
        name="org.apache.kafka.connect.data.Decimal",
        version=1,
        parameters={"scale": "2", "connect.decimal.precision": "10"},
    ),
    _field("quantity", "int32"),
    _field("weight", "double"),
    _field("active", "boolean"),
    _field("created_at", "int64", name="io.debezium.time.MicroTimestamp", version=1),
    _field("updated_at", "string", name="io.debezium.time.ZonedTimestamp", version=1),
    _field("birth_date", "int32", name="io.debezium.time.Date", version=1),
    _field("token", "string", name="io.debezium.data.Uuid", version=1),
    _field("notes", "string"),
]
ROW = {"type": "struct", "fields": ROW_FIELDS, "optional": True,
       "name": "dbserver1.inventory.orders.Value"}  # fmt: skip
SOURCE_FIELDS = [
    _field("version", "string", optional=False),
    _field("connector", "string", optional=False),
    _field("name", "string", optional=False),
    _field("ts_ms", "int64", optional=False),
    _field(
        "snapshot",
        "string",
        name="io.debezium.data.Enum",
        version=1,
        parameters={"allowed": "true,last,false,incremental"},
        default="false",
    ),
    _field("db", "string", optional=False),
    _field("sequence", "string"),
    _field("schema", "string", optional=False),
    _field("table", "string", optional=False),
    _field("txId", "int64"),
    _field("lsn", "int64"),
    _field("xmin", "int64"),
]
SCHEMA = {
    "type": "struct",
    "fields": [
        {**ROW, "field": "before"},
        {**ROW, "field": "after"},
        {
            "type": "struct",
            "fields": SOURCE_FIELDS,
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
        },
        _field("op", "string", optional=False),
        _field("ts_ms", "int64"),
        {
            "type": "struct",
            "fields": [
                _field("id", "string", optional=False),
                _field("total_order", "int64", optional=False),
                _field("data_collection_order", "int64", optional=False),
            ],
            "optional": True,
            "name": "event.block",
            "version": 1,
            "field": "transaction",
        },
    ],
    "optional": False,
    "name": "dbserver1.inventory.orders.Envelope",
    "version": 1,
}


def _row(rnd: random.Random, i: int) -> dict[str, Any]:
    unscaled = rnd.randint(0, 10**8)
    raw = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=rnd.randint(0, 10**7))
    return {
        "id": i,
        "customer_id": rnd.randint(1, 10**9),
        "name": f"customer {rnd.randint(1, 10**6)}",
        "email": f"user{rnd.randint(1, 10**6)}@example.com",
        "price": base64.b64encode(raw).decode(),
        "quantity": rnd.randint(1, 100),
        "weight": rnd.random() * 100,
        "active": rnd.random() < 0.5,
        "created_at": rnd.randint(1_600_000_000_000_000, 1_700_000_000_000_000),
        "updated_at": when.isoformat().replace("+00:00", "Z"),
        "birth_date": rnd.randint(-10_000, 20_000),
        "token": str(uuid.UUID(int=rnd.getrandbits(128))),
        "notes": None if i % 3 else "a note of moderate length",
    }


def envelopes(count: int, seed: int = 7) -> list[bytes]:
    """``count`` change events as JsonConverter writes them (compact, schema first)."""
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        source = {
            "version": "2.5.0.Final", "connector": "postgresql", "name": "dbserver1",
            "ts_ms": 1_700_000_000_000 + i, "snapshot": "false", "db": "inventory",
            "sequence": f'["{i}","{i + 1}"]', "schema": "inventory", "table": "orders",
            "txId": 1000 + i, "lsn": 33_000_000 + i, "xmin": None,
        }  # fmt: skip
        payload = {
            "before": _row(rnd, i) if i % 2 else None,
            "after": _row(rnd, i),
            "source": source,
            "op": "u" if i % 2 else "c",
            "ts_ms": 1_700_000_000_100 + i,
            "transaction": None,
        }
        text = json.dumps({"schema": SCHEMA, "payload": payload}, separators=(",", ":"))
        out.append(text.encode())
    return out


def rows(values: list[bytes]) -> pa.Table:
    """Row-contract rows holding ``values``."""
    count = len(values)
    return pa.Table.from_pydict(
        {
            "kafka_partition": [0] * count,
            "kafka_offset": list(range(count)),
            "kafka_timestamp": [0] * count,
            "kafka_timestamp_type": [0] * count,
            "kafka_key": [None] * count,
            "kafka_headers": [[]] * count,
            "kafka_value": values,
        },
        schema=ROW_ARROW_SCHEMA,
    )


def typed_rows(codec: Any, schema_type: str, batch: pa.Table) -> TypedRows:
    """The decoder of a table folded from ``batch`` (as the pipeline's driver folds it)."""
    codecs = TopicCodecs("orders", SideCodecs({schema_type: codec}, "orders-value"))
    shaped = build_layout_of_shapes(
        ROW_SCHEMA, ROW_SCHEMA.highest_field_id, codecs, StoredSchemas(),
        batch.column("kafka_value").combine_chunks(),
    )  # fmt: skip
    return TypedRows(shaped.layout, codecs, StoredSchemas().add(list(shaped.shapes.values())))


def best_cpu_seconds(run: Callable[[], object], repeat: int) -> float:
    """The least CPU time of ``repeat`` calls of ``run``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    """Print the speeds and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    values = envelopes(args.records)
    batch = rows(values)
    raw = batch.column("kafka_value").combine_chunks()
    size = sum(map(len, values)) / len(values)

    connect = ConnectJsonCodec()
    connect_rows = typed_rows(connect, "CONNECT", batch)
    plain_rows = typed_rows(PlainJsonCodec(), "JSON", batch)
    for typed in (connect_rows, plain_rows):  # warm up: kernels, caches
        typed.decode(batch.slice(0, 1000))
    decoded = connect_rows.decode(batch)
    assert not decoded.causes, decoded.causes
    assert decoded.table.column("after").null_count == 0
    plain = plain_rows.decode(batch)
    assert not plain.causes, plain.causes

    (shape,) = connect.shapes(raw, None, "orders-value").schemas
    connect_s = best_cpu_seconds(lambda: connect_rows.decode(batch), args.repeat)
    plain_s = best_cpu_seconds(lambda: plain_rows.decode(batch), args.repeat)
    shapes_s = best_cpu_seconds(lambda: connect.shapes(raw, None, "x"), args.repeat)
    payloads_s = best_cpu_seconds(lambda: connect.decode(shape, raw), args.repeat)

    count = len(values)
    print(f"records: {count} Debezium-like envelopes x {size:.0f} bytes, 13 row columns")
    print(f"{'TypedRows.decode':34}{'records/s per CPU s':>22}{'x json':>10}")
    for name, seconds in (("connect-json", connect_s), ("json (plain JSON)", plain_s)):
        print(f"{name:34}{count / seconds:>22,.0f}{plain_s / seconds:>10.2f}")
    print("connect-json steps")
    for name, seconds in (("  shapes (schema of each row)", shapes_s),
                          ("  decode (payloads to Arrow)", payloads_s)):  # fmt: skip
        print(f"{name:34}{count / seconds:>22,.0f}")


if __name__ == "__main__":
    main()
