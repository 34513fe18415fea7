"""The layout of a topic whose values (or keys) carry no schema id: their codec (a
:class:`~bergstream.core.backends.ShapeCodec`, such as ``json``) groups a batch's rows into
shapes and declares a schema for each, and those schemas are the versions the layout folds.

Folding a new batch takes two declarations: the first lets a key the table has no column for
take the column the whole batch makes (integers and numbers seen together make a double); the
second declares every shape against the columns so made, which is what any other batch of the
same rows declares too (workers decoding parts of the batch, ISK reading it later). The layout
is the first fold's columns (field ids included) with the second declarations as its versions
(folded into those columns they add none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType

from bergstream.core.typed.row_contract import KEY_COLUMN_PREFIX, SideLayout, TypedLayout
from bergstream.core.typed.schema_registry import RegisteredSchema
from bergstream.core.typed.typed_rows import SchemaSource, SideCodecs, TopicCodecs, build_layout

__all__ = ["ShapedLayout", "build_layout_of_columns", "build_layout_of_shapes", "side_columns"]


@dataclass(frozen=True)
class ShapedLayout:
    """A layout and the declared schemas of the batch's shapes it folded (by id): what workers
    decode with and what the table keeps for re-encoding."""

    layout: TypedLayout
    shapes: Mapping[int, RegisteredSchema]


class _WithShapes:
    """A schema source that answers the shape subjects itself and asks ``source`` the rest."""

    def __init__(self, source: SchemaSource, by_subject: Mapping[str, list[RegisteredSchema]]):
        self.source = source
        self.by_subject = by_subject
        self.by_id = {s.schema_id: s for shapes in by_subject.values() for s in shapes}

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        found = self.by_id.get(schema_id)
        return found if found is not None else self.source.schema_by_id(schema_id)

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        if subject in self.by_subject:
            return list(self.by_subject[subject])
        return self.source.subject_schemas(subject)


def side_columns(layout: TypedLayout, side: SideLayout | None, key: bool) -> dict[str, IcebergType]:
    """A side's typed columns as its value (key) fields: field name -> Iceberg type."""
    if side is None:
        return {}
    prefix = KEY_COLUMN_PREFIX if key else ""
    return {
        column.removeprefix(prefix): layout.schema.find_field(column).field_type
        for column in side.columns
    }


def _numbered(schemas: list[RegisteredSchema]) -> list[RegisteredSchema]:
    return [replace(s, version=i + 1) for i, s in enumerate(schemas)]


def _declare(
    sides: list[tuple[SideCodecs, pa.Array, bool]], layout: TypedLayout, *, window: bool
) -> dict[str, list[RegisteredSchema]]:
    """Each shape side's declared schemas of its values, against ``layout``'s columns."""
    declared = {}
    for side_codecs, batch, key in sides:
        shape_codec = side_codecs.shape_codec
        assert shape_codec is not None
        side = layout.key if key else layout.value
        columns = side_columns(layout, side, key)
        found = shape_codec.shapes(batch, columns, side_codecs.subject, window=window, telling=True)
        declared[side_codecs.subject] = _numbered(found.schemas)
    return declared


def build_layout_of_shapes(
    base: Schema,
    last_column_id: int,
    codecs: TopicCodecs,
    source: SchemaSource,
    values: pa.Array | None,
    keys: pa.Array | None = None,
) -> ShapedLayout:
    """The layout of a batch whose ``values`` (``keys``) are read by a shape codec, folded into
    ``base`` (see the module docstring); a side with framed values folds its subject's versions
    from ``source`` as :func:`~bergstream.core.typed.typed_rows.build_layout` does."""
    sides: list[tuple[SideCodecs, pa.Array, bool]] = []
    for side_codecs, batch, key in ((codecs.value, values, False), (codecs.key, keys, True)):
        if side_codecs is not None and side_codecs.shape_codec is not None and batch is not None:
            sides.append((side_codecs, batch, key))
    declared: dict[str, list[RegisteredSchema]] = {c.subject: [] for c, _, _ in sides}
    current = build_layout(base, last_column_id, codecs, _WithShapes(source, declared))
    declared = _declare(sides, current, window=True)
    made = build_layout(base, last_column_id, codecs, _WithShapes(source, declared))
    # The second declarations fit the columns the first made: folded into those columns they
    # add none, so field ids stay the ones the first fold gave.
    declared = _declare(sides, made, window=False)
    current = build_layout(made.schema, made.last_column_id, codecs, _WithShapes(source, declared))
    shapes = {s.schema_id: s for found in declared.values() for s in found}
    return ShapedLayout(current, shapes)


def build_layout_of_columns(
    base: Schema, last_column_id: int, codecs: TopicCodecs, source: SchemaSource
) -> TypedLayout | None:
    """The layout of a batch read with ``base``'s columns as they are: its shape sides fold no
    shapes (a :class:`~bergstream.core.typed.typed_rows.TypedRows` with ``adopt_shapes`` takes
    every shape that fits those columns, and raises for one that does not), its framed sides
    fold their subjects' versions from ``source``. None when a shape side has no columns in
    ``base`` yet (its first batch must be folded: :func:`build_layout_of_shapes`)."""
    declared: dict[str, list[RegisteredSchema]] = {}
    for side_codecs in (codecs.value, codecs.key):
        if side_codecs is not None and side_codecs.shape_codec is not None:
            declared[side_codecs.subject] = []
    layout = build_layout(base, last_column_id, codecs, _WithShapes(source, declared))
    for side_codecs, side in ((codecs.value, layout.value), (codecs.key, layout.key)):
        if side_codecs is not None and side_codecs.shape_codec is not None and side is None:
            return None
    return layout
