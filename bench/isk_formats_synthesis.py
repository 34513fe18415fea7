"""ISK synthesis of JSON Schema and Protobuf topics vs a raw one and vs the per-record library
decode, on the same batches, CPU seconds.

Run: ``python bench/isk_formats_synthesis.py [--format json-schema|protobuf|json]
[--records N]`` (issue 14's goal: typed synthesis >= 150 MB/s per CPU second for each codec; the
library's own per-record decode is the naive baseline). Without ``--format`` every format runs.

Builds ``--records`` values of the 20-field record of ``format_records`` (strings, longs,
doubles, a timestamp, a decimal as a string, a nullable note; about 300 bytes), in the format's
canonical form, with Confluent framing into v2 batches (see ``format_records`` for each format's
schema and values). The ``json`` format is the json-schema one's texts without framing, read by
the ``json`` codec (what a codecs rule ``value: json`` gives; no registry): its layout is folded
from the shapes of the whole input (``build_layout_of_shapes``), as ISK folds a topic's telling
values, and every synthesis declares its batch's shapes again, as ISK does.

Every row is canonical (checked: the typed table's ``kafka_value`` is all null). Then times (CPU
time of this process, best of ``--repeat``):

- **raw**: what ISK does for a raw topic: batches -> Arrow rows -> Parquet;
- **typed**: the same plus decoding into the typed layout (TypedTopic.decode, the format's
  codec);
- **decode only**: the typed decode without Parquet;
- **per record** (a tenth of the values): JSON ``orjson.loads`` (and ``json.loads``) of each
  payload; Protobuf ``ParseFromString`` then every field read into a Python value (the
  timestamp as an aware datetime, the note None when unset).

MB/s per CPU second counts the record-batch bytes. Prints one JSON object per format.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from format_records import DOUBLES, LONGS, STRINGS, message_class, plain_json_payloads
from format_records import FORMATS as RECORD_FORMATS

from bergstream.core.api import (
    ROW_SCHEMA,
    RegisteredSchema,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedLayout,
    TypedRows,
    ValueCodec,
    build_layout,
    build_layout_of_shapes,
)
from bergstream.core.records import BatchInfo, Record, build_batch
from bergstream.plugins.isk_gateway.files.hotset_layout import parquet_layout
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from bergstream.plugins.isk_gateway.files.typed_topic import TypedTopic, layout_digest
from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec

SCHEMA_ID = 7
GOAL_MB_PER_CPU_S = 150


@dataclass
class Format:
    """What one format needs: its codec, registered schema (None: plain values, no registry),
    payloads and per-record decode."""

    name: str
    codec: ValueCodec
    schema: RegisteredSchema | None
    payloads: list[bytes]
    #: per-record baselines by name: each decodes every payload given (framing included)
    per_record: dict[str, Callable[[list[bytes]], None]]


def _format(name: str, records: int) -> tuple[ValueCodec, RegisteredSchema, list[bytes]]:
    """The codec, registered schema and ``records`` framed values of the record in ``name``."""
    record = RECORD_FORMATS[name]
    schema = record.registered(SCHEMA_ID, "w-value")
    return record.codec(), schema, record.payloads(schema, records)


def json_format(records: int) -> Format:
    codec, schema, payloads = _format("json-schema", records)

    def with_orjson(values: list[bytes]) -> None:
        loads = orjson.loads
        for data in values:
            loads(data[5:])

    def with_json(values: list[bytes]) -> None:
        loads = json.loads
        for data in values:
            loads(data[5:])

    return Format(
        "json-schema",
        codec,
        schema,
        payloads,
        {"orjson_loads": with_orjson, "json_loads": with_json},
    )


def protobuf_format(records: int) -> Format:
    codec, schema, payloads = _format("protobuf", records)
    wide = message_class(schema)
    names = [*STRINGS, *LONGS, *DOUBLES, "price"]
    utc = dt.UTC

    def parse(values: list[bytes]) -> None:
        for data in values:
            message: Any = wide()
            message.ParseFromString(data[6:])
            [getattr(message, name) for name in names]
            message.at.ToDatetime(tzinfo=utc)
            message.note if message.HasField("note") else None

    return Format("protobuf", codec, schema, payloads, {"parse_and_read": parse})


def plain_json_format(records: int) -> Format:
    """The json-schema record unframed, read by the ``json`` codec; baselines: orjson, json."""

    def with_orjson(values: list[bytes]) -> None:
        loads = orjson.loads
        for data in values:
            loads(data)

    def with_json(values: list[bytes]) -> None:
        loads = json.loads
        for data in values:
            loads(data)

    return Format(
        "json",
        PlainJsonCodec(),
        None,
        plain_json_payloads(records),
        {"orjson_loads": with_orjson, "json_loads": with_json},
    )


FORMATS: dict[str, Callable[[int], Format]] = {
    "json-schema": json_format,
    "protobuf": protobuf_format,
    "json": plain_json_format,
}


def typed_topic(fmt: Format, data: bytes) -> TypedTopic:
    """The typed topic ISK would build: a registry format's layout from its subject's one
    version, the ``json`` format's from the shapes of every record in ``data``."""
    if fmt.schema is None:
        codecs = TopicCodecs("w", SideCodecs({"JSON": fmt.codec}, "w-value"))
        values = records_to_table(data, 0).column("kafka_value").combine_chunks()
        shaped = build_layout_of_shapes(
            ROW_SCHEMA, ROW_SCHEMA.highest_field_id, codecs, StoredSchemas(), values
        )
        layout: TypedLayout = shaped.layout
        source = StoredSchemas().add(list(shaped.shapes.values()))
    else:
        codecs = TopicCodecs("w", SideCodecs({fmt.schema.schema_type: fmt.codec}, "w-value"))
        source = StoredSchemas().add([fmt.schema])
        layout = build_layout(ROW_SCHEMA, ROW_SCHEMA.highest_field_id, codecs, source)
    return TypedTopic("w", layout, TypedRows(layout, codecs, source), layout_digest(layout, {}))


def measure(fmt: Format, batch_records: int, repeat: int) -> dict[str, Any]:
    records = len(fmt.payloads)
    blob = bytearray()
    for base in range(0, records, batch_records):
        batch = [
            Record(offset=o, timestamp=1_763_000_000_000 + o, key=None, value=fmt.payloads[o])
            for o in range(base, min(base + batch_records, records))
        ]
        blob += build_batch(batch, BatchInfo(base_offset=base))
    data = bytes(blob)
    megabytes = len(data) / 1e6

    typed = typed_topic(fmt, data)

    def raw() -> int:
        return len(parquet_layout(records_to_table(data, 0)))

    def typed_synthesis() -> int:
        return len(parquet_layout(typed.decode(records_to_table(data, 0))))

    def decode_only() -> None:
        typed.rows.decode(records_to_table(data, 0))

    def cpu(function: Callable[[], object]) -> float:
        times = []
        for _ in range(repeat):
            start = time.process_time()
            function()
            times.append(time.process_time() - start)
        return min(times)

    typed_synthesis()  # compile the codec's schema first
    typed_table = typed.decode(records_to_table(data, 0))
    assert typed_table.column("kafka_value").null_count == records, "all canonical"
    raw_s, typed_s, decode_s = cpu(raw), cpu(typed_synthesis), cpu(decode_only)
    typed_mb_s = megabytes / typed_s

    tenth = fmt.payloads[: max(1, records // 10)]
    tenth_mb = sum(map(len, tenth)) / 1e6
    result: dict[str, Any] = {
        "format": fmt.name,
        "records": records,
        "avg_value_bytes": round(sum(map(len, fmt.payloads)) / records, 1),
        "input_mb": round(megabytes, 1),
        "raw_synthesis_mb_per_cpu_s": round(megabytes / raw_s, 1),
        "typed_synthesis_mb_per_cpu_s": round(typed_mb_s, 1),
        "typed_decode_only_mb_per_cpu_s": round(megabytes / decode_s, 1),
        "typed_vs_raw": round(raw_s / typed_s, 3),
        "typed_parquet_bytes": typed_synthesis(),
        "raw_parquet_bytes": raw(),
    }
    for name, decode in fmt.per_record.items():
        loop_s = cpu(functools.partial(decode, tenth))
        result[f"{name}_per_record_records_per_cpu_s"] = round(len(tenth) / loop_s)
        result[f"{name}_per_record_mb_per_cpu_s"] = round(tenth_mb / loop_s, 1)
        result[f"typed_vs_{name}_per_record"] = round(typed_mb_s / (tenth_mb / loop_s), 1)
    result["goal_mb_per_cpu_s"] = GOAL_MB_PER_CPU_S
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--format", choices=sorted(FORMATS), help="one format (default: all)")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch-records", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    for name in [args.format] if args.format else list(FORMATS):
        fmt = FORMATS[name](args.records)
        print(json.dumps(measure(fmt, args.batch_records, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
