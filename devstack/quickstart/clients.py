"""The quickstart's clients of ISK and KSI: DuckDB's iceberg extension attached to the ISK
catalog, and an aiokafka consumer reading through the KSI proxy from offset 0.

DuckDB is an optional dependency (the ``quickstart`` extra); its extensions are loaded by path
from the ``duckdb-extension-*`` wheels, so nothing is downloaded at query time.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "DUCKDB_EXTENSIONS",
    "KsiRead",
    "MissingExtraError",
    "SqlSession",
    "duckdb_extension_paths",
    "offline_duckdb",
    "read_from_offset_zero",
    "require_quickstart_extra",
]

#: Loaded in this order: the iceberg extension needs avro (and parquet, httpfs) loaded first.
DUCKDB_EXTENSIONS = ("parquet", "avro", "httpfs", "iceberg")
_EXTRA_HINT = "pip install -e '.[quickstart]' (scripts/setup installs it)"


class MissingExtraError(RuntimeError):
    """A package of the ``quickstart`` extra is not installed."""


def duckdb_extension_paths() -> dict[str, Path]:
    """The extension files of the ``duckdb-extension-*`` wheels matching the installed DuckDB;
    raises MissingExtraError naming what is missing."""
    if importlib.util.find_spec("duckdb") is None:
        raise MissingExtraError(
            f"the quickstart queries with DuckDB, which is missing: {_EXTRA_HINT}"
        )
    import duckdb

    paths: dict[str, Path] = {}
    missing: list[str] = []
    for name in DUCKDB_EXTENSIONS:
        spec = importlib.util.find_spec(f"duckdb_extension_{name}")
        path = None
        if spec is not None and spec.origin is not None:
            path = (
                Path(spec.origin).parent
                / "extensions"
                / f"v{duckdb.__version__}"
                / f"{name}.duckdb_extension"
            )
        if path is None or not path.is_file():
            missing.append(f"duckdb-extension-{name}=={duckdb.__version__}")
        else:
            paths[name] = path
    if missing:
        raise MissingExtraError(
            f"DuckDB {duckdb.__version__} lacks {', '.join(missing)}: {_EXTRA_HINT}"
        )
    return paths


def offline_duckdb(extensions: dict[str, Path] | None = None) -> Any:
    """A new in-memory DuckDB connection with the wheels' extensions loaded by path (parquet,
    avro, httpfs, then iceberg) and nothing ever downloaded or autoloaded; raises
    MissingExtraError if DuckDB or an extension is missing."""
    paths = extensions if extensions is not None else duckdb_extension_paths()
    import duckdb

    connection = duckdb.connect(
        config={
            "allow_unsigned_extensions": "true",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
        }
    )
    try:
        for path in paths.values():
            connection.execute(f"LOAD '{path}'")
    except BaseException:
        connection.close()
        raise
    return connection


def require_quickstart_extra() -> dict[str, Path]:
    """Check that everything the quickstart runs is installed (DuckDB with its extensions,
    PySpark for the pipeline) before anything starts; returns the DuckDB extension paths."""
    paths = duckdb_extension_paths()
    if importlib.util.find_spec("pyspark") is None:
        raise MissingExtraError(f"the lake pipeline needs PySpark, which is missing: {_EXTRA_HINT}")
    return paths


class SqlSession:
    """A DuckDB connection with the ISK catalog attached as ``isk``."""

    def __init__(self, catalog_url: str, extensions: dict[str, Path]) -> None:
        import duckdb

        self.catalog_url = catalog_url
        self.connection = offline_duckdb(extensions)
        try:
            self.connection.execute(self.attach_sql(catalog_url))
        except duckdb.Error as error:
            self.connection.close()
            raise RuntimeError(
                f"DuckDB cannot attach the ISK catalog {catalog_url}: {error}"
            ) from None

    @staticmethod
    def attach_sql(catalog_url: str) -> str:
        """The ATTACH statement for the ISK catalog at ``catalog_url`` (the one users type)."""
        return (
            f"ATTACH '' AS isk (TYPE iceberg, ENDPOINT '{catalog_url}', AUTHORIZATION_TYPE 'none')"
        )

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Run ``sql`` and return every row; a DuckDB error becomes a RuntimeError naming it."""
        import duckdb

        try:
            return self.connection.execute(sql).fetchall()
        except duckdb.Error as error:
            raise RuntimeError(f"DuckDB: {error}\n  in: {sql}") from None

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()

    def __enter__(self) -> SqlSession:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


@dataclass
class KsiRead:
    """What a consumer read through KSI: per partition the offsets seen, plus every value."""

    records: int = 0
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    gaps: int = 0
    below_log_start: int = 0
    values: list[bytes] = field(default_factory=list)
    seconds: float = 0.0


async def read_from_offset_zero(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    kafka_log_start: dict[int, int],
    timeout: float = 300,
) -> KsiRead:
    """Consume every partition of ``topic`` through ``bootstrap`` as a new consumer with
    ``auto_offset_reset=earliest`` (it asks the proxy where a partition begins) until each
    reaches its end offset in ``ends``; count records, offset gaps and records below Kafka's log
    start (served by KSI from the coldset), and keep every value (null ones as ``b""``)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    read = KsiRead()
    started = time.monotonic()
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in sorted(ends)])
        deadline = started + timeout
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the consumer read {read.records:,} records through KSI in {timeout:.0f} s "
                    f"and stopped at offsets {read.last}; wanted {ends}"
                )
            batches = await consumer.getmany(timeout_ms=1000, max_records=50_000)
            for tp, messages in batches.items():
                for message in messages:
                    partition, offset = tp.partition, message.offset
                    if partition not in read.first:
                        read.first[partition] = offset
                    elif offset != read.last[partition] + 1:
                        read.gaps += 1
                    read.last[partition] = offset
                    read.records += 1
                    if offset < kafka_log_start.get(partition, 0):
                        read.below_log_start += 1
                    read.values.append(message.value or b"")
                    if offset + 1 >= ends[partition]:
                        done.add(partition)
    finally:
        await consumer.stop()
    read.seconds = time.monotonic() - started
    return read
