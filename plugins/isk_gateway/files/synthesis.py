"""Hotset synthesis: raw Kafka record batches -> Arrow rows (the row contract) -> Parquet + stats.

The input is what a Fetch response's ``records`` field holds for one partition (any number of v2
batches, possibly cut mid-batch at the end). Batches are decoded by compiled loops straight into
Arrow buffers (:mod:`.batch_decoder`), so no Python object is built per record.

Records are kept as a ``read_committed`` Java consumer keeps them (:mod:`.batch_decoder`).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record as IcebergRecord

from bergstream.core.api import ROW_ARROW_SCHEMA, ROW_SCHEMA, SORT_ORDER
from bergstream.plugins.isk_gateway.files.batch_decoder import (
    AbortedTransaction,
    SynthesisError,
    decode_batches,
)
from bergstream.plugins.isk_gateway.files.parquet_options import (
    PARQUET_COMPRESSIONS,
    ParquetCompression,
)
from bergstream.plugins.isk_gateway.kafka.buffers import large_buffer

__all__ = [
    "PARQUET_COMPRESSIONS",
    "AbortedTransaction",
    "ParquetCompression",
    "SynthesisError",
    "SynthesizedFile",
    "parquet_bytes",
    "records_to_table",
    "synthesize_data_file",
]

_US_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class SynthesizedFile:
    """A Parquet data file and its Iceberg ``DataFile`` (stats, size, partition)."""

    parquet: bytes | memoryview
    data_file: DataFile


#: Decode a partition's record batches into an Arrow table in ``ROW_ARROW_SCHEMA`` (the rules are
#: :func:`.batch_decoder.decode_batches`'s).
records_to_table = decode_batches


#: Small columns: the only ones with Parquet statistics and dictionaries. Iceberg engines prune
#: by the manifests' bounds, and min/max of 1 KB values cost more than they save.
_STATISTICS_COLUMNS = ["kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_timestamp_type"]
_DICTIONARY_COLUMNS = ["kafka_partition", "kafka_timestamp_type", "kafka_key"]


#: The row contract's columns, and their Parquet leaf columns in order.
_ROW_COLUMNS = tuple(ROW_ARROW_SCHEMA.names)
_ROW_LEAVES = (
    "kafka_partition",
    "kafka_offset",
    "kafka_timestamp",
    "kafka_timestamp_type",
    "kafka_key",
    "kafka_headers.list.element.key",
    "kafka_headers.list.element.value",
    "kafka_value",
)
#: The byte columns whose codec follows their rows, and how much of each is tried.
_PAYLOAD_COLUMNS = ("kafka_key", "kafka_value")
_SAMPLE_BYTES = 256 * 1024
#: A payload that the codec shrinks by less than this is written uncompressed.
_WORTH_COMPRESSING = 0.9


def column_codecs(table: pa.Table, compression: str) -> str | dict[str, str]:
    """The codec of each column of ``table``: ``compression``, except for a key or value column
    of the row contract that ``compression`` does not shrink by a tenth on its first 256 KB,
    which is written uncompressed.

    Why: values that are already compressed or encrypted (Kafka's own batch compression is
    undone by ISK, but many producers compress payloads themselves) cost the codec's CPU on
    every write and every read for nothing. Measured (100k random values of 1 KB, pyarrow's
    writer): snappy 45-72 ms, uncompressed 33-35 ms. The choice depends on the rows alone, so a
    file rebuilt from its key has the same bytes."""
    if compression == "none" or tuple(table.column_names) != _ROW_COLUMNS:
        return compression
    plain = [name for name in _PAYLOAD_COLUMNS if not _shrinks(table.column(name), compression)]
    if not plain:
        return compression
    return {leaf: "none" if leaf in plain else compression for leaf in _ROW_LEAVES}


def _shrinks(column: pa.ChunkedArray, compression: str) -> bool:
    """Whether ``compression`` shrinks the first value bytes of a binary column by a tenth (a
    column of under 4 KB of values: assumed so)."""
    sample = _first_value_bytes(column.chunks[0]) if column.num_chunks else None
    if sample is None or sample.size < 4096:
        return True
    packed = pa.compress(sample, codec=compression, asbytes=False)
    return packed.size < _WORTH_COMPRESSING * sample.size


def _first_value_bytes(chunk: pa.Array) -> pa.Buffer | None:
    """Up to :data:`_SAMPLE_BYTES` of the concatenated values of a (large) binary array, as a
    slice of its data buffer (no copy)."""
    offsets, data = chunk.buffers()[1:3]
    if not len(chunk) or offsets is None or data is None:
        return None
    kind = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
    width = np.dtype(kind).itemsize
    bounds = np.frombuffer(offsets, dtype=kind, count=len(chunk) + 1, offset=chunk.offset * width)
    start = int(bounds[0])
    return data.slice(start, min(int(bounds[-1]) - start, _SAMPLE_BYTES))


def parquet_bytes(
    table: pa.Table,
    compression: str = "snappy",
    row_group_rows: int = 1 << 20,
    all_statistics: bool = False,
    dictionary_columns: Sequence[str] = _DICTIONARY_COLUMNS,
) -> memoryview:
    """Write ``table`` (``ROW_ARROW_SCHEMA``, field ids kept) as one Parquet file in memory:
    statistics (unless ``all_statistics``) and dictionaries only on small columns (or on
    ``dictionary_columns``).

    The file is written into one buffer of Arrow's pool sized for the worst case (the rows
    plus codec overhead: pages never touched cost nothing) and returned as a view of it: a
    growing output stream copies the file about twice, and a ``bytes`` copy once more, which
    together cost twice the CPU of writing it."""
    if compression not in PARQUET_COMPRESSIONS:
        raise ValueError(
            f"Parquet compression {compression!r} is not one of {', '.join(PARQUET_COMPRESSIONS)}"
        )
    options = {
        "compression": column_codecs(table, compression),
        "row_group_size": row_group_rows,
        "store_schema": False,
        "use_dictionary": list(dictionary_columns),
        "write_statistics": True if all_statistics else _STATISTICS_COLUMNS,
    }
    bound = table.nbytes + table.nbytes // 4 + (1 << 20)
    target = large_buffer(bound)
    sink = pa.FixedSizeBufferWriter(target)
    try:
        pq.write_table(table, sink, **options)
    except (OSError, pa.ArrowInvalid):  # past the bound (it is not a proven one): grow
        growing = pa.BufferOutputStream()
        pq.write_table(table, growing, **options)
        return memoryview(growing.getvalue()).cast("B")
    return memoryview(target.slice(0, sink.tell())).cast("B")


def _partition_record(table: pa.Table, partition: int, day: int | None) -> IcebergRecord:
    if day is None and table.num_rows:
        micros = table.column("kafka_timestamp").cast(pa.int64())
        low, high = pc.min_max(micros).values()
        first_day, last_day = low.as_py() // _US_PER_DAY, high.as_py() // _US_PER_DAY
        if first_day != last_day:
            raise SynthesisError(
                f"rows span days {first_day}..{last_day}: a data file holds one partition "
                "value, pass day= to keep one day's rows"
            )
        day = first_day
    return IcebergRecord(partition, day)


def synthesize_data_file(
    path: str,
    records: bytes | memoryview,
    partition: int,
    start_offset: int = 0,
    end_offset: int | None = None,
    aborted_transactions: Sequence[AbortedTransaction] | None = None,
    day: int | None = None,
    compression: str = "snappy",
    spec_id: int = 0,
) -> SynthesizedFile:
    """Build the Parquet file at ``path`` from a partition's record batches, with its DataFile.

    Rows are chosen as :func:`records_to_table` chooses them; with ``day`` (days since the epoch,
    UTC) only rows of that day are kept, so the file has one value of the default partition spec
    (``kafka_partition``, ``day(kafka_timestamp)``). Without ``day``, rows spanning several days
    raise :class:`SynthesisError`. The DataFile carries Iceberg column stats (offset and
    timestamp bounds, counts) read back from the Parquet footer and the exact byte size.
    """
    table = records_to_table(records, partition, start_offset, end_offset, aborted_transactions)
    if day is not None:
        days = table.column("kafka_timestamp").cast(pa.date32()).cast(pa.int32())
        table = table.filter(pc.equal(days, day))
    data = parquet_bytes(table, compression, all_statistics=True)
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(ROW_SCHEMA, {}),
        parquet_column_mapping=parquet_path_to_id_mapping(ROW_SCHEMA),
    )
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=_partition_record(table, partition, day),
        file_size_in_bytes=len(data),
        sort_order_id=SORT_ORDER.order_id,  # rows come in offset order
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    data_file.spec_id = spec_id  # not a DataFile field: from_args would drop it
    return SynthesizedFile(parquet=data, data_file=data_file)
