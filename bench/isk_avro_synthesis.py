"""ISK synthesis of an Avro topic vs a raw one and vs fastavro, on the same batches, CPU seconds.

Run: ``python bench/isk_avro_synthesis.py [--records N]`` (issue 13's goal: typed synthesis
>= 200 MB/s per CPU second; fastavro per record is the naive baseline).

Builds ``--records`` Avro values of a 20-field record (strings, longs, doubles, a timestamp, a
decimal; about 300 bytes) with Confluent framing into v2 batches, then times (CPU time of this
process, best of ``--repeat``):

- **raw**: what ISK does for a raw topic: batches -> Arrow rows -> Parquet;
- **typed**: the same plus decoding into the typed layout (TypedTopic.decode, the avro codec);
- **fastavro per record**: ``schemaless_reader`` per value (a tenth of them), the naive path.

MB/s per CPU second counts the record-batch bytes. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import decimal
import io
import json
import time

import fastavro

from bergstream.core.api import (
    ROW_SCHEMA,
    RegisteredSchema,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedRows,
    build_layout,
)
from bergstream.core.records import BatchInfo, Record, build_batch
from bergstream.plugins.isk_gateway.files.hotset_layout import parquet_layout
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic, layout_digest
from bergstream.plugins.value_codecs.avro.codec import AvroCodec

SCHEMA = {
    "type": "record",
    "name": "Wide",
    "fields": [
        *({"name": f"s{i}", "type": "string"} for i in range(6)),
        *({"name": f"l{i}", "type": "long"} for i in range(6)),
        *({"name": f"d{i}", "type": "double"} for i in range(5)),
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def value(i: int) -> dict:
    out: dict = {f"s{k}": f"text-{k}-{i % 997:05d}-" + "x" * (20 + (i + k) % 15) for k in range(6)}
    out.update({f"l{k}": i * 1_000_003 + k for k in range(6)})
    out.update({f"d{k}": i / (k + 1.5) for k in range(5)})
    out["at"] = 1_763_000_000_000 + i
    out["price"] = decimal.Decimal(i % 100_000) / 100
    out["note"] = None if i % 3 else f"note {i}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch-records", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    parsed = fastavro.parse_schema(SCHEMA)
    schema = RegisteredSchema(7, "AVRO", json.dumps(SCHEMA), subject="w-value", version=1)
    payloads = []
    for i in range(args.records):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, value(i))
        payloads.append(b"\x00" + (7).to_bytes(4, "big") + buffer.getvalue())
    blob = bytearray()
    for base in range(0, args.records, args.batch_records):
        batch = [
            Record(offset=o, timestamp=1_763_000_000_000 + o, key=None, value=payloads[o])
            for o in range(base, min(base + args.batch_records, args.records))
        ]
        blob += build_batch(batch, BatchInfo(base_offset=base))
    blob = bytes(blob)
    megabytes = len(blob) / 1e6

    codecs = TopicCodecs("w", SideCodecs({"AVRO": AvroCodec()}, "w-value"))
    source = StoredSchemas().add([schema])
    layout = build_layout(ROW_SCHEMA, ROW_SCHEMA.highest_field_id, codecs, source)
    typed = TypedTopic("w", layout, TypedRows(layout, codecs, source), layout_digest(layout, {}))

    def raw() -> int:
        return len(parquet_layout(records_to_table(blob, 0)))

    def typed_synthesis() -> int:
        return len(parquet_layout(typed.decode(records_to_table(blob, 0))))

    def decode_only() -> None:
        typed.rows.decode(records_to_table(blob, 0))

    tenth = payloads[: args.records // 10]

    def per_record() -> None:
        for data in tenth:
            fastavro.schemaless_reader(io.BytesIO(data[5:]), parsed, None)

    def cpu(function) -> float:  # type: ignore[no-untyped-def]
        times = []
        for _ in range(args.repeat):
            start = time.process_time()
            function()
            times.append(time.process_time() - start)
        return min(times)

    typed_synthesis()  # compile the codec's kernels first
    raw_s, typed_s, decode_s = cpu(raw), cpu(typed_synthesis), cpu(decode_only)
    loop_s = cpu(per_record)
    typed_table = typed.decode(records_to_table(blob, 0))
    assert typed_table.column("kafka_value").null_count == args.records, "all canonical"
    print(
        json.dumps(
            {
                "records": args.records,
                "avg_value_bytes": round(sum(map(len, payloads)) / len(payloads), 1),
                "input_mb": round(megabytes, 1),
                "raw_synthesis_mb_per_cpu_s": round(megabytes / raw_s, 1),
                "typed_synthesis_mb_per_cpu_s": round(megabytes / typed_s, 1),
                "typed_decode_only_mb_per_cpu_s": round(megabytes / decode_s, 1),
                "typed_vs_raw": round(raw_s / typed_s, 3),
                "typed_parquet_bytes": typed_synthesis(),
                "raw_parquet_bytes": raw(),
                "fastavro_per_record_records_per_cpu_s": round(len(tenth) / loop_s),
                "fastavro_per_record_mb_per_cpu_s": round(sum(map(len, tenth)) / 1e6 / loop_s, 1),
                "typed_vs_fastavro_per_record": round(
                    (megabytes / typed_s) / (sum(map(len, tenth)) / 1e6 / loop_s), 1
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
