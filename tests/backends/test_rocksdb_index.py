"""The ``rocksdb`` index backend: the conformance suite through the pytest mix-in class (as a
third party would use it), then what is specific to RocksDB: restarts after a killed process,
the one-process lock, refusals, the key layout and the registration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from bergstream.core.backends import ChunkEntry, ServiceContext
from bergstream.core.plugins import load_registry
from bergstream.core.testing.backends import (
    ConformanceError,
    IndexCase,
    IndexConformance,
    chunk,
    run_index_conformance,
)
from bergstream.plugins.index_backends import plugin
from bergstream.plugins.index_backends.rocksdb_index import IndexLockedError, RocksIndex
from bergstream.plugins.index_backends.sqlite_index import IndexClosedError, IndexEntryError

CASE = IndexCase("rocksdb", lambda location: RocksIndex(location / "index.rocksdb"))


class TestRocksdbConformance(IndexConformance):
    """Every index check, one test each."""

    @pytest.fixture
    def index_case(self) -> IndexCase:
        """The case every inherited test runs."""
        return CASE


def test_the_runner_passes_rocksdb_and_names_what_a_broken_backend_breaks(
    tmp_path: Path,
) -> None:
    run_index_conformance(CASE, tmp_path / "good")

    class ForgetsOverwrites(RocksIndex):
        def put_chunks(self, entries: Any) -> None:
            known = {e.start_offset for e in self.chunks("t", 0)}
            super().put_chunks([e for e in entries if e.start_offset not in known])

    broken = IndexCase("forgetful", lambda location: ForgetsOverwrites(location / "db"))
    with pytest.raises(ConformanceError, match="index_overwrite") as caught:
        run_index_conformance(broken, tmp_path / "bad")
    assert "'forgetful' fails" in str(caught.value)
    assert "index_round_trip" not in str(caught.value)


_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from bergstream.core.testing.backends import chunk
    from bergstream.plugins.index_backends.rocksdb_index import RocksIndex
    index = RocksIndex(Path(sys.argv[1]))
    for i in range(50):
        index.put_chunks([chunk(i * 10, i * 10 + 10)])
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush
    """
)


def test_writes_survive_a_killed_process(tmp_path: Path) -> None:
    path = tmp_path / "index.rocksdb"
    result = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == -signal.SIGKILL and "written" in result.stdout, result.stderr
    index = RocksIndex(path)
    assert [e.start_offset for e in index.chunks("t", 0)] == list(range(0, 500, 10))
    assert index.chunks("t", 0, 495, 496) == [chunk(490, 500)]
    index.close()


def test_a_second_process_gets_a_clear_lock_error(tmp_path: Path) -> None:
    path = tmp_path / "index.rocksdb"
    index = RocksIndex(path)
    probe = (
        "import sys; from pathlib import Path\n"
        "from bergstream.plugins.index_backends.rocksdb_index import RocksIndex, "
        "IndexLockedError\n"
        "try:\n    RocksIndex(Path(sys.argv[1]))\n"
        "except IndexLockedError as e:\n    print(e)\n    sys.exit(3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr
    assert "open elsewhere" in result.stdout and "index.config.path" in result.stdout
    index.close()
    # once closed, the directory is free again (no iterator kept it open)
    result = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_reopening_in_the_same_process_needs_close(tmp_path: Path) -> None:
    index = RocksIndex(tmp_path / "db")
    index.put_chunks([chunk(0, 10)])
    index.chunks("t", 0)
    with pytest.raises(IndexLockedError):
        RocksIndex(tmp_path / "db")
    index.close()
    RocksIndex(tmp_path / "db").close()


def test_use_after_close_is_a_clear_error(tmp_path: Path) -> None:
    index = RocksIndex(tmp_path / "db")
    index.close()
    index.close()  # twice is harmless
    with pytest.raises(IndexClosedError, match="closed"):
        index.chunks("t", 0)
    with pytest.raises(IndexClosedError, match="closed"):
        index.put_chunks([chunk(0, 1)])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (ChunkEntry("t", 0, 10, 5, 0, 0), "start_offset <= end_offset"),
        (ChunkEntry("t", -1, 0, 5, 0, 0), "partition >= 0"),
        (ChunkEntry("t", 0, 0, 5, -1, 0), "row_count"),
        (ChunkEntry("t", 0, 0, 5, 5, 0, {"x": (object(), 1)}), "cannot be stored"),
        (ChunkEntry("x" * 70000, 0, 0, 5, 5, 0), "out of range"),
    ],
)
def test_bad_entries_are_refused_and_nothing_is_written(
    tmp_path: Path, entry: ChunkEntry, message: str
) -> None:
    index = RocksIndex(tmp_path / "db")
    with pytest.raises(IndexEntryError, match=message):
        index.put_chunks([chunk(0, 5), entry])
    assert index.chunks("t", 0) == []
    index.close()


def test_a_range_query_reads_only_nearby_keys(tmp_path: Path) -> None:
    """With 20 000 chunks, a query near the end answers as fast as one near the start (the
    scan starts one span before the range, not at offset 0)."""
    import time

    index = RocksIndex(tmp_path / "db")
    for base in range(0, 200_000, 10_000):
        index.put_chunks([chunk(o, o + 10) for o in range(base, base + 10_000, 10)])

    def timed(start: int) -> float:
        begin = time.perf_counter()
        for _ in range(200):
            assert len(index.chunks("t", 0, start, start + 25)) == 3
        return time.perf_counter() - begin

    early, late = timed(5), timed(199_900)
    assert late < early * 5 + 0.05, (early, late)
    index.close()


def test_the_plugin_registers_rocksdb_with_a_typed_config(tmp_path: Path) -> None:
    registration = load_registry([plugin], entry_points=False).get("index backend", "rocksdb")
    fake: Any = SimpleNamespace()
    context = ServiceContext(config=fake, plugins=fake, home=tmp_path)
    index = registration.factory(registration.config_model.model_validate({}), context)
    assert isinstance(index, RocksIndex) and index.path == tmp_path / "isk" / "index.rocksdb"
    index.put_chunks([chunk(0, 3)])
    index.close()
    explicit = registration.config_model.model_validate(
        {"path": str(tmp_path / "x"), "sync_writes": True}
    )
    index = registration.factory(explicit, context)
    assert index.path == tmp_path / "x" and os.path.isdir(tmp_path / "x")
    index.close()
    with pytest.raises(ValidationError, match="pth"):
        registration.config_model.model_validate({"pth": "x"})
