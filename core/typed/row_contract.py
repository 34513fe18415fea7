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
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform
from pyiceberg.types import (
    BinaryType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from bergstream.core.records import Header, Record
from bergstream.core.typed.schema_evolution import (
    IdAllocator,
    NotExpressible,
    fresh_ids,
    merge_type,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from bergstream.core.typed.schema_registry import RegisteredSchema

__all__ = [
    "BOUNDARY_PROPERTY",
    "COLUMNS",
    "CREATE_TIME",
    "HOUR_PARTITION_SPEC",
    "KEY_COLUMN_PREFIX",
    "KEY_ERROR_COLUMN",
    "KEY_FIELD_DOC",
    "KEY_SCHEMA_ID_COLUMN",
    "LOG_APPEND_TIME",
    "PARTITION_SPEC",
    "ROW_ARROW_SCHEMA",
    "ROW_SCHEMA",
    "SCHEMA_PROPERTY_PREFIX",
    "SORT_ORDER",
    "VALUE_ERROR_COLUMN",
    "VALUE_FIELD_DOC",
    "VALUE_SCHEMA_ID_COLUMN",
    "Boundary",
    "BoundaryError",
    "LayoutVersion",
    "RowContractError",
    "RowRecord",
    "SideLayout",
    "TypedLayout",
    "arrow_type",
    "boundary_of_ancestry",
    "check_schema",
    "fits_layout",
    "format_boundary",
    "layout_columns",
    "merge_boundaries",
    "parse_boundary",
    "record_to_row",
    "row_to_record",
    "schema_property",
    "table_boundary",
    "typed_layout",
    "version_fit",
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
    requiredness and field ids, followed by nothing or by a typed layout's columns (the schema id
    and error columns, and value or key fields marked as such in their ``doc``)."""
    if isinstance(schema, str):
        schema = Schema.model_validate_json(schema)
    fields = schema.fields
    contract = ROW_SCHEMA.fields
    extra = fields[len(contract) :]
    if StructType(*fields[: len(contract)]) != ROW_SCHEMA.as_struct() or not all(
        _is_layout_column(field) for field in extra
    ):
        raise RowContractError(
            "the table's schema is not bergstream's row contract (columns, types or field ids "
            f"differ):\n  found:    {schema.as_struct()}\n  expected: {ROW_SCHEMA.as_struct()}"
            "\n  (optionally followed by typed columns)\nwrite to a new table, or recreate this one"
        )


def _is_layout_column(field: NestedField) -> bool:
    if field.name in _EXTRA_TYPES:
        return field.field_type == _EXTRA_TYPES[field.name] and not field.required
    return field.doc in (VALUE_FIELD_DOC, KEY_FIELD_DOC) and not field.required


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


# --------------------------------------------------------------------------- typed layout
#
# A topic whose values (or keys) are written with a registered schema gets typed columns after
# the contract's: the schema id and error columns, then the value's fields (a record's fields;
# one column ``value`` for any other schema), then the key's fields prefixed ``key_`` (one column
# ``key`` for a non-record key schema). Every typed column is optional and carries a ``doc``
# saying whose field it is, so a table's own schema tells its layout.
#
# ``kafka_value`` (``kafka_key``) then holds the original bytes only when the typed columns cannot
# give them back: the value did not decode (``kafka_value_error`` says why) or re-encoding it would
# not give the same bytes; it is null otherwise. A tombstone has both ``kafka_value`` and
# ``kafka_value_schema_id`` null. Which schema versions make the layout, and how it evolves, is
# :func:`typed_layout`.

#: The value's schema id (Confluent framing), null for a tombstone or an unframed value.
VALUE_SCHEMA_ID_COLUMN = "kafka_value_schema_id"
#: Why the value did not decode; null when it did.
VALUE_ERROR_COLUMN = "kafka_value_error"
#: The key's schema id, when a key codec is set.
KEY_SCHEMA_ID_COLUMN = "kafka_key_schema_id"
#: Why the key did not decode.
KEY_ERROR_COLUMN = "kafka_key_error"
#: Prefix of the columns holding a key's fields.
KEY_COLUMN_PREFIX = "key_"
#: ``doc`` of a column holding a value field.
VALUE_FIELD_DOC = "bergstream: a field of the record value"
#: ``doc`` of a column holding a key field.
KEY_FIELD_DOC = "bergstream: a field of the record key"
#: Table property prefix of the schemas a table's rows were written with:
#: ``bergstream.schema.<id>`` = ``{"schemaType": "AVRO", "schema": "..."}``.
SCHEMA_PROPERTY_PREFIX = "bergstream.schema."

_EXTRA_TYPES: dict[str, IcebergType] = {
    VALUE_SCHEMA_ID_COLUMN: IntegerType(),
    VALUE_ERROR_COLUMN: StringType(),
    KEY_SCHEMA_ID_COLUMN: IntegerType(),
    KEY_ERROR_COLUMN: StringType(),
}


def arrow_type(type_: IcebergType) -> pa.DataType:
    """The Arrow type of values of an Iceberg type, field ids in the ``PARQUET:field_id``
    metadata of nested fields, as PyIceberg reads and writes them: large strings, binaries and
    lists, ``timestamp[us, tz=UTC]`` for timestamptz, ``fixed_size_binary`` for fixed, the
    ``arrow.uuid`` extension type for uuid."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(type_, include_field_ids=True)


@dataclass(frozen=True)
class LayoutVersion:
    """One registered schema of a topic's values (or keys), with the Iceberg type its codec
    maps it to, or why it has none (no codec reads it, or Iceberg cannot hold it)."""

    schema: RegisteredSchema
    type: IcebergType | None = None
    problem: str | None = None


@dataclass(frozen=True)
class SideLayout:
    """The typed columns of one side (values or keys) of a topic's table."""

    columns: tuple[str, ...]  # the top-level columns holding this side's fields
    schemas: Mapping[int, RegisteredSchema]  # accepted schema ids
    types: Mapping[int, IcebergType]  # the codec's type of each accepted id
    rejected: Mapping[int, str]  # schema id -> why its records stay raw


@dataclass(frozen=True)
class TypedLayout:
    """What a topic's table looks like: the contract's columns, then typed columns.

    ``value``/``key`` are ``None`` for a side kept raw. A layout with both ``None`` is the plain
    row contract (``schema`` is the base it was made from).
    """

    schema: Schema
    last_column_id: int
    value: SideLayout | None
    key: SideLayout | None

    @property
    def typed(self) -> bool:
        """Whether any side is typed."""
        return self.value is not None or self.key is not None

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the table's rows (field ids as Parquet metadata)."""
        return arrow_type(self.schema)

    @cached_property
    def fingerprint(self) -> str:
        """A short stable hash of everything that shapes the table's rows (schema with ids,
        accepted and rejected schema ids): synthesized files are keyed by it."""
        parts: dict[str, Any] = {"schema": self.schema.model_dump(mode="json")}
        for name, side in (("value", self.value), ("key", self.key)):
            if side is not None:
                parts[name] = {
                    "schemas": sorted(side.schemas),
                    "rejected": sorted((str(k), v) for k, v in side.rejected.items()),
                }
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def schema_properties(self) -> dict[str, str]:
        """The ``bergstream.schema.<id>`` table properties of every accepted schema."""
        out: dict[str, str] = {}
        for side in (self.value, self.key):
            if side is None:
                continue
            for schema_id, schema in side.schemas.items():
                out[f"{SCHEMA_PROPERTY_PREFIX}{schema_id}"] = schema_property(schema)
        return out


def schema_property(schema: RegisteredSchema, *, with_subject: bool = False) -> str:
    """The value of a ``bergstream.schema.<id>`` table property: the schema's type, text and
    references (what it takes to load it again without the registry); ``with_subject`` adds
    its subject and version (a schema others reference is found by them)."""
    body: dict[str, Any] = {"schemaType": schema.schema_type, "schema": schema.schema}
    if schema.references:
        body["references"] = [
            {"name": r.name, "subject": r.subject, "version": r.version} for r in schema.references
        ]
    if with_subject and schema.subject is not None:
        body["subject"] = schema.subject
        body["version"] = schema.version
    return json.dumps(body, separators=(",", ":"))


def layout_columns(schema: Schema) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The value and key field columns of a table's schema (by their ``doc``)."""
    value = tuple(f.name for f in schema.fields if f.doc == VALUE_FIELD_DOC)
    key = tuple(f.name for f in schema.fields if f.doc == KEY_FIELD_DOC)
    return value, key


def _side_fields(type_: IcebergType, key: bool) -> list[NestedField]:
    """The top-level columns one value (or key) type asks for."""
    if isinstance(type_, StructType):
        prefix = KEY_COLUMN_PREFIX if key else ""
        return [
            NestedField(f.field_id, prefix + f.name, f.field_type, required=False)
            for f in type_.fields
        ]
    return [NestedField(1 << 30, "key" if key else "value", type_, required=False)]


class _Fold:
    """Builds a layout's columns one schema version at a time."""

    def __init__(self, base: Schema, last_column_id: int) -> None:
        self.fields: list[NestedField] = list(base.fields)
        self.ids = IdAllocator(max(last_column_id, base.highest_field_id))
        self.owner: dict[str, str] = {f.name: "contract" for f in ROW_SCHEMA.fields}
        for f in self.fields:
            if f.name in _EXTRA_TYPES:
                self.owner[f.name] = "contract"
            elif f.doc in (VALUE_FIELD_DOC, KEY_FIELD_DOC):
                self.owner[f.name] = "key" if f.doc == KEY_FIELD_DOC else "value"

    def ensure(self, name: str) -> None:
        if not any(f.name == name for f in self.fields):
            self.fields.append(
                NestedField(self.ids.next(), name, _EXTRA_TYPES[name], required=False)
            )

    def fold(self, type_: IcebergType, side: str, add: bool) -> None:
        """Merge one version's columns in; raise NotExpressible (nothing changed) if it cannot."""
        doc = KEY_FIELD_DOC if side == "key" else VALUE_FIELD_DOC
        fields = list(self.fields)
        ids = IdAllocator(self.ids.last_column_id)
        index = {f.name: i for i, f in enumerate(fields)}
        for new in _side_fields(type_, key=side == "key"):
            owner = self.owner.get(new.name)
            if owner is not None and owner != side:
                whose = "the row contract's" if owner == "contract" else f"the {owner}'s"
                raise NotExpressible(
                    f"the {side} field {new.name!r} collides with {whose} column {new.name!r}; "
                    "rename the field (or set another key codec)"
                )
            if new.name in index:
                old = fields[index[new.name]]
                merged = merge_type(old.field_type, new.field_type, ids, new.name, add=add)
                fields[index[new.name]] = NestedField(
                    old.field_id, old.name, merged, required=False, doc=old.doc
                )
            elif not add:
                raise NotExpressible(f"{new.name}: the table has no such column")
            else:
                field_id = ids.next()
                fields.append(
                    NestedField(
                        field_id, new.name, fresh_ids(new.field_type, ids), required=False, doc=doc
                    )
                )
                index[new.name] = len(fields) - 1
        if add:
            self.fields, self.ids = fields, ids
            for f in fields:
                self.owner.setdefault(f.name, side)


def _side(
    fold: _Fold, versions: Sequence[LayoutVersion] | None, side: str, base: Schema
) -> SideLayout | None:
    doc = KEY_FIELD_DOC if side == "key" else VALUE_FIELD_DOC
    id_column = KEY_SCHEMA_ID_COLUMN if side == "key" else VALUE_SCHEMA_ID_COLUMN
    error_column = KEY_ERROR_COLUMN if side == "key" else VALUE_ERROR_COLUMN
    already = any(f.name == id_column for f in base.fields)
    if versions is None or (not versions and not already):
        return None
    fold.ensure(id_column)
    fold.ensure(error_column)
    schemas: dict[int, RegisteredSchema] = {}
    types: dict[int, IcebergType] = {}
    rejected: dict[int, str] = {}
    for version in sorted(versions, key=lambda v: (v.schema.version or 0, v.schema.schema_id)):
        schema_id = version.schema.schema_id
        if schema_id in schemas or schema_id in rejected:
            continue
        if version.type is None:
            rejected[schema_id] = version.problem or f"schema id {schema_id} has no codec"
            continue
        try:
            fold.fold(version.type, side, add=True)
        except NotExpressible as error:
            rejected[schema_id] = f"schema id {schema_id} does not fit the table: {error}"
            continue
        schemas[schema_id] = version.schema
        types[schema_id] = version.type
    columns = tuple(f.name for f in fold.fields if f.doc == doc)
    return SideLayout(columns, schemas, types, rejected)


def typed_layout(
    base: Schema,
    last_column_id: int,
    value_versions: Sequence[LayoutVersion] | None,
    key_versions: Sequence[LayoutVersion] | None = None,
) -> TypedLayout:
    """The layout of a topic's table (the rule the pipeline, ISK and KSI all follow).

    ``base`` is the table's current schema (the row contract for a new table) and
    ``last_column_id`` its metadata's last column id. ``value_versions`` are the versions of the
    topic's value subject (``None``: values stay raw); ``key_versions`` the same for keys. A side
    is typed when its subject has versions or ``base`` is typed already.

    Versions fold in ascending version order: the schema id and error columns are added first
    (when missing), then each version's fields; a path that exists keeps its field id, a new one
    gets the next id, allowed promotions widen a column. A version that cannot fold (a type
    change Iceberg cannot express, a field named like a contract column or like the other side's
    column) is rejected with its cause and changes nothing. Deterministic: the same base and
    versions give the same layout, ids included.
    """
    fold = _Fold(base, last_column_id)
    value = _side(fold, value_versions, "value", base)
    key = _side(fold, key_versions, "key", base)
    schema = Schema(*fold.fields, schema_id=base.schema_id)
    if schema.as_struct() != base.as_struct():
        schema = Schema(*fold.fields, schema_id=base.schema_id + 1)
    return TypedLayout(schema, fold.ids.last_column_id, value, key)


def fits_layout(layout: TypedLayout, type_: IcebergType, key: bool = False) -> str | None:
    """``None`` when values of ``type_`` (a schema that is not one of the layout's versions) read
    into the layout's columns as they are; else why not."""
    fold = _Fold(layout.schema, layout.last_column_id)
    try:
        fold.fold(type_, "key" if key else "value", add=False)
    except NotExpressible as error:
        return str(error)
    return None


def version_fit(
    layout: TypedLayout, type_: IcebergType, key: bool = False
) -> tuple[str, str | None]:
    """What folding one more version of ``type_`` into ``layout`` would do, as
    :func:`typed_layout` folds it: ``("fits", None)`` when the columns stay as they are,
    ``("grows", None)`` when it adds or widens a column, ``("rejected", why)`` when it cannot
    fold (its records then stay raw with ``why``)."""
    fold = _Fold(layout.schema, layout.last_column_id)
    before = list(fold.fields)
    try:
        fold.fold(type_, "key" if key else "value", add=True)
    except NotExpressible as error:
        return "rejected", str(error)
    return ("fits", None) if fold.fields == before else ("grows", None)
