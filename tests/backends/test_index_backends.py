"""The ``sqlite`` index backend: the conformance suite (:mod:`bergstream.core.testing.backends`),
then what is specific to it. The ``rocksdb`` backend is tested in test_rocksdb_index.py."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import sqlite3
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from bergstream.core.backends import ChunkEntry, ServiceContext
from bergstream.core.plugins import load_registry
from bergstream.core.testing.backends import INDEX_CHECKS, IndexCase, check_id, chunk
from bergstream.plugins.index_backends import plugin
from bergstream.plugins.index_backends.sqlite_index import (
    IndexClosedError,
    IndexEntryError,
    SqliteIndex,
    decode_bounds,
    encode_bounds,
)

CASES = [IndexCase("sqlite", lambda location: SqliteIndex(location / "index.sqlite"))]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("check", INDEX_CHECKS, ids=check_id)
def test_index_contract(
    case: IndexCase, check: Callable[[IndexCase, Path], None], tmp_path: Path
) -> None:
    check(case, tmp_path)


# --------------------------------------------------------------------------- sqlite specifics


def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    SqliteIndex(tmp_path / "i.sqlite").close()
    with sqlite3.connect(tmp_path / "i.sqlite") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_bounds_round_trip_as_json() -> None:
    bounds = {
        "kafka_offset": (0, 2**62),
        "kafka_timestamp": (
            dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
            dt.datetime(2030, 1, 1, 1, 2, 3, 456000, tzinfo=dt.UTC),
        ),
        "kafka_key": (b"", b"\xff"),
        "name": ("a", None),
    }
    assert decode_bounds(encode_bounds(bounds)) == bounds


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (ChunkEntry("t", 0, 10, 5, 0, 0), "start_offset <= end_offset"),
        (ChunkEntry("t", -1, 0, 5, 0, 0), "partition >= 0"),
        (ChunkEntry("t", 0, 0, 5, -1, 0), "row_count"),
        (ChunkEntry("t", 0, 0, 5, 5, 0, {"x": (object(), 1)}), "cannot be stored"),
        (ChunkEntry("t", 0, 0, 5, 5, 0, {"x": (dt.datetime(2020, 1, 1), 1)}), "naive"),
    ],
)
def test_bad_entries_are_refused_and_nothing_is_written(
    tmp_path: Path, entry: ChunkEntry, message: str
) -> None:
    index = SqliteIndex(tmp_path / "i.sqlite")
    with pytest.raises(IndexEntryError, match=message):
        index.put_chunks([chunk(0, 5), entry])
    assert index.chunks("t", 0) == []
    index.close()


def test_use_after_close_is_a_clear_error(tmp_path: Path) -> None:
    index = SqliteIndex(tmp_path / "i.sqlite")
    index.close()
    with pytest.raises(IndexClosedError, match="closed"):
        index.chunks("t", 0)


def _write_in_another_process(path: str, first: int, count: int) -> None:
    index = SqliteIndex(Path(path))
    for i in range(first, first + count):
        index.put_chunks([chunk(i * 10, i * 10 + 10)])
    index.close()


def test_writers_and_readers_in_other_processes(tmp_path: Path) -> None:
    path = tmp_path / "i.sqlite"
    index = SqliteIndex(path)
    spawn = multiprocessing.get_context("spawn")
    writers = [
        spawn.Process(target=_write_in_another_process, args=(str(path), n * 50, 50))
        for n in range(2)
    ]
    for writer in writers:
        writer.start()
    while any(writer.is_alive() for writer in writers):
        found = index.chunks("t", 0)
        assert all(e.end_offset == e.start_offset + 10 for e in found)
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert [e.start_offset for e in index.chunks("t", 0)] == list(range(0, 1000, 10))
    index.close()


# --------------------------------------------------------------------------- registration


def test_the_plugin_registers_sqlite_with_a_typed_config(tmp_path: Path) -> None:
    registration = load_registry([plugin], entry_points=False).get("index backend", "sqlite")
    config = registration.config_model.model_validate({})
    fake: Any = SimpleNamespace()
    index = registration.factory(config, ServiceContext(config=fake, plugins=fake, home=tmp_path))
    assert isinstance(index, SqliteIndex) and index.path == tmp_path / "isk" / "index.sqlite"
    index.close()
    explicit = registration.config_model.model_validate({"path": str(tmp_path / "x.db")})
    assert explicit.path == tmp_path / "x.db"
    with pytest.raises(ValidationError, match="pth"):
        registration.config_model.model_validate({"pth": "x"})


def test_a_file_without_spans_gets_them_on_open(tmp_path: Path) -> None:
    """Files written before spans were kept: opening derives them, so a long chunk that starts
    well before a range is still found."""
    path = tmp_path / "i.sqlite"
    index = SqliteIndex(path)
    index.put_chunks([chunk(0, 1000), chunk(1000, 1010)])
    index.close()
    with sqlite3.connect(path) as connection:
        connection.execute("DELETE FROM spans")
    reopened = SqliteIndex(path)
    assert reopened.chunks("t", 0, 900, 901) == [chunk(0, 1000)]
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT span FROM spans").fetchall() == [(1000,)]
    reopened.close()


def test_a_range_query_is_one_bounded_primary_key_search(tmp_path: Path) -> None:
    from bergstream.plugins.index_backends.sqlite_index import _OVERLAPPING

    SqliteIndex(tmp_path / "i.sqlite").close()
    with sqlite3.connect(tmp_path / "i.sqlite") as connection:
        plan = " ".join(
            row[3]
            for row in connection.execute(f"EXPLAIN QUERY PLAN {_OVERLAPPING}", ("t", 0, 5, 9))
        )
    assert "SEARCH chunks USING PRIMARY KEY (topic=? AND partition=? AND start_offset>?" in plan
