"""Unit tests of core's current-state rules: a log's rows applied to a state, in one reduction
or in many (as the pipeline's micro-batches and ISK's snapshots apply them), equal a replay of
the log record by record; the index of a state's live rows follows its commits."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from bergstream.core.current_state import (
    STATE_OP_COLUMN,
    STATE_SOURCE_POSITION_COLUMN,
    StateLayoutError,
    reduce_changes,
    rejected_layout,
    state_layout,
)
from bergstream.core.state_index import (
    StateFileRows,
    StateIndex,
    deleted_positions,
    position_deletes_table,
)
from bergstream.core.table_modes import TableModeRule
from bergstream.core.typed.row_contract import (
    KEY_FIELD_DOC,
    KEY_SCHEMA_ID_COLUMN,
    ROW_SCHEMA,
    VALUE_ERROR_COLUMN,
    VALUE_FIELD_DOC,
    VALUE_SCHEMA_ID_COLUMN,
    arrow_type,
)

UPSERT = TableModeRule(match="*", mode="upsert")
DEBEZIUM = TableModeRule(match="*", mode="debezium")
EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def raw_rows(records: list[tuple[int, int, bytes | None, bytes | None]]) -> pa.Table:
    """Row-contract rows of (partition, offset, key, value)."""
    return pa.Table.from_pylist(
        [
            {
                "kafka_partition": p,
                "kafka_offset": o,
                "kafka_timestamp": EPOCH + dt.timedelta(seconds=o),
                "kafka_timestamp_type": 0,
                "kafka_key": k,
                "kafka_headers": [],
                "kafka_value": v,
            }
            for p, o, k, v in records
        ],
        schema=arrow_type(ROW_SCHEMA),
    )


class StateModel:
    """The state applied to, reduction by reduction, with a :class:`StateIndex` kept as the
    pipeline keeps it: each reduction a new data file and the positions it deletes."""

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        self.index = StateIndex()
        self.files: dict[str, pa.Table] = {}
        self.rejected: list[dict[str, Any]] = []

    def apply(self, rows: pa.Table) -> None:
        rejected_schema = arrow_type(rejected_layout(ROW_SCHEMA))
        changes = reduce_changes(self.layout, rows, rejected_schema, self.index)
        removed = changes.removed
        added = None
        if changes.upserts.num_rows:
            path = f"file-{len(self.files)}"
            self.files[path] = changes.upserts
            partitions = changes.upserts.column("kafka_partition").to_numpy()
            added = StateFileRows(path, changes.upsert_ids, partitions)
        # the deletes survive a round trip through a delete file's rows
        removed = deleted_positions(position_deletes_table(removed))
        self.index = self.index.with_changes(removed, added)
        self.rejected += changes.rejected.to_pylist()

    def live(self) -> dict[bytes, bytes | None]:
        out = {}
        for number, path in enumerate(self.index.files):
            table = self.files[path].to_pylist()
            positions = self.index.positions[self.index.file_index == number]
            for position in positions:
                row = table[position]
                assert row["kafka_key"] not in out, "a key has two live rows"
                out[row["kafka_key"]] = row["kafka_value"]
        return out

    def rebuilt(self) -> StateIndex:
        """The index read again from the files and their deletes, as a restart reads it."""
        files = [
            StateFileRows(p, self.files[p].column("kafka_key").combine_chunks(),
                          self.files[p].column("kafka_partition").to_numpy())
            for p in self.index.files
        ]  # fmt: skip
        return StateIndex.build(files, self.index.deleted)


def replay(records: list[tuple[int, int, bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for _, _, key, value in records:
        if key is None:
            continue
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


logs = st.lists(
    st.tuples(st.integers(0, 12), st.one_of(st.none(), st.binary(max_size=4))),
    min_size=0,
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(log=logs, cuts=st.lists(st.integers(0, 80), max_size=6))
def test_upsert_in_any_number_of_steps_equals_a_replay(
    log: list[tuple[int, bytes | None]], cuts: list[int]
) -> None:
    # Each key stays in the partition its number gives: every record applies.
    records = [(k % 3, 0, b"k%d" % k, v) for k, v in log]
    offsets = [0, 0, 0]
    numbered = []
    for partition, _, key, value in records:
        numbered.append((partition, offsets[partition], key, value))
        offsets[partition] += 1
    model = StateModel(state_layout(ROW_SCHEMA, 10, UPSERT))
    bounds = sorted({0, len(numbered), *(c for c in cuts if c <= len(numbered))})
    for start, end in itertools.pairwise(bounds):
        model.apply(raw_rows(numbered[start:end]))
    assert model.live() == replay(numbered)
    assert not model.rejected
    rebuilt = model.rebuilt()
    assert sorted(rebuilt.ids.to_pylist()) == sorted(model.index.ids.to_pylist())


def test_records_without_a_key_or_in_a_second_partition_are_rejected() -> None:
    model = StateModel(state_layout(ROW_SCHEMA, 10, UPSERT))
    model.apply(raw_rows([(0, 0, b"a", b"1"), (1, 0, None, b"x"), (1, 1, b"a", b"2")]))
    assert model.live() == {b"a": b"1"}
    reasons = sorted(r["reason"] for r in model.rejected)
    assert reasons[0].startswith("no key")
    assert "partitions 0 and 1" in reasons[1]
    # the key's row stays with partition 0 in a later reduction too
    model.apply(raw_rows([(1, 2, b"a", b"3"), (0, 1, b"a", b"4")]))
    assert model.live() == {b"a": b"4"}
    assert len(model.rejected) == 3


def typed_log_schema() -> Schema:
    """A log table typed like Debezium's JSON envelope read by the ``json`` codec."""
    after = StructType(
        NestedField(20, "id", LongType(), required=False),
        NestedField(21, "name", StringType(), required=False),
        NestedField(22, "amount", DoubleType(), required=False),
    )
    source = StructType(
        NestedField(30, "lsn", LongType(), required=False),
        NestedField(31, "ts_ms", LongType(), required=False),
    )
    return Schema(
        *ROW_SCHEMA.fields,
        NestedField(11, VALUE_SCHEMA_ID_COLUMN, IntegerType(), required=False),
        NestedField(12, VALUE_ERROR_COLUMN, StringType(), required=False),
        NestedField(13, "after", after, required=False, doc=VALUE_FIELD_DOC),
        NestedField(14, "op", StringType(), required=False, doc=VALUE_FIELD_DOC),
        NestedField(15, "source", source, required=False, doc=VALUE_FIELD_DOC),
        NestedField(16, KEY_SCHEMA_ID_COLUMN, IntegerType(), required=False),
        NestedField(17, "key_id", LongType(), required=False, doc=KEY_FIELD_DOC),
    )


def event_rows(schema: Schema, events: list[dict[str, Any]]) -> pa.Table:
    rows = []
    for offset, event in enumerate(events):
        op = event.get("op")
        tombstone = event.get("tombstone", False)
        rows.append(
            {
                "kafka_partition": 0,
                "kafka_offset": offset,
                "kafka_timestamp": EPOCH + dt.timedelta(seconds=offset),
                "kafka_timestamp_type": 0,
                "kafka_key": None,
                "kafka_headers": [],
                "kafka_value": None,
                VALUE_SCHEMA_ID_COLUMN: None if tombstone else 7,
                VALUE_ERROR_COLUMN: event.get("error"),
                "after": event.get("after"),
                "op": op,
                "source": None if tombstone else {"lsn": 100 + offset, "ts_ms": 5000 + offset},
                KEY_SCHEMA_ID_COLUMN: None if event.get("id") is None else 9,
                "key_id": event.get("id"),
            }
        )
    return pa.Table.from_pylist(rows, schema=arrow_type(schema))


def test_debezium_events_make_the_source_table() -> None:
    schema = typed_log_schema()
    layout = state_layout(schema, 40, DEBEZIUM)
    names = [f.name for f in layout.schema.fields]
    assert names[:5] == [f.name for f in ROW_SCHEMA.fields[:5]]
    assert names[5:] == ["key_id", "id", "name", "amount", "_op", "_source_ts",
                         "_source_position"]  # fmt: skip
    assert layout.schema.find_field("name").field_id == 21  # after's ids are kept
    events = [
        {"op": "r", "id": 1, "after": {"id": 1, "name": "a", "amount": 1.0}},
        {"op": "c", "id": 2, "after": {"id": 2, "name": "b", "amount": 2.0}},
        {"op": "u", "id": 1, "after": {"id": 1, "name": "a2", "amount": 1.5}},
        {"op": "d", "id": 2},
        {"tombstone": True, "id": 2},
        {"op": "m", "id": 3},
        {"op": "c", "id": 4, "after": None},
        {"op": "c", "id": 5, "error": "invalid JSON"},
    ]
    model = StateModel(layout)
    rejected_schema = arrow_type(rejected_layout(schema))
    changes = reduce_changes(layout, event_rows(schema, events), rejected_schema)
    rows = changes.upserts.to_pylist()
    assert [(r["id"], r["name"], r[STATE_OP_COLUMN]) for r in rows] == [(1, "a2", "u")]
    assert rows[0][STATE_SOURCE_POSITION_COLUMN] == "102"
    assert rows[0]["_source_ts"] == dt.datetime.fromtimestamp(5.002, dt.UTC)
    assert changes.deletes.to_pylist() == [b"2"]
    reasons = [r["reason"] for r in changes.rejected.to_pylist()]
    assert len(reasons) == 3
    assert "op 'm'" in reasons[0]
    assert "without 'after'" in reasons[1]
    assert "did not decode" in reasons[2]
    del model


def test_debezium_truncate_empties_what_came_before() -> None:
    schema = typed_log_schema()
    layout = state_layout(schema, 40, DEBEZIUM)
    rejected_schema = arrow_type(rejected_layout(schema))
    first = [
        {"op": "c", "id": 1, "after": {"id": 1, "name": "a", "amount": 1.0}},
        {"op": "c", "id": 2, "after": {"id": 2, "name": "b", "amount": 2.0}},
    ]
    index = StateIndex()
    changes = reduce_changes(layout, event_rows(schema, first), rejected_schema)
    partitions = changes.upserts.column("kafka_partition").to_numpy()
    index = index.with_changes({}, StateFileRows("f0", changes.upsert_ids, partitions))
    second = [*first, {"op": "t"}, {"op": "c", "id": 3, "after": {"id": 3, "name": "c"}}]
    rows = event_rows(schema, second).slice(2)
    changes = reduce_changes(layout, rows, rejected_schema, index)
    assert changes.truncated
    assert {p: list(v) for p, v in changes.removed.items()} == {"f0": [0, 1]}
    assert [r["id"] for r in changes.upserts.to_pylist()] == [3]


def test_key_fields_name_rows_by_value_columns() -> None:
    schema = Schema(
        *ROW_SCHEMA.fields,
        NestedField(11, VALUE_SCHEMA_ID_COLUMN, IntegerType(), required=False),
        NestedField(12, VALUE_ERROR_COLUMN, StringType(), required=False),
        NestedField(13, "order_id", LongType(), required=False, doc=VALUE_FIELD_DOC),
        NestedField(14, "region", StringType(), required=False, doc=VALUE_FIELD_DOC),
    )
    rule = TableModeRule(match="*", mode="upsert", key_fields=["order_id", "region"])
    layout = state_layout(schema, 20, rule)
    rows = pa.Table.from_pylist(
        [
            {"kafka_partition": 0, "kafka_offset": i, "kafka_timestamp": EPOCH,
             "kafka_timestamp_type": 0, "kafka_key": None, "kafka_headers": [],
             "kafka_value": None, VALUE_SCHEMA_ID_COLUMN: schema_id, VALUE_ERROR_COLUMN: None,
             "order_id": order, "region": region}
            for i, (order, region, schema_id) in enumerate(
                [(1, "eu", 1), (1, "us", 1), (1, "eu", 1), (None, None, None)]
            )
        ],
        schema=arrow_type(schema),
    )  # fmt: skip
    changes = reduce_changes(layout, rows, arrow_type(rejected_layout(schema)))
    assert sorted(json.loads(i) for i in changes.upsert_ids.to_pylist()) == [[1, "eu"], [1, "us"]]
    assert [r["kafka_offset"] for r in changes.upserts.to_pylist()] == [1, 2]
    assert changes.rejected.num_rows == 1  # a null value names no key fields
    with pytest.raises(StateLayoutError, match="not value columns"):
        state_layout(schema, 20, TableModeRule(match="*", mode="upsert", key_fields=["nope"]))


def test_a_debezium_rule_on_values_that_are_not_change_events_is_an_error() -> None:
    schema = Schema(
        *ROW_SCHEMA.fields,
        NestedField(13, "amount", LongType(), required=False, doc=VALUE_FIELD_DOC),
    )
    with pytest.raises(StateLayoutError, match="no 'after' record"):
        state_layout(schema, 20, DEBEZIUM)


def test_key_fields_need_upsert_mode() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="key_fields names a row's identity"):
        TableModeRule(match="*", mode="debezium", key_fields=["id"])


def test_debezium_without_a_value_codec_rejects_every_event_with_the_fix() -> None:
    layout = state_layout(ROW_SCHEMA, 10, DEBEZIUM)
    assert layout.envelope is None
    rows = raw_rows([(0, 0, b'{"id":1}', b'{"op":"c"}'), (0, 1, b'{"id":1}', None)])
    changes = reduce_changes(layout, rows, arrow_type(rejected_layout(ROW_SCHEMA)))
    assert changes.upserts.num_rows == 0 and not len(changes.deletes)
    (reason,) = [r["reason"] for r in changes.rejected.to_pylist()]
    assert "give the topic a codecs: rule" in reason  # the tombstone is ignored
