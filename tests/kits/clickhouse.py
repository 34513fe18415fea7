"""ClickHouse as an engine of the tests: chDB (ClickHouse in process) with a ``DataLakeCatalog``
database on ISK's REST catalog, as a user of ClickHouse creates it.

Each batch of queries runs in a Python process of its own: chDB starts ClickHouse's engine
inside the process that imports it, and its background threads (connection pools, caches)
outlive a closed session; in a test worker that lives for the whole run they would keep
working against gateways long after the test.

The database is dropped before the session closes: chDB's ``Session.close()`` loads every table
of a ``DataLakeCatalog`` database still attached (measured through a logging proxy: one
LoadTable per table of the catalog at close, none with ``DROP DATABASE`` or ``DETACH DATABASE``
first), which on the run's shared Kafka means every topic every test made."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from tests.kits.isk_gateway import ACCESS_KEY, SECRET_KEY, Gateway

_RUN = """
import json, sys, tempfile
from chdb import session as chdb_session
statements = json.loads(sys.stdin.read())
with tempfile.TemporaryDirectory(prefix="chdb-") as path:
    session = chdb_session.Session(path)
    try:
        session.query("SET allow_experimental_database_iceberg = 1")
        session.query(statements["create"])
        out = []
        for sql in statements["queries"]:
            result = session.query(sql, "JSONCompact")
            raw = result.bytes() or b'{"data": []}'
            out.append(json.loads(raw)["data"])
        session.query("DROP DATABASE IF EXISTS isk")
    finally:
        session.close()
print(json.dumps(out))
"""


def database_sql(name: str, gateway: Gateway, bucket: str = "bergstream") -> str:
    """``CREATE DATABASE`` of the ISK catalog at ``gateway`` (its S3 gateway as the storage
    endpoint, ISK's keys)."""
    return (
        f"CREATE DATABASE {name} ENGINE = DataLakeCatalog('{gateway.catalog_url}/v1') "
        f"SETTINGS catalog_type = 'rest', warehouse = '{bucket}', "
        f"storage_endpoint = '{gateway.s3_url}/{bucket}', vended_credentials = false, "
        f"aws_access_key_id = '{ACCESS_KEY}', aws_secret_access_key = '{SECRET_KEY}', "
        "region = 'us-east-1'"
    )


def clickhouse_rows(gateway: Gateway, queries: Sequence[str]) -> list[list[tuple[Any, ...]]]:
    """The rows of each of ``queries``, run by ClickHouse (chDB) with ``gateway``'s catalog as
    the database ``isk`` (``isk.`<namespace>.<table>``` names a table)."""
    statements = {"create": database_sql("isk", gateway), "queries": list(queries)}
    done = subprocess.run(
        [sys.executable, "-c", _RUN],
        input=json.dumps(statements),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise AssertionError(f"ClickHouse failed:\n{done.stderr[-3000:]}")
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return [[tuple(row) for row in rows] for rows in results]
