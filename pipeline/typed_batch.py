"""Typed micro-batches on the driver: each batch's layout, the table's schema evolution, and the
``mapInArrow`` step that decodes its rows in Spark's Python workers.

Per batch:

1. the layout: the table's current schema folded with the versions of the topic's subjects,
   read from the registry now (:func:`~bergstream.core.api.build_layout`);
2. when the layout added columns or schemas, one metadata commit sets the table's schema with
   the layout's own field ids and the ``bergstream.schema.<id>`` properties (before any row that
   needs them is written);
3. the rows are decoded in the workers (which read them from Kafka themselves when they can:
   :mod:`~bergstream.pipeline.batch_rows`), which write them as Parquet data files themselves; the
   driver commits those files in one append that carries the boundary
   (:mod:`~bergstream.pipeline.typed_files`). A table whose spec, location or codec the
   workers cannot write (see there) gets the decoded rows back in Spark
   (:mod:`~bergstream.pipeline.typed_worker`), written by the caller's append.

Plain values (a shape codec such as ``json``) have no registry to read: their layout is folded
from the values themselves. A later batch is read in one pass with the columns the table has:
workers decode every shape that fits them and report the new ones, whose declarations the driver
commits in the table's properties before the append. The first batch is read in one pass too,
with the columns folded from a sample (its first rows): workers check that their values would
have made the same columns (every key in the sample, of a kind the sample's columns hold as they
are), and the driver commits the columns only after the files are written. A batch that fails
either check fails the job; the driver then folds the whole batch (one pass picks the values
that make its shapes, the driver folds them: step 1 reads those instead of the registry) and
runs it again.

A worker that meets a schema id the driver did not ship fails the job; the driver reads those ids
and runs the batch again (:mod:`~bergstream.pipeline.typed`). A registry that cannot be reached
stops the batch before anything is written; it is tried again with a growing pause, as long as a
continuous run lasts, for ``registry_wait_seconds`` in a ``--once`` run. A failed attempt leaves
nothing behind (Iceberg commits the append atomically), so no record is lost or written twice.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from bergstream.core.api import (
    SCHEMA_PROPERTY_PREFIX,
    RegisteredSchema,
    RegistryUnavailable,
    SchemaNotFound,
    ShapeCodec,
    TypedLayout,
    TypedRows,
    build_layout,
    build_layout_of_columns,
    build_layout_of_shapes,
    schema_property,
)
from bergstream.pipeline.batch_rows import BatchRows
from bergstream.pipeline.tables import LakeTable, TableSchema, s3_filesystem_options
from bergstream.pipeline.typed import (
    SchemasNeeded,
    ShippedSchemas,
    TopicTyping,
    needed_by,
    shape_sides,
)
from bergstream.pipeline.typed_files import (
    WRITTEN_FILES_SCHEMA,
    FileTarget,
    WrittenFile,
    file_target,
    write_files,
)
from bergstream.pipeline.typed_worker import (
    TELLING_SCHEMA,
    CausesParam,
    DecodeJob,
    ShapesParam,
    decode_batches,
    telling_values,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RegistryUnreachable", "TypedBatches"]

Report = Callable[[str], None]
Append = Callable[["DataFrame"], None]

#: Columns of the row contract the decoder never changes.
_UNCHANGED = frozenset(
    {"kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_timestamp_type", "kafka_headers"}
)
#: Rows of a table's first batch of plain values its columns are first folded from.
SAMPLE_ROWS = 20_000
#: Longest pause between two attempts at an unreachable registry.
_MAX_PAUSE_SECONDS = 30.0


class RegistryUnreachable(RuntimeError):
    """The Schema Registry did not answer for longer than the run waits: nothing of the batch
    was written; running again resumes from the table's boundary."""


class _DriverSchemas:
    """The driver's schema source for one attempt: each subject read once (so the layout and
    the shipped schemas come from the same answer), every schema read kept for the workers."""

    def __init__(self, typing: TopicTyping, shipped: ShippedSchemas) -> None:
        self.registry = typing.registry
        self.shipped = shipped

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        schema = self.registry.schema_by_id(schema_id)
        self.shipped.by_id.setdefault(schema_id, schema)
        return schema

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        if subject not in self.shipped.subjects:
            versions = self.registry.subject_schemas(subject)
            self.shipped.subjects[subject] = versions
            for schema in versions:
                self.shipped.by_id.setdefault(schema.schema_id, schema)
        return list(self.shipped.subjects[subject])


def _referenced(
    layout: TypedLayout, extra: Iterable[RegisteredSchema], shipped: ShippedSchemas
) -> list[RegisteredSchema]:
    """The schemas the stored ones reference, and theirs (as read for this batch): kept in
    the table too, so KSI loads a schema that imports others without the registry."""
    pending = [
        schema
        for side in (layout.value, layout.key)
        if side is not None
        for schema in side.schemas.values()
    ] + list(extra)
    found: dict[int, RegisteredSchema] = {}
    while pending:
        for reference in pending.pop().references:
            versions = shipped.subjects.get(reference.subject, [])
            match = [s for s in versions if s.version == reference.version] or versions[-1:]
            for schema in match:
                if schema.schema_id not in found:
                    found[schema.schema_id] = schema
                    pending.append(schema)
    return list(found.values())


class TypedBatches:
    """Writes the micro-batches of one typed topic (see the module docstring)."""

    def __init__(
        self,
        table: LakeTable,
        typing: TopicTyping,
        report: Report,
        *,
        once: bool,
        stop: threading.Event,
        registry_wait_seconds: float,
    ) -> None:
        self.table = table
        self.typing = typing
        self.report = report
        self.once = once
        self.stop = stop
        self.registry_wait_seconds = registry_wait_seconds
        # Schemas of ids that are no version of the subjects, read when a worker met them;
        # immutable, so kept for the run. Ids the registry did not have are asked again for
        # each batch (the client remembers a miss for subject_refresh_seconds), so a batch
        # holding them is not run twice. Referenced subjects are read again per attempt.
        self._extra: dict[int, RegisteredSchema] = {}
        self._absent: set[int] = set()
        self._extra_subjects: set[str] = set()

    # ------------------------------------------------------------------ one batch

    def write(
        self, rows: BatchRows, append: Append, summary: Mapping[str, str]
    ) -> Counter[tuple[str, str]]:
        """Decode ``rows`` (row-contract columns) and commit them in one append whose snapshot
        summary has ``summary``: written by the workers themselves when the table allows it
        (:mod:`~bergstream.pipeline.typed_files`), else through ``append`` (Spark's writer).
        Returns the undecodable counts by ``(side, cause)``. Raises
        :class:`RegistryUnreachable` when the registry stays away longer than the run
        waits."""
        needs = SchemasNeeded()
        waited, pause = 0.0, 1.0
        while True:
            try:
                return self._attempt(rows, append, summary, needs)
            except RegistryUnavailable as error:
                if self.stop.is_set() or (self.once and waited >= self.registry_wait_seconds):
                    raise RegistryUnreachable(
                        f"the Schema Registry did not answer for {waited:.0f} s ({error}); "
                        f"nothing of this batch of topic '{self.table.topic}' was written; run "
                        "again once it is back: the pipeline resumes from the table's boundary"
                    ) from None
                self.report(
                    f"warning: the Schema Registry cannot be reached ({error}); the batch "
                    f"waits {pause:.0f} s and tries again"
                )
                self._sleep(pause)
                waited += pause
                pause = min(pause * 2, _MAX_PAUSE_SECONDS)
            except Exception as error:
                more = needed_by(error)
                if more is None:
                    raise
                merged = SchemasNeeded(
                    [*needs.ids, *more.ids],
                    [*needs.subjects, *more.subjects],
                    fold_shapes=needs.fold_shapes or more.fold_shapes,
                )
                if (merged.ids, merged.subjects, merged.fold_shapes) == (
                    needs.ids,
                    needs.subjects,
                    needs.fold_shapes,
                ):
                    raise  # asked again for what was shipped: a bug, not a missing schema
                if more.ids or more.subjects:
                    self.report(
                        f"schema ids {more.ids or '-'} (subjects {more.subjects or '-'}) are no "
                        "version of the topic's subjects: read them, running the batch again"
                    )
                else:
                    self.report(
                        "the batch has values the columns it was read with were not folded "
                        "from (new keys, wider kinds): folding its shapes, running it again"
                    )
                needs = merged

    def _sleep(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def _attempt(
        self, rows: BatchRows, append: Append, summary: Mapping[str, str], needs: SchemasNeeded
    ) -> Counter[tuple[str, str]]:
        shipped = ShippedSchemas()
        source = _DriverSchemas(self.typing, shipped)
        base = self.table.current_schema()
        layout = self._layout_of_columns(base, source, needs)
        sampled = None if layout is not None else self._layout_of_sample(rows, base, source, needs)
        if sampled is not None:
            layout = sampled[0]
        adopting = layout is not None
        if layout is None:
            if shape_sides(self.typing.codecs):
                layout = self._layout_of_shapes(rows, base, source)
            else:
                layout = build_layout(base.schema, base.last_column_id, self.typing.codecs, source)
        if not layout.typed:
            append(rows.frame)  # no version of the subject yet: raw rows, as for an untyped topic
            return Counter()
        self._read_needed(needs, source)
        spark = self.table.spark
        causes = spark.sparkContext.accumulator(Counter(), CausesParam())
        if sampled is not None:  # the columns are committed once the whole batch fits them
            target = self._target(layout, base)
            assert target is not None
            self._write_files(
                rows, layout, shipped, causes, target, summary, base, sampled[1], evolve=True
            )
            return Counter(causes.value)
        self._evolve(base, layout, shipped)
        target = self._file_target(layout)
        if target is None:
            append(self._frame(rows, layout, shipped, causes))
        else:
            self._write_files(
                rows, layout, shipped, causes, target, summary, base if adopting else None
            )
        return Counter(causes.value)

    # ------------------------------------------------------------------ driver steps

    def _layout_of_columns(
        self, base: TableSchema, source: _DriverSchemas, needs: SchemasNeeded
    ) -> TypedLayout | None:
        """The layout of a later batch of plain values, read in one pass with the table's
        columns as they are (workers adopt the shapes that fit them); None when the batch must
        be folded first: no plain values, the table's first batch, an earlier attempt met
        shapes that need columns, or the table's files are written by Spark's writer (which
        would commit rows before the driver could commit their shapes)."""
        codecs = self.typing.codecs
        if not shape_sides(codecs) or needs.fold_shapes:
            return None
        layout = build_layout_of_columns(base.schema, base.last_column_id, codecs, source)
        if layout is None or self._target(layout, base) is None:
            return None
        return layout

    def _layout_of_sample(
        self, rows: BatchRows, base: TableSchema, source: _DriverSchemas, needs: SchemasNeeded
    ) -> tuple[TypedLayout, dict[str, Mapping[str, object]]] | None:
        """The layout of a table's first batch of plain values, folded from its first
        :data:`SAMPLE_ROWS` rows, and what those rows' columns are made of (per side, for the
        workers' check; see the module docstring); None when the batch must be folded whole
        (no plain values, an earlier attempt failed the check, files written by Spark)."""
        codecs = self.typing.codecs
        by_column = self._shape_codecs()
        if not by_column or needs.fold_shapes:
            return None
        picked = rows.frame.select(*by_column).limit(SAMPLE_ROWS).collect()

        def values(column: str) -> pa.Array | None:
            if column not in by_column:
                return None
            return pa.array([row[column] for row in picked], pa.large_binary())

        value_sample, key_sample = values("kafka_value"), values("kafka_key")
        shaped = build_layout_of_shapes(
            base.schema, base.last_column_id, codecs, source, value_sample, key_sample
        )
        if self._target(shaped.layout, base) is None:
            return None
        for schema in shaped.shapes.values():
            source.shipped.by_id.setdefault(schema.schema_id, schema)
        within = {
            side: by_column[column].joined_kinds(sample)
            for side, column, sample in (
                ("value", "kafka_value", value_sample),
                ("key", "kafka_key", key_sample),
            )
            if sample is not None
        }
        return shaped.layout, within

    def _shape_codecs(self) -> dict[str, ShapeCodec]:
        """Input column -> the shape codec reading it."""
        codecs = self.typing.codecs
        return {
            column: side.shape_codec
            for column, side in (("kafka_value", codecs.value), ("kafka_key", codecs.key))
            if side is not None and side.shape_codec is not None
        }

    def _target(self, layout: TypedLayout, base: TableSchema) -> FileTarget | None:
        """How workers would write ``layout``'s files into the table (``base``: its current
        schema and properties); None: through Spark's writer."""
        return file_target(
            layout.arrow_schema,
            self.table.partition_spec(),
            self.table.data_location(),
            base.properties,
            {},
        )

    def _layout_of_shapes(
        self, rows: BatchRows, base: TableSchema, source: _DriverSchemas
    ) -> TypedLayout:
        """The layout of a batch of plain values: one pass over the batch picks the values that
        make its shapes (a few per shape), the driver folds them (the values a shape codec
        reads; see :func:`~bergstream.core.api.build_layout_of_shapes`)."""
        codecs = self.typing.codecs
        by_column = self._shape_codecs()
        picked = rows.map_in_arrow(
            functools.partial(telling_values, by_column), TELLING_SCHEMA, tuple(by_column)
        )
        telling: dict[str, list[bytes]] = {column: [] for column in by_column}
        for row in picked.collect():
            telling[row["column"]].append(bytes(row["value"]))

        def values(column: str) -> pa.Array | None:
            if column not in telling:
                return None
            return pa.array(telling[column], pa.large_binary())

        shaped = build_layout_of_shapes(
            base.schema,
            base.last_column_id,
            codecs,
            source,
            values("kafka_value"),
            values("kafka_key"),
        )
        for schema in shaped.shapes.values():
            source.shipped.by_id.setdefault(schema.schema_id, schema)
        return shaped.layout

    def _read_needed(self, needs: SchemasNeeded, source: _DriverSchemas) -> None:
        """Read what workers asked for (and every schema seen for an earlier batch)."""
        absent: set[int] = set()
        for schema_id in sorted({*needs.ids, *self._absent}):
            if schema_id in self._extra or schema_id in source.shipped.by_id:
                continue
            try:
                self._extra[schema_id] = source.schema_by_id(schema_id)
            except SchemaNotFound:
                absent.add(schema_id)
        self._absent = absent
        self._extra_subjects.update(needs.subjects)
        pending = list(self._extra.values())
        for subject in sorted(self._extra_subjects):
            source.subject_schemas(subject)
        while pending:  # subjects the extra schemas reference, and theirs
            schema = pending.pop()
            source.shipped.by_id.setdefault(schema.schema_id, schema)
            for reference in schema.references:
                if reference.subject not in source.shipped.subjects:
                    pending.extend(source.subject_schemas(reference.subject))
        source.shipped.absent = frozenset(absent)

    def _evolve(
        self,
        base: TableSchema,
        layout: TypedLayout,
        shipped: ShippedSchemas,
        more: Mapping[str, str] | None = None,
    ) -> None:
        """Commit the layout's schema and the schema properties the table lacks (``more``
        too)."""
        properties = {**layout.schema_properties(), **(more or {})}
        for schema_id, schema in self._extra.items():
            properties.setdefault(f"{SCHEMA_PROPERTY_PREFIX}{schema_id}", schema_property(schema))
        for schema in _referenced(layout, self._extra.values(), shipped):
            properties.setdefault(
                f"{SCHEMA_PROPERTY_PREFIX}{schema.schema_id}",
                schema_property(schema, with_subject=True),
            )
        added = len(layout.schema.fields) - len(base.schema.fields)
        if self.table.commit_schema(layout.schema, layout.last_column_id, properties) and added:
            names = [f.name for f in layout.schema.fields[len(base.schema.fields) :]]
            self.report(f"table {self.table.name}: {added} new column(s) {', '.join(names)}")

    def _file_target(self, layout: TypedLayout) -> FileTarget | None:
        """How workers write this table's files; None: through Spark's writer."""
        current = self.table.current_schema(refresh=False)
        if current.schema.as_struct() != layout.schema.as_struct():
            raise RuntimeError(
                f"table {self.table.name} has the schema {current.schema}, not the layout's "
                f"{layout.schema}"
            )
        return file_target(
            layout.arrow_schema,
            self.table.partition_spec(),
            self.table.data_location(),
            current.properties,
            s3_filesystem_options(self.table.lake),
        )

    def _write_files(
        self,
        rows: BatchRows,
        layout: TypedLayout,
        shipped: ShippedSchemas,
        causes: object,
        target: FileTarget,
        summary: Mapping[str, str],
        adopting: TableSchema | None,
        within: Mapping[str, Mapping[str, object]] | None = None,
        *,
        evolve: bool = False,
    ) -> None:
        """Workers decode and write data files; the driver commits the declarations of the
        shapes they adopted (``adopting``: the table's schema the attempt began with, whose
        properties hold the shapes stored already; ``within``: see ``TypedRows``), then the
        files, all in one append. ``evolve``: ``layout`` is committed (:meth:`_evolve`) only
        once the files are written, with those declarations."""
        shapes = (
            self.table.spark.sparkContext.accumulator({}, ShapesParam())
            if adopting is not None
            else None
        )
        typed_rows = TypedRows(
            layout, self.typing.codecs, shipped, adopt_shapes=shapes is not None, within=within
        )
        job = DecodeJob(
            rows=typed_rows,
            schemas=shipped,
            names=tuple(layout.arrow_schema.names),
            passthrough=frozenset(),
            framed=self._framed(layout),
            causes=causes,
            shapes=shapes,
        )

        written = rows.map_in_arrow(
            functools.partial(write_files, job, target), WRITTEN_FILES_SCHEMA
        ).collect()
        new: dict[str, str] = {}
        if adopting is not None and shapes is not None:
            for schema_id, schema in sorted(shapes.value.items()):
                name, text = f"{SCHEMA_PROPERTY_PREFIX}{schema_id}", schema_property(schema)
                if adopting.properties.get(name) != text:  # a later batch mostly stores none
                    new[name] = text
        if evolve:
            assert adopting is not None
            self._evolve(adopting, layout, shipped, new)
        elif new:
            self.table.commit_schema(layout.schema, layout.last_column_id, new)
        files = [
            WrittenFile(r["path"], r["kafka_partition"], r["time_bucket"], r["size"])
            for r in written
        ]
        self.table.append_files(files, summary)

    def _framed(self, layout: TypedLayout) -> tuple[str, ...]:
        """The input columns holding framed values to decode."""
        framed = []
        if layout.value is not None:
            framed.append("kafka_value")
        if layout.key is not None:
            framed.append("kafka_key")
        plain = shape_sides(self.typing.codecs)
        return tuple(column for column in framed if column not in plain)

    def _frame(
        self, rows: BatchRows, layout: TypedLayout, shipped: ShippedSchemas, causes: object
    ) -> DataFrame:
        target = self.table.spark.table(self.table.name).schema
        names = tuple(target.fieldNames())
        expected = tuple(layout.arrow_schema.names)
        if names != expected:
            raise RuntimeError(
                f"table {self.table.name} shows Spark the columns {names}, not the layout's "
                f"{expected}"
            )
        passthrough = set(_UNCHANGED)
        if layout.value is None:
            passthrough.add("kafka_value")
        if layout.key is None:
            passthrough.add("kafka_key")
        job = DecodeJob(
            rows=TypedRows(layout, self.typing.codecs, shipped),
            schemas=shipped,
            names=names,
            passthrough=frozenset(passthrough),
            framed=self._framed(layout),
            causes=causes,
        )
        return rows.map_in_arrow(functools.partial(decode_batches, job), target)
