"""ClickHouse as an engine of the tests: chDB (ClickHouse in process) with a ``DataLakeCatalog``
database on ISK's REST catalog, as a user of ClickHouse creates it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.kits.isk_gateway import ACCESS_KEY, SECRET_KEY, Gateway


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


class ClickHouse:
    """A chDB session with ISK's catalog as the database ``isk``."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` (``isk.`<namespace>.<table>``` names a table)."""
        result = self.session.query(sql, "JSONCompact")
        import json

        return [tuple(row) for row in json.loads(result.bytes() or b'{"data": []}')["data"]]


@contextmanager
def clickhouse(gateway: Gateway) -> Iterator[ClickHouse]:
    """A fresh chDB session (its own temporary data path) attached to ``gateway``'s catalog."""
    import tempfile

    from chdb import session as chdb_session

    with tempfile.TemporaryDirectory(prefix=f"chdb-{uuid.uuid4().hex[:6]}-") as path:
        session = chdb_session.Session(path)
        try:
            session.query("SET allow_experimental_database_iceberg = 1")
            session.query(database_sql("isk", gateway))
            yield ClickHouse(session)
        finally:
            session.close()
