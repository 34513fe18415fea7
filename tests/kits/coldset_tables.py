"""Helpers of the KSI tests (and of ISK's coldset and KSI's metrics tests): coldset tables written
with PyIceberg (no Spark), in the row contract. The filter runs on the public test kit's
``FakeFilterContext``."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table

from bergstream.core.config import BergstreamConfig
from bergstream.core.lake import (
    LakeCatalogConfig,
    LakeConfig,
    ResolvedLake,
    load_catalog,
    resolve_lake,
)
from bergstream.core.records import Record
from bergstream.core.typed.row_contract import (
    BOUNDARY_PROPERTY,
    PARTITION_SPEC,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    SORT_ORDER,
    format_boundary,
    record_to_row,
)

ColdRow = tuple[int, int, Record]  # partition, timestamp type, record

#: The contract's spec without ``day(kafka_timestamp)`` (PyIceberg writes that transform only
#: with pyiceberg-core installed); KSI prunes on kafka_partition and offset bounds either way.
TEST_SPEC = PartitionSpec(PARTITION_SPEC.fields[0], spec_id=0)


def make_lake(home: Path) -> ResolvedLake:
    """A lake with an embedded SQL catalog and a local warehouse under ``home``."""
    catalog = LakeCatalogConfig(
        uri=f"sqlite:///{home / 'lake' / 'catalog.db'}", warehouse=str(home / "lake" / "warehouse")
    )
    config = LakeConfig(kafka_bootstrap="127.0.0.1:9", catalog=catalog)
    return resolve_lake(config, home=home)


def make_record(offset: int, *, timestamp: int | None = None, size: int = 40) -> Record:
    """A deterministic record with a key, a value and two headers (one null)."""
    rng = random.Random(offset)
    return Record(
        offset=offset,
        timestamp=1_700_000_000_000 + offset * 10 if timestamp is None else timestamp,
        key=None if offset % 7 == 0 else f"k{offset}".encode(),
        value=bytes(rng.getrandbits(8) for _ in range(size)),
        headers=(("h", f"v{offset}".encode()), ("n", None)) if offset % 3 else (),
    )


def row_table(lake: ResolvedLake, topic: str, **create: Any) -> Table:
    """``topic``'s table in the lake's namespace; created when missing with the row contract's
    schema and ``create`` (``create_table``'s arguments; default: :data:`TEST_SPEC` and the
    row contract's sort order)."""
    catalog = load_catalog(lake)
    catalog.create_namespace_if_not_exists(lake.namespace)
    identifier = lake.table_identifier(topic)
    if catalog.table_exists(identifier):
        return catalog.load_table(identifier)
    settings = {"partition_spec": TEST_SPEC, "sort_order": SORT_ORDER, **create}
    return catalog.create_table(identifier, ROW_SCHEMA, **settings)


def write_cold(
    lake: ResolvedLake,
    topic: str,
    rows: Iterable[ColdRow],
    boundary: dict[int, int],
    *,
    rows_per_file: int = 100,
) -> None:
    """Append ``rows`` to ``topic``'s table (created when missing), ``rows_per_file`` per
    data file and partition, each append's snapshot carrying ``boundary``."""
    table = row_table(lake, topic)
    by_partition: dict[int, list[dict[str, Any]]] = {}
    for partition, timestamp_type, record in rows:
        by_partition.setdefault(partition, []).append(
            record_to_row(partition, record, timestamp_type)
        )
    chunks = [
        items[i : i + rows_per_file]
        for items in by_partition.values()
        for i in range(0, len(items), rows_per_file)
    ]
    for chunk in chunks or [[]]:
        table.append(
            pa.Table.from_pylist(chunk, schema=ROW_ARROW_SCHEMA),
            snapshot_properties={BOUNDARY_PROPERTY: format_boundary(boundary)},
        )
        table = table.refresh()


def ksi_config_model(lake: ResolvedLake) -> BergstreamConfig:
    """A config holding only the lake (what the filter factory reads)."""
    return BergstreamConfig(lake=lake.config)
