"""Test scaffolding: an in-memory TableProvider and an IskHttpService run in its own loop thread."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table.metadata import new_table_metadata

from bergstream.core.typed.row_contract import PARTITION_SPEC, ROW_SCHEMA, SORT_ORDER
from bergstream.plugins.isk_gateway.http.server import IskHttpConfig, IskHttpService
from bergstream.plugins.isk_gateway.tables.provider import (
    LoadedTable,
    NoSuchFile,
    NoSuchNamespace,
    NoSuchTable,
    ProviderUnavailable,
    TableNotServable,
)

ACCESS_KEY = "isk-access"
SECRET_KEY = "isk-secret/with+chars"
BUCKET = "bergstream"
TABLES = {"hotset": ["orders", "payments"], "merged": ["orders"], "coldset": []}
BLOB = bytes(range(256)) * 40  # 10240 bytes
SPECIAL_KEY = "hotset/orders/data/key with space+plus%25=ü.bin"
PARQUET_KEY = "hotset/orders/data/part-0.parquet"
PARQUET_TABLE = pa.table({"id": list(range(100)), "name": [f"n{i}" for i in range(100)]})


def _parquet_bytes() -> bytes:
    sink = io.BytesIO()
    pq.write_table(PARQUET_TABLE, sink)
    return sink.getvalue()


def table_metadata(namespace: str, table: str) -> dict[str, Any]:
    """The metadata of an empty table in the row contract at ``s3://<BUCKET>/namespace/table``."""
    location = f"s3://{BUCKET}/{namespace}/{table}"
    meta = new_table_metadata(ROW_SCHEMA, PARTITION_SPEC, SORT_ORDER, location, {})
    return json.loads(meta.model_dump_json(by_alias=True, exclude_none=True))


class FakeProvider:
    """Tables with real TableMetadataV2 JSON; files with known bytes, metadata files included."""

    def __init__(self) -> None:
        self.unavailable = False
        self.not_servable = False
        self.tables: dict[tuple[str, str], LoadedTable] = {}
        self.files: dict[str, bytes] = {
            "hotset/orders/data/blob.bin": BLOB,
            "hotset/orders/data/empty.bin": b"",
            SPECIAL_KEY: b"special bytes",
            PARQUET_KEY: _parquet_bytes(),
        }
        for namespace, tables in TABLES.items():
            for table in tables:
                metadata = table_metadata(namespace, table)
                key = f"{namespace}/{table}/metadata/00001-{namespace}-{table}.metadata.json"
                self.files[key] = json.dumps(metadata).encode()
                self.tables[namespace, table] = LoadedTable(f"s3://{BUCKET}/{key}", metadata)

    def _check(self) -> None:
        if self.unavailable:
            raise ProviderUnavailable("kafka is down")

    async def list_namespaces(self) -> list[str]:
        self._check()
        return sorted(TABLES)

    async def list_tables(self, namespace: str) -> list[str]:
        self._check()
        if namespace not in TABLES:
            raise NoSuchNamespace(namespace)
        return list(TABLES[namespace])

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        self._check()
        if self.not_servable:
            raise TableNotServable(f"{namespace}.{table}: the coldset has delete files")
        if namespace not in TABLES:
            raise NoSuchNamespace(namespace)
        try:
            return self.tables[namespace, table]
        except KeyError:
            raise NoSuchTable(f"{namespace}.{table}") from None

    async def file_size(self, key: str) -> int:
        return len(await self.read_file(key))

    async def read_file(self, key: str) -> bytes:
        self._check()
        try:
            return self.files[key]
        except KeyError:
            raise NoSuchFile(key) from None

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        return (await self.read_file(key))[start:end]

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        self._check()
        keys = sorted(k for k in self.files if k.startswith(prefix))
        return [(k, len(self.files[k])) for k in keys[:limit]]


class RunningService:
    """A started IskHttpService on free ports, driven from a dedicated event-loop thread."""

    def __init__(self, provider: FakeProvider, **config: Any) -> None:
        self.provider = provider
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        cfg = IskHttpConfig(
            catalog_port=0, s3_port=0, access_key=ACCESS_KEY, secret_key=SECRET_KEY, **config
        )
        self.service = IskHttpService(cfg, provider)
        self._run(self.service.start())
        assert self.service.catalog_url and self.service.s3_url
        self.catalog_url: str = self.service.catalog_url
        self.s3_url: str = self.service.s3_url

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self._run(self.service.stop())
        self._run(self.service.stop())  # idempotent
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
