"""Exactly once under a crash, for an upsert topic: ``bergstream pipeline run`` SIGKILLed at
random moments (some between a batch's log commit and its state commit) while keyed updates and
tombstones keep arriving, restarted each time; the state table ends equal to a replay of the
topic, and its boundary equals the log table's."""

from __future__ import annotations

import os
import random
import signal
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.core.lake import LakeConfig, load_catalog
from bergstream.core.typed.row_contract import table_boundary
from bergstream.pipeline.settings import resolve_pipeline_lake
from tests.kits.lake import Produced, consume_all, produce
from tests.pipeline.pipeline_process import commits_since, start_run

pytestmark = pytest.mark.slow

PARTITIONS = 3
KILLS = 4
KEYS = 400


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
                max_offsets_per_trigger: 800
                checkpoint_dir: {home}/lake/checkpoints
                spark_conf:
                  spark.driver.memory: 1g
            tables:
              topics:
                - match: "*"
                  mode: upsert
            """
        )
    )
    return path


def _producer(
    bootstrap: str, topic: str, stop: threading.Event, sent: list[int], seed: int
) -> None:
    rng = random.Random(seed)
    index = 0
    while not stop.is_set() and index < 12_000:
        chunk = []
        for i in range(index, index + 400):
            key = rng.randrange(KEYS)
            value = None if rng.random() < 0.1 else f"v{i}".encode() * 4
            chunk.append(Produced(key % PARTITIONS, f"k{key}".encode(), value, (), None))
        produce(bootstrap, topic, chunk)
        index += len(chunk)
        sent[0] = index
        stop.wait(1.0)


def _state_commits_since(log: Path, offset: int) -> int:
    with open(log, "rb") as handle:
        handle.seek(offset)
        return sum(1 for line in handle if line.startswith(b"state "))


@pytest.mark.timeout(1800)
def test_sigkill_keeps_the_state_exactly_once(
    kafka_bootstrap: str, create_topic: Callable[..., str], tmp_path: Path
) -> None:
    seed = int(os.environ.get("BERGSTREAM_CRASH_SEED", str(random.randrange(2**32))))
    print(f"state crash test seed {seed} (set BERGSTREAM_CRASH_SEED to repeat)")
    rng = random.Random(seed)
    home = tmp_path / "home"
    config = _config(tmp_path / "lake.yaml", kafka_bootstrap, home)
    lake = resolve_pipeline_lake(LakeConfig(kafka_bootstrap=kafka_bootstrap), home=home)
    topic = create_topic(PARTITIONS, prefix="crash-state")
    log = tmp_path / "pipeline.log"
    stop, sent = threading.Event(), [0]
    producer = threading.Thread(target=_producer, args=(kafka_bootstrap, topic, stop, sent, seed))
    producer.start()
    between = 0
    try:
        for kill in range(KILLS):
            seen = log.stat().st_size if log.exists() else 0
            process = start_run(config, topic, log)
            deadline = time.monotonic() + 300
            # Once this run has committed a batch to the log table, kill it at a random
            # moment: within the state step right after a log commit, or later.
            while commits_since(log, seen) < 1:
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.5))
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
            logged, states = commits_since(log, seen), _state_commits_since(log, seen)
            between += logged > states
            print(f"kill {kill + 1}: {logged} log commit(s), {states} state commit(s)")
    finally:
        stop.set()
        producer.join(timeout=120)

    final = start_run(config, topic, log, once=True)
    assert final.wait(timeout=300) == 0, log.read_text()[-5000:]

    truth = consume_all(kafka_bootstrap, topic, PARTITIONS)
    assert len(truth) == sent[0]
    expected: dict[bytes, bytes] = {}
    for record in sorted(truth, key=lambda r: (r.partition, r.record.offset)):
        key = record.record.key
        assert key is not None
        if record.record.value is None:
            expected.pop(key, None)
        else:
            expected[key] = record.record.value
    catalog = load_catalog(lake)
    state = catalog.load_table((lake.current_namespace, topic))
    rows = state.scan().to_arrow().to_pylist()
    found = {r["kafka_key"]: r["kafka_value"] for r in rows}
    assert len(found) == len(rows), "a key has two rows"
    assert found == expected
    log_table = catalog.load_table(lake.table_identifier(topic))
    assert table_boundary(state) == table_boundary(log_table)
    print(f"{KILLS} kills, {between} between a log commit and its state commit")
