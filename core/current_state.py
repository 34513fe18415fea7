"""A topic's current state from its log: the rule the pipeline and ISK both follow.

A topic in ``upsert`` or ``debezium`` mode (:mod:`bergstream.core.table_modes`) keeps its log
table (one row per record) and has a *state table* beside it: one row per live key. Both the
pipeline's physical state table and ISK's ``current`` namespace apply the log's rows, in offset
order, to the state by the same rules, from this module:

- **Identity.** An ``upsert`` row is named by the record key: its bytes (``kafka_key``), or the
  key's typed columns when a key codec types keys, or the value fields a rule's ``key_fields``
  names. A ``debezium`` row is named by the record key the same way (Debezium keys a change by
  the source table's primary key).
- **Upsert.** The record with the highest offset of a key wins; its row is the log row itself
  (same columns, typed or not); a null value (tombstone) deletes the key.
- **Debezium.** A value is a change event (``op``, ``before``, ``after``, ``source``, ``ts_ms``,
  as top-level typed columns, or inside ``payload`` for Connect's JSON envelope). ``c``, ``r``
  and ``u`` make the row from ``after``; ``d`` deletes the key; ``t`` empties the table (every
  row whose change came before it: in its own partition a lower offset, in another partition a
  timestamp not after its own); the tombstone Debezium writes after a delete is ignored. The
  state row holds the row contract's ``kafka_partition``, ``kafka_offset`` (the change that made
  the row), ``kafka_timestamp``, ``kafka_timestamp_type`` and ``kafka_key``, then the source
  table's columns (``after``'s fields, with their field ids, so they evolve with the log
  table's layout), then ``_op``, ``_source_ts`` and ``_source_position`` (the LSN, or
  ``file:pos`` of a binlog).
- **Rejected.** A record that cannot be applied (no key or a key that did not decode; a
  malformed change event; a key whose records are in two partitions, which have no order between
  them) changes nothing and is listed, with its ``reason``, in the topic's rejected rows, beside
  values of any topic that did not decode. It stays in the log table as it is.

One key's records in two partitions: the partition of the key's row in the state owns it (else
the lowest partition among the changes applied together); records of the key in other
partitions are rejected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType, StructType, TimestamptzType

from bergstream.core.state_index import StateIndex
from bergstream.core.table_modes import TableMode, TableModeRule
from bergstream.core.typed.row_contract import (
    KEY_ERROR_COLUMN,
    KEY_FIELD_DOC,
    KEY_SCHEMA_ID_COLUMN,
    ROW_SCHEMA,
    VALUE_ERROR_COLUMN,
    VALUE_FIELD_DOC,
    arrow_type,
)
from bergstream.core.typed.typed_rows import project_array

__all__ = [
    "REJECTED_REASON_COLUMN",
    "STATE_OP_COLUMN",
    "STATE_SOURCE_POSITION_COLUMN",
    "STATE_SOURCE_TS_COLUMN",
    "StateChanges",
    "StateLayout",
    "StateLayoutError",
    "identities",
    "reduce_changes",
    "rejected_layout",
    "rejected_log_rows",
    "state_identities",
    "state_layout",
    "undecodable_reasons",
]

#: The Debezium operation (``c``, ``r``, ``u``) of the change that made a state row.
STATE_OP_COLUMN = "_op"
#: When the source database made the change (``source.ts_ms``, or ``ts_us``).
STATE_SOURCE_TS_COLUMN = "_source_ts"
#: The change's position in the source's log: the LSN, ``file:pos`` of a binlog, an SCN.
STATE_SOURCE_POSITION_COLUMN = "_source_position"
#: Why a rejected row was not applied (or did not decode).
REJECTED_REASON_COLUMN = "reason"

# Field ids of the columns this module adds, fixed forever and far above any id a layout gives
# (those count up from the row contract's), so a column keeps its id as the log's layout grows.
_OP_ID = 1_000_000_001
_SOURCE_TS_ID = 1_000_000_002
_SOURCE_POSITION_ID = 1_000_000_003
_REASON_ID = 1_000_000_011

#: The row contract's columns a debezium state row keeps.
_DEBEZIUM_CONTRACT = ROW_SCHEMA.fields[:5]

_UPSERT_OPS = ("c", "r", "u")


class StateLayoutError(ValueError):
    """A log table's layout from which no state table can be made (the message says why and
    what to change)."""


@dataclass(frozen=True)
class StateLayout:
    """What a topic's state table looks like, and how log rows become its rows."""

    mode: TableMode
    #: The state table's schema.
    schema: Schema
    last_column_id: int
    #: Columns of a log row that name it (``("kafka_key",)``: the key's bytes).
    identity: tuple[str, ...]
    #: Whether ``identity`` is value fields (``key_fields``) rather than the record key.
    identity_from_value: bool = False
    #: ``debezium``: the path of the change event's fields in a log row (``()``: top-level
    #: columns; ``("payload",)``: Connect's JSON envelope); None when the layout has no
    #: ``after`` yet (no typed value seen: the state can only be empty).
    envelope: tuple[str, ...] | None = None

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of state rows (field ids as Parquet metadata)."""
        return arrow_type(self.schema)


def rejected_layout(log_schema: Schema) -> Schema:
    """The schema of a topic's rejected rows: the log table's columns, then ``reason``."""
    fields = [*log_schema.fields]
    fields.append(NestedField(_REASON_ID, REJECTED_REASON_COLUMN, StringType(), required=False))
    return Schema(*fields, schema_id=log_schema.schema_id)


def _field(schema: Schema | StructType, name: str) -> NestedField | None:
    for field in schema.fields:
        if field.name == name:
            return field
    return None


def _envelope(log_schema: Schema) -> tuple[tuple[str, ...], StructType] | None:
    """Where a Debezium change event's fields are in a log row, and the ``after`` type."""
    for path in ((), ("payload",)):
        holder: Schema | StructType = log_schema
        for name in path:
            field = _field(holder, name)
            if field is None or not isinstance(field.field_type, StructType):
                break
            holder = field.field_type
        else:
            after = _field(holder, "after")
            if after is not None and isinstance(after.field_type, StructType):
                return path, after.field_type
    return None


def _value_columns(log_schema: Schema) -> list[str]:
    return [f.name for f in log_schema.fields if f.doc == VALUE_FIELD_DOC]


def _key_identity(log_schema: Schema) -> tuple[str, ...]:
    key_columns = tuple(f.name for f in log_schema.fields if f.doc == KEY_FIELD_DOC)
    return key_columns or ("kafka_key",)


def state_layout(log_schema: Schema, last_column_id: int, rule: TableModeRule) -> StateLayout:
    """The state table of a topic whose log table has ``log_schema`` (its current layout) and
    ``last_column_id``, in ``rule``'s mode (``upsert`` or ``debezium``). Raises
    :class:`StateLayoutError` when the log's layout cannot make one."""
    if rule.mode is TableMode.UPSERT:
        if rule.key_fields is None:
            return StateLayout(
                TableMode.UPSERT, log_schema, last_column_id, _key_identity(log_schema)
            )
        values = _value_columns(log_schema)
        missing = [name for name in rule.key_fields if name not in values]
        if missing and values:
            raise StateLayoutError(
                f"key_fields {missing} are not value columns of the log table (its value "
                f"columns: {', '.join(values)}); name fields the topic's values have"
            )
        return StateLayout(
            TableMode.UPSERT, log_schema, last_column_id, tuple(rule.key_fields), True
        )
    if rule.mode is not TableMode.DEBEZIUM:
        raise StateLayoutError(f"mode {rule.mode.value!r} has no state table")
    found = _envelope(log_schema)
    key_columns = [f for f in log_schema.fields if f.doc == KEY_FIELD_DOC]
    fields: list[NestedField] = [*_DEBEZIUM_CONTRACT, *key_columns]
    envelope: tuple[str, ...] | None = None
    if found is not None:
        envelope, after = found
        taken = {f.name for f in fields} | {
            STATE_OP_COLUMN, STATE_SOURCE_TS_COLUMN, STATE_SOURCE_POSITION_COLUMN,
        }  # fmt: skip
        for column in after.fields:
            if column.name in taken:
                raise StateLayoutError(
                    f"the source table's column {column.name!r} has the name of a column the "
                    "state table adds; rename it in the source (or read the log table)"
                )
            fields.append(NestedField(column.field_id, column.name, column.field_type,
                                      required=False, doc=column.doc))  # fmt: skip
    elif _value_columns(log_schema):
        raise StateLayoutError(
            "debezium mode: the topic's values have no 'after' record (value columns: "
            f"{', '.join(_value_columns(log_schema))}); are they Debezium change events? Use "
            "mode: upsert for other keyed topics"
        )
    fields += [
        NestedField(_OP_ID, STATE_OP_COLUMN, StringType(), required=False),
        NestedField(_SOURCE_TS_ID, STATE_SOURCE_TS_COLUMN, TimestamptzType(), required=False),
        NestedField(_SOURCE_POSITION_ID, STATE_SOURCE_POSITION_COLUMN, StringType(),
                    required=False),
    ]  # fmt: skip
    schema = Schema(*fields, schema_id=log_schema.schema_id)
    return StateLayout(
        TableMode.DEBEZIUM,
        schema,
        max(last_column_id, schema.highest_field_id),
        _key_identity(log_schema),
        envelope=envelope,
    )


# --------------------------------------------------------------------------- identities


def _column(rows: pa.Table, name: str) -> pa.Array:
    """Column ``name`` of ``rows`` as one array (all nulls if ``rows`` lacks it)."""
    if name not in rows.column_names:
        return pa.nulls(rows.num_rows)
    column = rows.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _canonical(arrays: Sequence[pa.Array]) -> pa.Array:
    """One ``large_binary`` identity per row of typed columns: the decimal text of a single
    integer or string column, else the JSON array of the row's values (equal values give equal
    bytes whatever bytes the record carried)."""
    if len(arrays) == 1 and (
        pa.types.is_integer(arrays[0].type)
        or pa.types.is_string(arrays[0].type)
        or pa.types.is_large_string(arrays[0].type)
    ):
        return pc.cast(pc.cast(arrays[0], pa.large_string()), pa.large_binary())
    columns = [array.to_pylist() for array in arrays]
    out = [
        orjson.dumps(list(values), option=orjson.OPT_SORT_KEYS, default=str)
        for values in zip(*columns, strict=True)
    ]
    return pa.array(out, pa.large_binary())


def _mask(values: pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)


def state_identities(layout: StateLayout, rows: pa.Table) -> pa.Array:
    """The identity of each state row (or of each log row that has one): its key bytes, or its
    identity columns made canonical (:func:`_canonical`)."""
    if layout.identity == ("kafka_key",):
        return pc.cast(_column(rows, "kafka_key"), pa.large_binary())
    return _canonical([_column(rows, name) for name in layout.identity])


def identities(layout: StateLayout, rows: pa.Table) -> tuple[pa.Array, list[str | None]]:
    """Each log row's identity (``large_binary``, null where it has none) and why it has none
    (None where it has one)."""
    count = rows.num_rows
    reasons: list[str | None] = [None] * count
    ids = state_identities(layout, rows)
    if layout.identity == ("kafka_key",):
        for index in np.flatnonzero(_mask(ids.is_null())):
            reasons[index] = "no key (a record with a null key names no row)"
        return ids, reasons
    if layout.identity_from_value:
        errors = _column(rows, VALUE_ERROR_COLUMN).to_pylist()
        no_value = _mask(_column(rows, "kafka_value").is_null()) & _mask(
            _column(rows, "kafka_value_schema_id").is_null()
        )
        firsts = _mask(_column(rows, layout.identity[0]).is_null())
        for index in range(count):
            if errors[index] is not None:
                reasons[index] = f"the value did not decode ({errors[index]}): no key fields"
            elif no_value[index]:
                reasons[index] = (
                    "a null value names no key fields (key_fields rows are named by their value)"
                )
            elif firsts[index] and len(layout.identity) == 1:
                reasons[index] = f"the value has no key field {layout.identity[0]!r}"
    else:
        errors = _column(rows, KEY_ERROR_COLUMN).to_pylist()
        no_key = _mask(_column(rows, "kafka_key").is_null()) & _mask(
            _column(rows, KEY_SCHEMA_ID_COLUMN).is_null()
        )
        for index in range(count):
            if errors[index] is not None:
                reasons[index] = f"the key did not decode ({errors[index]})"
            elif no_key[index]:
                reasons[index] = "no key (a record with a null key names no row)"
    missing = np.array([reason is not None for reason in reasons], dtype=bool)
    if missing.any():
        ids = pc.if_else(pa.array(missing), pa.nulls(count, pa.large_binary()), ids)
    return ids, reasons


# --------------------------------------------------------------------------- changes


@dataclass
class StateChanges:
    """What applying a range of log rows does to a state: rows to write, keys whose row goes,
    whether the state before them was emptied, and the rows that could not be applied."""

    #: New state rows (the layout's Arrow schema), one per identity, by partition and offset.
    upserts: pa.Table
    #: The identity of each upsert row.
    upsert_ids: pa.Array
    #: Identities whose row is deleted (none of them has an upsert row).
    deletes: pa.Array
    #: Whether a truncate emptied the state as it was before these rows.
    truncated: bool
    #: Log rows not applied, in the rejected layout (the log's columns, then ``reason``).
    rejected: pa.Table
    #: Positions per data file of the state's rows these changes replace or delete (every
    #: row after a truncate): what the delete file of the commit names.
    removed: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


_UPSERT, _DELETE, _TRUNCATE, _IGNORE, _REJECT = range(5)


def _struct_child(array: pa.Array, name: str) -> pa.Array | None:
    if not pa.types.is_struct(array.type):
        return None
    index = array.type.get_field_index(name)
    if index < 0:
        return None
    return array.flatten()[index]


def _event(rows: pa.Table, envelope: tuple[str, ...]) -> dict[str, pa.Array | None]:
    """The change event's fields of each row (None: not in the layout)."""
    if envelope:
        holder: pa.Array | None = _column(rows, envelope[0])
        for name in envelope[1:]:
            holder = None if holder is None else _struct_child(holder, name)
        return {
            name: None if holder is None else _struct_child(holder, name)
            for name in ("op", "after", "source", "ts_ms")
        }
    return {
        name: _column(rows, name) if name in rows.column_names else None
        for name in ("op", "after", "source", "ts_ms")
    }


def _kinds_debezium(
    layout: StateLayout, rows: pa.Table, reasons: list[str | None]
) -> tuple[np.ndarray, list[str | None]]:
    count = rows.num_rows
    kinds = np.full(count, _REJECT, dtype=np.int8)
    why: list[str | None] = [None] * count
    value_null = _mask(_column(rows, "kafka_value").is_null()) & _mask(
        _column(rows, "kafka_value_schema_id").is_null()
    )
    value_errors = _column(rows, VALUE_ERROR_COLUMN).to_pylist()
    if layout.envelope is None:  # the log has no typed values: no change event to read
        why = [
            None
            if value_null[index] and value_errors[index] is None
            else "debezium mode reads change events from typed values: give the topic a codecs: "
            "rule (connect-json, json or registry)"
            for index in range(count)
        ]
        kinds[[w is None for w in why]] = _IGNORE
        return kinds, why
    event = _event(rows, layout.envelope)
    ops = event.get("op")
    op_list = ops.to_pylist() if ops is not None else [None] * count
    after = event.get("after")
    after_null = _mask(after.is_null()) if after is not None else np.ones(count, dtype=bool)
    for index in range(count):
        if value_null[index] and value_errors[index] is None:
            kinds[index] = _IGNORE  # the tombstone Debezium writes after a delete
            continue
        if value_errors[index] is not None:
            why[index] = f"malformed change event: the value did not decode ({value_errors[index]})"
            continue
        op = op_list[index]
        if op in _UPSERT_OPS:
            if after_null[index]:
                why[index] = f"malformed change event: op {op!r} without 'after'"
            elif reasons[index] is not None:
                why[index] = reasons[index]
            else:
                kinds[index] = _UPSERT
        elif op == "d":
            if reasons[index] is not None:
                why[index] = reasons[index]
            else:
                kinds[index] = _DELETE
        elif op == "t":
            kinds[index] = _TRUNCATE
        elif op is None:
            why[index] = "malformed change event: no 'op' (is this a Debezium topic?)"
        else:
            why[index] = (
                f"op {op!r} is not a change of the table's rows (c, r, u, d and t are applied)"
            )
    return kinds, why


def _kinds_upsert(
    layout: StateLayout, rows: pa.Table, reasons: list[str | None]
) -> tuple[np.ndarray, list[str | None]]:
    count = rows.num_rows
    kinds = np.full(count, _UPSERT, dtype=np.int8)
    tombstone = _mask(_column(rows, "kafka_value").is_null()) & _mask(
        _column(rows, "kafka_value_schema_id").is_null()
    )
    if not layout.identity_from_value:
        kinds[tombstone] = _DELETE
    why = list(reasons)
    for index in range(count):
        if why[index] is not None:
            kinds[index] = _REJECT
    return kinds, why


def _after_truncates(rows: pa.Table, kinds: np.ndarray) -> tuple[np.ndarray, bool]:
    """Which rows survive the truncates among them, and whether any truncate happened."""
    truncates = np.flatnonzero(kinds == _TRUNCATE)
    alive = np.ones(rows.num_rows, dtype=bool)
    if not len(truncates):
        return alive, False
    partitions = _column(rows, "kafka_partition").to_numpy(zero_copy_only=False)
    offsets = _column(rows, "kafka_offset").to_numpy(zero_copy_only=False)
    times = pc.cast(_column(rows, "kafka_timestamp"), pa.int64()).to_numpy(zero_copy_only=False)
    for index in truncates:
        same = partitions == partitions[index]
        alive &= np.where(same, offsets > offsets[index], times > times[index])
    return alive, True


def _source_position(source: pa.Array | None, count: int) -> pa.Array:
    """The change's position in the source's log, as text (null where unknown)."""
    if source is None:
        return pa.nulls(count, pa.large_string())
    for name in ("lsn", "scn", "change_lsn", "commit_lsn"):
        child = _struct_child(source, name)
        if child is not None:
            return pc.cast(child, pa.large_string())
    file_, pos = _struct_child(source, "file"), _struct_child(source, "pos")
    if file_ is not None and pos is not None:
        return pc.binary_join_element_wise(
            pc.cast(file_, pa.large_string()), pc.cast(pos, pa.large_string()), ":"
        )
    return pa.nulls(count, pa.large_string())


def _source_ts(source: pa.Array | None, ts_ms: pa.Array | None, count: int) -> pa.Array:
    """When the source made the change, in µs (``source.ts_us``, else ``source.ts_ms``, else
    the event's ``ts_ms``)."""
    target = pa.timestamp("us", tz="UTC")
    micros = _struct_child(source, "ts_us") if source is not None else None
    if micros is not None:
        return pc.cast(pc.cast(micros, pa.int64()), target)
    millis = _struct_child(source, "ts_ms") if source is not None else None
    if millis is None:
        millis = ts_ms
    if millis is None:
        return pa.nulls(count, target)
    return pc.cast(pc.multiply(pc.cast(millis, pa.int64()), 1000), target)


def _state_rows(layout: StateLayout, rows: pa.Table) -> pa.Table:
    """``rows`` (log rows to upsert) as state rows."""
    schema = layout.arrow_schema
    count = rows.num_rows
    columns: dict[str, pa.Array] = {}
    if layout.mode is TableMode.DEBEZIUM and layout.envelope is not None:
        event = _event(rows, layout.envelope)
        after = event["after"]
        assert after is not None
        children = {after.type.field(i).name: child for i, child in enumerate(after.flatten())}
        columns.update(children)
        columns[STATE_OP_COLUMN] = event["op"] if event["op"] is not None else pa.nulls(count)
        columns[STATE_SOURCE_TS_COLUMN] = _source_ts(event["source"], event["ts_ms"], count)
        columns[STATE_SOURCE_POSITION_COLUMN] = _source_position(event["source"], count)
    arrays = []
    for field in schema:
        array = columns[field.name] if field.name in columns else _column(rows, field.name)
        arrays.append(project_array(array, field.type) if array.null_count < count
                      else pa.nulls(count, field.type))  # fmt: skip
    return pa.Table.from_arrays(arrays, schema=schema)


def rejected_log_rows(rows: pa.Table, reasons: Sequence[str | None], schema: pa.Schema) -> pa.Table:
    """The rows of ``rows`` that have a reason, in the rejected layout ``schema`` (the log's
    columns projected to it, then ``reason``)."""
    picked = np.flatnonzero(np.array([r is not None for r in reasons], dtype=bool))
    taken = rows.take(pa.array(picked, pa.int64()))
    arrays = []
    for field in schema:
        if field.name == REJECTED_REASON_COLUMN:
            arrays.append(pa.array([reasons[i] for i in picked], field.type))
        else:
            array = _column(taken, field.name)
            arrays.append(project_array(array, field.type) if array.null_count < len(picked)
                          else pa.nulls(len(picked), field.type))  # fmt: skip
    return pa.Table.from_arrays(arrays, schema=schema)


def undecodable_reasons(rows: pa.Table) -> list[str | None]:
    """Why each log row's value (or key) did not decode; None for rows that did (or have no
    typed side): what an append topic lists as rejected."""
    values = _column(rows, VALUE_ERROR_COLUMN).to_pylist()
    keys = _column(rows, KEY_ERROR_COLUMN).to_pylist()
    out: list[str | None] = []
    for value, key in zip(values, keys, strict=True):
        if value is not None:
            out.append(f"the value did not decode ({value})")
        elif key is not None:
            out.append(f"the key did not decode ({key})")
        else:
            out.append(None)
    return out


def reduce_changes(
    layout: StateLayout,
    rows: pa.Table,
    rejected_schema: pa.Schema,
    state: StateIndex | None = None,
) -> StateChanges:
    """What the log rows ``rows`` (any order; every row of a range of offsets per partition,
    above what the state has applied) do to the state whose live rows ``state`` indexes
    (None: an empty state): see the module docstring. The state's rows are probed once, for
    the partition of each key's row and the rows the changes remove."""
    ids, reasons = identities(layout, rows)
    if layout.mode is TableMode.DEBEZIUM:
        kinds, why = _kinds_debezium(layout, rows, reasons)
    else:
        kinds, why = _kinds_upsert(layout, rows, reasons)
    alive, truncated = _after_truncates(rows, kinds)
    applied = np.flatnonzero(alive & ((kinds == _UPSERT) | (kinds == _DELETE)))
    partitions = _column(rows, "kafka_partition").to_numpy(zero_copy_only=False)
    offsets = _column(rows, "kafka_offset").to_numpy(zero_copy_only=False)
    winners = np.empty(0, dtype=np.int64)
    hit_rows = hit_groups = winner_groups = np.empty(0, dtype=np.int64)
    if len(applied):
        applied_ids = ids.take(pa.array(applied))
        order = pc.sort_indices(
            pa.table({"id": applied_ids, "p": partitions[applied], "o": offsets[applied]}),
            sort_keys=[("id", "ascending"), ("p", "ascending"), ("o", "ascending")],
        ).to_numpy()
        sorted_rows = applied[order]
        sorted_ids = applied_ids.take(pa.array(order))
        if len(sorted_rows) > 1:
            changes = pc.not_equal(sorted_ids[1:], sorted_ids[:-1]).to_numpy(zero_copy_only=False)
            starts = np.concatenate([[True], changes])
        else:
            starts = np.array([True])
        group = np.cumsum(starts) - 1
        first_rows = sorted_rows[starts]
        owner = partitions[first_rows].astype(np.int64)  # the lowest partition of each key
        if state is not None and not truncated:
            hit_rows, hit_groups = state.probe(sorted_ids.filter(pa.array(starts)))
            owner[hit_groups] = state.partitions[hit_rows]
        row_owner = owner[group]
        strays = partitions[sorted_rows] != row_owner
        for index, group_id in zip(sorted_rows[strays], group[strays], strict=True):
            why[index] = (
                f"the key's records are in partitions {int(owner[group_id])} and "
                f"{int(partitions[index])}: records of one key in two partitions have no order "
                f"(its row stays with partition {int(owner[group_id])})"
            )
            kinds[index] = _REJECT
        keep = ~strays
        kept_rows, kept_group = sorted_rows[keep], group[keep]
        if len(kept_rows):
            ends = np.concatenate([kept_group[1:] != kept_group[:-1], [True]])
            winners = kept_rows[ends]
            winner_groups = kept_group[ends]
    winner_kinds = kinds[winners]
    upsert_rows = np.sort(winners[winner_kinds == _UPSERT])
    delete_rows = winners[winner_kinds == _DELETE]
    # Rows by partition and offset: the same changes give the same file.
    order = np.lexsort((offsets[upsert_rows], partitions[upsert_rows])) if len(upsert_rows) else []
    upsert_rows = upsert_rows[order] if len(upsert_rows) else upsert_rows
    upserts = _state_rows(layout, rows.take(pa.array(upsert_rows, pa.int64())))
    rejected = rejected_log_rows(rows, why, rejected_schema)
    removed: dict[str, np.ndarray] = {}
    if state is not None and truncated:
        removed = state.by_file()
    elif state is not None:
        removed = state.by_file(hit_rows[np.isin(hit_groups, winner_groups)])
    return StateChanges(
        upserts=upserts,
        upsert_ids=ids.take(pa.array(upsert_rows, pa.int64())),
        deletes=ids.take(pa.array(delete_rows, pa.int64())),
        truncated=truncated,
        rejected=rejected,
        removed=removed,
    )
