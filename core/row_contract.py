"""The row contract: one Kafka record is one Iceberg row, the same for the pipeline, ISK and KSI.

Columns and their fixed Iceberg field ids (ids are what Iceberg resolves columns by, so they never
change; they equal the ids Iceberg itself assigns when it creates a table from this schema, top
level first, then nested fields, so a table created by Spark, Java or PyIceberg gets the same):

====  =========================  =============================================  ===========
 id   column                     type                                           required
====  =========================  =============================================  ===========
  1   ``kafka_partition``        int                                            yes
  2   ``kafka_offset``           long                                           yes
  3   ``kafka_timestamp``        timestamptz (µs; Kafka's ms times 1000)        yes
  4   ``kafka_timestamp_type``   int: 0 CreateTime, 1 LogAppendTime             yes
  5   ``kafka_key``              binary; null key stays null, empty stays empty no
  6   ``kafka_headers``          list<struct<key, value>>; element id 8         no
  9   ``kafka_headers[].key``    string                                         yes
 10   ``kafka_headers[].value``  binary; a null header value stays null         no
  7   ``kafka_value``            binary; null is a tombstone                    no
====  =========================  =============================================  ===========

Headers keep their order and duplicate keys. A record without headers is written with an empty
list; readers treat a null list as no headers too.

Default partition spec (partition field ids from 1000): ``kafka_partition`` (identity, field 1000)
and ``day(kafka_timestamp)`` (field 1001, named ``kafka_timestamp_day``); sort order 1:
``kafka_offset`` ascending, so an offset lookup prunes to few files.

**The boundary.** Every pipeline commit writes :data:`BOUNDARY_PROPERTY` into the snapshot summary:
JSON ``{"<partition>": next_offset}`` covering every partition written so far. Offsets below it are
in the table (the coldset); offsets from it on are only in Kafka (the hotset). Maintenance commits
(compaction) carry no boundary, so the boundary of a table is the one of the newest snapshot in the
current snapshot's ancestry that has one (:func:`boundary_of_ancestry`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from bergstream.core.records import Header, Record

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = [
    "BOUNDARY_PROPERTY",
    "COLUMNS",
    "CREATE_TIME",
    "HOUR_PARTITION_SPEC",
    "LOG_APPEND_TIME",
    "PARTITION_SPEC",
    "ROW_ARROW_SCHEMA",
    "ROW_SCHEMA",
    "SORT_ORDER",
    "Boundary",
    "BoundaryError",
    "RowContractError",
    "RowRecord",
    "boundary_of_ancestry",
    "check_schema",
    "format_boundary",
    "merge_boundaries",
    "parse_boundary",
    "record_to_row",
    "row_to_record",
    "table_boundary",
]

#: Snapshot summary key holding the boundary JSON.
BOUNDARY_PROPERTY = "bergstream.kafka-offsets"

#: Kafka timestamp types as stored in ``kafka_timestamp_type``.
CREATE_TIME = 0
LOG_APPEND_TIME = 1

# Field ids, fixed forever (see the module docstring).
PARTITION_ID = 1
OFFSET_ID = 2
TIMESTAMP_ID = 3
TIMESTAMP_TYPE_ID = 4
KEY_ID = 5
HEADERS_ID = 6
VALUE_ID = 7
HEADER_ELEMENT_ID = 8
HEADER_KEY_ID = 9
HEADER_VALUE_ID = 10

HEADER_STRUCT = StructType(
    NestedField(HEADER_KEY_ID, "key", StringType(), required=True),
    NestedField(HEADER_VALUE_ID, "value", BinaryType(), required=False),
)

#: The Iceberg schema of a topic's table.
ROW_SCHEMA = Schema(
    NestedField(PARTITION_ID, "kafka_partition", IntegerType(), required=True),
    NestedField(OFFSET_ID, "kafka_offset", LongType(), required=True),
    NestedField(TIMESTAMP_ID, "kafka_timestamp", TimestamptzType(), required=True),
    NestedField(TIMESTAMP_TYPE_ID, "kafka_timestamp_type", IntegerType(), required=True),
    NestedField(KEY_ID, "kafka_key", BinaryType(), required=False),
    NestedField(
        HEADERS_ID,
        "kafka_headers",
        ListType(HEADER_ELEMENT_ID, HEADER_STRUCT, element_required=True),
        required=False,
    ),
    NestedField(VALUE_ID, "kafka_value", BinaryType(), required=False),
    schema_id=0,
)

#: Column names in schema order.
COLUMNS: tuple[str, ...] = tuple(field.name for field in ROW_SCHEMA.fields)


def _spec_by(transform: DayTransform | HourTransform, name: str) -> PartitionSpec:
    return PartitionSpec(
        PartitionField(
            source_id=PARTITION_ID,
            field_id=1000,
            transform=IdentityTransform(),
            name="kafka_partition",
        ),
        PartitionField(source_id=TIMESTAMP_ID, field_id=1001, transform=transform, name=name),
        spec_id=0,
    )


#: Default partition spec: Kafka partition (identity) and the record's day.
PARTITION_SPEC = _spec_by(DayTransform(), "kafka_timestamp_day")
#: The partition spec with hours instead of days (ISK's ``partition_time: hour``).
HOUR_PARTITION_SPEC = _spec_by(HourTransform(), "kafka_timestamp_hour")

#: Default sort order: by offset, ascending.
SORT_ORDER = SortOrder(
    SortField(
        source_id=OFFSET_ID,
        transform=IdentityTransform(),
        direction=SortDirection.ASC,
        null_order=NullOrder.NULLS_FIRST,
    ),
    order_id=1,
)


def _arrow_field(name: str, type_: pa.DataType, nullable: bool, field_id: int) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={b"PARQUET:field_id": str(field_id)})


#: The pyarrow schema of a row batch, with Parquet field ids as Iceberg data files carry them and
#: the large (64-bit offset) types PyIceberg reads and writes.
ROW_ARROW_SCHEMA = pa.schema(
    [
        _arrow_field("kafka_partition", pa.int32(), False, PARTITION_ID),
        _arrow_field("kafka_offset", pa.int64(), False, OFFSET_ID),
        _arrow_field("kafka_timestamp", pa.timestamp("us", tz="UTC"), False, TIMESTAMP_ID),
        _arrow_field("kafka_timestamp_type", pa.int32(), False, TIMESTAMP_TYPE_ID),
        _arrow_field("kafka_key", pa.large_binary(), True, KEY_ID),
        _arrow_field(
            "kafka_headers",
            pa.large_list(
                _arrow_field(
                    "element",
                    pa.struct(
                        [
                            _arrow_field("key", pa.large_string(), False, HEADER_KEY_ID),
                            _arrow_field("value", pa.large_binary(), True, HEADER_VALUE_ID),
                        ]
                    ),
                    False,
                    HEADER_ELEMENT_ID,
                )
            ),
            True,
            HEADERS_ID,
        ),
        _arrow_field("kafka_value", pa.large_binary(), True, VALUE_ID),
    ]
)


class RowContractError(ValueError):
    """A row, record or table does not follow the row contract."""


class BoundaryError(ValueError):
    """A ``bergstream.kafka-offsets`` value that is not valid boundary JSON."""


# --------------------------------------------------------------------------- schema checks


def check_schema(schema: Schema | str) -> None:
    """Raise :class:`RowContractError` unless ``schema`` (a PyIceberg schema or Iceberg schema
    JSON, as Java's ``SchemaParser.toJson`` writes it) has exactly the contract's columns, types,
    requiredness and field ids."""
    if isinstance(schema, str):
        schema = Schema.model_validate_json(schema)
    if schema.as_struct() != ROW_SCHEMA.as_struct():
        raise RowContractError(
            "the table's schema is not bergstream's row contract (columns, types or field ids "
            f"differ):\n  found:    {schema.as_struct()}\n  expected: {ROW_SCHEMA.as_struct()}\n"
            "write to a new table, or recreate this one"
        )


# --------------------------------------------------------------------------- conversions


class RowRecord(NamedTuple):
    """A record read back from a row: its Kafka partition, timestamp type and the record."""

    partition: int
    timestamp_type: int
    record: Record


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _timestamp_from_ms(ms: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(milliseconds=ms)


def _ms_from_timestamp(value: Any) -> int:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - _EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    elif isinstance(value, int):  # microseconds since the epoch (raw Iceberg value)
        micros = value
    else:
        raise RowContractError(f"kafka_timestamp must be a datetime or µs int, got {value!r}")
    if micros % 1000:
        raise RowContractError(f"kafka_timestamp {value!r} is not a whole millisecond")
    return micros // 1000


def record_to_row(partition: int, record: Record, timestamp_type: int) -> dict[str, Any]:
    """The row of one Kafka record: ``kafka_timestamp`` as an aware UTC datetime, headers as a
    list of ``{"key", "value"}`` dicts in order (duplicates kept), key and value untouched
    (``None`` stays ``None``, ``b""`` stays ``b""``)."""
    if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
        raise RowContractError(
            f"timestamp_type must be {CREATE_TIME} (CreateTime) or {LOG_APPEND_TIME} "
            f"(LogAppendTime), got {timestamp_type!r}"
        )
    return {
        "kafka_partition": partition,
        "kafka_offset": record.offset,
        "kafka_timestamp": _timestamp_from_ms(record.timestamp),
        "kafka_timestamp_type": timestamp_type,
        "kafka_key": record.key,
        "kafka_headers": [{"key": key, "value": value} for key, value in record.headers],
        "kafka_value": record.value,
    }


def _header(item: Any) -> Header:
    if isinstance(item, Mapping):
        key, value = item["key"], item["value"]
    else:  # a Spark Row or a (key, value) tuple
        key, value = item[0], item[1]
    if not isinstance(key, str):
        raise RowContractError(f"a header key must be a string, got {key!r}")
    return key, None if value is None else bytes(value)


def row_to_record(row: Mapping[str, Any]) -> RowRecord:
    """The Kafka record of one row (a dict, a Spark ``Row.asDict()`` or a PyArrow
    ``to_pylist()`` item): the inverse of :func:`record_to_row`."""
    try:
        headers = row["kafka_headers"]
        key = row["kafka_key"]
        value = row["kafka_value"]
        record = Record(
            offset=int(row["kafka_offset"]),
            timestamp=_ms_from_timestamp(row["kafka_timestamp"]),
            key=None if key is None else bytes(key),
            value=None if value is None else bytes(value),
            headers=tuple(_header(item) for item in headers or ()),
        )
        return RowRecord(int(row["kafka_partition"]), int(row["kafka_timestamp_type"]), record)
    except KeyError as error:
        raise RowContractError(f"a row lacks the column {error.args[0]!r}") from None


# --------------------------------------------------------------------------- the boundary

#: Next offset to copy, per Kafka partition.
Boundary = dict[int, int]


def parse_boundary(text: str | None) -> Boundary:
    """Parse ``{"<partition>": next_offset}`` JSON; ``None`` or empty gives ``{}``."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise BoundaryError(f"{BOUNDARY_PROPERTY} is not JSON: {error}: {text!r}") from None
    if not isinstance(data, dict):
        raise BoundaryError(f"{BOUNDARY_PROPERTY} must be a JSON object, got {text!r}")
    out: Boundary = {}
    for key, value in data.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise BoundaryError(f"{BOUNDARY_PROPERTY}: partition {key!r} is not a number")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BoundaryError(
                f"{BOUNDARY_PROPERTY}: offset of partition {key} must be an int >= 0, got {value!r}"
            )
        out[int(key)] = value
    return out


def format_boundary(boundary: Mapping[int, int]) -> str:
    """Compact JSON ``{"0": 12, "1": 40}``, partitions in numeric order."""
    return json.dumps(
        {str(partition): int(boundary[partition]) for partition in sorted(boundary)},
        separators=(",", ":"),
    )


def merge_boundaries(*boundaries: Mapping[int, int]) -> Boundary:
    """Union of boundaries, the highest next offset winning per partition."""
    out: Boundary = {}
    for boundary in boundaries:
        for partition, offset in boundary.items():
            out[partition] = max(offset, out.get(partition, offset))
    return out


def boundary_of_ancestry(summaries: Iterable[Mapping[str, str] | None]) -> Boundary:
    """The boundary given snapshot summaries newest first along the current snapshot's
    ancestry: the first one that has :data:`BOUNDARY_PROPERTY`; ``{}`` if none does."""
    for summary in summaries:
        if summary and summary.get(BOUNDARY_PROPERTY):
            return parse_boundary(summary[BOUNDARY_PROPERTY])
    return {}


def _ancestry(table: Table) -> Iterable[Mapping[str, str] | None]:
    metadata = table.metadata
    snapshot = metadata.current_snapshot()
    seen: set[int] = set()
    while snapshot is not None and snapshot.snapshot_id not in seen:
        seen.add(snapshot.snapshot_id)
        summary = snapshot.summary
        yield None if summary is None else dict(summary.additional_properties)
        if snapshot.parent_snapshot_id is None:
            return
        snapshot = metadata.snapshot_by_id(snapshot.parent_snapshot_id)


def table_boundary(table: Table) -> Boundary:
    """The boundary of a PyIceberg table (see :func:`boundary_of_ancestry`)."""
    return boundary_of_ancestry(_ancestry(table))
