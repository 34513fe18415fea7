"""Small files rebuilt as one: a table loaded after every few new records gets a file per
served watermark; a run of them is read and indexed again as one file, the next snapshot is a
REPLACE of them (the same rows), and older snapshots still read what they read."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from tests.isk.tables.hotset_cases import T0, expected_rows, make_provider
from tests.kits.fake_log import FakeLog
from tests.kits.hotset_reader import data_files, scan_rows
from tests.support import BERGSTREAM

#: Offsets per chunk window; with coalesce_files 4 a chunk under 20 offsets is small.
WINDOW = 80


async def load_after_each(
    provider: HotsetProvider, log: FakeLog, loads: int, records: int, produced: list
) -> list[Any]:
    """Produce ``records`` to partition 0 of ``orders`` and load its table, ``loads`` times,
    each time once the small files the load started rebuilding are rebuilt."""
    tables = []
    for _ in range(loads):
        first = len(produced)
        produced += log.produce("orders", 0, records, lambda i, first=first: T0 + first + i)
        tables.append(await provider.load_table("hotset", "orders"))
        await provider.indexer.settle()
    return tables


async def test_runs_of_small_files_become_one_and_snapshots_replace_them(
    tmp_path: Path, log: FakeLog
) -> None:
    provider = make_provider(tmp_path, log, chunk_records=WINDOW, coalesce_files=4)
    produced: list = []
    tables = await load_after_each(provider, log, 11, 3, produced)
    last = tables[-1]
    # Load 5 listed four small files before its tail: rebuilt as 0-12. Load 8 listed 0-12 and
    # three small ones before its tail: rebuilt as 0-21, no longer small (20 offsets or more).
    assert await data_files(provider, last) == [
        "0-21.parquet", "21-24.parquet", "24-27.parquet", "27-30.parquet", "30-33.parquet"
    ]  # fmt: skip
    snapshots = last.metadata["snapshots"]
    operations = "".join(s["summary"]["operation"][0] for s in snapshots)
    assert operations == "aaaaaraaaraaa"
    for parent, snapshot in itertools.pairwise(snapshots):
        if snapshot["summary"]["operation"] == "replace":  # the same rows in fewer files
            assert snapshot["summary"]["total-records"] == parent["summary"]["total-records"]
            assert int(snapshot["summary"]["total-data-files"]) < int(
                parent["summary"]["total-data-files"]
            )
    # Every snapshot reads what it read when it was served: a REPLACE the rows of its parent.
    appended = 0
    for snapshot in snapshots:
        appended += snapshot["summary"]["operation"] == "append"
        rows = await scan_rows(provider, last, snapshot_id=snapshot["snapshot-id"])
        assert rows == expected_rows({0: produced[: 3 * appended]}), snapshot
    assert await scan_rows(provider, last) == expected_rows({0: produced})
    # Earlier tables' metadata (served before a rebuild) still read the same rows.
    assert await scan_rows(provider, tables[3]) == expected_rows({0: produced[:12]})


async def test_a_window_the_tail_has_left_becomes_one_file(tmp_path: Path, log: FakeLog) -> None:
    provider = make_provider(tmp_path, log, chunk_records=20, coalesce_files=4)
    produced: list = []
    tables = await load_after_each(provider, log, 9, 3, produced)
    last = tables[-1]
    # Offsets 0-27 in windows of 20: the first window, left by the tail, is one file.
    files = await data_files(provider, last)
    assert files[0] == "0-20.parquet" and all(int(f.split("-")[0]) >= 20 for f in files[1:])
    assert "r" in "".join(s["summary"]["operation"][0] for s in last.metadata["snapshots"])
    appended = 0
    for snapshot in last.metadata["snapshots"]:
        appended += snapshot["summary"]["operation"] == "append"
        rows = await scan_rows(provider, last, snapshot_id=snapshot["snapshot-id"])
        assert rows == expected_rows({0: produced[: 3 * appended]}), snapshot
    assert await scan_rows(provider, tables[2]) == expected_rows({0: produced[:9]})


async def test_without_coalescing_every_load_keeps_its_file(tmp_path: Path, log: FakeLog) -> None:
    provider = make_provider(tmp_path, log, chunk_records=WINDOW, coalesce_files=0)
    produced: list = []
    *_, after = await load_after_each(provider, log, 11, 3, produced)
    assert len(await data_files(provider, after)) == 11
    assert {s["summary"]["operation"] for s in after.metadata["snapshots"]} == {"append"}


async def test_runs_are_small_consecutive_chunks_of_one_window(
    tmp_path: Path, log: FakeLog
) -> None:
    from bergstream.core.api import ChunkEntry

    indexer = make_provider(tmp_path, log, chunk_records=WINDOW, coalesce_files=4).indexer

    day = 86_400_000_000  # micros

    def chunks(*offsets: tuple[int, ...]) -> list[ChunkEntry]:
        """Chunks ``(start, end)`` of day 0's rows, or ``(start, end, day)``."""
        return [
            ChunkEntry("orders", 0, a, b, b - a, 100, {"kafka_timestamp": (d * day, d * day)})
            for a, b, d in ((*o, 0) if len(o) == 2 else o for o in offsets)
        ]

    small4 = [(0, 5), (5, 10), (10, 15), (15, 20)]
    assert indexer.small_runs(chunks(*small4, (20, 21))) == [(0, 20)]
    # The last chunk (the tail) never joins; three small ones are not a run.
    assert indexer.small_runs(chunks(*small4)) == []
    # A chunk of 20 offsets (chunk_records / coalesce_files) is not small: it splits the run.
    assert indexer.small_runs(chunks(*small4[:2], (10, 30), (30, 35), (35, 36))) == []
    # Chunks of the next window start a new run; a gap does too.
    assert indexer.small_runs(chunks((70, 75), (75, 80), (80, 85), (85, 90), (90, 95), (95, 99),
                                     (99, 100))) == [(70, 80), (80, 99)]  # fmt: skip
    assert indexer.small_runs(chunks((0, 5), (5, 10), (12, 15), (15, 18), (18, 19), (19, 20),
                                     (20, 21))) == [(12, 20)]  # fmt: skip
    # A window the tail has left becomes one file whatever its chunks' sizes (two or more,
    # consecutive); a gap splits it, and a lone chunk stays.
    assert indexer.small_runs(chunks((0, 40), (40, 70), (70, 80), (80, 81))) == [(0, 80)]
    assert indexer.small_runs(chunks((0, 40), (45, 70), (70, 80), (80, 81))) == [(45, 80)]
    assert indexer.small_runs(chunks((0, 80), (80, 160), (160, 161))) == []
    # The window right before the tail's is left once the tail starts the next one.
    assert indexer.small_runs(chunks((0, 40), (40, 80))) == []
    # A run never spans two time buckets (a rebuild would cut it there again); a chunk without
    # rows (control records, aborted ones) joins either.
    assert indexer.small_runs(chunks((0, 40), (40, 80, 1), (80, 81, 1))) == []
    assert indexer.small_runs(chunks((0, 30), (30, 50), (50, 80, 1), (80, 81, 1))) == [(0, 50)]
    small_days = [(0, 5), (5, 10, 1), (10, 15, 1), (15, 20, 1), (20, 25, 1), (25, 26, 1)]
    assert indexer.small_runs(chunks(*small_days)) == [(5, 25)]
    empty = ChunkEntry("orders", 0, 40, 45, 0, 0, {})
    mixed = [*chunks((0, 40)), empty, *chunks((45, 80, 1), (80, 81, 1))]
    assert indexer.small_runs(mixed) == [(0, 45)]


def test_a_negative_coalesce_files_is_refused_by_config_check(tmp_path: Path) -> None:
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      http: {access_key: a, secret_key: b}\n      coalesce_files: -1\n"
    )
    result = subprocess.run(
        [BERGSTREAM, "config", "check", str(config)], capture_output=True, text=True, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "coalesce_files" in output and "greater than or equal to 0" in output
