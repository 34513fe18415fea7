"""Hotset providers over a fake log for the table tests of this folder, and the rows a topic's
records make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bergstream.core.typed.row_contract import CREATE_TIME, record_to_row
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from tests.kits.fake_log import FakeLog

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def make_provider(
    tmp_path: Path, log: FakeLog, chunk_records: int = 10, name: str = "a", **options: Any
):
    return HotsetProvider(
        log,
        SqliteIndex(tmp_path / f"index-{name}.db"),
        LocalDiskCache(tmp_path / f"cache-{name}", 1 << 28),
        bucket="gw",
        cluster="c1",
        chunk_records=chunk_records,
        **options,
    )


def expected_rows(log_records: dict[int, list]) -> list[dict]:
    return [
        record_to_row(partition, record, CREATE_TIME)
        for partition in sorted(log_records)
        for record in log_records[partition]
    ]
