"""Raw rows of many topics written by the workers into each topic's table files (:mod:`bergstream.
pipeline.group_files`), without Spark: the rows as Spark hands them (small binary types, a
``topic`` column), a file per topic, Kafka partition and day with the row contract's field ids,
every row kept byte for byte, and a failed task leaving no file behind."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bergstream.core.api import PARTITION_SPEC, ROW_ARROW_SCHEMA
from bergstream.pipeline.group_files import write_group_files
from bergstream.pipeline.typed_files import FileTarget, file_target

DAY = dt.datetime(2024, 5, 1, 23, 59, 58, tzinfo=dt.UTC)

#: The Arrow schema Spark's mapInArrow hands the workers (Spark's types: no large ones).
SPARK_ROWS = pa.schema(
    [
        ("topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("us", tz="Etc/UTC")),
        ("kafka_timestamp_type", pa.int32()),
        ("kafka_key", pa.binary()),
        (
            "kafka_headers",
            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
        ),
        ("kafka_value", pa.binary()),
    ]
)


def _rows(topic: str, partition: int, offsets: range, moment: dt.datetime) -> list[dict]:
    return [
        {
            "topic": topic,
            "kafka_partition": partition,
            "kafka_offset": o,
            "kafka_timestamp": moment + dt.timedelta(seconds=o),
            "kafka_timestamp_type": 0,
            "kafka_key": b"k%d" % o if o % 3 else None,
            "kafka_headers": [{"key": "h", "value": b"\x00\xff%d" % o}] if o % 2 else [],
            "kafka_value": b"v\x00%d" % o,
        }
        for o in offsets
    ]


def _batch(rows: list[dict]) -> pa.RecordBatch:
    return pa.Table.from_pylist(rows, schema=SPARK_ROWS).to_batches()[0]


def _target(path: Path) -> FileTarget:
    target = file_target(ROW_ARROW_SCHEMA, PARTITION_SPEC, f"file:{path}/data", {}, {})
    assert target is not None
    return target


def _answer(out: Iterator[pa.RecordBatch]) -> list[dict]:
    return pa.Table.from_batches(list(out)).to_pylist()


def test_each_topic_gets_its_own_files_with_every_row(tmp_path: Path) -> None:
    targets = {"a": _target(tmp_path / "a"), "b": _target(tmp_path / "b")}
    rows_a = _rows("a", 0, range(0, 5), DAY)  # crosses midnight: two days
    rows_b = _rows("b", 1, range(10, 13), DAY - dt.timedelta(days=3))
    # One batch from each task (one topic-partition), and one that mixes both topics.
    batches = [_batch(rows_a[:3]), _batch(rows_b), _batch(rows_a[3:])]
    answer = _answer(write_group_files(targets, iter(batches)))
    by_topic = {t: [r for r in answer if r["topic"] == t] for t in ("a", "b")}
    # Two days; after b's rows, a's go on in a file of their own.
    assert sorted(r["time_bucket"] for r in by_topic["a"]) == [19844, 19845, 19845]
    assert [r["kafka_partition"] for r in by_topic["b"]] == [1]
    assert sum(r["records"] for r in answer) == len(rows_a) + len(rows_b)
    for topic, expected in (("a", rows_a), ("b", rows_b)):
        read = []
        for row in by_topic[topic]:
            path = row["path"].removeprefix("file:")
            assert path.startswith(f"{tmp_path}/{topic}/data/kafka_partition=")
            assert Path(path).stat().st_size == row["size"]
            table = pq.read_table(path)
            ids = [f.metadata[b"PARQUET:field_id"] for f in table.schema]
            assert ids == [f.metadata[b"PARQUET:field_id"] for f in ROW_ARROW_SCHEMA]
            read += table.to_pylist()
        read.sort(key=lambda r: r["kafka_offset"])
        want = [{k: v for k, v in r.items() if k != "topic"} for r in expected]
        for row in want:
            row["kafka_timestamp"] = row["kafka_timestamp"].astimezone(dt.UTC)
        assert read == want


def test_a_mixed_batch_is_split_by_topic(tmp_path: Path) -> None:
    targets = {"a": _target(tmp_path / "a"), "b": _target(tmp_path / "b")}
    mixed = _rows("a", 0, range(0, 2), DAY) + _rows("b", 0, range(0, 3), DAY)
    answer = _answer(write_group_files(targets, iter([_batch(mixed)])))
    records = {t: sum(r["records"] for r in answer if r["topic"] == t) for t in ("a", "b")}
    assert records == {"a": 2, "b": 3}


def test_a_failed_task_leaves_no_file(tmp_path: Path) -> None:
    targets = {"a": _target(tmp_path / "a")}

    def batches() -> Iterator[pa.RecordBatch]:
        yield _batch(_rows("a", 0, range(0, 4), DAY - dt.timedelta(days=1)))
        yield _batch(_rows("a", 1, range(0, 4), DAY))
        raise RuntimeError("the task dies")

    with pytest.raises(RuntimeError, match="the task dies"):
        list(write_group_files(targets, batches()))
    assert [p for p in (tmp_path / "a").rglob("*") if p.is_file()] == []


def test_a_topic_without_a_target_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        list(write_group_files({}, iter([_batch(_rows("z", 0, range(1), DAY))])))
