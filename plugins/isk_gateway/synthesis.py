"""Hotset synthesis: raw Kafka record batches -> Arrow rows (the row contract) -> Parquet + stats.

The input is what a Fetch response's ``records`` field holds for one partition (any number of v2
batches, possibly cut mid-batch at the end). Batches are decoded by aiokafka's C parser (all
codecs); per batch, fields are gathered with C-level ``map``/``attrgetter`` loops into flat lists
and turned into Arrow arrays in bulk, so no Python row (dict) is ever built per record.

Semantics are the ones of a ``read_committed`` Java consumer given the fetch's aborted
transactions: control batches are skipped, and data batches of aborted transactions are dropped.
Offsets outside ``[start_offset, end_offset)`` are dropped too (a fetch may begin before the asked
offset). With LogAppendTime every record of a batch carries the batch's max timestamp (type 1).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import io
import struct
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
from operator import attrgetter, itemgetter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from aiokafka.record.default_records import DefaultRecordBatch
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record as IcebergRecord

from bergstream.core.records import split_batches
from bergstream.core.row_contract import LOG_APPEND_TIME, ROW_ARROW_SCHEMA, ROW_SCHEMA, SORT_ORDER

__all__ = [
    "AbortedTransaction",
    "SynthesisError",
    "SynthesizedFile",
    "parquet_bytes",
    "records_to_table",
    "synthesize_data_file",
]

_MAGIC = 16
_HEADER_SIZE = 61
_ABORT = 0
_US_PER_DAY = 86_400_000_000

_OFFSET = attrgetter("offset")
_TIMESTAMP = attrgetter("timestamp")
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_HEADERS = attrgetter("headers")
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)

_HEADER_STRUCT: pa.StructType = ROW_ARROW_SCHEMA.field("kafka_headers").type.value_type
_HEADERS_TYPE: pa.DataType = ROW_ARROW_SCHEMA.field("kafka_headers").type

#: (producer_id, first_offset), as a Fetch response's ``aborted_transactions`` lists them.
AbortedTransaction = tuple[int, int]


class SynthesisError(ValueError):
    """Record bytes or a request that cannot be synthesized into a data file."""


@dataclass(frozen=True)
class SynthesizedFile:
    """A Parquet data file and its Iceberg ``DataFile`` (stats, size, partition)."""

    parquet: bytes
    data_file: DataFile


class _Columns:
    """Flat per-column lists gathered batch by batch."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.header_counts: list[int] = []
        self.headers: list[tuple[str, bytes | None]] = []

    def add(self, batch: DefaultRecordBatch, start: int, end: int | None) -> None:
        records = list(batch)
        offsets = list(map(_OFFSET, records))
        lo = bisect_left(offsets, start) if offsets and offsets[0] < start else 0
        hi = (
            bisect_left(offsets, end)
            if end is not None and offsets and offsets[-1] >= end
            else len(offsets)
        )
        if lo or hi != len(offsets):
            records, offsets = records[lo:hi], offsets[lo:hi]
        if not records:
            return
        count = len(records)
        self.offsets += offsets
        if batch.timestamp_type == LOG_APPEND_TIME:
            self.timestamps += repeat(batch.max_timestamp, count)
        else:
            self.timestamps += map(_TIMESTAMP, records)
        self.timestamp_types += repeat(batch.timestamp_type, count)
        self.keys += map(_KEY, records)
        self.values += map(_VALUE, records)
        headers = list(map(_HEADERS, records))
        counts = list(map(len, headers))
        self.header_counts += counts
        if any(counts):
            self.headers += chain.from_iterable(headers)

    def table(self, partition: int) -> pa.Table:
        rows = len(self.offsets)
        list_offsets = list(accumulate(self.header_counts, initial=0))
        header_struct = pa.StructArray.from_arrays(
            [
                pa.array(list(map(_FIRST, self.headers)), pa.large_string()),
                pa.array(list(map(_SECOND, self.headers)), pa.large_binary()),
            ],
            fields=list(_HEADER_STRUCT),
        )
        timestamps = pc.multiply_checked(pa.array(self.timestamps, pa.int64()), 1000).cast(
            ROW_ARROW_SCHEMA.field("kafka_timestamp").type
        )
        return pa.Table.from_arrays(
            [
                pa.repeat(pa.scalar(partition, pa.int32()), rows),
                pa.array(self.offsets, pa.int64()),
                timestamps,
                pa.array(self.timestamp_types, pa.int32()),
                pa.array(self.keys, pa.large_binary()),
                pa.LargeListArray.from_arrays(
                    pa.array(list_offsets, pa.int64()), header_struct, type=_HEADERS_TYPE
                ),
                pa.array(self.values, pa.large_binary()),
            ],
            schema=ROW_ARROW_SCHEMA,
        )


def _is_abort_marker(batch: DefaultRecordBatch) -> bool:
    for record in batch:
        key = record.key
        if key is not None and len(key) >= 4:
            _version, kind = struct.unpack_from(">hh", key)
            return kind == _ABORT
        return False
    return False


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while decoding: the many short-lived header tuples would otherwise
    trigger collections that cost more than the decode (it is turned back on, never left off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def records_to_table(
    records: bytes | memoryview,
    partition: int,
    start_offset: int = 0,
    end_offset: int | None = None,
    aborted_transactions: Iterable[AbortedTransaction] | None = None,
) -> pa.Table:
    """Decode a partition's record batches into an Arrow table in ``ROW_ARROW_SCHEMA``.

    Keeps records with ``start_offset <= offset < end_offset`` (``end_offset`` None: no upper
    bound; pass the last stable offset for read_committed). ``aborted_transactions`` is the
    fetch's list of ``(producer_id, first_offset)``: their data batches are dropped as a
    read_committed consumer drops them. Control batches never yield rows. A trailing partial
    batch is ignored. Raises :class:`SynthesisError` on a batch that is not magic v2 or whose
    CRC does not match.
    """
    with _gc_paused():
        return _decode(records, partition, start_offset, end_offset, aborted_transactions)


def _decode(
    records: bytes | memoryview,
    partition: int,
    start_offset: int,
    end_offset: int | None,
    aborted_transactions: Iterable[AbortedTransaction] | None,
) -> pa.Table:
    aborted = sorted((first, producer) for producer, first in aborted_transactions or ())
    heapq.heapify(aborted)
    aborted_producers: set[int] = set()
    columns = _Columns()
    for view in split_batches(records):
        if len(view) < _HEADER_SIZE or view[_MAGIC] != 2:
            raise SynthesisError("not a v2 record batch (magic 2 needed, Kafka >= 0.11 clients)")
        batch = DefaultRecordBatch(view)  # the C parser reads the buffer in place
        if not batch.validate_crc():
            raise SynthesisError(f"record batch at offset {batch.base_offset} fails its CRC")
        last_offset = batch.base_offset + batch.last_offset_delta
        producer = batch.producer_id
        if producer >= 0:
            while aborted and aborted[0][0] <= last_offset:
                aborted_producers.add(heapq.heappop(aborted)[1])
            if batch.is_control_batch:
                if _is_abort_marker(batch):
                    aborted_producers.discard(producer)
            elif batch.is_transactional and producer in aborted_producers:
                continue
        if batch.is_control_batch:
            continue
        past_end = end_offset is not None and batch.base_offset >= end_offset
        if last_offset < start_offset or past_end:
            continue
        columns.add(batch, start_offset, end_offset)
    return columns.table(partition)


def parquet_bytes(
    table: pa.Table, compression: str = "zstd", row_group_rows: int = 1 << 20
) -> bytes:
    """Write ``table`` (``ROW_ARROW_SCHEMA``, field ids kept) as one Parquet file in memory."""
    sink = io.BytesIO()
    pq.write_table(
        table, sink, compression=compression, row_group_size=row_group_rows, store_schema=False
    )
    return sink.getvalue()


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
    compression: str = "zstd",
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
    data = parquet_bytes(table, compression)
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
