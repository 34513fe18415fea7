"""Rows of a typed table from row-contract rows and back, byte for byte (one rule, three users).

:class:`TypedRows` turns Arrow rows with the row contract's columns (``kafka_value`` and
``kafka_key`` holding the bytes Kafka has) into rows of a
:class:`~bergstream.core.typed.row_contract.TypedLayout`, and typed rows back into the exact
bytes. The pipeline runs it in Spark's Python workers, ISK on the hotset's record batches, KSI
on coldset row groups, so a record gets the same row wherever it is read.

Per value (and per key, when its side is typed):

- a null value is a tombstone: every typed column null, ``kafka_value`` null;
- a value without Confluent framing (magic byte 0 and a 4-byte schema id) stays in
  ``kafka_value`` with the cause ``no Confluent framing``;
- otherwise the schema id picks the schema (the layout's versions, else the schema source) and
  its codec decodes the payloads of all rows with that id at once; a payload that does not decode,
  or whose schema has no codec or does not fit the table, stays in ``kafka_value`` with its cause;
  one that decodes but would not re-encode to the same bytes keeps its bytes there too.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, cast

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, StructType

from bergstream.core.backends import (
    SchemaNotExpressible,
    ShapeCodec,
    ValueCodec,
    is_shape_codec,
)
from bergstream.core.metrics import UNDECODABLE_RECORDS
from bergstream.core.typed.row_contract import (
    KEY_COLUMN_PREFIX,
    KEY_ERROR_COLUMN,
    KEY_SCHEMA_ID_COLUMN,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
    LayoutVersion,
    SideLayout,
    TypedLayout,
    arrow_type,
    fits_layout,
    typed_layout,
    version_fit,
)
from bergstream.core.typed.schema_registry import RegisteredSchema, SchemaNotFound, SchemaReference

__all__ = [
    "NO_FRAMING",
    "DecodedRows",
    "SchemaSource",
    "ShapesToFold",
    "SideCodecs",
    "StoredSchemas",
    "TopicCodecs",
    "TypedRows",
    "build_layout",
    "build_layout_seeing",
    "frame_payloads",
    "project_array",
    "report_undecodable",
    "split_framing",
]

NO_FRAMING = "no Confluent framing"
_MAGIC = 0
_HEADER = 5

log = logging.getLogger("bergstream.typed_rows")


class SchemaSource(Protocol):
    """Where schemas come from: a
    :class:`~bergstream.core.typed.schema_registry.SchemaRegistryClient`, or
    :class:`StoredSchemas` (schemas fetched before, or kept in a table's properties)."""

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema with this id; raise ``SchemaNotFound`` or ``RegistryUnavailable``."""
        ...

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        """Every version of ``subject``, ascending; ``[]`` when there is no such subject."""
        ...


@dataclass
class StoredSchemas:
    """A :class:`SchemaSource` over schemas already at hand (picklable, no network)."""

    by_id: dict[int, RegisteredSchema] = field(default_factory=dict)

    def add(self, schemas: Sequence[RegisteredSchema]) -> StoredSchemas:
        """Keep ``schemas`` too; returns self."""
        for schema in schemas:
            self.by_id.setdefault(schema.schema_id, schema)
        return self

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The stored schema with this id; ``SchemaNotFound`` when there is none."""
        try:
            return self.by_id[schema_id]
        except KeyError:
            raise SchemaNotFound(f"unknown schema id {schema_id}") from None

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        """The stored versions of ``subject``, ascending."""
        found = [s for s in self.by_id.values() if s.subject == subject]
        return sorted(found, key=lambda s: s.version or 0)


@dataclass(frozen=True)
class SideCodecs:
    """The codecs of one side (values or keys) of a topic, by the schema types they read, and
    the subject whose versions make the layout."""

    codecs: Mapping[str, ValueCodec]
    subject: str

    def codec_for(self, schema: RegisteredSchema) -> ValueCodec | None:
        """The codec reading ``schema``'s type, if any."""
        return self.codecs.get(schema.schema_type.upper())

    @property
    def shape_codec(self) -> ShapeCodec | None:
        """The codec that groups this side's values (which carry no framing) into shapes; None
        for a side of framed values."""
        for codec in self.codecs.values():
            if is_shape_codec(codec):
                return cast("ShapeCodec", codec)
        return None


@dataclass(frozen=True)
class TopicCodecs:
    """How a topic's values and keys become columns; ``None`` keeps that side raw."""

    topic: str
    value: SideCodecs | None
    key: SideCodecs | None = None


def _resolver(source: SchemaSource) -> Callable[[SchemaReference], RegisteredSchema]:
    def resolve(reference: SchemaReference) -> RegisteredSchema:
        versions = source.subject_schemas(reference.subject)
        if reference.version in (None, -1) and versions:
            return versions[-1]
        for schema in versions:
            if schema.version == reference.version:
                return schema
        raise SchemaNotFound(
            f"schema reference {reference.name!r}: subject {reference.subject!r} has no "
            f"version {reference.version}"
        )

    return resolve


def _iceberg_type(
    side: SideCodecs, schema: RegisteredSchema, source: SchemaSource
) -> tuple[IcebergType | None, str | None]:
    codec = side.codec_for(schema)
    if codec is None:
        return None, f"schema id {schema.schema_id} is {schema.schema_type}, no codec reads it"
    try:
        return codec.iceberg_type(schema, _resolver(source)), None
    except SchemaNotExpressible as error:
        return None, f"schema id {schema.schema_id} cannot be columns: {error}"


def build_layout(
    base: Schema,
    last_column_id: int,
    codecs: TopicCodecs | None,
    source: SchemaSource,
) -> TypedLayout:
    """The layout of ``codecs.topic``'s table: ``base`` (its current schema; the row contract for
    a new table) folded with the versions of the topic's value and key subjects read from
    ``source`` (see :func:`~bergstream.core.typed.row_contract.typed_layout`). Raises
    ``RegistryUnavailable`` when the registry cannot be asked."""

    def versions(side: SideCodecs | None) -> list[LayoutVersion] | None:
        if side is None:
            return None
        out = []
        for schema in source.subject_schemas(side.subject):
            type_, problem = _iceberg_type(side, schema, source)
            out.append(LayoutVersion(schema, type_, problem))
        return out

    if codecs is None:
        return typed_layout(base, last_column_id, None, None)
    return typed_layout(base, last_column_id, versions(codecs.value), versions(codecs.key))


def build_layout_seeing(
    base: Schema,
    last_column_id: int,
    codecs: TopicCodecs | None,
    source: SchemaSource,
    value_ids: Sequence[int] = (),
    key_ids: Sequence[int] = (),
) -> TypedLayout:
    """:func:`build_layout` for rows whose schema ids are known (``value_ids``, ``key_ids``):
    when one of them is neither a version the layout took nor one it rejected (a version
    registered after the source cached the subject), the subjects are read again once, so such
    rows are not kept raw for a stale cache."""
    layout = build_layout(base, last_column_id, codecs, source)
    if codecs is None:
        return layout
    stale = []
    for side_codecs, side, ids in (
        (codecs.value, layout.value, value_ids),
        (codecs.key, layout.key, key_ids),
    ):
        if side_codecs is None:
            continue
        known = set(side.schemas) | set(side.rejected) if side is not None else set()
        if any(int(i) not in known for i in ids):
            stale.append(side_codecs.subject)
    forget = getattr(source, "forget_subject", None)
    if not stale or forget is None:
        return layout
    for subject in stale:
        forget(subject)
    return build_layout(base, last_column_id, codecs, source)


# --------------------------------------------------------------------------- framing


def _binary(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if array.type != pa.large_binary():
        array = array.cast(pa.large_binary())
    return array


def _buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (``len + 1``, absolute in the data) and data of a large_binary array."""
    buffers = array.buffers()
    first = array.offset
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[first : first + len(array) + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    return offsets, data


def split_framing(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a large_binary array: whether it has Confluent framing (not null, at least 5
    bytes, magic byte 0), and its schema id (``-1`` where it has none)."""
    from bergstream.core.typed.framing_kernels import frame_ids

    values = _binary(values)
    offsets, data = _buffers(values)
    count = len(values)
    framed = np.empty(count, bool)
    ids = np.empty(count, np.int64)
    if not len(data):
        framed[:] = False
        ids[:] = -1
        return framed, ids
    valid = ~np.asarray(values.is_null(), dtype=bool)
    frame_ids(data, offsets, valid, _HEADER, _MAGIC, framed, ids)
    return framed, ids


def _pool_array(dtype: type, count: int) -> tuple[pa.Buffer, np.ndarray]:
    """A writable array in a buffer of Arrow's memory pool (reused memory: no page faults of a
    fresh numpy allocation)."""
    itemsize = np.dtype(dtype).itemsize
    buffer = pa.allocate_buffer(max(count * itemsize, 1))
    return buffer, np.frombuffer(buffer, dtype=dtype)[:count]


def _payloads(values: pa.Array, rows: np.ndarray) -> pa.Array:
    """The payloads (framing cut off) of the given rows (framed, so at least 5 bytes each), as
    one large_binary array."""
    from bergstream.core.typed.framing_kernels import strip_headers

    offsets, data = _buffers(values)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    size = int((offsets[rows + 1] - offsets[rows]).sum()) - _HEADER * len(rows)
    body_buffer, body = _pool_array(np.uint8, size)
    offsets_buffer, new_offsets = _pool_array(np.int64, len(rows) + 1)
    strip_headers(data, offsets, rows, _HEADER, body, new_offsets)
    return pa.Array.from_buffers(pa.large_binary(), len(rows), [None, offsets_buffer, body_buffer])


def frame_payloads(schema_id: int, payloads: pa.Array) -> pa.Array:
    """Payloads (large_binary, no nulls) with the Confluent framing of ``schema_id`` put back."""
    from bergstream.core.typed.framing_kernels import add_headers

    payloads = _binary(payloads)
    offsets, data = _buffers(payloads)
    count = len(payloads)
    header = np.frombuffer(bytes([_MAGIC]) + schema_id.to_bytes(4, "big", signed=True), np.uint8)
    size = int(offsets[-1] - offsets[0]) + _HEADER * count
    out_buffer, out = _pool_array(np.uint8, size)
    offsets_buffer, out_offsets = _pool_array(np.int64, count + 1)
    add_headers(data, offsets, header, out, out_offsets)
    return pa.Array.from_buffers(pa.large_binary(), count, [None, offsets_buffer, out_buffer])


# --------------------------------------------------------------------------- projection


def project_array(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as values of ``target`` (same field names; missing fields null, promotions and
    narrowings cast, field metadata taken from ``target``)."""
    if array.type.equals(target, check_metadata=True):
        return array
    mask = array.is_null() if array.null_count else None
    if isinstance(target, pa.ExtensionType):
        storage = array.storage if isinstance(array, pa.ExtensionArray) else array
        return pa.ExtensionArray.from_storage(target, project_array(storage, target.storage_type))
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if pa.types.is_struct(target):
        source = {array.type.field(i).name: child for i, child in enumerate(array.flatten())}
        children = [
            project_array(source[f.name], f.type)
            if f.name in source
            else pa.nulls(len(array), f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_map(target):
        return pa.MapArray.from_arrays(
            array.offsets,
            project_array(array.keys, target.key_type),
            project_array(array.items, target.item_type),
            type=target,
            mask=mask,
        )
    if pa.types.is_large_list(target) or pa.types.is_list(target):
        cls = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray
        return cls.from_arrays(
            array.offsets, project_array(array.values, target.value_type), type=target, mask=mask
        )
    return array.cast(target)


def _side_columns(side: SideLayout, key: bool) -> dict[str, str]:
    """Column name -> field name of the value (key) type."""
    prefix = KEY_COLUMN_PREFIX if key else ""
    return {column: column.removeprefix(prefix) for column in side.columns}


# --------------------------------------------------------------------------- decoding


@dataclass
class DecodedRows:
    """Typed rows and how many values (keys) did not decode, by cause."""

    table: pa.Table
    causes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (side, cause) -> rows
    #: shapes the layout had not folded that these rows were decoded with (``adopt_shapes``):
    #: schema id -> declared schema, for the table's properties
    adopted: dict[int, RegisteredSchema] = field(default_factory=dict)


class ShapesToFold(LookupError):
    """Rows have shapes that would add or widen columns: the layout must fold them first
    (raised by :meth:`TypedRows.decode` with ``adopt_shapes``)."""

    def __init__(self, schema_ids: Sequence[int]) -> None:
        self.schema_ids = sorted(set(schema_ids))
        super().__init__(
            f"shapes {self.schema_ids} add or widen columns the table's layout does not have"
        )


@dataclass
class _SideResult:
    columns: dict[str, pa.Array]
    schema_ids: pa.Array
    errors: pa.Array
    kept: pa.Array
    adopted: dict[int, RegisteredSchema] = field(default_factory=dict)


class TypedRows:
    """Decodes and encodes the rows of one topic's table with one layout (picklable).

    ``adopt_shapes``: a row whose shape (see :class:`~bergstream.core.backends.ShapeCodec`) the
    layout has not folded is decoded when folding the shape would leave the columns as they
    are (it is then reported in :attr:`DecodedRows.adopted`), and keeps its bytes with the
    cause when the fold would reject it, exactly as a layout that folded it would have it; a
    shape that would add or widen a column raises :class:`ShapesToFold`. Without it, such rows
    keep their bytes with a cause saying the table has not folded the shape yet.

    ``within`` (with ``adopt_shapes``; side ``"value"``/``"key"`` -> what the shape codec's
    ``joined_kinds`` gave for the values the layout was folded from): a batch whose values
    would have folded into other columns together with those (``within_kinds`` false) raises
    :class:`ShapesToFold`, so a layout folded from a sample of a batch decodes the batch only
    when folding the whole batch would have made the same layout."""

    def __init__(
        self,
        layout: TypedLayout,
        codecs: TopicCodecs | None,
        source: SchemaSource,
        *,
        adopt_shapes: bool = False,
        within: Mapping[str, Mapping[str, object]] | None = None,
    ):
        self.layout = layout
        self.codecs = codecs
        self.source = source
        self.adopt_shapes = adopt_shapes
        self.within = dict(within or {})
        self._types: dict[tuple[str, int], tuple[IcebergType | None, str | None]] = {}
        # (side, schema id) -> what folding a shape the layout lacks would do (adopt_shapes)
        self._fits: dict[tuple[str, int], tuple[str, IcebergType | None, str | None]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- schemas

    def _type_of(
        self, name: str, side: SideLayout, codecs: SideCodecs, schema: RegisteredSchema
    ) -> tuple[IcebergType | None, str | None]:
        """The codec's type of a schema and why its rows cannot become columns (None if they
        can)."""
        key = (name, schema.schema_id)
        with self._lock:
            if key in self._types:
                return self._types[key]
        if schema.schema_id in side.rejected:
            found: tuple[IcebergType | None, str | None] = (None, side.rejected[schema.schema_id])
        elif schema.schema_id in side.types:
            found = (side.types[schema.schema_id], None)
        else:
            type_, problem = _iceberg_type(codecs, schema, self.source)
            if type_ is not None:
                why = fits_layout(self.layout, type_, key=name == "key")
                if why is not None:
                    problem = (
                        f"schema id {schema.schema_id} is not a version of subject "
                        f"{codecs.subject!r} and does not fit the table: {why}"
                    )
            found = (type_, problem)
        with self._lock:
            self._types[key] = found
        return found

    def _schema(self, side: SideLayout, schema_id: int) -> RegisteredSchema | None:
        if schema_id in side.schemas:
            return side.schemas[schema_id]
        try:
            return self.source.schema_by_id(schema_id)
        except SchemaNotFound:
            return None

    # -- decode

    def decode(self, rows: pa.Table) -> DecodedRows:
        """Typed rows (``layout.arrow_schema``) of row-contract rows. Raises
        ``RegistryUnavailable`` when a schema id must be looked up and the registry is down
        (nothing is decoded then: retry later)."""
        out = DecodedRows(rows)
        layout = self.layout
        results: dict[str, _SideResult] = {}
        for name, side, codecs in self._sides():
            column = "kafka_key" if name == "key" else "kafka_value"
            results[name] = self._decode_side(name, side, codecs, rows.column(column), out.causes)
            out.adopted.update(results[name].adopted)
        arrays: list[pa.Array] = []
        for target in layout.arrow_schema:
            arrays.append(self._column(target, rows, results))
        out.table = pa.Table.from_arrays(arrays, schema=layout.arrow_schema)
        return out

    def _sides(self) -> list[tuple[str, SideLayout, SideCodecs]]:
        sides = []
        codecs = self.codecs
        for name in ("value", "key"):
            side = getattr(self.layout, name)
            side_codecs = getattr(codecs, name) if codecs is not None else None
            if side is not None:
                sides.append((name, side, side_codecs or SideCodecs({}, "")))
        return sides

    def _column(
        self, target: pa.Field, rows: pa.Table, results: Mapping[str, _SideResult]
    ) -> pa.Array:
        name = target.name
        special = {
            "kafka_value": ("value", "kept"),
            "kafka_key": ("key", "kept"),
            VALUE_SCHEMA_ID_COLUMN: ("value", "schema_ids"),
            VALUE_ERROR_COLUMN: ("value", "errors"),
            KEY_SCHEMA_ID_COLUMN: ("key", "schema_ids"),
            KEY_ERROR_COLUMN: ("key", "errors"),
        }
        if name in special and special[name][0] in results:
            side, attribute = special[name]
            array = getattr(results[side], attribute)
        else:
            array = None
            for result in results.values():
                if name in result.columns:
                    array = result.columns[name]
            if array is None:
                if name not in rows.column_names:
                    return pa.nulls(rows.num_rows, target.type)
                array = _chunk(rows.column(name))
        return project_array(array, target.type)

    def _decode_side(
        self,
        name: str,
        side: SideLayout,
        codecs: SideCodecs,
        raw: pa.Array | pa.ChunkedArray,
        causes: Counter[tuple[str, str]],
    ) -> _SideResult:
        raw = _binary(raw)
        count = len(raw)
        valid = ~np.asarray(raw.is_null(), dtype=bool)
        keep = valid.copy()  # bytes kept unless a codec says they re-encode exactly
        errors = _Causes(count)
        targets = {column: self.layout.arrow_schema.field(column).type for column in side.columns}
        key = name == "key"
        field_of = _side_columns(side, key)
        shape_codec = codecs.shape_codec
        adopted: dict[int, RegisteredSchema] = {}
        if shape_codec is None:
            framed, ids = split_framing(raw)
            errors.set(valid & ~framed, NO_FRAMING)
        else:
            framed, ids, side, adopted = self._shape_ids(
                name, side, codecs, shape_codec, raw, field_of, errors
            )
        pieces: dict[str, list[pa.Array]] = {column: [] for column in side.columns}
        order: list[np.ndarray] = []
        distinct = _distinct(ids[framed])
        one_group = len(distinct) == 1 and bool(framed.all())
        for schema_id in distinct:
            rows = np.arange(count) if one_group else np.nonzero(framed & (ids == schema_id))[0]
            if int(schema_id) in side.rejected:  # its cause is known: no schema to look up
                errors.set(rows, side.rejected[int(schema_id)])
                continue
            schema = self._schema(side, int(schema_id))
            if schema is None:
                problem: str | None = f"unknown schema id {int(schema_id)}"
                type_ = None
            else:
                type_, problem = self._type_of(name, side, codecs, schema)
            if problem is not None or schema is None or type_ is None:
                errors.set(rows, problem or f"schema id {int(schema_id)} has no codec")
                continue
            codec = codecs.codec_for(schema)
            assert codec is not None
            decode_framed = getattr(codec, "decode_framed", None)
            if shape_codec is not None:
                decoded = codec.decode(schema, raw if one_group else raw.take(pa.array(rows)))
            elif one_group and decode_framed is not None:  # every row framed: no copy to cut it
                decoded = decode_framed(schema, raw, _HEADER)
            else:
                decoded = codec.decode(schema, _payloads(raw, rows))
            keep[rows] = np.asarray(decoded.keep_bytes, dtype=bool)
            if decoded.errors.count(None) != len(decoded.errors):
                for row, error in zip(rows, decoded.errors, strict=True):
                    if error is not None:
                        errors.set(row, error)
            order.append(rows)
            values = decoded.values
            if isinstance(type_, StructType):
                children = dict(
                    zip(
                        [values.type.field(i).name for i in range(values.type.num_fields)],
                        values.flatten(),
                        strict=True,
                    )
                )
                for column, field_name in field_of.items():
                    if field_name in children:
                        pieces[column].append(project_array(children[field_name], targets[column]))
                    else:
                        pieces[column].append(pa.nulls(len(rows), targets[column]))
            else:
                single = "key" if key else "value"
                for column in side.columns:
                    if column == single:
                        pieces[column].append(project_array(values, targets[column]))
                    else:
                        pieces[column].append(pa.nulls(len(rows), targets[column]))
        columns = _scatter(pieces, order, count, targets)
        for cause, rows_with_it in errors.counts().items():
            causes[(name, cause)] += rows_with_it
        kept_rows = keep & valid
        if kept_rows.any():
            kept = pa.compute.if_else(pa.array(kept_rows), raw, pa.nulls(count, pa.large_binary()))
        else:  # every value decoded canonically (the usual batch): no bytes kept
            kept = pa.nulls(count, pa.large_binary())
        schema_ids = pa.array(np.where(framed, ids, 0), pa.int32(), mask=~framed)
        return _SideResult(columns, schema_ids, errors.array(), kept, adopted)

    def _shape_ids(
        self,
        name: str,
        side: SideLayout,
        codecs: SideCodecs,
        shape_codec: ShapeCodec,
        raw: pa.Array,
        field_of: Mapping[str, str],
        errors: _Causes,
    ) -> tuple[np.ndarray, np.ndarray, SideLayout, dict[int, RegisteredSchema]]:
        """Per row of unframed values: whether it has a shape the layout folded (or adopted,
        see the class docstring), and that shape's schema id (the rest get their cause); the
        side with the adopted shapes, and those shapes."""
        columns = {
            field_of[column]: self.layout.schema.find_field(column).field_type
            for column in side.columns
        }
        found = shape_codec.shapes(raw, columns, codecs.subject)
        ids = np.asarray(found.ids, dtype=np.int64)
        for row, error in enumerate(found.errors):
            if error is not None:
                errors.set(row, error)
        unfolded = [
            schema
            for schema in found.schemas
            if schema.schema_id not in side.schemas and schema.schema_id not in side.rejected
        ]
        adopted: dict[int, RegisteredSchema] = {}
        joined = self.within.get(name) if self.adopt_shapes else None
        if joined is not None and not shape_codec.within_kinds(raw, joined):
            raise ShapesToFold([s.schema_id for s in unfolded])
        if unfolded and self.adopt_shapes:
            side, adopted = self._adopt(name, side, codecs, unfolded)
            unfolded = []
        for schema in unfolded:
            rows = ids == schema.schema_id
            errors.set(
                rows,
                f"its keys and kinds make a shape (schema id {schema.schema_id}) the table's "
                "layout has not folded yet: read it again once the table has it",
            )
            ids[rows] = -1
        return ids >= 0, ids, side, adopted

    def _adopt(
        self, name: str, side: SideLayout, codecs: SideCodecs, shapes: list[RegisteredSchema]
    ) -> tuple[SideLayout, dict[int, RegisteredSchema]]:
        """``side`` with ``shapes`` folded as :func:`typed_layout` would fold them, when none
        changes the columns; raise :class:`ShapesToFold` otherwise."""
        schemas, types, rejected = dict(side.schemas), dict(side.types), dict(side.rejected)
        adopted: dict[int, RegisteredSchema] = {}
        grows = []
        for schema in shapes:
            schema_id = schema.schema_id
            found = self._fits.get((name, schema_id))
            if found is None:
                type_, problem = _iceberg_type(codecs, schema, self.source)
                if type_ is None:
                    found = ("rejected", None, problem or f"schema id {schema_id} has no codec")
                else:
                    outcome, why = version_fit(self.layout, type_, key=name == "key")
                    cause = f"schema id {schema_id} does not fit the table: {why}"
                    found = (outcome, type_, cause if outcome == "rejected" else None)
                self._fits[(name, schema_id)] = found
            outcome, type_, cause = found
            if outcome == "grows":
                grows.append(schema_id)
            elif outcome == "rejected":
                rejected[schema_id] = cause or ""
            else:
                assert type_ is not None
                schemas[schema_id], types[schema_id] = schema, type_
                adopted[schema_id] = schema
        if grows:
            raise ShapesToFold(grows)
        return replace(side, schemas=schemas, types=types, rejected=rejected), adopted

    # -- encode

    def encode(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """The original ``kafka_key`` and ``kafka_value`` bytes of typed rows (any table with the
        layout's columns, in any order), byte for byte."""
        out = {}
        for name in ("key", "value"):
            column = f"kafka_{name}"
            raw = _binary(rows.column(column))
            side = getattr(self.layout, name)
            codecs = getattr(self.codecs, name) if self.codecs is not None else None
            if side is None:
                out[name] = raw
                continue
            out[name] = self._encode_side(name, side, codecs or SideCodecs({}, ""), rows, raw)
        return out["key"], out["value"]

    def _encode_side(
        self, name: str, side: SideLayout, codecs: SideCodecs, rows: pa.Table, raw: pa.Array
    ) -> pa.Array:
        id_column = KEY_SCHEMA_ID_COLUMN if name == "key" else VALUE_SCHEMA_ID_COLUMN
        ids_array = rows.column(id_column)
        ids = (
            np.asarray(ids_array.fill_null(-1), dtype=np.int64)
            if len(ids_array)
            else np.zeros(0, np.int64)
        )
        need = np.asarray(raw.is_null(), dtype=bool) & (
            ~np.asarray(ids_array.is_null(), dtype=bool)
        )
        if not need.any():
            return raw
        key = name == "key"
        field_of = _side_columns(side, key)
        pieces: list[pa.Array] = []
        order: list[np.ndarray] = []
        distinct = _distinct(ids[need])
        every_row = len(distinct) == 1 and bool(need.all())
        for schema_id in distinct:
            positions = (
                np.arange(len(raw)) if every_row else np.nonzero(need & (ids == schema_id))[0]
            )
            schema = self._schema(side, int(schema_id))
            if schema is None:
                raise SchemaNotFound(
                    f"unknown schema id {int(schema_id)}: rows of topic "
                    f"{self.codecs.topic if self.codecs else '?'} cannot be rebuilt without it"
                )
            type_, problem = self._type_of(name, side, codecs, schema)
            codec = codecs.codec_for(schema)
            if type_ is None or codec is None:
                raise SchemaNotExpressible(
                    f"rows with schema id {int(schema_id)} have no kept bytes but {problem}"
                )
            selected = rows if every_row else rows.take(pa.array(positions))
            target = arrow_type(type_)
            if isinstance(type_, StructType):
                by_field = {field_of[c]: c for c in side.columns}
                children = []
                for f in target:
                    column = by_field.get(f.name)
                    children.append(
                        project_array(_chunk(selected.column(column)), f.type)
                        if column is not None
                        else pa.nulls(len(positions), f.type)
                    )
                values = pa.StructArray.from_arrays(children, fields=list(target))
            else:
                single = "key" if key else "value"
                values = project_array(_chunk(selected.column(single)), target)
            payloads = codec.encode(schema, values)
            if codecs.shape_codec is None:
                payloads = frame_payloads(int(schema_id), payloads)
            pieces.append(_binary(payloads))
            order.append(positions)
        if every_row:
            return pieces[0]
        rest = np.nonzero(~need)[0]
        pieces.append(raw.take(pa.array(rest)))
        permutation = np.concatenate([*order, rest])
        inverse = np.empty(len(raw), np.int64)
        inverse[permutation] = np.arange(len(raw))
        return pa.concat_arrays(pieces).take(pa.array(inverse))


def _distinct(ids: np.ndarray) -> list[int]:
    """The distinct schema ids, in ascending order (one id: no sort)."""
    if not len(ids):
        return []
    if bool((ids == ids[0]).all()):
        return [int(ids[0])]
    return [int(i) for i in np.unique(ids)]


class _Causes:
    """Per row, why it did not decode: codes into a list of distinct cause texts."""

    def __init__(self, count: int) -> None:
        self.codes = np.full(count, -1, np.int32)
        self.texts: list[str] = []
        self.index: dict[str, int] = {}

    def set(self, rows: np.ndarray | int, text: str) -> None:
        code = self.index.get(text)
        if code is None:
            code = self.index[text] = len(self.texts)
            self.texts.append(text)
        self.codes[rows] = code

    def counts(self) -> dict[str, int]:
        if not self.texts:
            return {}
        tally = np.bincount(self.codes[self.codes >= 0], minlength=len(self.texts))
        return {text: int(n) for text, n in zip(self.texts, tally, strict=True) if n}

    def array(self) -> pa.Array:
        if not self.texts:
            return pa.nulls(len(self.codes), pa.large_string())
        indices = pa.array(self.codes, pa.int32(), mask=self.codes < 0)
        dictionary = pa.array(self.texts, pa.large_string())
        return pa.DictionaryArray.from_arrays(indices, dictionary).cast(pa.large_string())


def _scatter(
    pieces: Mapping[str, list[pa.Array]],
    order: list[np.ndarray],
    count: int,
    targets: Mapping[str, pa.DataType],
) -> dict[str, pa.Array]:
    """Full columns from the pieces of each schema id's rows (``order``), nulls elsewhere."""
    covered = np.concatenate(order) if order else np.zeros(0, np.int64)
    identity = len(covered) == count and bool(np.array_equal(covered, np.arange(count)))
    rest = (
        np.zeros(0, np.int64)
        if identity
        else np.setdiff1d(np.arange(count), covered, assume_unique=True)
    )
    inverse = None
    if not identity:
        permutation = np.concatenate([covered, rest])
        inverse = np.empty(count, np.int64)
        inverse[permutation] = np.arange(count)
    columns: dict[str, pa.Array] = {}
    for column, parts in pieces.items():
        parts = [*parts, pa.nulls(len(rest), targets[column])] if len(rest) else list(parts)
        if len(parts) == 1:
            whole = parts[0]  # one schema id for every row: no copy
        else:
            whole = pa.concat_arrays(parts) if parts else pa.nulls(0, targets[column])
        columns[column] = whole if inverse is None else whole.take(pa.array(inverse))
    return columns


def _chunk(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        return array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array


_reported: set[tuple[str, str, str]] = set()
_reported_lock = threading.Lock()


def report_undecodable(component: str, topic: str, causes: Mapping[tuple[str, str], int]) -> None:
    """Count values (keys) that did not decode in the ``bergstream_undecodable_records`` metric
    and log each cause once per process (the rows themselves are kept raw, never dropped)."""
    for (side, cause), rows in causes.items():
        UNDECODABLE_RECORDS.labels(component, topic, side, cause.split(":")[0]).inc(rows)
        with _reported_lock:
            first = (component, topic, cause) not in _reported
            _reported.add((component, topic, cause))
        if first:
            log.warning(
                "%s: %d %s(s) of topic %s did not decode and are kept as bytes: %s "
                "(logged once per cause; see bergstream_undecodable_records)",
                component,
                rows,
                side,
                topic,
                cause,
            )
