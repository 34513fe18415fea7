"""The stack's ``rest-catalog`` component: Apache Iceberg's own REST catalog server in the shared
test stack, its files on the stack's S3. PyIceberg creates, writes and reads a table through
it; the server listens on 127.0.0.1 only; ``bergstream stack env`` exports its URL."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from tests.support import BERGSTREAM, boto_s3

pytestmark = pytest.mark.slow


def _catalog(env: dict[str, str]) -> Catalog:
    from pyiceberg.catalog import load_catalog

    return load_catalog(
        "reference",
        type="rest",
        uri=env["BERGSTREAM_REST_CATALOG_URL"],
        **{
            "s3.endpoint": env["BERGSTREAM_S3_ENDPOINT"],
            "s3.access-key-id": env["BERGSTREAM_S3_ACCESS_KEY"],
            "s3.secret-access-key": env["BERGSTREAM_S3_SECRET_KEY"],
            "s3.region": env["BERGSTREAM_S3_REGION"],
            "s3.path-style-access": "true",
        },
    )


def test_pyiceberg_writes_and_reads_a_table_on_s3(rest_catalog_env: dict[str, str]) -> None:
    catalog = _catalog(rest_catalog_env)
    namespace = f"live_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", None]})
    table = catalog.create_table(f"{namespace}.people", schema=rows.schema)
    table.append(rows)
    table.append(rows.slice(0, 1))
    again = _catalog(rest_catalog_env).load_table(f"{namespace}.people")
    assert sorted(again.scan().to_arrow().column("id").to_pylist()) == [1, 1, 2, 3]
    assert len(again.history()) == 2
    assert (namespace, "people") in catalog.list_tables(namespace)
    warehouse = urlparse(rest_catalog_env["BERGSTREAM_REST_CATALOG_WAREHOUSE"])
    assert again.metadata_location.startswith(
        f"s3://{warehouse.netloc}{warehouse.path}/{namespace}/people/metadata/"
    )
    s3 = boto_s3(
        rest_catalog_env["BERGSTREAM_S3_ENDPOINT"],
        rest_catalog_env["BERGSTREAM_S3_ACCESS_KEY"],
        rest_catalog_env["BERGSTREAM_S3_SECRET_KEY"],
    )
    listed = s3.list_objects_v2(
        Bucket=warehouse.netloc, Prefix=f"{warehouse.path.lstrip('/')}/{namespace}/people/data/"
    )
    assert listed["KeyCount"] == 2  # one Parquet file per append


def _listeners(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net shows them) of the sockets listening on ``port``."""
    found = set()
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def test_the_server_listens_on_loopback_only(rest_catalog_env: dict[str, str]) -> None:
    port = urlparse(rest_catalog_env["BERGSTREAM_REST_CATALOG_URL"]).port
    assert port is not None
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, ::ffff:127.0.0.1
    listeners = _listeners(port)
    assert listeners and listeners <= loopback, listeners


def test_stack_env_exports_the_catalog(rest_catalog_env: dict[str, str]) -> None:
    env = {**os.environ, "BERGSTREAM_HOME": rest_catalog_env["BERGSTREAM_HOME"]}
    out = subprocess.run(
        [BERGSTREAM, "stack", "env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    url = rest_catalog_env["BERGSTREAM_REST_CATALOG_URL"]
    assert f"export BERGSTREAM_REST_CATALOG_URL={url}\n" in out
    assert "export BERGSTREAM_REST_CATALOG_WAREHOUSE=s3://rest-catalog/warehouse\n" in out
