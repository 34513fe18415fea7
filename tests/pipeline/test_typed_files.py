"""Typed micro-batches written as data files by the workers (:mod:`bergstream.pipeline.
typed_files`), without Spark: which tables allow it, files per Kafka partition and day with the
table's field ids, rolling at the target size, and a failed task leaving no file behind."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform, MonthTransform

from bergstream.core.api import (
    HOUR_PARTITION_SPEC,
    PARTITION_SPEC,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    RegisteredSchema,
    SideCodecs,
    TopicCodecs,
    TypedRows,
    build_layout,
)
from bergstream.pipeline.typed import SchemasNeeded, ShippedSchemas
from bergstream.pipeline.typed_files import file_target, write_files
from bergstream.pipeline.typed_worker import DecodeJob
from bergstream.plugins.value_codecs.avro.codec import AvroCodec

SCHEMA = {
    "type": "record",
    "name": "Item",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
REGISTERED = RegisteredSchema(7, "AVRO", json.dumps(SCHEMA), subject="t-value", version=1)
DAY = dt.datetime(2024, 5, 1, 23, 59, 58, tzinfo=dt.UTC)


class _Accumulator:
    def __init__(self) -> None:
        self.value: Counter[tuple[str, str]] = Counter()

    def add(self, causes: Counter[tuple[str, str]]) -> None:
        self.value.update(causes)


def _job(shipped: ShippedSchemas | None = None) -> tuple[DecodeJob, Any]:
    codecs = TopicCodecs("t", SideCodecs({"AVRO": AvroCodec()}, "t-value"))
    shipped = shipped or ShippedSchemas(by_id={7: REGISTERED}, subjects={"t-value": [REGISTERED]})
    layout = build_layout(ROW_SCHEMA, ROW_SCHEMA.highest_field_id, codecs, shipped)
    job = DecodeJob(
        rows=TypedRows(layout, codecs, shipped),
        schemas=shipped,
        names=tuple(layout.arrow_schema.names),
        passthrough=frozenset(),
        framed=("kafka_value",),
        causes=_Accumulator(),
    )
    return job, layout


def _value(i: int, schema_id: int = 7) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), {"id": i, "name": f"n{i}"})
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def _batch(rows: list[tuple[int, int, dt.datetime, bytes]]) -> pa.RecordBatch:
    """Row-contract rows ``(partition, offset, timestamp, value)``."""
    table = pa.Table.from_pylist(
        [
            {
                "kafka_partition": p,
                "kafka_offset": o,
                "kafka_timestamp": t,
                "kafka_timestamp_type": 0,
                "kafka_key": None,
                "kafka_headers": [],
                "kafka_value": v,
            }
            for p, o, t, v in rows
        ],
        schema=ROW_ARROW_SCHEMA,
    )
    return table.to_batches()[0]


def _target(layout: Any, tmp_path: Path, **properties: str) -> Any:
    target = file_target(
        layout.arrow_schema, PARTITION_SPEC, f"file:{tmp_path}/data", properties, {}
    )
    assert target is not None
    return target


def test_only_tables_of_the_row_contracts_spec_local_or_s3_are_written_by_workers() -> None:
    _, layout = _job()
    day = file_target(layout.arrow_schema, PARTITION_SPEC, "s3://b/w/t/data/", {}, {"region": "x"})
    assert day is not None
    assert (day.time_unit, day.time_name, day.compression) == ("day", "kafka_timestamp_day", "zstd")
    assert day.data_location == "s3://b/w/t/data"
    hour = file_target(
        layout.arrow_schema,
        HOUR_PARTITION_SPEC,
        "/w/t/data",
        {"write.parquet.compression-codec": "uncompressed"},
        {},
    )
    assert hour is not None and (hour.time_unit, hour.compression) == ("hour", "none")
    by_month = PartitionSpec(
        PartitionField(1, 1000, IdentityTransform(), "kafka_partition"),
        PartitionField(3, 1001, MonthTransform(), "kafka_timestamp_month"),
    )
    assert file_target(layout.arrow_schema, by_month, "/w/t/data", {}, {}) is None
    assert file_target(layout.arrow_schema, PARTITION_SPEC, "gs://b/t/data", {}, {}) is None
    assert (
        file_target(
            layout.arrow_schema,
            PARTITION_SPEC,
            "/w/t/data",
            {"write.object-storage.enabled": "true"},
            {},
        )
        is None
    )
    assert (
        file_target(
            layout.arrow_schema,
            PARTITION_SPEC,
            "/w/t/data",
            {"write.parquet.compression-codec": "lzo"},
            {},
        )
        is None
    )


def test_files_per_partition_and_day_with_the_tables_field_ids(tmp_path: Path) -> None:
    job, layout = _job()
    target = _target(layout, tmp_path)
    next_day = DAY + dt.timedelta(seconds=3)
    batches = [
        _batch([(0, 0, DAY, _value(0)), (0, 1, next_day, _value(1)), (1, 0, DAY, _value(2))]),
        _batch([(0, 2, next_day, _value(3)), (1, 1, DAY, b"not framed")]),
    ]
    (answer,) = list(write_files(job, target, iter(batches)))
    written = answer.to_pylist()
    assert sorted((w["kafka_partition"], w["time_bucket"]) for w in written) == [
        (0, 19844), (0, 19845), (1, 19844)
    ]  # fmt: skip
    assert [(side, count) for (side, _), count in job.causes.value.items()] == [("value", 1)]
    rows = []
    for w in written:
        path = w["path"]
        assert path.startswith(f"file:{tmp_path}/data/kafka_partition={w['kafka_partition']}/")
        day = dt.date.fromordinal(dt.date(1970, 1, 1).toordinal() + w["time_bucket"])
        assert f"/kafka_timestamp_day={day.isoformat()}/bergstream-" in path
        local = path.removeprefix("file:")
        assert Path(local).stat().st_size == w["size"]
        parquet = pq.ParquetFile(local)
        ids = {f.name: f.metadata[b"PARQUET:field_id"] for f in parquet.schema_arrow}
        expected = {f.name: str(f.field_id).encode() for f in layout.schema.fields}
        assert ids == expected
        rows += parquet.read().to_pylist()
    decoded = {(r["kafka_partition"], r["kafka_offset"]): (r["id"], r["name"]) for r in rows}
    assert decoded == {
        (0, 0): (0, "n0"), (0, 1): (1, "n1"), (1, 0): (2, "n2"), (0, 2): (3, "n3"),
        (1, 1): (None, None),
    }  # fmt: skip
    kept = {(r["kafka_partition"], r["kafka_offset"]): r["kafka_value"] for r in rows}
    assert kept[(1, 1)] == b"not framed" and kept[(0, 0)] is None


def test_a_file_rolls_at_the_target_size(tmp_path: Path) -> None:
    job, layout = _job()
    target = _target(layout, tmp_path, **{"write.target-file-size-bytes": "1"})
    batches = [_batch([(0, i, DAY, _value(i))]) for i in range(3)]
    written = next(iter(write_files(job, target, iter(batches)))).to_pylist()
    assert len(written) >= 2
    files = [pq.ParquetFile(w["path"].removeprefix("file:")) for w in written]
    assert sum(f.metadata.num_rows for f in files) == 3


def test_a_failed_task_deletes_what_it_wrote(tmp_path: Path) -> None:
    job, layout = _job()
    target = _target(layout, tmp_path)
    batches = [_batch([(0, 0, DAY, _value(0))]), _batch([(0, 1, DAY, _value(1, schema_id=99))])]
    with pytest.raises(SchemasNeeded):
        list(write_files(job, target, iter(batches)))
    assert not [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
