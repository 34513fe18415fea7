"""Schema evolution across two and three versions of one topic, read through ISK's ``merged``
table with DuckDB, Spark and PyIceberg; then the gateway's registry goes away and comes back.

One topic, one subject, three Avro versions:

- v1: ``id`` int, ``currency``, ``amount`` float, ``price`` decimal(6,2), ``note`` optional;
- v2: ``id`` promoted to long, a new optional ``country``;
- v3: ``amount`` promoted to double, ``price`` widened to decimal(10,2), ``note`` removed, a
  new optional ``channel``.

The pipeline copies v1 records; v2 records are only in Kafka: ``merged`` reads two versions
(cold v1, hot v2). The pipeline copies the v2 records; v3 records are only in Kafka: ``merged``
reads three versions (cold v1 and v2 in files written by Spark with the older types, hot v3).
Each engine must see every record once, with the newest schema's types and null for the
fields its version did not have. The module fixture ``evolved`` takes the topic through the
three versions (keeping what each engine read at two), so each test runs alone too.

Then the gateway's registry (behind a TCP forwarder; subjects re-read on every load) stops
answering: loading the table is a retriable error (HTTP 503), no file is built from a guess;
records produced meanwhile are all there, typed, once the registry is back, with nothing
restarted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from bergstream.core.api import VALUE_SCHEMA_ID_COLUMN
from bergstream.devstack.stack.ports import free_ports
from bergstream.pipeline.settings import PipelineLake
from tests.kits.isk_gateway import (
    Gateway,
    attach_spark_catalog,
    start_gateway,
)
from tests.kits.lake import Produced, produce
from tests.pipeline.evolution_kit import (
    Row,
    as_row,
    by_first,
    check_merged_everywhere,
    copy_all,
    merged_by_duckdb,
    merged_by_pyiceberg,
    merged_by_spark,
)
from tests.pipeline.property_kit import lake_and_codecs_yaml
from tests.pipeline.typed_kit import FIRST_MS, Forwarder, avro_serializer, coldset

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

pytestmark = pytest.mark.slow

PARTS = 2
PER_VERSION = 12  # records of each version (then 6 more v3 ones during the outage)
COLUMNS = ("id", "currency", "amount", "price", "note", "country", "channel")
COLUMNS_V2 = tuple(c for c in COLUMNS if c != "channel")  # the columns of two versions

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "bergstream.evolution",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "currency", "type": "string"},
        {"name": "amount", "type": "float"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6,
                                   "scale": 2}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}  # fmt: skip
V2: dict[str, Any] = {
    **V1,
    "fields": [
        {"name": "id", "type": "long"},
        *V1["fields"][1:],
        {"name": "country", "type": ["null", "string"], "default": None},
    ],
}
V3: dict[str, Any] = {
    **V1,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "currency", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                   "scale": 2}},
        {"name": "country", "type": ["null", "string"], "default": None},
        {"name": "channel", "type": ["null", "string"], "default": None},
    ],
}  # fmt: skip
SCHEMAS = {1: V1, 2: V2, 3: V3}


def order(i: int, version: int) -> dict[str, Any]:
    """Order ``i`` as version ``version`` writes it (amounts exact in a float)."""
    value: dict[str, Any] = {
        "id": i if version == 1 else 10_000_000_000 + i,
        "currency": ("EUR", "USD", "CHF")[i % 3],
        "amount": i * 0.25 + 0.5,
        "price": Decimal(i * 1234 + (12_345_678 if version == 3 else 17)).scaleb(-2),
    }
    if version < 3:
        value["note"] = None if i % 2 else f"note {i}"
    if version > 1:
        value["country"] = None if i % 4 == 0 else f"C{i % 5}"
    if version == 3:
        value["channel"] = ("web", "pos", None)[i % 3]
    return value


@dataclass
class Stage:
    lake: PipelineLake
    topic: str
    gateway: Gateway
    forwarder: Forwarder
    spark_catalog: str
    produced: list[tuple[int, dict[str, Any]]]  # (version, value) in production order
    schema_ids: dict[int, int]

    def produce(self, version: int, indexes: range, bootstrap: str, registry_url: str) -> None:
        """Produce orders ``indexes`` as ``version`` (registering it), round robin."""
        serialize = avro_serializer(registry_url, self.topic, SCHEMAS[version])
        produced = []
        for i in indexes:
            data = serialize(order(i, version))
            self.schema_ids[version] = int.from_bytes(data[1:5], "big")
            produced.append(Produced(i % PARTS, b"k%d" % i, data, (), FIRST_MS + i))
        produce(bootstrap, self.topic, produced)
        self.produced += [(version, order(i, version)) for i in indexes]

    def expected(self, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
        """Every produced value as a row of ``columns``, by id."""
        return sorted((as_row(value, columns) for _, value in self.produced), key=by_first)


@pytest.fixture(scope="module")
def stage(
    spark: Any,
    lake: PipelineLake,
    stack_env: dict[str, str],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    target = urlsplit(registry_url)
    assert target.hostname is not None and target.port is not None
    (port,) = free_ports(1)
    forwarder = Forwarder(port, (target.hostname, target.port))
    forwarder.start()
    topic = create_topic(PARTS, prefix="typed-evolution")
    workdir = tmp_path_factory.mktemp("typed-evolution")
    # subjects read again on every load, so an outage shows at once
    registry = {
        "url": f"http://127.0.0.1:{port}{target.path}",
        "subject_refresh_seconds": 0,
        "timeout_seconds": 2,
    }
    extra = lake_and_codecs_yaml(lake, registry, topic)
    gateway = start_gateway(kafka_bootstrap, workdir, chunk_records=5, extra=extra)
    name = attach_spark_catalog(spark, gateway.catalog_url)
    try:
        yield Stage(lake, topic, gateway, forwarder, name, [], {})
    finally:
        forwarder.stop()
        code = gateway.process.stop()
        assert code == 0, f"bergstream run exited with {code}:\n{gateway.process.log()}"


@dataclass
class Evolution:
    """What was seen while the topic went through its three versions (fixture ``evolved``)."""

    cold_v1: Schema  # the coldset's schema once v1 was copied
    reads_v2: dict[str, list[Row]]  # merged.<topic> read by each engine: v1 cold, v2 hot
    expected_v2: list[Row]  # what each engine had to read then
    merged_v2: Schema  # merged's schema then
    cold_v2: Schema  # the coldset's schema once v2 was copied too


@pytest.fixture(scope="module")
def evolved(
    spark: Any,
    stage: Stage,
    kafka_bootstrap: str,
    stack_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Evolution:
    """The topic through its three versions: v1 produced and copied to the coldset; v2
    produced and ``merged`` read by every engine (two versions); v2 copied; v3 produced, only
    in Kafka (three versions)."""
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    home = tmp_path_factory.mktemp("typed-evolution-copies")
    stage.produce(1, range(PER_VERSION), kafka_bootstrap, registry_url)
    copy_all(spark, stage.lake, stage.topic, registry_url, home)
    cold_v1 = coldset(stage.lake, stage.topic).schema()
    stage.produce(2, range(PER_VERSION, 2 * PER_VERSION), kafka_bootstrap, registry_url)
    reads_v2 = {
        "pyiceberg": merged_by_pyiceberg(stage.gateway, stage.topic, COLUMNS_V2),
        "spark": merged_by_spark(spark, stage.spark_catalog, stage.topic, COLUMNS_V2),
        "duckdb": merged_by_duckdb(stage.gateway, stage.topic, COLUMNS_V2),
    }
    expected_v2 = stage.expected(COLUMNS_V2)
    merged_v2 = stage.gateway.catalog().load_table(f"merged.{stage.topic}").schema()
    copy_all(spark, stage.lake, stage.topic, registry_url, home)
    cold_v2 = coldset(stage.lake, stage.topic).schema()
    stage.produce(3, range(2 * PER_VERSION, 3 * PER_VERSION), kafka_bootstrap, registry_url)
    return Evolution(cold_v1, reads_v2, expected_v2, merged_v2, cold_v2)


def _check_merged(spark: Any, stage: Stage) -> None:
    """All three engines read every produced value once, as the newest (third) schema's
    columns."""
    assert len({version for version, _ in stage.produced}) == 3
    check_merged_everywhere(
        spark, stage.gateway, stage.spark_catalog, stage.topic, COLUMNS, stage.expected(COLUMNS)
    )


def test_merged_reads_two_then_three_versions_with_every_engine(
    spark: Any, stage: Stage, evolved: Evolution
) -> None:
    cold_v1 = evolved.cold_v1
    assert str(cold_v1.find_field("id").field_type) == "int"

    # two versions: v1 in the coldset, v2 only in Kafka
    for engine, rows in evolved.reads_v2.items():
        assert rows == evolved.expected_v2, engine
    merged = evolved.merged_v2
    assert str(merged.find_field("id").field_type) == "long"
    assert merged.find_field("country").field_id > cold_v1.highest_field_id

    # three versions: v1 and v2 in the coldset (files of the older types), v3 only in Kafka
    cold_v2 = evolved.cold_v2
    assert str(cold_v2.find_field("amount").field_type) == "float"
    _check_merged(spark, stage)
    merged = stage.gateway.catalog().load_table(f"merged.{stage.topic}").schema()
    for field in cold_v2.fields:  # ids stable by name across all three versions
        assert merged.find_field(field.name).field_id == field.field_id
    assert str(merged.find_field("amount").field_type) == "double"
    assert str(merged.find_field("price").field_type) == "decimal(10, 2)"
    assert merged.find_field("channel").field_id > cold_v2.highest_field_id
    assert "note" in merged.column_names  # a removed optional field stays, null from v3 on

    ids = {
        row[VALUE_SCHEMA_ID_COLUMN]
        for row in stage.gateway.catalog()
        .load_table(f"merged.{stage.topic}")
        .scan(selected_fields=(VALUE_SCHEMA_ID_COLUMN,))
        .to_arrow()
        .to_pylist()
    }
    assert ids == set(stage.schema_ids.values()) and len(ids) == 3


def test_the_gateway_survives_a_registry_outage_and_recovers_by_itself(
    spark: Any, stage: Stage, evolved: Evolution, kafka_bootstrap: str, stack_env: dict[str, str]
) -> None:
    from pyiceberg.exceptions import ServiceUnavailableError

    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    start = 3 * PER_VERSION
    stage.forwarder.stop()
    try:
        # records acked while the gateway's registry is away (the producer's is not)
        stage.produce(3, range(start, start + 6), kafka_bootstrap, registry_url)
        for namespace in ("hotset", "merged"):
            with pytest.raises(ServiceUnavailableError, match="Schema Registry"):
                stage.gateway.catalog().load_table(f"{namespace}.{stage.topic}")
    finally:
        stage.forwarder.start()
    deadline = time.monotonic() + 60
    while True:  # nothing restarted: the next load after the registry is back just works
        try:
            _check_merged(spark, stage)
            break
        except ServiceUnavailableError:
            assert time.monotonic() < deadline, "the gateway did not recover within 60 s"
            time.sleep(1)
