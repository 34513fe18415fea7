"""Read a hotset table with PyIceberg, without HTTP: metadata from ``load_table``, files through
a FileIO over ``provider.read_file``."""

from __future__ import annotations

import asyncio
from typing import Any

from pyiceberg.catalog.noop import NoopCatalog
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataV2

from bergstream.plugins.isk_gateway.files.fileio import KeyFileIO
from bergstream.plugins.isk_gateway.files.table_metadata import (
    BuiltTable,
    build_metadata,
    plan_table,
)
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.provider import LoadedTable


def open_table(provider: HotsetProvider, loaded: LoadedTable, loop: asyncio.AbstractEventLoop):
    """A PyIceberg ``Table``; its file reads run ``provider.read_file`` on ``loop`` (so use the
    table from another thread)."""

    def read(key: str) -> bytes:
        return asyncio.run_coroutine_threadsafe(provider.read_file(key), loop).result(60)

    return Table(
        identifier=("hotset", "t"),
        metadata=TableMetadataV2.model_validate(loaded.metadata),
        metadata_location=loaded.metadata_location,
        io=KeyFileIO(provider.bucket, read),
        catalog=NoopCatalog("noop"),
    )


async def scan_rows(provider: HotsetProvider, loaded: LoadedTable, **scan: Any) -> list[dict]:
    """Rows of a table scan, sorted by (partition, offset)."""
    table = open_table(provider, loaded, asyncio.get_running_loop())

    def run() -> list[dict]:
        return table.scan(**scan).to_arrow().to_pylist()

    rows = await asyncio.to_thread(run)
    return sorted(rows, key=lambda row: (row["kafka_partition"], row["kafka_offset"]))


def build_table(
    bucket: str, cluster: str, topic: str, chunks: Any, end_offsets: Any, **options: Any
) -> BuiltTable:
    """The metadata of a hotset table with one snapshot and no history, from its chunks."""
    plan = plan_table(bucket, cluster, topic, chunks, end_offsets, **options)
    return build_metadata(bucket, cluster, plan)


async def data_files(provider: HotsetProvider, loaded: LoadedTable) -> list[str]:
    """The data files of ``loaded``'s current snapshot, by name (``START-END.parquet``)."""
    table = open_table(provider, loaded, asyncio.get_running_loop())
    tasks = await asyncio.to_thread(lambda: list(table.scan().plan_files()))
    return sorted(task.file.file_path.rsplit("/", 1)[1] for task in tasks)
