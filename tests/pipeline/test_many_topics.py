"""One ``bergstream pipeline run --topics REGEX`` for many topics (append, typed and upsert
tables mixed) in one Spark application, the raw append topics in one query: every table equals
its topic; a topic created mid-run is picked up without a restart; a topic whose table cannot be
written fails alone and is retried, while the others go on; a grouped topic whose table is
dropped mid-run leaves the group for a query of its own; a SIGKILL mid-run and a ``--once`` run
after it lose and repeat nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from bergstream.core.lake import LakeConfig, load_catalog
from bergstream.core.typed.row_contract import BOUNDARY_PROPERTY, parse_boundary
from bergstream.pipeline.settings import PipelineLake, resolve_pipeline_lake
from tests.kits.lake import Produced, produce
from tests.support import BERGSTREAM

pytestmark = pytest.mark.slow

#: Topics of each kind at the start (the issue's 50 in all: append, typed, upsert). Typed
#: batches start Python workers: the dearest kind on CI's two cores, so the fewest.
KINDS = {"a": 40, "t": 5, "u": 5}
PARTITIONS = 2
RECORDS = 40


def _config(path: Path, bootstrap: str, home: Path, run: str) -> Path:
    path.write_text(
        textwrap.dedent(
            f"""
            lake:
              kafka_bootstrap: "{bootstrap}"
              catalog:
                uri: sqlite:///{home}/lake/catalog.db
                warehouse: {home}/lake/warehouse
              pipeline:
                trigger_interval_seconds: 5
                topics_refresh_seconds: 1
                topic_retry_seconds: 0.5
                topic_retry_max_seconds: 5
                checkpoint_dir: {home}/lake/checkpoints
                spark_conf:
                  spark.driver.memory: 1g
            codecs:
              topics:
                - match: "{run}-t-*"
                  value: json
            tables:
              topics:
                - match: "{run}-u-*"
                  mode: upsert
            """
        )
    )
    return path


def _records(kind: str, start: int, count: int) -> list[Produced]:
    keys = 7 if kind == "u" else 10**9  # upsert topics write each key many times
    return [
        Produced(
            i % PARTITIONS,
            f"k{i % keys}".encode(),
            f'{{"n": {i}, "name": "v{i}"}}'.encode(),
            (),
            None,
        )
        for i in range(start, start + count)
    ]


def _topics_rows(
    bootstrap: str, topics: list[str]
) -> dict[str, set[tuple[int, int, bytes | None, bytes | None]]]:
    """Every record of ``topics``, read by one consumer assigned all their partitions."""
    from confluent_kafka import Consumer, TopicPartition

    ends = _ends(bootstrap, topics)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    rows: dict[str, set[tuple[int, int, bytes | None, bytes | None]]] = {t: set() for t in topics}
    try:
        consumer.assign(
            [TopicPartition(t, p, 0) for t in topics for p in range(PARTITIONS) if ends[t][p]]
        )
        wanted = sum(sum(e.values()) for e in ends.values())
        deadline = time.monotonic() + 120
        while sum(len(found) for found in rows.values()) < wanted:
            assert time.monotonic() < deadline, "consuming the topics took over 120 s"
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is None:
                    rows[message.topic()].add(
                        (message.partition(), message.offset(), message.key(), message.value())
                    )
        return rows
    finally:
        consumer.close()


def _table_rows(
    lake: PipelineLake, topic: str
) -> list[tuple[int, int, bytes | None, bytes | None]] | None:
    catalog = load_catalog(lake)
    identifier = lake.table_identifier(topic)
    if not catalog.table_exists(identifier):
        return None
    columns = ("kafka_partition", "kafka_offset", "kafka_key", "kafka_value")
    table = catalog.load_table(identifier).scan(selected_fields=columns).to_arrow()
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def _mismatches(lake: PipelineLake, bootstrap: str, topics: list[str]) -> dict[str, str]:
    """What differs between each topic and its table (empty: every table equals its topic,
    no row missing and none twice)."""
    wrong: dict[str, str] = {}
    expected_rows = _topics_rows(bootstrap, topics)
    for topic in topics:
        rows = _table_rows(lake, topic)
        if rows is None:
            wrong[topic] = "no table"
            continue
        expected = expected_rows[topic]
        if len(rows) != len(set(rows)):
            wrong[topic] = f"{len(rows) - len(set(rows))} row(s) twice"
        elif set(rows) != expected:
            wrong[topic] = f"{len(rows)} rows, the topic has {len(expected)}"
    return wrong


def _ends(bootstrap: str, topics: list[str]) -> dict[str, dict[int, int]]:
    """Each topic's end offset per partition (nothing is transactional here)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4().hex}"})
    try:
        return {
            topic: {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(PARTITIONS)
            }
            for topic in topics
        }
    finally:
        consumer.close()


def _behind(lake: PipelineLake, bootstrap: str, topics: list[str]) -> list[str]:
    """The topics whose table's boundary (its current snapshot's) has not reached Kafka's end
    offsets: a cheap look, one LoadTable per topic (the rows are compared once caught up)."""
    catalog = load_catalog(lake)
    behind = []
    for topic, ends in _ends(bootstrap, topics).items():
        identifier = lake.table_identifier(topic)
        snapshot = (
            catalog.load_table(identifier).current_snapshot()
            if catalog.table_exists(identifier)
            else None
        )
        summary = snapshot.summary.additional_properties if snapshot is not None else {}
        boundary = parse_boundary(summary.get(BOUNDARY_PROPERTY))
        if any(boundary.get(p, 0) < end for p, end in ends.items()):
            behind.append(topic)
    return behind


def _wait_equal(
    lake: PipelineLake,
    bootstrap: str,
    topics: list[str],
    process: subprocess.Popen[bytes],
    log: Path,
    timeout: float,
) -> None:
    """Wait until every table caught up with its topic, then compare their rows."""
    deadline = time.monotonic() + timeout
    while behind := _behind(lake, bootstrap, topics):
        assert process.poll() is None, f"the pipeline exited:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, (
            f"{len(behind)} table(s) still behind their topics after {timeout:.0f} s: "
            f"{behind[:5]}\n{log.read_text()[-4000:]}"
        )
        time.sleep(1)
    assert _mismatches(lake, bootstrap, topics) == {}


def _start(config: Path, pattern: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    command = [BERGSTREAM, "pipeline", "run", "-c", str(config), "--topics", pattern, *extra]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _create_bad_table(lake: PipelineLake, topic: str) -> None:
    """A table named like ``topic`` that does not follow the row contract: the pipeline cannot
    write the topic into it."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = load_catalog(lake)
    catalog.create_namespace_if_not_exists(lake.namespace)
    catalog.create_table(
        lake.table_identifier(topic), Schema(NestedField(1, "x", LongType(), required=True))
    )


@pytest.mark.timeout(1500)
def test_one_application_copies_many_topics(
    kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    run = f"many{uuid.uuid4().hex[:8]}"
    home = tmp_path / "home"
    config = _config(tmp_path / "lake.yaml", kafka_bootstrap, home, run)
    lake = resolve_pipeline_lake(LakeConfig(kafka_bootstrap=kafka_bootstrap), home=home)
    pattern = re.escape(run) + "-.*"
    topics = [
        new_topic(PARTITIONS, prefix=f"{run}-{kind}")
        for kind, count in KINDS.items()
        for _ in range(count)
    ]
    for topic in topics:
        produce(kafka_bootstrap, topic, _records(topic.split("-")[1], 0, RECORDS))
    bad = new_topic(PARTITIONS, prefix=f"{run}-a")
    produce(kafka_bootstrap, bad, _records("a", 0, RECORDS))
    _create_bad_table(lake, bad)
    log = tmp_path / "pipeline.log"
    process = _start(config, pattern, log)
    try:
        _wait_equal(lake, kafka_bootstrap, topics, process, log, timeout=600)
        text = log.read_text()
        assert f"[{bad}] failed (attempt 1)" in text, text[-4000:]
        untouched = load_catalog(lake).load_table(lake.table_identifier(bad))
        assert [f.name for f in untouched.schema().fields] == ["x"]
        assert untouched.scan().to_arrow().num_rows == 0, "the bad table got rows"

        grouped = sum(1 for t in topics if t.split("-")[1] == "a")
        assert f"copying {grouped} topic(s) in one query" in text, text[-4000:]

        # A topic made mid-run gets its query without a restart.
        late = new_topic(PARTITIONS, prefix=f"{run}-a")
        produce(kafka_bootstrap, late, _records("a", 0, RECORDS))
        # The bad topic's table fixed: its next attempt copies it.
        load_catalog(lake).drop_table(lake.table_identifier(bad))
        # A grouped topic's table dropped under the running group: the topic leaves the group
        # for a query of its own (which makes the table again), the group goes on without it.
        dropped = topics[1]
        load_catalog(lake).drop_table(lake.table_identifier(dropped))
        produce(kafka_bootstrap, dropped, _records("a", RECORDS, 10))
        _wait_equal(lake, kafka_bootstrap, [late, bad, dropped, topics[2]], process, log, 300)
        deadline = time.monotonic() + 120  # the group starts again without the dropped topic
        while f"copying {grouped - 1} topic(s) in one query" not in (text := log.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, text[-4000:]
            time.sleep(0.5)
        assert f"new topic(s) matching the pattern: {late}" in text
        assert f"[{dropped}] leaves the group" in text, text[-4000:]
        assert "topic(s) failed" not in text, text[-4000:]

        # Records keep coming; SIGKILL once some of them were committed.
        seen = log.stat().st_size
        busy = topics[::5]
        for topic in busy:
            produce(kafka_bootstrap, topic, _records(topic.split("-")[1], RECORDS, 200))
        deadline = time.monotonic() + 300
        while log.read_bytes()[seen:].count(b"] batch ") < 2:
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        for topic in busy[::2]:
            produce(kafka_bootstrap, topic, _records(topic.split("-")[1], RECORDS + 200, 100))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)

    everything = [*topics, late, bad]
    final = _start(config, pattern, log, "--once")
    assert final.wait(timeout=600) == 0, log.read_text()[-5000:]
    assert _mismatches(lake, kafka_bootstrap, everything) == {}

    # Upsert topics keep their state tables too: one row per key.
    catalog = load_catalog(lake)
    for topic in [t for t in topics if t.split("-")[1] == "u"]:
        state = catalog.load_table((lake.current_namespace, topic)).scan().to_arrow()
        assert state.num_rows == 7, (topic, state.num_rows)
