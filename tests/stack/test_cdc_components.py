"""The stack's change-data-capture components against the real servers: PostgreSQL
(``wal_level=logical``) and a Kafka Connect worker with Debezium's Postgres connector, on the
session's ``cdc_stack_env`` (Kafka, S3, the Schema Registry, PostgreSQL, Connect).

Each capture test registers one connector (its own table, slot, publication and topic prefix)
through the Connect REST API, makes inserts, an update, a delete and a truncate, reads the change
events from ``<prefix>.public.<table>``, and deletes the connector and drops its slot at the end.
The last test stops the stack, checks that no process of it is left, and starts it again.
"""

from __future__ import annotations

import base64
import decimal
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bergstream.devstack.stack import KAFKA_VERSION, stack_down, stack_env, stack_status, stack_up
from bergstream.devstack.stack.kafka_connect import (
    APICURIO_AVRO_CONVERTER,
    POSTGRES_CONNECTOR,
    apicurio_avro_converter_config,
)
from bergstream.devstack.stack.ports import port_is_open
from tests.kits.debezium import (
    JSON_CONVERTER,
    Capture,
    connect_client,
    connector_config,
    drop_slot,
    wait_running,
)
from tests.support import CDC_COMPONENTS

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.slow

BERGSTREAM = str(Path(sys.executable).with_name("bergstream"))

#: The captured table: a composite key and one column of each kind Debezium maps differently.
TABLE_DDL = """
CREATE TABLE public.{table} (
    region text NOT NULL,
    id integer NOT NULL,
    amount numeric(12, 2) NOT NULL,
    at timestamptz NOT NULL,
    note text,
    doc jsonb,
    tags integer[],
    maybe integer,
    PRIMARY KEY (region, id)
);
ALTER TABLE public.{table} REPLICA IDENTITY FULL;
"""

#: The row there before the connector starts (its snapshot reads it: op ``r``).
SEED = ("eu", 1, decimal.Decimal("12.50"), "2024-01-02T03:04:05Z", "first", '{"a": 1}', [1, 2])
SEED_AFTER = {
    "region": "eu",
    "id": 1,
    "amount": decimal.Decimal("12.50"),
    "at": "2024-01-02T03:04:05.000000Z",
    "note": "first",
    "doc": {"a": 1},
    "tags": [1, 2],
    "maybe": None,
}
INSERTED_AFTER = {
    "region": "us",
    "id": 2,
    "amount": decimal.Decimal("99.99"),
    "at": "2025-06-30T23:59:59.123456Z",
    "note": None,
    "doc": {"b": [1, 2], "c": None},
    "tags": [],
    "maybe": 7,
}
UPDATED_AFTER = {**SEED_AFTER, "amount": decimal.Decimal("13.75"), "maybe": 1}
#: Change events (tombstones left out) of the seed, then insert, update, delete, truncate.
OPS = ["r", "c", "u", "d", "t"]


# ---------------------------------------------------------------------------------------------
# Connectors


@pytest.fixture
def capture(cdc_stack_env: dict[str, str]) -> Iterator[Callable[[dict[str, str]], Capture]]:
    """Register a Debezium connector (with the converter settings given) on a new table that
    holds the seed row; deleted at the end of the test, with its slot."""
    env = cdc_stack_env
    made: list[Capture] = []

    def register(converters: dict[str, str]) -> Capture:
        suffix = uuid.uuid4().hex[:10]
        cap = Capture(
            name=f"pg-{suffix}",
            table=f"orders_{suffix}",
            slot=f"slot_{suffix}",
            publication=f"pub_{suffix}",
            prefix=f"cdc{suffix}",
        )
        with psycopg.connect(env["BERGSTREAM_POSTGRES_URL"], autocommit=True) as conn:
            conn.execute(TABLE_DDL.format(table=cap.table))
            conn.execute(
                f"INSERT INTO public.{cap.table} VALUES (%s, %s, %s, %s, %s, %s, %s, NULL)",
                SEED,
            )
        made.append(cap)
        with connect_client(env) as client:
            config = {**connector_config(env, cap), **converters}
            response = client.post("/connectors", json={"name": cap.name, "config": config})
            assert response.status_code == 201, response.text
            wait_running(client, cap.name)
        return cap

    yield register
    with connect_client(env) as client:
        for cap in made:
            client.delete(f"/connectors/{cap.name}")
    for cap in made:
        drop_slot(env, cap)


def _make_changes(env: dict[str, str], table: str) -> None:
    """Insert, update, delete, truncate: one transaction each."""
    with psycopg.connect(env["BERGSTREAM_POSTGRES_URL"], autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO public.{table} VALUES (%s, %s, %s, %s, NULL, %s, %s, %s)",
            ("us", 2, decimal.Decimal("99.99"), "2025-06-30T23:59:59.123456Z",
             '{"b": [1, 2], "c": null}', [], 7),
        )  # fmt: skip
        conn.execute(
            f"UPDATE public.{table} SET amount = 13.75, maybe = 1 WHERE region = 'eu' AND id = 1"
        )
        conn.execute(f"DELETE FROM public.{table} WHERE region = 'us' AND id = 2")
        conn.execute(f"TRUNCATE public.{table}")


def _records(
    env: dict[str, str], topic: str, count: int, after_first: Callable[[], None] | None = None
) -> list[tuple[bytes | None, bytes | None]]:
    """The first ``count`` records (key, value) of ``topic``, which the connector creates;
    ``after_first`` runs once the first record is read (the snapshot is done then)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": env["BERGSTREAM_KAFKA_BOOTSTRAP"],
            "group.id": f"cdc-test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            topics = consumer.list_topics(topic, timeout=5).topics
            if topic in topics and topics[topic].error is None and topics[topic].partitions:
                break
            assert time.monotonic() < deadline, f"the connector did not create {topic}"
            time.sleep(0.2)
        partitions = sorted(topics[topic].partitions)
        assert partitions == [0]  # one partition: the events keep their order
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        records: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 60
        while len(records) < count:
            assert time.monotonic() < deadline, f"{len(records)} of {count} records: {records}"
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            records.append((message.key(), message.value()))
            if len(records) == 1 and after_first is not None:
                after_first()
        return records
    finally:
        consumer.close()


def _capture_all(env: dict[str, str], cap: Capture) -> list[tuple[bytes | None, bytes | None]]:
    """The records of the seed and of :func:`_make_changes`: five events and the delete's
    tombstone."""
    return _records(env, cap.topic, 6, lambda: _make_changes(env, cap.table))


def _decimal(encoded: str, scale: int) -> decimal.Decimal:
    """A Connect ``Decimal`` as JSON: base64 of the big-endian two's-complement unscaled value."""
    unscaled = int.from_bytes(base64.b64decode(encoded), "big", signed=True)
    return decimal.Decimal(unscaled).scaleb(-scale)


def _row(raw: dict[str, Any] | None, decode_amount: Callable[[Any], decimal.Decimal]) -> Any:
    """A row of a change event as comparable values (numeric decoded, JSON parsed)."""
    if raw is None:
        return None
    return {**raw, "amount": decode_amount(raw["amount"]), "doc": json.loads(raw["doc"])}


def _check_events(
    keys: list[Any], values: list[Any], decode_amount: Callable[[Any], decimal.Decimal]
) -> None:
    """The decoded keys and envelopes of the six records: the five events and a tombstone."""
    tombstones = [i for i, value in enumerate(values) if value is None]
    assert tombstones == [4] and keys[4] == {"region": "us", "id": 2}  # after the delete
    events = [value for value in values if value is not None]
    assert [event["op"] for event in events] == OPS
    snapshot, created, updated, deleted, truncated = events
    assert keys[:4] == [{"region": "eu", "id": 1}, {"region": "us", "id": 2}] * 2
    assert keys[5] is None  # a truncate is of no row
    assert (snapshot["before"], _row(snapshot["after"], decode_amount)) == (None, SEED_AFTER)
    assert created["before"] is None
    assert _row(created["after"], decode_amount) == INSERTED_AFTER
    # REPLICA IDENTITY FULL: updates and deletes carry the whole old row.
    assert _row(updated["before"], decode_amount) == SEED_AFTER
    assert _row(updated["after"], decode_amount) == UPDATED_AFTER
    assert _row(deleted["before"], decode_amount) == INSERTED_AFTER
    assert deleted["after"] is None
    assert truncated["before"] is None and truncated["after"] is None
    for event in events:
        assert event["source"]["connector"] == "postgresql"
        assert event["source"]["version"] == "3.6.1.Final"
        assert event["source"]["db"] == "bergstream"
    assert snapshot["source"]["snapshot"] in ("true", "last")
    assert [e["source"]["snapshot"] for e in events[1:]] == ["false"] * 4


# ---------------------------------------------------------------------------------------------
# Capture tests


def test_json_without_schemas(
    capture: Callable[..., Capture], cdc_stack_env: dict[str, str]
) -> None:
    cap = capture(
        {
            "key.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": "false",
            "value.converter": JSON_CONVERTER,
            "value.converter.schemas.enable": "false",
        }
    )
    records = _capture_all(cdc_stack_env, cap)
    keys = [json.loads(k) if k is not None else None for k, _ in records]
    values = [json.loads(v) if v is not None else None for _, v in records]
    _check_events(keys, values, lambda raw: _decimal(raw, 2))


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["field"] == name)


def test_json_with_schemas(capture: Callable[..., Capture], cdc_stack_env: dict[str, str]) -> None:
    cap = capture(
        {
            "key.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": "true",
            "value.converter": JSON_CONVERTER,
            "value.converter.schemas.enable": "true",
        }
    )
    records = _capture_all(cdc_stack_env, cap)
    envelopes = [json.loads(v) if v is not None else None for _, v in records]
    keyed = [json.loads(k) if k is not None else None for k, _ in records]
    # Every message is {"schema", "payload"}, the key's too.
    key_schema = keyed[0]["schema"]
    assert [(f["field"], f["type"], f["optional"]) for f in key_schema["fields"]] == [
        ("region", "string", False),
        ("id", "int32", False),
    ]
    value_schema = envelopes[0]["schema"]
    assert value_schema["name"] == f"{cap.prefix}.public.{cap.table}.Envelope"
    after = _field(value_schema, "after")
    assert after["optional"] is True
    amount = _field(after, "amount")
    assert amount["name"] == "org.apache.kafka.connect.data.Decimal"
    assert amount["parameters"]["scale"] == "2"
    assert amount["optional"] is False
    assert _field(after, "at")["name"] == "io.debezium.time.ZonedTimestamp"
    assert _field(after, "doc")["name"] == "io.debezium.data.Json"
    assert _field(after, "tags")["type"] == "array"
    assert _field(after, "tags")["items"]["type"] == "int32"
    assert (_field(after, "maybe")["type"], _field(after, "maybe")["optional"]) == ("int32", True)
    scale = int(amount["parameters"]["scale"])
    _check_events(
        [k["payload"] if k is not None else None for k in keyed],
        [e["payload"] if e is not None else None for e in envelopes],
        lambda raw: _decimal(raw, scale),
    )


def test_avro_through_the_stack_registry(
    capture: Callable[..., Capture], cdc_stack_env: dict[str, str]
) -> None:
    """Apicurio's Avro converter registers the schemas in the stack's registry and writes
    Confluent's framing; Confluent's deserializer reads them back through the compatible API."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry_url = cdc_stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    cap = capture(
        {
            **apicurio_avro_converter_config(registry_url, "key.converter"),
            **apicurio_avro_converter_config(registry_url, "value.converter"),
        }
    )
    records = _capture_all(cdc_stack_env, cap)
    registry = SchemaRegistryClient({"url": registry_url})
    assert {f"{cap.topic}-key", f"{cap.topic}-value"} <= set(registry.get_subjects())
    deserialize = AvroDeserializer(registry)

    def decode(data: bytes | None, field: str) -> Any:
        if data is None:
            return None
        assert data[0] == 0  # Confluent's magic byte, then the 4-byte schema id
        return deserialize(data, SerializationContext(cap.topic, field))

    keys = [decode(k, MessageField.KEY) for k, _ in records]
    values = [decode(v, MessageField.VALUE) for _, v in records]
    _check_events(keys, values, lambda raw: raw)  # Avro decimals arrive as Decimal


# ---------------------------------------------------------------------------------------------
# Environment, status, stop


def test_env_exports_postgres_and_connect(cdc_stack_env: dict[str, str]) -> None:
    home = Path(cdc_stack_env["BERGSTREAM_HOME"])
    exported = stack_env(home).as_dict()
    assert exported == cdc_stack_env
    postgres_url = exported["BERGSTREAM_POSTGRES_URL"]
    connect_url = exported["BERGSTREAM_CONNECT_URL"]
    pattern = r"postgresql://bergstream:[0-9a-f]{32}@127\.0\.0\.1:\d+/bergstream"
    assert re.fullmatch(pattern, postgres_url)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", connect_url)
    done = subprocess.run(
        [BERGSTREAM, "stack", "env"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BERGSTREAM_HOME": str(home)},
        check=True,
    )
    assert f"export BERGSTREAM_POSTGRES_URL={postgres_url}" in done.stdout.splitlines()
    assert f"export BERGSTREAM_CONNECT_URL={connect_url}" in done.stdout.splitlines()

    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute(
            "SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (True, True)
        assert int(conn.execute("SHOW max_replication_slots").fetchone()[0]) >= 10
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres_url.replace(urlsplit(postgres_url).password or "", "wrong"))

    with connect_client(cdc_stack_env) as client:
        assert client.get("/").json()["version"] == KAFKA_VERSION
        plugins = client.get("/connector-plugins", params={"connectorsOnly": "false"}).json()
        classes = {plugin["class"] for plugin in plugins}
        assert {POSTGRES_CONNECTOR, APICURIO_AVRO_CONVERTER, JSON_CONVERTER} <= classes


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* has them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


def test_status_and_loopback_only(cdc_stack_env: dict[str, str]) -> None:
    status = stack_status(Path(cdc_stack_env["BERGSTREAM_HOME"]))
    postgres, connect = status["postgres"], status["connect"]
    assert postgres["running"] and connect["running"]
    assert re.fullmatch(r"1[5-9](\.\d+)+", postgres["version"])
    assert connect["version"] == KAFKA_VERSION
    # The status shows no password; the env has it.
    password = urlsplit(cdc_stack_env["BERGSTREAM_POSTGRES_URL"]).password
    assert password and password not in json.dumps(status)
    assert postgres["address"] == cdc_stack_env["BERGSTREAM_POSTGRES_URL"].replace(
        f":{password}@", "@"
    )
    assert connect["address"] == cdc_stack_env["BERGSTREAM_CONNECT_URL"]
    for entry in (postgres, connect):
        for port in entry["ports"].values():
            # 127.0.0.1 and nothing else (Java binds it as ::ffff:127.0.0.1).
            assert _listening(port) in ({"0100007F"}, {"0000000000000000FFFF00000100007F"})


def _processes_of(home: Path) -> list[str]:
    """Processes whose command line names ``home`` or that work below it."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if str(home) in cmdline or Path(cwd).is_relative_to(home):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def test_down_stops_every_process_then_up_restores_the_stack(
    cdc_stack_env: dict[str, str],
) -> None:
    """Runs last: stops the stack, then starts it again for the session's other users (same
    ports, same password, the database's data kept)."""
    home = Path(cdc_stack_env["BERGSTREAM_HOME"])
    with psycopg.connect(cdc_stack_env["BERGSTREAM_POSTGRES_URL"], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS kept (n integer)")
        conn.execute("INSERT INTO kept VALUES (42)")
    before = stack_status(home)
    ports = [port for entry in before.values() for port in entry["ports"].values()]
    assert _processes_of(home)

    t0 = time.monotonic()
    stopped = stack_down(home)
    print(f"\ncdc stack down: {time.monotonic() - t0:.1f} s")
    assert set(stopped) == set(CDC_COMPONENTS)
    assert stopped.index("connect") < stopped.index("kafka")  # Connect first
    assert _processes_of(home) == []
    assert [port for port in ports if port_is_open(port)] == []

    t0 = time.monotonic()
    env = stack_up(home, set(CDC_COMPONENTS)).as_dict()
    print(f"cdc stack up again: {time.monotonic() - t0:.1f} s")
    assert env == cdc_stack_env
    with psycopg.connect(env["BERGSTREAM_POSTGRES_URL"]) as conn:
        assert conn.execute("SELECT n FROM kept").fetchall() == [(42,)]
        conn.execute("DROP TABLE kept")
        conn.commit()
    with connect_client(env) as client:
        assert client.get("/health").status_code == 200
