"""Snapshot histories in index backends (ISK's time travel), beyond the conformance suite: the
docs/hooks.md example passes the suite's snapshot checks, the built-in backends refuse records
they cannot hold, keep them through a killed process and after ``close`` say so; an SQLite file
from before snapshot histories gains them on open."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.backends import IndexBackend, SnapshotRecord
from bergstream.core.testing.backends import (
    INDEX_CHECKS,
    IndexCase,
    IndexCheck,
    check_id,
    chunk,
    snapshot,
)
from bergstream.plugins.index_backends.rocksdb_index import RocksIndex
from bergstream.plugins.index_backends.sqlite_index import (
    _SNAPSHOTS,
    IndexClosedError,
    IndexEntryError,
    SqliteIndex,
)
from tests.kits.hook_examples import context, registered

OPENERS: dict[str, Callable[[Path], IndexBackend]] = {
    "sqlite": lambda location: SqliteIndex(location / "index.sqlite"),
    "rocksdb": lambda location: RocksIndex(location / "index.rocksdb"),
}

SNAPSHOT_CHECKS = [
    check
    for check in INDEX_CHECKS
    if "snapshot" in check.__name__ and check.__name__ != "index_snapshots_survive_restart"
]


def test_the_suite_has_snapshot_checks() -> None:
    assert len(SNAPSHOT_CHECKS) == 6, [check.__name__ for check in SNAPSHOT_CHECKS]


@pytest.mark.parametrize("check", SNAPSHOT_CHECKS, ids=check_id)
def test_the_docs_memory_index_keeps_snapshot_histories(check: IndexCheck, tmp_path: Path) -> None:
    """The example in docs/hooks.md (in memory, so no restart check)."""
    registration, config = registered("register_index_backends", "index backend")
    case = IndexCase("docs-memory", lambda location: registration.factory(config, context()))
    check(case, tmp_path)


@pytest.mark.parametrize("name", sorted(OPENERS))
@pytest.mark.parametrize(
    ("table", "record", "message"),
    [
        ("t", SnapshotRecord(0, 1, 0, "{}"), "0 < snapshot_id < 2\\*\\*63"),
        ("t", SnapshotRecord(-5, 1, 0, "{}"), "snapshot_id"),
        ("t", SnapshotRecord(2**63, 1, 0, "{}"), "snapshot_id"),
        ("t", SnapshotRecord(1, 0, 0, "{}"), "1 <= sequence_number"),
        ("t", SnapshotRecord(1, 2**63, 0, "{}"), "sequence_number"),
        ("t", SnapshotRecord(1, 1, -1, "{}"), "0 <= timestamp_ms"),
        ("t", SnapshotRecord(1, True, 0, "{}"), "sequence_number"),
        ("t", SnapshotRecord(1, 1, 1.5, "{}"), "timestamp_ms"),  # type: ignore[arg-type]
        ("t", SnapshotRecord(1, 1, 0, b"{}"), "state must be a str"),  # type: ignore[arg-type]
        ("t", SnapshotRecord(1, 1, 0, "\ud800"), "not valid UTF-8"),
        ("", SnapshotRecord(1, 1, 0, "{}"), "non-empty str"),
    ],
)
def test_bad_snapshot_records_are_refused_and_nothing_is_written(
    tmp_path: Path, name: str, table: str, record: SnapshotRecord, message: str
) -> None:
    index = OPENERS[name](tmp_path)
    try:
        index.put_snapshot("t", snapshot(9, 1))
        with pytest.raises(IndexEntryError, match=message):
            index.put_snapshot(table, record)
        assert index.snapshots("t") == [snapshot(9, 1)]
        assert index.snapshots(table) == ([snapshot(9, 1)] if table == "t" else [])
    finally:
        index.close()


@pytest.mark.parametrize("name", sorted(OPENERS))
def test_dropping_ids_that_are_not_ints_is_refused(tmp_path: Path, name: str) -> None:
    index = OPENERS[name](tmp_path)
    try:
        index.put_snapshot("t", snapshot(9, 1))
        bad: Any = ["9"]
        with pytest.raises(IndexEntryError, match="'9' to drop is not an int"):
            index.drop_snapshots("t", bad)
        index.drop_snapshots("t", [0, -1, 2**64])  # ids no index can hold: nothing to drop
        assert index.snapshots("t") == [snapshot(9, 1)]
    finally:
        index.close()


def test_rocksdb_refuses_a_table_name_too_long_for_its_keys(tmp_path: Path) -> None:
    index = RocksIndex(tmp_path / "db")
    try:
        with pytest.raises(IndexEntryError, match="at most 65535 fit"):
            index.put_snapshot("x" * 70_000, snapshot(1, 1))
    finally:
        index.close()


@pytest.mark.parametrize("name", sorted(OPENERS))
def test_snapshot_calls_after_close_are_a_clear_error(tmp_path: Path, name: str) -> None:
    index = OPENERS[name](tmp_path)
    index.close()
    with pytest.raises(IndexClosedError, match="closed"):
        index.put_snapshot("t", snapshot(1, 1))
    with pytest.raises(IndexClosedError, match="closed"):
        index.snapshots("t")
    with pytest.raises(IndexClosedError, match="closed"):
        index.drop_snapshots("t", [1])


_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from bergstream.core.testing.backends import snapshot
    from bergstream.plugins.index_backends.rocksdb_index import RocksIndex
    from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
    opener = RocksIndex if sys.argv[1] == "rocksdb" else SqliteIndex
    index = opener(Path(sys.argv[2]))
    for sequence in range(1, 31):
        index.put_snapshot("ns.t", snapshot(1000 + sequence, sequence, "ns.t"))
    index.drop_snapshots("ns.t", [1001, 1002])
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush
    """
)


@pytest.mark.parametrize("name", sorted(OPENERS))
def test_snapshots_survive_a_killed_process(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"index.{name}"
    result = subprocess.run(
        [sys.executable, "-c", _WRITER, name, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == -signal.SIGKILL and "written" in result.stdout, result.stderr
    index = RocksIndex(path) if name == "rocksdb" else SqliteIndex(path)
    try:
        expected = [snapshot(1000 + s, s, "ns.t") for s in range(3, 31)]
        assert index.snapshots("ns.t") == expected
    finally:
        index.close()


def test_an_sqlite_file_from_before_snapshot_histories_gains_them(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """
            CREATE TABLE chunks (
                topic TEXT NOT NULL, partition INTEGER NOT NULL, start_offset INTEGER NOT NULL,
                end_offset INTEGER NOT NULL, row_count INTEGER NOT NULL,
                size_bytes INTEGER NOT NULL, bounds TEXT NOT NULL,
                PRIMARY KEY (topic, partition, start_offset)
            ) WITHOUT ROWID;
            CREATE TABLE spans (
                topic TEXT NOT NULL, partition INTEGER NOT NULL, span INTEGER NOT NULL,
                PRIMARY KEY (topic, partition)
            ) WITHOUT ROWID;
            INSERT INTO chunks VALUES ('t', 0, 0, 10, 10, 1000, '{}');
            INSERT INTO spans VALUES ('t', 0, 10);
            """
        )
    connection.close()
    index = SqliteIndex(path)
    try:
        assert [c.end_offset for c in index.chunks("t", 0)] == [10]
        assert index.snapshots("t") == []
        index.put_snapshot("t", snapshot(5, 1))
        assert index.snapshots("t") == [snapshot(5, 1)]
    finally:
        index.close()


def test_an_sqlite_history_is_read_through_its_index(tmp_path: Path) -> None:
    index = SqliteIndex(tmp_path / "i.sqlite")
    index.put_snapshot("t", snapshot(5, 1))
    index.put_chunks([chunk(0, 1)])
    index.close()
    with sqlite3.connect(tmp_path / "i.sqlite") as connection:
        plan = connection.execute(f"EXPLAIN QUERY PLAN {_SNAPSHOTS}", ("t",)).fetchall()
    connection.close()
    details = " ".join(str(row[-1]) for row in plan)
    assert "snapshots_by_sequence" in details and "SCAN snapshots" not in details, details
