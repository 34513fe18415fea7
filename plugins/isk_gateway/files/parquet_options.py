"""The Parquet codecs ISK may write synthesized files with: a type the settings use, kept apart
from the writer so that loading the settings does not load pyarrow."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["PARQUET_COMPRESSIONS", "ParquetCompression"]

#: Codecs a synthesized Parquet file may be written with (``isk.parquet_compression``).
ParquetCompression = Literal["snappy", "zstd", "lz4", "gzip", "none"]
PARQUET_COMPRESSIONS: tuple[str, ...] = get_args(ParquetCompression)
