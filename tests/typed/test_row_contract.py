"""The row contract: fixed field ids, partition spec and sort order, record <-> row conversions,
the boundary helpers, and the lake settings that locate the table."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids

from bergstream.core.config import ConfigError, parse_config
from bergstream.core.lake import LakeConfig, LakeConfigError, resolve_lake
from bergstream.core.plugins import load_registry
from bergstream.core.records import Record
from bergstream.core.typed.row_contract import (
    BOUNDARY_PROPERTY,
    COLUMNS,
    CREATE_TIME,
    LOG_APPEND_TIME,
    PARTITION_SPEC,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    SORT_ORDER,
    BoundaryError,
    RowContractError,
    RowRecord,
    boundary_of_ancestry,
    check_schema,
    format_boundary,
    merge_boundaries,
    parse_boundary,
    record_to_row,
    row_to_record,
)

FAR_FUTURE_MS = 253_402_300_799_999


def test_field_ids_are_fixed_and_match_what_iceberg_assigns():
    ids = {field.name: field.field_id for field in ROW_SCHEMA.fields}
    assert ids == {
        "kafka_partition": 1,
        "kafka_offset": 2,
        "kafka_timestamp": 3,
        "kafka_timestamp_type": 4,
        "kafka_key": 5,
        "kafka_headers": 6,
        "kafka_value": 7,
    }
    headers = ROW_SCHEMA.find_field("kafka_headers").field_type
    assert headers.element_id == 8
    assert [(f.field_id, f.name) for f in headers.element_type.fields] == [
        (9, "key"),
        (10, "value"),
    ]
    # A catalog that renumbers on create (Java's and PyIceberg's do) gets the same ids.
    assert assign_fresh_schema_ids(ROW_SCHEMA).as_struct() == ROW_SCHEMA.as_struct()
    assert ROW_SCHEMA.highest_field_id == 10
    assert COLUMNS[:3] == ("kafka_partition", "kafka_offset", "kafka_timestamp")


def test_partition_spec_and_sort_order():
    assert [(f.field_id, f.source_id, str(f.transform), f.name) for f in PARTITION_SPEC.fields] == [
        (1000, 1, "identity", "kafka_partition"),
        (1001, 3, "day", "kafka_timestamp_day"),
    ]
    assert [(f.source_id, f.direction.value) for f in SORT_ORDER.fields] == [(2, "asc")]


def test_arrow_schema_is_what_pyiceberg_derives():
    derived = schema_to_pyarrow(ROW_SCHEMA, include_field_ids=True)
    assert ROW_ARROW_SCHEMA.equals(derived, check_metadata=True)


def test_check_schema_accepts_json_and_names_the_difference():
    check_schema(ROW_SCHEMA)
    check_schema(ROW_SCHEMA.model_dump_json())
    other = Schema(*ROW_SCHEMA.fields[:-1])
    with pytest.raises(RowContractError, match="not bergstream's row contract"):
        check_schema(other)


headers = st.lists(
    st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=10)), max_size=20
).map(tuple)
records = st.builds(
    Record,
    offset=st.integers(0, 2**63 - 1),
    timestamp=st.integers(0, FAR_FUTURE_MS),
    key=st.none() | st.binary(max_size=40),
    value=st.none() | st.binary(max_size=40),
    headers=headers,
)


@given(st.integers(0, 2**31 - 1), records, st.sampled_from([CREATE_TIME, LOG_APPEND_TIME]))
def test_record_row_record(partition: int, record: Record, timestamp_type: int):
    row = record_to_row(partition, record, timestamp_type)
    assert list(row) == list(COLUMNS)
    assert row_to_record(row) == RowRecord(partition, timestamp_type, record)
    # The row fits the Arrow schema and survives a trip through Arrow.
    table = pa.Table.from_pylist([row], schema=ROW_ARROW_SCHEMA)
    assert row_to_record(table.to_pylist()[0]) == RowRecord(partition, timestamp_type, record)


def test_null_and_empty_keys_tombstones_and_header_order():
    record = Record(
        offset=7, timestamp=0, key=b"", value=None, headers=(("a", b"1"), ("a", None), ("b", b""))
    )
    row = record_to_row(2, record, CREATE_TIME)
    assert row["kafka_key"] == b"" and row["kafka_value"] is None
    assert row["kafka_headers"] == [
        {"key": "a", "value": b"1"},
        {"key": "a", "value": None},
        {"key": "b", "value": b""},
    ]
    assert row["kafka_timestamp"] == dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    null_key = record_to_row(2, Record(offset=8, timestamp=5, key=None, value=b"v"), 1)
    assert null_key["kafka_key"] is None and null_key["kafka_headers"] == []
    assert row_to_record({**null_key, "kafka_headers": None}).record.headers == ()


def test_row_timestamps_as_micros_and_naive_datetimes():
    row = record_to_row(0, Record(offset=1, timestamp=FAR_FUTURE_MS, key=None, value=None), 0)
    as_micros = {**row, "kafka_timestamp": FAR_FUTURE_MS * 1000}
    naive = {**row, "kafka_timestamp": row["kafka_timestamp"].replace(tzinfo=None)}
    assert row_to_record(as_micros) == row_to_record(naive) == row_to_record(row)
    with pytest.raises(RowContractError, match="whole millisecond"):
        row_to_record({**row, "kafka_timestamp": 1})


def test_conversion_errors_name_the_problem():
    with pytest.raises(RowContractError, match="timestamp_type"):
        record_to_row(0, Record(offset=0, timestamp=0, key=None, value=None), 2)
    with pytest.raises(RowContractError, match="lacks the column"):
        row_to_record({"kafka_partition": 0})


def test_boundary_json():
    assert parse_boundary(None) == {} and parse_boundary("") == {}
    boundary = parse_boundary('{"10": 5, "2": 0}')
    assert boundary == {10: 5, 2: 0}
    assert format_boundary(boundary) == '{"2":0,"10":5}'
    assert parse_boundary(format_boundary(boundary)) == boundary
    for bad in ("[1]", '{"x": 1}', '{"1": -1}', '{"1": "2"}', '{"1": true}', "{"):
        with pytest.raises(BoundaryError, match=BOUNDARY_PROPERTY):
            parse_boundary(bad)


def test_merge_and_ancestry():
    assert merge_boundaries({0: 5, 1: 9}, {0: 7, 2: 1}, {}) == {0: 7, 1: 9, 2: 1}
    ancestry = [
        {"operation": "replace"},  # compaction carries no boundary
        None,
        {BOUNDARY_PROPERTY: '{"0": 12}'},
        {BOUNDARY_PROPERTY: '{"0": 3}'},
    ]
    assert boundary_of_ancestry(ancestry) == {0: 12}
    assert boundary_of_ancestry([{"operation": "append"}]) == {}


def test_lake_defaults_live_under_home(tmp_path: Path):
    lake = resolve_lake(LakeConfig(kafka_bootstrap="127.0.0.1:9092"), home=tmp_path)
    assert lake.catalog_uri == f"sqlite:///{tmp_path}/lake/catalog.db"
    assert lake.jdbc_uri == f"jdbc:sqlite:{tmp_path}/lake/catalog.db"
    assert lake.warehouse == f"file://{tmp_path}/lake/warehouse"
    assert lake.namespace == "coldset" and lake.catalog_name == "bergstream"
    assert lake.table_identifier("orders.v1") == ("coldset", "orders.v1")
    assert lake.spark_table_name("a`b") == "bergstream.coldset.`a``b`"


def test_lake_settings_that_cannot_work_are_refused(tmp_path: Path):
    def resolve(**catalog: str) -> None:
        config = LakeConfig.model_validate(
            {"kafka_bootstrap": "127.0.0.1:9092", "catalog": catalog}
        )
        resolve_lake(config, home=tmp_path)

    with pytest.raises(LakeConfigError, match="sqlite:///PATH"):
        resolve(uri="postgresql://db/catalog")
    with pytest.raises(LakeConfigError, match="base URL"):
        resolve(type="rest")
    with pytest.raises(LakeConfigError, match="names no bucket"):
        resolve(warehouse="s3:///prefix")
    resolve(warehouse="s3://bucket/prefix/")


def test_lake_section_in_a_config_file():
    text = """
lake:
  kafka_bootstrap: ${BOOT}
  catalog: {type: rest, uri: "http://127.0.0.1:8181", warehouse: s3://b/w}
  s3: {endpoint: "http://127.0.0.1:9000", access_key: a, secret_key: s}
  pipeline: {trigger_interval_seconds: 2, max_offsets_per_trigger: 1000}
"""
    config = parse_config(text, env={"BOOT": "127.0.0.1:9092"})
    assert config.lake is not None and config.lake.pipeline["max_offsets_per_trigger"] == 1000
    with pytest.raises(ConfigError) as error:
        parse_config(
            "lake: {kafka_bootstrap: nope, catalg: {}}\n", source="x.yaml", registry=load_registry()
        )
    text = str(error.value)
    assert "lake.catalg: 'catalg' is no setting of 'lake'" in text
    assert "did you mean 'catalog'?" in text and "lake.kafka_bootstrap" in text


def test_core_never_imports_pyspark():
    code = (
        "import sys, bergstream.core.config, bergstream.core.typed.row_contract, "
        "bergstream.core.lake, "
        "bergstream.core.cli; assert 'pyspark' not in sys.modules; "
        "assert 'bergstream.pipeline' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
