"""Debezium connectors on the stack's Kafka Connect worker, for the tests that capture a
PostgreSQL table: a connector's names (its slot, publication and topic prefix), its config, and
its removal with its slot."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from bergstream.devstack.stack.kafka_connect import POSTGRES_CONNECTOR

#: Kafka Connect's JSON converter (``schemas.enable`` true or false).
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"


@dataclass
class Capture:
    """One Debezium connector on its own table."""

    name: str
    table: str
    slot: str
    publication: str
    prefix: str

    @property
    def topic(self) -> str:
        """The topic Debezium writes the table's changes to."""
        return f"{self.prefix}.public.{self.table}"


def connect_client(env: dict[str, str]) -> httpx.Client:
    """A client of the stack's Kafka Connect REST API."""
    return httpx.Client(base_url=env["BERGSTREAM_CONNECT_URL"], timeout=30.0, trust_env=False)


def connector_config(env: dict[str, str], capture: Capture) -> dict[str, str]:
    """Debezium's Postgres connector on the stack's database for ``capture`` (pgoutput, its
    own slot and publication, an initial snapshot, truncates captured too)."""
    url = urlsplit(env["BERGSTREAM_POSTGRES_URL"])
    assert url.hostname and url.port and url.username and url.password
    return {
        "connector.class": POSTGRES_CONNECTOR,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": url.hostname,
        "database.port": str(url.port),
        "database.user": url.username,
        "database.password": url.password,
        "database.dbname": url.path.lstrip("/"),
        "topic.prefix": capture.prefix,
        "slot.name": capture.slot,
        "publication.name": capture.publication,
        "publication.autocreate.mode": "filtered",
        "table.include.list": f"public.{capture.table}",
        "snapshot.mode": "initial",
        # Debezium 3 skips truncates by default ("t"): capture every operation.
        "skipped.operations": "none",
        # How long the task waits for new changes before its next poll (default 500 ms): the
        # tests wait for every change to arrive, dozens of times each.
        "poll.interval.ms": "50",
    }


def wait_running(client: httpx.Client, name: str, timeout: float = 60.0) -> None:
    """Wait until connector ``name`` and its tasks run (fail at once if one failed)."""
    deadline = time.monotonic() + timeout
    status: Any = None
    while time.monotonic() < deadline:
        response = client.get(f"/connectors/{name}/status")
        if response.status_code == 200:
            status = response.json()
            states = [status["connector"]["state"]] + [t["state"] for t in status["tasks"]]
            assert "FAILED" not in states, json.dumps(status, indent=2)
            if status["tasks"] and set(states) == {"RUNNING"}:
                return
        time.sleep(0.2)
    raise AssertionError(f"connector {name} not running after {timeout} s: {status}")


def drop_slot(env: dict[str, str], capture: Capture) -> None:
    """Drop the connector's slot (once its walsender is gone), its publication and table."""
    import psycopg

    with psycopg.connect(env["BERGSTREAM_POSTGRES_URL"], autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while True:
            row = conn.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                (capture.slot,),
            ).fetchone()
            if row is None:
                break
            if row[0] is None:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (capture.slot,))
                break
            if time.monotonic() > deadline:  # the task did not let go: end its walsender
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            time.sleep(0.2)
        conn.execute(f"DROP PUBLICATION IF EXISTS {capture.publication}")
        conn.execute(f"DROP TABLE IF EXISTS public.{capture.table}")
