"""Change data capture end to end, as a property (hypothesis): random transactions on a
PostgreSQL table (inserts, updates, updates of the primary key, deletes, deletes of rows the
same transaction inserted, truncates, and ``ALTER TABLE ... ADD COLUMN`` between examples),
captured by Debezium three ways at once (Kafka Connect's JsonConverter without and with schemas,
and Avro through the stack's registry with Apicurio's converter); after each, ``current.<topic>``
of each topic through ISK equals ``SELECT * FROM`` the table. Read by PyIceberg and DuckDB after
every example, by Spark and Trino at each stage; after the pipeline copies part of the topics
(state tables in the lake), again; after ``pipeline maintain``, again."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyiceberg.exceptions import NoSuchTableError

from bergstream.devstack.stack.kafka_connect import apicurio_avro_converter_config
from tests.kits.debezium import (
    JSON_CONVERTER,
    Capture,
    connect_client,
    connector_config,
    drop_slot,
    wait_running,
)
from tests.kits.isk_gateway import (
    Gateway,
    attach_isk,
    attach_spark_catalog,
    duckdb_connection,
    shared_spark,
    start_gateway,
    stop_gateway,
)
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once
from tests.kits.trino import create_catalog
from tests.kits.worker_spark import maintain_in_worker

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.slow

BERGSTREAM = str(Path(sys.executable).with_name("bergstream"))
#: Examples per stage: at least 50 in all (two stages).
EXAMPLES = int(os.environ.get("BERGSTREAM_CDC_EXAMPLES", "26"))

TABLE_DDL = """
CREATE TABLE public.{table} (
    region text NOT NULL,
    id integer NOT NULL,
    amount numeric(12, 2),
    at timestamptz,
    note text,
    doc jsonb,
    tags integer[],
    maybe integer,
    PRIMARY KEY (region, id)
);
ALTER TABLE public.{table} REPLICA IDENTITY FULL;
"""
#: The first row, every column set: the snapshot's event fixes the columns plain JSON infers.
SEED = {
    "region": "eu",
    "id": 0,
    "amount": decimal.Decimal("12.50"),
    "at": dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
    "note": "seed",
    "doc": {"a": 1, "b": [True, None]},
    "tags": [1, 2],
    "maybe": 7,
}
VARIANTS = {
    # Kafka Connect's JSON without schemas (decimals as text, a common setting), read by
    # connect-json's plain JSON rules
    "j": {
        "key.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": "false",
        "value.converter": JSON_CONVERTER,
        "value.converter.schemas.enable": "false",
        "decimal.handling.mode": "string",
    },
    # the JSON envelope with schemas: connect-json's Connect types
    "s": {
        "key.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": "true",
        "value.converter": JSON_CONVERTER,
        "value.converter.schemas.enable": "true",
    },
}
REGIONS = ("eu", "us", "ap")


def normalized(value: Any) -> Any:
    """A column's value as the three captures and PostgreSQL can agree on it: numbers exact,
    instants in UTC, JSON documents parsed."""
    if isinstance(value, decimal.Decimal | float) and not isinstance(value, bool):
        return decimal.Decimal(str(value)).quantize(decimal.Decimal("0.01"))
    if isinstance(value, dt.datetime):
        value = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)
    if isinstance(value, list | tuple):
        return tuple(normalized(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


def normalize_row(row: dict[str, Any], columns: list[str]) -> tuple[Any, ...]:
    out = []
    for name in columns:
        value = row.get(name)
        if name == "amount" and isinstance(value, str):
            value = decimal.Decimal(value)
        elif name == "at" and isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        elif name == "doc" and isinstance(value, str):
            value = json.loads(value)
        out.append(normalized(value))
    return tuple(out)


@dataclass
class Source:
    """The captured table and what the test did to it."""

    url: str
    table: str
    columns: list[str] = field(
        default_factory=lambda: ["region", "id", "amount", "at", "note", "doc", "tags", "maybe"]
    )
    added: int = 0

    def rows(self) -> set[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn, conn.cursor() as cursor:
            cursor.execute(f"SELECT * FROM public.{self.table}")
            names = [d.name for d in cursor.description]
            found = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return {normalize_row(r, self.columns) for r in found}

    def keys(self) -> list[tuple[str, int]]:
        with psycopg.connect(self.url) as conn:
            return list(conn.execute(f"SELECT region, id FROM public.{self.table}").fetchall())

    def run(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        with psycopg.connect(self.url) as conn, conn.transaction():
            for sql, args in statements:
                conn.execute(sql.format(table=self.table), args)

    def add_column(self) -> None:
        self.added += 1
        name = f"extra_{self.added}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE public.{self.table} ADD COLUMN {name} text")
        self.columns.append(name)


@dataclass
class Stage:
    source: Source
    gateway: Gateway
    captures: dict[str, Capture]
    config: Path
    #: DuckDB reads that found no snapshot as of their transaction's start (see ``duckdb``).
    unreachable: list[str] = field(default_factory=list)

    def current(self, variant: str) -> set[tuple[Any, ...]]:
        table = self.gateway.catalog().load_table(("current", self.captures[variant].topic))
        rows = table.scan().to_arrow().to_pylist()
        found = {normalize_row(r, self.source.columns) for r in rows}
        assert len(found) == len(rows), f"{variant}: a key has two rows"
        return found

    def duckdb(self, variant: str) -> set[tuple[Any, ...]] | None:
        """The current table's rows as DuckDB reads them; None if DuckDB found no snapshot as
        of its transaction's start."""
        connection = duckdb_connection()
        attach_isk(connection, self.gateway.catalog_url)
        topic = self.captures[variant].topic
        began_ms = int(time.time() * 1000)
        try:
            # Arrow, not Python rows: DuckDB's own conversion of timestamptz needs pytz
            rows = (
                connection.execute(f'SELECT * FROM isk.current."{topic}"')
                .arrow()
                .read_all()
                .to_pylist()
            )
        except duckdb.Error as error:
            if "reachable state" not in str(error):
                raise
            # DuckDB reads the snapshot as of its transaction's start and refuses a table whose
            # every snapshot is newer. Seen once in CI under load, not reproduced alone (160
            # examples): converge reads again until its deadline and reports what it saw.
            self.unreachable.append(f"{error} {self._snapshot_log(topic, began_ms)}")
            return None
        finally:
            connection.close()
        return {normalize_row(r, self.source.columns) for r in rows}

    def _snapshot_log(self, topic: str, began_ms: int) -> str:
        metadata = self.gateway.catalog().load_table(("current", topic)).metadata
        log = [(e.snapshot_id, e.timestamp_ms - began_ms) for e in metadata.snapshot_log]
        return (
            f"(query began at {began_ms}; the table's {len(log)} snapshots, the last ones as "
            f"(id, ms after that): {log[-4:]})"
        )

    def converge(
        self, read: Callable[[str], set[tuple[Any, ...]] | None], timeout: float = 90
    ) -> None:
        """Wait until every capture's current table equals the source table (Debezium's
        latency), then until ``read`` (DuckDB) agrees too."""
        expected = self.source.rows()
        for variant in self.captures:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    found = self.current(variant)
                except NoSuchTableError:  # Debezium has not made the topic yet
                    found = set()
                if found == expected:
                    break
                if time.monotonic() > deadline:
                    missing, extra = expected - found, found - expected
                    raise AssertionError(
                        f"{variant}: current differs from PostgreSQL after {timeout} s: "
                        f"missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}"
                    )
                time.sleep(0.2)
            # The other reader too, until it agrees: a transaction whose changes cancel out
            # (a key inserted and deleted) leaves the expected rows as they were, so PyIceberg may
            # agree before its events arrive and the next reader then see them half applied.
            self.unreachable.clear()
            while read is not self.current and (seen := read(variant)) != expected:
                differs = list((seen or set()) ^ expected)[:5]
                assert time.monotonic() < deadline, (
                    f"{variant}: {differs}; DuckDB reads that found no snapshot as of their "
                    f"transaction's start: {self.unreachable[-3:]}"
                )
                time.sleep(0.2)


def _values() -> st.SearchStrategy[tuple[Any, ...]]:
    """Every column but the key: amount, at, note, doc (JSON text), tags, maybe."""
    amount = st.decimals(-10_000, 10_000, places=2, allow_nan=False, allow_infinity=False)
    moment = st.datetimes(
        dt.datetime(2000, 1, 1), dt.datetime(2030, 1, 1), timezones=st.just(dt.UTC)
    )
    characters = st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00")
    text = st.one_of(st.none(), st.text(characters, max_size=8))
    doc = st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from("abc"), st.integers(-5, 5), max_size=3).map(json.dumps),
    )
    tags = st.one_of(st.none(), st.lists(st.integers(-100, 100), max_size=3))
    maybe = st.one_of(st.none(), st.integers(-9, 9))
    return st.tuples(amount, moment, text, doc, tags, maybe)


INSERT = (
    "INSERT INTO public.{table} (region, id, amount, at, note, doc, tags, maybe) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
DELETE = "DELETE FROM public.{table} WHERE region = %s AND id = %s"
UPDATE = "UPDATE public.{table} SET amount = %s, note = %s WHERE region = %s AND id = %s"
UPDATE_KEY = (
    "UPDATE public.{table} SET id = %s WHERE region = %s AND id = %s AND NOT EXISTS "
    "(SELECT 1 FROM public.{table} WHERE region = %s AND id = %s)"
)
new_key = st.tuples(st.sampled_from(REGIONS), st.integers(1, 10_000))
pick = st.integers(0, 10_000)
#: One transaction as operations on keys: picks choose among the rows the table holds when it
#: runs (so the strategy does not depend on the table: hypothesis replays it as it drew it).
operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), new_key, _values()),
        st.tuples(st.just("update"), pick, _values()),
        st.tuples(st.just("update key"), pick, st.integers(10_001, 20_000)),
        st.tuples(st.just("delete"), pick),
        st.tuples(st.just("insert, delete"), new_key, _values()),
    ),
    min_size=1,
    max_size=5,
)


def statements(ops: list[tuple[Any, ...]], keys: list[tuple[str, int]]) -> list[tuple[str, tuple]]:
    """The SQL of ``ops`` on a table holding ``keys``."""
    out: list[tuple[str, tuple]] = []
    for op in ops:
        kind = op[0]
        if kind in ("insert", "insert, delete"):
            key, values = op[1], op[2]
            out.append((INSERT, (*key, *values)))
            if kind == "insert, delete" and key not in keys:
                out.append((DELETE, key))
        elif keys:
            key = keys[op[1] % len(keys)]
            if kind == "update":
                out.append((UPDATE, (op[2][0], op[2][2], *key)))
            elif kind == "update key":
                out.append((UPDATE_KEY, (op[2], *key, key[0], op[2])))
            else:
                out.append((DELETE, key))
    return out


@pytest.fixture(scope="module")
def stage(
    cdc_stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stage]:
    env = cdc_stack_env
    workdir = tmp_path_factory.mktemp("cdc-current")
    suffix = uuid.uuid4().hex[:8]
    source = Source(env["BERGSTREAM_POSTGRES_URL"], f"items_{suffix}")
    with psycopg.connect(source.url, autocommit=True) as conn:
        conn.execute(TABLE_DDL.format(table=source.table))
        conn.execute(
            f"INSERT INTO public.{source.table} VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                *[SEED[c] for c in ("region", "id", "amount", "at", "note")],
                json.dumps(SEED["doc"]),
                SEED["tags"],
                SEED["maybe"],
            ),
        )
    registry = env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    variants = {
        **VARIANTS,
        "a": {
            **apicurio_avro_converter_config(registry, "key.converter"),
            **apicurio_avro_converter_config(registry, "value.converter"),
        },
    }
    captures = {
        name: Capture(
            f"pg-{name}-{suffix}",
            source.table,
            f"slot_{name}_{suffix}",
            f"pub_{name}_{suffix}",
            f"cdc.{name}{suffix}",
        )
        for name in variants
    }
    rules = f"""
    codecs:
      schema_registry: {{url: "{registry}"}}
      topics:
        - {{match: "cdc.a*", value: registry, key: registry}}
        - {{match: "cdc.*", value: connect-json, key: connect-json}}
    tables:
      topics:
        - {{match: "cdc.*", mode: debezium}}
    """
    extra = lake_yaml(workdir / "home", env["BERGSTREAM_KAFKA_BOOTSTRAP"]) + textwrap.dedent(rules)
    gateway = start_gateway(
        env["BERGSTREAM_KAFKA_BOOTSTRAP"], workdir, chunk_records=50, extra=extra
    )
    try:
        with connect_client(env) as client:
            for name, capture in captures.items():
                config = {**connector_config(env, capture), **variants[name]}
                response = client.post("/connectors", json={"name": capture.name, "config": config})
                assert response.status_code == 201, response.text
                wait_running(client, capture.name)
        yield Stage(source, gateway, captures, workdir / "isk.yaml")
    finally:
        with connect_client(env) as client:
            for capture in captures.values():
                client.delete(f"/connectors/{capture.name}")
        for capture in captures.values():
            drop_slot(env, capture)
        stop_gateway(gateway)


def run_examples(stage: Stage, count: int) -> None:
    """``count`` random transactions, each converging in every capture (PyIceberg, DuckDB);
    a truncate now and then, and a new column between examples."""
    done = [0]

    @settings(
        max_examples=count,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
        phases=[Phase.generate],  # each example changes the table: nothing to replay
        database=None,
    )
    @given(ops=operations)
    def example(ops: list[tuple[Any, ...]]) -> None:
        done[0] += 1
        if done[0] % 11 == 0:
            stage.source.add_column()
        sql = statements(ops, stage.source.keys())
        if done[0] % 17 == 0:
            sql.append(("TRUNCATE public.{table}", ()))
        stage.source.run(sql)
        stage.converge(stage.duckdb)

    example()


def check_spark_and_trino(stage: Stage, trino: Any) -> None:
    expected = stage.source.rows()
    catalog = create_catalog(trino, stage.gateway)
    try:
        with shared_spark() as spark:
            name = attach_spark_catalog(spark, stage.gateway.catalog_url)
            for variant, capture in stage.captures.items():
                rows = spark.sql(f"SELECT * FROM {name}.current.`{capture.topic}`").collect()
                found = {
                    normalize_row(r.asDict(recursive=True), stage.source.columns) for r in rows
                }
                assert found == expected, f"spark, {variant}"
                table = catalog.table("current", capture.topic)
                count = trino.query(f"SELECT count(*) FROM {table}").rows
                assert count == [(len(expected),)], f"trino, {variant}"
                keys = trino.query(f"SELECT region, id, note, maybe FROM {table}").rows
                want = {(r[0], r[1], r[4], r[7]) for r in expected}
                assert {tuple(k) for k in keys} == want, f"trino, {variant}"
    finally:
        trino.query(f"DROP CATALOG {catalog.name}")


def maintain(config: Path, topic: str) -> None:
    """``pipeline maintain`` of ``topic`` (in the test process's Spark session, as the command
    would): its state table has no delete file left."""
    report = maintain_in_worker(config, topic)
    assert report["state"]["deletes_after"]["delete_files"] == 0, report["state"]


@pytest.mark.timeout(3600)
def test_current_equals_the_source_table(stage: Stage, trino: Any) -> None:
    stage.converge(stage.duckdb)  # the snapshot of the seed row
    run_examples(stage, EXAMPLES)
    check_spark_and_trino(stage, trino)
    for capture in stage.captures.values():  # the lake's state tables from here on
        assert run_pipeline_once(stage.config, capture.topic)["records"] > 0
    stage.converge(stage.duckdb)
    run_examples(stage, EXAMPLES)
    check_spark_and_trino(stage, trino)
    for capture in stage.captures.values():
        run_pipeline_once(stage.config, capture.topic)
        maintain(stage.config, capture.topic)
    stage.converge(stage.duckdb)
    check_spark_and_trino(stage, trino)
