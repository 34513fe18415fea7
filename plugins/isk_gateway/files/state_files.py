"""The files ISK builds for a ``current`` or ``rejected`` snapshot: the rows the records not yet
in the lake make, and the position deletes that hide the lake table's rows they replace.

Both are Parquet, written deterministically (the same changes give the same bytes, so every
ISK instance serves the same file under one key), into an unpartitioned table (the state
tables are unpartitioned: a position delete file then applies to every data file it names).
The rows file carries Iceberg column statistics read back from its footer, as the pipeline's
files do; the delete file names ``s3://`` gateway locations of the data files, exactly as the
manifests list them (readers match the two as strings).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.typedef import Record as IcebergRecord

from bergstream.core.api import POSITION_DELETE_SCHEMA
from bergstream.plugins.isk_gateway.files.synthesis import SynthesizedFile, parquet_bytes

__all__ = [
    "UNPARTITIONED",
    "StateFiles",
    "deletes_file",
    "rows_file",
]

#: The partition spec of state and rejected tables.
UNPARTITIONED = PartitionSpec(spec_id=0)


@dataclass(frozen=True)
class StateFiles:
    """What one snapshot adds to the lake table's files: a rows file and a delete file (either
    may be absent: no new rows, nothing to delete)."""

    rows: SynthesizedFile | None
    deletes: SynthesizedFile | None


def rows_file(path: str, rows: pa.Table, schema: Schema, compression: str) -> SynthesizedFile:
    """The Parquet data file at ``path`` (an ``s3://`` gateway location) holding ``rows`` (the
    Arrow schema of ``schema``), with its ``DataFile`` and the statistics of the row contract's
    small columns (partition, offset, timestamp), as the hotset's files have them."""
    data = parquet_bytes(rows, compression)
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, {}),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=IcebergRecord(),
        file_size_in_bytes=len(data),
        sort_order_id=UNSORTED_SORT_ORDER.order_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    file.spec_id = UNPARTITIONED.spec_id
    return SynthesizedFile(data, file)


def deletes_file(path: str, deletes: pa.Table, compression: str) -> SynthesizedFile:
    """The position delete file at ``path`` holding ``deletes`` (``file_path``, ``pos``,
    sorted), with its ``DataFile``."""
    # One path per data file, repeated for each of its positions: a dictionary keeps the file
    # small and quick to read.
    data = parquet_bytes(
        deletes.cast(POSITION_DELETE_SCHEMA),
        compression,
        all_statistics=True,
        dictionary_columns=["file_path"],
    )
    file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=IcebergRecord(),
        record_count=deletes.num_rows,
        file_size_in_bytes=len(data),
        column_sizes=None,
        value_counts=None,
        null_value_counts=None,
        nan_value_counts=None,
        lower_bounds=None,
        upper_bounds=None,
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=None,
    )
    file.spec_id = UNPARTITIONED.spec_id
    return SynthesizedFile(data, file)
