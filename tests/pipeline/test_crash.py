"""Crash safety: ``bergstream pipeline run`` killed with SIGKILL at random moments while records
keep arriving, restarted each time, sometimes with its checkpoint deleted; the table ends equal
to the topic, with no duplicate and no gap."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.core.lake import LakeConfig
from bergstream.pipeline.settings import resolve_pipeline_lake
from tests.kits.lake import Produced, consume_all, produce, table_rows_pyiceberg
from tests.pipeline.pipeline_process import commits_since, start_run

pytestmark = pytest.mark.slow

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
PARTITIONS = 3
#: SIGKILLs per run: 6 in CI (three of them once the run has committed, as the last assert
#: needs), more with BERGSTREAM_CRASH_KILLS (each new seed explores other moments).
KILLS = int(os.environ.get("BERGSTREAM_CRASH_KILLS", "6"))


def _config(path: Path, bootstrap: str, home: Path) -> Path:
    path.write_text(
        textwrap.dedent(
            f"""
            lake:
              kafka_bootstrap: "{bootstrap}"
              catalog:
                uri: sqlite:///{home}/lake/catalog.db
                warehouse: {home}/lake/warehouse
              pipeline:
                trigger_interval_seconds: 0.5
                max_offsets_per_trigger: 1500
                checkpoint_dir: {home}/lake/checkpoints
                spark_conf:
                  spark.driver.memory: 1g
            """
        )
    )
    return path


def _producer(bootstrap: str, topic: str, stop: threading.Event, sent: list[int]) -> None:
    index = 0
    while not stop.is_set() and index < 30_000:
        chunk = [
            Produced(i % PARTITIONS, f"k{i}".encode(), f"value-{i}".encode() * 8, (), None)
            for i in range(index, index + 500)
        ]
        produce(bootstrap, topic, chunk)
        index += len(chunk)
        sent[0] = index
        stop.wait(2.0)


def _caught_up(log: Path, offset: int, total: int) -> bool:
    """Whether this run's last batch reached offsets that add up to ``total`` records."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        batches = [line for line in handle if line.startswith(b"batch ")]
    found = re.search(rb"offsets ((?:\d+:\d+ ?)+)\s*$", batches[-1]) if batches else None
    if found is None:
        return False
    return sum(int(pair.split(b":")[1]) for pair in found.group(1).split()) == total


def _wait_for_commits(
    log: Path,
    offset: int,
    count: int,
    process: subprocess.Popen[bytes],
    produced_all: Callable[[], int | None],
    timeout: float = 300,  # a Spark start and 3 batches: 180 s was once too short at load ~2
) -> None:
    """Wait for ``count`` commits of this run, or fewer if it copied everything there will
    ever be (``produced_all()``: the total once the producer has finished): no more commits
    would come."""
    deadline = time.monotonic() + timeout
    while commits_since(log, offset) < count:
        total = produced_all()
        if total is not None and _caught_up(log, offset, total):
            return
        assert process.poll() is None, f"the pipeline exited early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, (
            f"no {count} commits in {timeout}s:\n{log.read_text()[-3000:]}"
        )
        time.sleep(0.1)


@pytest.mark.timeout(1800)
def test_sigkill_at_random_moments(
    kafka_bootstrap: str, create_topic: Callable[..., str], tmp_path: Path
) -> None:
    seed = int(os.environ.get("BERGSTREAM_CRASH_SEED", str(random.randrange(2**32))))
    print(f"crash test seed {seed} (set BERGSTREAM_CRASH_SEED to repeat)")
    rng = random.Random(seed)
    home = tmp_path / "home"
    config = _config(tmp_path / "lake.yaml", kafka_bootstrap, home)
    lake = resolve_pipeline_lake(LakeConfig(kafka_bootstrap=kafka_bootstrap), home=home)
    topic = create_topic(PARTITIONS, prefix="crash")
    log = tmp_path / "pipeline.log"

    stop, sent = threading.Event(), [0]
    producer = threading.Thread(target=_producer, args=(kafka_bootstrap, topic, stop, sent))
    producer.start()
    deleted_checkpoints = 0
    killed_while_copying = 0
    try:
        for kill in range(KILLS):
            seen = log.stat().st_size if log.exists() else 0
            process = start_run(config, topic, log)
            if kill % 2:
                # Anywhere from start-up to the middle of copying.
                time.sleep(rng.uniform(2.0, 20.0))
            else:
                # Once this run has committed 1-3 batches, then at a random point of the next
                # batch: a machine slow to start Spark must not turn every kill into a start-up
                # kill.
                _wait_for_commits(
                    log,
                    seen,
                    rng.randint(1, 3),
                    process,
                    lambda: None if producer.is_alive() else sent[0],
                )
                time.sleep(rng.uniform(0.0, 2.0))
            assert process.poll() is None, f"the pipeline exited early:\n{log.read_text()[-3000:]}"
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
            commits = commits_since(log, seen)
            killed_while_copying += commits > 0
            if rng.random() < 0.35:
                shutil.rmtree(lake.checkpoint_dir / f"coldset.{topic}", ignore_errors=True)
                deleted_checkpoints += 1
            print(f"kill {kill + 1}: {sent[0]} records produced, {commits} commit(s) in this run")
    finally:
        stop.set()
        producer.join(timeout=120)

    # SIGTERM stops a continuous run cleanly (exit 0) after its current batch.
    seen = log.stat().st_size
    process = start_run(config, topic, log)
    deadline = time.monotonic() + 120
    while b"copying topic" not in log.read_bytes()[seen:]:
        assert time.monotonic() < deadline and process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    time.sleep(3)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0, log.read_text()[-3000:]

    final = start_run(config, topic, log, once=True)
    assert final.wait(timeout=300) == 0, log.read_text()[-5000:]

    truth = consume_all(kafka_bootstrap, topic, PARTITIONS)
    rows = table_rows_pyiceberg(lake, topic)
    keys = [(r["kafka_partition"], r["kafka_offset"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate rows"
    assert len(rows) == len(truth) == sent[0]
    for row, record in zip(rows, truth, strict=True):
        assert (row["kafka_partition"], row["kafka_offset"]) == (
            record.partition,
            record.record.offset,
        )
        assert row["kafka_value"] == record.record.value
    print(f"{KILLS} kills, {deleted_checkpoints} checkpoint(s) deleted, {len(rows)} rows")
    assert killed_while_copying >= 3, "too few kills landed while the pipeline was copying"

    described = subprocess.run(
        [BERGSTREAM, "table", "describe", "-c", str(config), "--topic", topic],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    facts = json.loads(described.stdout)
    ends = {str(p): sum(1 for r in truth if r.partition == p) for p in range(PARTITIONS)}
    assert facts["rows"] == len(truth) and facts["boundary"] == ends
    assert facts["table"] == f"coldset.{topic}" and facts["data_files"] > 0
    assert facts["snapshots"] >= 1
