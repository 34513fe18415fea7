"""Typed tables through ``bergstream run``'s ``isk`` service, read by PyIceberg and DuckDB
unmodified: an Avro topic's ``hotset``, ``coldset`` and ``merged`` tables have the value's fields
as columns (``amount`` is the column ``amount`` in all three), ``merged`` is one schema over a
typed coldset and the hotset above its boundary, a raw topic is served as before, and a gateway
whose registry is unreachable answers a typed table with a retriable error."""

from __future__ import annotations

import io
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFile

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    PARTITION_SPEC,
    ROW_SCHEMA,
    SORT_ORDER,
    TopicCodecsResolver,
    TypedRows,
    build_layout,
    format_boundary,
    load_catalog,
    load_config,
    load_registry,
    resolve_lake,
)
from bergstream.core.typed.topic_codecs import shared_registry_client
from bergstream.plugins.isk_gateway.files.batch_decoder import decode_batches
from bergstream.plugins.isk_gateway.files.synthesis import parquet_bytes
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from tests.kits.avro_registry import (
    PAYMENT_V1,
    closed_registry_url,
    codecs_settings,
    codecs_yaml,
    payment,
    produce_avro,
    typed_context,
)
from tests.kits.isk_gateway import Gateway, attach_isk, duckdb_connection, produce, start_gateway
from tests.kits.ksi_stack import lake_yaml

pytestmark = pytest.mark.slow

PARTITIONS = 2
COLD = 10  # records per partition in the hand-made typed coldset
TOTAL = 25  # records per partition in Kafka
FIELDS = ["id", "currency", "amount", "at", "note", "tags"]


@dataclass
class Stage:
    gateway: Gateway
    topic: str
    raw_topic: str
    values: dict[int, list[dict[str, Any]]]  # by partition, in offset order
    workdir: Path
    kafka_bootstrap: str


def make_coldset(config: Path, home: Path, topic: str, bootstrap: str) -> None:
    """A typed coldset table of ``topic`` holding offsets ``[0, COLD)`` of each partition, as
    the pipeline writes one: the layout's schema and properties, rows decoded by TypedRows,
    the boundary in the snapshot summary."""
    import asyncio

    loaded = load_config(config, registry=load_registry())
    assert loaded.lake is not None
    lake = resolve_lake(loaded.lake, home)
    catalog = load_catalog(lake)
    context = typed_context(home, loaded.codecs.model_dump(mode="json"))
    codecs = TopicCodecsResolver(context).for_topic(topic)
    assert codecs is not None and loaded.codecs.schema_registry is not None
    client = shared_registry_client(loaded.codecs.schema_registry)
    # created as the row contract, then evolved column by column (as Iceberg's UpdateSchema
    # numbers them), then the layout read from the table itself, as the pipeline does
    wanted = build_layout(ROW_SCHEMA, ROW_SCHEMA.highest_field_id, codecs, client)
    catalog.create_namespace_if_not_exists(lake.namespace)
    table = catalog.create_table(
        lake.table_identifier(topic),
        schema=ROW_SCHEMA,
        partition_spec=PARTITION_SPEC,
        sort_order=SORT_ORDER,
        properties=wanted.schema_properties(),
    )
    with table.update_schema() as update:
        for column in wanted.schema.fields[len(ROW_SCHEMA.fields) :]:
            update.add_column(column.name, column.field_type, doc=column.doc)
    layout = build_layout(table.schema(), table.metadata.last_column_id, codecs, client)
    assert layout.schema.as_struct() == table.schema().as_struct()

    async def fetch() -> pa.Table:
        async with KafkaReader(bootstrap) as reader:
            parts = []
            for partition in range(PARTITIONS):
                fetched = await reader.fetch(topic, partition, 0, COLD)
                parts.append(decode_batches(fetched.records, partition, 0, COLD))
            return pa.concat_tables(parts)

    rows = TypedRows(layout, codecs, client).decode(asyncio.run(fetch())).table
    boundary = dict.fromkeys(range(PARTITIONS), COLD)
    # one data file per Kafka partition (all rows of one day), with field ids and stats
    # (PyIceberg's own append needs pyiceberg-core for the day transform)
    with table.transaction() as transaction:
        update = transaction.update_snapshot({BOUNDARY_PROPERTY: format_boundary(boundary)})
        with update.fast_append() as append:
            for partition in range(PARTITIONS):
                part = rows.filter(pc.equal(rows.column("kafka_partition"), partition))
                append.append_data_file(write_data_file(table, part, partition))


def write_data_file(table: Any, rows: pa.Table, partition: int) -> DataFile:
    """``rows`` of one Kafka partition and day as a data file of ``table``, with its stats."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.typedef import Record as IcebergRecord

    schema = table.schema()
    data = bytes(parquet_bytes(rows, all_statistics=True))
    path = f"{table.location()}/data/p{partition}.parquet"
    with table.io.new_output(path).create() as out:
        out.write(data)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=pq.ParquetFile(io.BytesIO(data)).metadata,
        stats_columns=compute_statistics_plan(schema, table.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    micros = rows.column("kafka_timestamp").cast(pa.int64())[0].as_py()
    file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=IcebergRecord(partition, micros // 86_400_000_000),
        file_size_in_bytes=len(data),
        sort_order_id=SORT_ORDER.order_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    file.spec_id = PARTITION_SPEC.spec_id
    return file


@pytest.fixture(scope="module")
def stage(
    kafka_bootstrap: str,
    stack_env: dict[str, str],
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    workdir = tmp_path_factory.mktemp("isk-typed")
    topic = new_topic(partitions=PARTITIONS, prefix="payments")
    raw_topic = new_topic(partitions=1, prefix="raw")
    pairs = [(i % PARTITIONS, payment(i)) for i in range(PARTITIONS * TOTAL)]
    produce_avro(kafka_bootstrap, registry_url, topic, PAYMENT_V1, pairs)
    produce(kafka_bootstrap, raw_topic, [{"partition": 0, "value": b"r%d" % i} for i in range(5)])
    values: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for partition, value in pairs:
        values[partition].append(value)
    extra = lake_yaml(workdir / "home", kafka_bootstrap) + codecs_yaml(
        codecs_settings(registry_url, "payments-*")
    )
    gateway = start_gateway(kafka_bootstrap, workdir, chunk_records=6, extra=extra)
    try:
        make_coldset(workdir / "isk.yaml", workdir / "home", topic, kafka_bootstrap)
        yield Stage(gateway, topic, raw_topic, dict(values), workdir, kafka_bootstrap)
    finally:
        code = gateway.process.stop()
        print(gateway.process.log()[-20000:], file=sys.stderr)
        assert code == 0, f"bergstream run exited with {code}:\n{gateway.process.log()}"


def scan(stage: Stage, namespace: str) -> list[dict[str, Any]]:
    table = stage.gateway.catalog().load_table(f"{namespace}.{stage.topic}")
    rows = table.scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


def expected(stage: Stage, start: int, end: int) -> list[dict[str, Any]]:
    return [v for p in sorted(stage.values) for v in stage.values[p][start:end]]


@pytest.mark.parametrize(
    ("namespace", "start", "end"),
    [("hotset", 0, TOTAL), ("coldset", 0, COLD), ("merged", 0, TOTAL)],
)
def test_pyiceberg_reads_typed_columns(stage: Stage, namespace: str, start: int, end: int) -> None:
    rows = scan(stage, namespace)
    assert [{f: r[f] for f in FIELDS} for r in rows] == expected(stage, start, end)
    assert all(r["kafka_value"] is None and r["kafka_value_error"] is None for r in rows)
    table = stage.gateway.catalog().load_table(f"{namespace}.{stage.topic}")
    assert str(table.schema().find_field("amount").field_type) == "double"
    assert any(k.startswith("bergstream.schema.") for k in table.properties)


def test_merged_is_one_schema_the_coldset_s(stage: Stage) -> None:
    catalog = stage.gateway.catalog()
    cold = catalog.load_table(f"coldset.{stage.topic}").schema()
    hot = catalog.load_table(f"hotset.{stage.topic}").schema()
    merged = catalog.load_table(f"merged.{stage.topic}").schema()
    assert merged.as_struct() == cold.as_struct() == hot.as_struct()


def test_duckdb_sums_amount_per_currency(stage: Stage) -> None:
    sums: dict[str, float] = defaultdict(float)
    for value in expected(stage, 0, TOTAL):
        sums[value["currency"]] += value["amount"]
    connection = duckdb_connection()
    try:
        attach_isk(connection, stage.gateway.catalog_url)
        for namespace in ("hotset", "merged"):
            found = connection.execute(
                f'SELECT currency, sum(amount) FROM isk.{namespace}."{stage.topic}" '
                "GROUP BY currency ORDER BY currency"
            ).fetchall()
            assert [(c, round(s, 6)) for c, s in found] == [
                (c, round(sums[c], 6)) for c in sorted(sums)
            ]
    finally:
        connection.close()


def test_a_raw_topic_keeps_the_row_contract(stage: Stage) -> None:
    table = stage.gateway.catalog().load_table(f"hotset.{stage.raw_topic}")
    assert table.schema().column_names[-1] == "kafka_value"
    assert len(table.schema().fields) == 7
    assert sorted(table.scan().to_arrow().column("kafka_value").to_pylist()) == sorted(
        b"r%d" % i for i in range(5)
    )


def test_an_unreachable_registry_is_a_retriable_catalog_error(stage: Stage, tmp_path: Path) -> None:
    from pyiceberg.exceptions import ServiceUnavailableError

    extra = codecs_yaml(codecs_settings(closed_registry_url(), "payments-*", timeout_seconds=2))
    down = start_gateway(stage.kafka_bootstrap, tmp_path, chunk_records=6, extra=extra)
    try:
        with pytest.raises(ServiceUnavailableError, match="Schema Registry"):
            down.catalog().load_table(f"hotset.{stage.topic}")
        raw = down.catalog().load_table(f"hotset.{stage.raw_topic}")  # no rule: no registry
        assert raw.scan().to_arrow().num_rows == 5
    finally:
        code = down.process.stop()
        assert code == 0, down.process.log()
