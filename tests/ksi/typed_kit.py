"""Typed coldset tables written with PyIceberg the way the pipeline writes them: the table is
created from the row contract, evolved to the topic's layout (``build_layout`` over the schemas
at hand) with the schemas kept in its ``bergstream.schema.<id>`` properties, and rows decoded by
core's ``TypedRows`` appended with the boundary."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    ROW_ARROW_SCHEMA,
    Record,
    ResolvedLake,
    SchemaSource,
    TopicCodecs,
    TypedLayout,
    TypedRows,
    build_layout,
    format_boundary,
    load_catalog,
)
from bergstream.core.typed.row_contract import record_to_row
from tests.kits.coldset_tables import row_table

#: (partition, timestamp type, record): a record as it sits in Kafka.
KafkaRow = tuple[int, int, Record]


def contract_rows(rows: Iterable[KafkaRow]) -> pa.Table:
    """Row-contract rows of Kafka records."""
    return pa.Table.from_pylist(
        [record_to_row(partition, record, kind) for partition, kind, record in rows],
        schema=ROW_ARROW_SCHEMA,
    )


def write_typed(
    lake: ResolvedLake,
    topic: str,
    rows: pa.Table,
    codecs: TopicCodecs,
    source: SchemaSource,
    boundary: Mapping[int, int],
    *,
    rows_per_file: int | None = None,
) -> TypedLayout:
    """Append contract ``rows`` to ``topic``'s typed table (created from the contract when
    missing, evolved to the layout the subjects of ``source`` give), ``rows_per_file`` rows per
    data file (one append each); returns the layout written with."""
    table = row_table(lake, topic)
    catalog = load_catalog(lake)
    identifier = lake.table_identifier(topic)
    layout = build_layout(table.schema(), table.metadata.last_column_id, codecs, source)
    if layout.schema.as_struct() != table.schema().as_struct():
        with table.update_schema() as update:
            update.union_by_name(layout.schema)
        table = catalog.load_table(identifier)
        if table.schema().as_struct() != layout.schema.as_struct():
            raise AssertionError(
                "PyIceberg's schema update gave other field ids than the layout:\n"
                f"  table:  {table.schema()}\n  layout: {layout.schema}"
            )
    with table.transaction() as transaction:
        transaction.set_properties(layout.schema_properties())
    table = catalog.load_table(identifier)
    typed = TypedRows(layout, codecs, source).decode(rows).table
    step = rows_per_file or max(typed.num_rows, 1)
    for start in range(0, max(typed.num_rows, 1), step):
        table.append(
            typed.slice(start, step),
            snapshot_properties={BOUNDARY_PROPERTY: format_boundary(boundary)},
        )
        table = catalog.load_table(identifier)
    return layout
