"""ISK hotset synthesis: raw Kafka record batches -> Parquet data file (+ Iceberg stats), against
a plain ``pyarrow.parquet.write_table`` of the same rows, in one run, on one core.

Builds ``--records`` records of ``--value-size`` bytes (keys of 16 bytes, ``--headers`` headers
each) into v2 batches of ``--batch-records`` with aiokafka's builder, then times, best of
``--repeat``:

- **synthesis**: :func:`synthesize_data_file` on the batch bytes (decode, Arrow, Parquet, stats);
- **decode**: :func:`records_to_table` alone (batches -> Arrow);
- **write_table**: ``pq.write_table`` of the already-built Arrow table, same compression;
- **per-record loop**: the naive way, a ``record_to_row`` dict per record then
  ``pa.Table.from_pylist`` and the same Parquet write (once, on a tenth of the batches).

MB/s counts the record batch bytes given to synthesis (compressed, if ``--kafka-compression``);
``*_row_mb_s`` count the decoded rows' Arrow bytes instead, comparable across codecs. Prints one
JSON object.

    .venv/bin/python bench/isk_synthesis.py [--records 200000] [--value-size 1024]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq

from bergstream.core.records import BatchInfo, Record, build_batch, read_records, split_batches
from bergstream.core.typed.row_contract import ROW_ARROW_SCHEMA, record_to_row
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table, synthesize_data_file


def make_batches(
    records: int, value_size: int, headers: int, per_batch: int, compression: int
) -> bytes:
    """``records`` records in batches of ``per_batch``, values of pseudo-random bytes."""
    payload = os.urandom(value_size * 4)
    out = bytearray()
    base_ts = 1_763_000_000_000
    for base in range(0, records, per_batch):
        batch = [
            Record(
                offset=offset,
                timestamp=base_ts + offset,
                key=b"key-%012d" % (offset % 10_000),
                value=payload[offset % value_size : offset % value_size + value_size],
                headers=tuple((f"h{i}", b"header-value") for i in range(headers)),
            )
            for offset in range(base, min(base + per_batch, records))
        ]
        out += build_batch(batch, BatchInfo(base_offset=base, compression_type=compression))
    return bytes(out)


def best_of(repeat: int, function) -> float:  # type: ignore[no-untyped-def]
    """The fastest of ``repeat`` timed calls of ``function``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Run the benchmark and print its JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--headers", type=int, default=2)
    parser.add_argument("--batch-records", type=int, default=500)
    parser.add_argument("--kafka-compression", type=int, default=0, help="0 none, 1 gzip, ...")
    parser.add_argument("--parquet-compression", default="snappy")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    blob = make_batches(
        args.records, args.value_size, args.headers, args.batch_records, args.kafka_compression
    )
    megabytes = len(blob) / 1e6
    table = records_to_table(blob, 0)
    assert table.num_rows == args.records

    def write_table() -> None:
        pq.write_table(table, io.BytesIO(), compression=args.parquet_compression)

    synthesis = best_of(
        args.repeat,
        lambda: synthesize_data_file(
            "bench.parquet", blob, 0, compression=args.parquet_compression
        ),
    )
    decode = best_of(args.repeat, lambda: records_to_table(blob, 0))
    baseline = best_of(args.repeat, write_table)
    batches = list(split_batches(blob))
    tenth = b"".join(batches[: max(1, len(batches) // 10)])

    def per_record_loop() -> None:
        rows = [
            record_to_row(0, record, 0)
            for batch in split_batches(tenth)
            for record in read_records(batch)
        ]
        loop_table = pa.Table.from_pylist(rows, schema=ROW_ARROW_SCHEMA)
        pq.write_table(loop_table, io.BytesIO(), compression=args.parquet_compression)

    loop = best_of(1, per_record_loop)
    print(
        json.dumps(
            {
                "records": args.records,
                "value_size": args.value_size,
                "headers": args.headers,
                "kafka_compression": args.kafka_compression,
                "parquet_compression": args.parquet_compression,
                "input_mb": round(megabytes, 1),
                "row_mb": round(table.nbytes / 1e6, 1),
                "synthesis_mb_s": round(megabytes / synthesis, 1),
                "synthesis_row_mb_s": round(table.nbytes / 1e6 / synthesis, 1),
                "decode_only_mb_s": round(megabytes / decode, 1),
                "write_table_mb_s": round(megabytes / baseline, 1),
                "synthesis_vs_write_table": round(baseline / synthesis, 3),
                "per_record_loop_mb_s": round(len(tenth) / 1e6 / loop, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
