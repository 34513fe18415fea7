"""ISK under load: concurrent DuckDB and PyIceberg clients querying ``merged`` tables while
records are produced, against a single client, in one run.

Starts its own Kafka (the local stack, under a temporary home), creates ``--topics`` topics of 3
partitions, fills each with ``--records`` records (Kafka's ProducerPerformance), runs ``bergstream
run`` with an ``isk`` service over that Kafka with a ``lake:`` section (so the ``merged``
namespace is served; the coldset is empty, so a merged table reads every offset from Kafka),
brings every table's index up to date with one LoadTable each, then, with a producer adding
``--rate`` records/s to the topics all along:

- **1 client**: one client alternating DuckDB (``ATTACH`` of the ISK catalog) and PyIceberg
  (RestCatalog, vended S3 settings) queries for ``--single-seconds``;
- **N clients**: ``--clients`` clients, half DuckDB, half PyIceberg, for ``--seconds``.

Each client is a process of its own, as real users are (started, connected and warmed up with
one query per engine before the clock starts: a process's first PyIceberg scan pays its
imports, see ``_client_process``), so the clients' harness is not what limits the load: for
each phase the bench prints queries/s, p50/p99, and the CPU seconds per query of ISK
(``/proc``) and of the clients separately. The load test (``tests/isk/load``) runs the same
clients as threads.

Each client's engine gets one thread (``--client-threads 1``, DuckDB's ``threads`` and
PyIceberg's ``max-workers``): a real user's engine has its own cores, while here 16 clients share
ISK's two. With each engine's default (a thread per core, ``--client-threads 0``) the 16 clients'
thread pools spin against one another: measured with ``--quick``, the clients' CPU per query rose
10x from one client to 16 and queries/s fell to 0.26x; with one thread, 3.3x and 0.68x.
``--profile PREFIX`` records ISK with py-spy in each phase (``py-spy`` must be installed).

Each query reads ``kafka_partition`` and ``kafka_offset`` of a whole merged table (the topics in
turn) and is checked: per partition the count equals the largest offset + 1 and the distinct
offsets (no duplicate, no gap: the topics have no deletes or transactions), the total is at
least the records acked before the query started and at most those produced when it ended. A
query that fails or breaks a check is an error; the run fails if any.

The last line's JSON ends with the goals' ratios: ``ratio_16_to_1`` (queries/s at N clients
over one client's), ``isk_cpu_per_query_ratio`` (ISK's CPU per query at N clients over one
client's) and ``p99_n_to_p50_1``; then the same per row read (``rows_s_ratio``,
``isk_cpu_per_row_ratio``): a query reads its whole table, which grows all along. The one
client runs half its time before the N clients and half after, so the two compare at the same
table sizes on average.

Then the baseline, with the producer still running: each merged table's rows as ISK serves
them are written once to a physical Iceberg table of their own (SQLite catalog, local files, a
data file per ``--chunk-records`` rows), and the same clients run the same phases and queries on
those copies (DuckDB's ``iceberg_scan``, PyIceberg's ``SqlCatalog``), with no ISK between them
and the files. The JSON's ``physical`` holds its phases, ``p99_n_to_p50_1`` and
``ratio_16_to_1``: what the clients and the machine do alone under the same concurrency, beside
ISK's.

Reported: queries/s and p50/p99 latency of both phases (all queries and per engine), ISK's
resident memory (baseline after the first loads, peak from the kernel's high-water mark), and
ISK's Kafka reads: range reads per distinct range (``bergstream_isk_kafka_fetches``: 1.0 means
no file was built twice), Fetch requests, MB of data files synthesized.

    .venv/bin/python bench/isk_load.py [--records 200000] [--clients 16] [--seconds 60] [--quick]

The functions above ``main`` are the load test's too (tests/isk_load/test_isk_load.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit import cpu_seconds

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
ACCESS_KEY = "isk-load"
SECRET_KEY = "isk-load-secret"
ENGINES = ("duckdb", "pyiceberg")
#: Client processes start fresh interpreters (not forks of one that runs a producer thread).
_SPAWN = multiprocessing.get_context("spawn")


# --------------------------------------------------------------------------- ISK


def isk_yaml(
    kafka: str,
    workdir: Path,
    ports: Sequence[int],
    chunk_records: int,
    cache_yaml: str,
    index_interval_seconds: float = 5.0,
    lake: bool = True,
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    coalesce_files: int | None = None,
) -> str:
    """A ``bergstream run`` config of one ``isk`` service on ``ports`` (catalog, S3, metrics)
    with its index under ``workdir``, the cache ``cache_yaml`` (flow YAML of the choice) and,
    with ``lake``, a ``lake:`` section (SQLite catalog under ``workdir``) for ``merged``;
    ``coalesce_files`` as given (None: ISK's default)."""
    catalog_port, s3_port, metrics_port = ports
    text = textwrap.dedent(
        f"""
        metrics: {{host: 127.0.0.1, port: {metrics_port}}}
        services:
          - type: isk
            config:
              cluster: load
              kafka_bootstrap: "{kafka}"
              chunk_records: {chunk_records}
              index_interval_seconds: {index_interval_seconds}
              {"" if coalesce_files is None else f"coalesce_files: {coalesce_files}"}
              http:
                catalog_host: 127.0.0.1
                catalog_port: {catalog_port}
                s3_host: 127.0.0.1
                s3_port: {s3_port}
                access_key: {access_key}
                secret_key: {secret_key}
              index: {{type: sqlite, config: {{path: "{workdir / "index.sqlite"}"}}}}
              cache: {cache_yaml}
        """
    )
    if lake:
        text += textwrap.dedent(
            f"""
            lake:
              kafka_bootstrap: "{kafka}"
              catalog: {{type: sql, uri: "sqlite:///{workdir}/lake/catalog.db",
                        warehouse: "{workdir}/lake/warehouse"}}
              pipeline: {{checkpoint_dir: "{workdir}/lake/checkpoints"}}
            """
        )
    return text


def scrape(metrics_port: int) -> dict[str, float]:
    """The process's Prometheus samples (``name{labels}`` -> value), ``_created`` ones left out."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def kafka_reads(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """ISK's Kafka reads between two :func:`scrape` results: range reads (one per file built
    from Kafka), ranges read again (a file built twice), range reads per distinct range,
    Fetch requests, and MB of data files synthesized."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    ranges = delta('bergstream_isk_kafka_fetches_total{kind="range"}')
    repeats = delta('bergstream_isk_kafka_fetches_total{kind="repeat"}')
    synthesized = sum(
        value - before.get(name, 0.0)
        for name, value in after.items()
        if name.startswith("bergstream_isk_synthesized_bytes_total") and 'kind="data"' in name
    )
    return {
        "isk_cpu_s": round(delta("process_cpu_seconds_total"), 1),
        "range_reads": ranges,
        "repeated_ranges": repeats,
        "reads_per_file": round(ranges / (ranges - repeats), 4) if ranges > repeats else 0.0,
        "fetch_requests": delta('bergstream_isk_kafka_fetches_total{kind="request"}'),
        "synthesized_data_mb": round(synthesized / 1e6, 2),
    }


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (the peak resident set) of process ``pid``, in bytes."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


class RssSampler:
    """Samples a process's resident memory every ``interval`` seconds in a thread
    (``with``-block); :attr:`peak` is the largest sample."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, proc_status(self.pid)["VmRSS"])
                self.samples += 1
            except (OSError, KeyError):
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- producing


class Acks:
    """Per topic, records handed to the producer and records Kafka acknowledged: counters in
    shared memory, so client processes read them as the producing process writes them."""

    def __init__(self, topics: Sequence[str], already: int = 0) -> None:
        self.topics = list(topics)
        self._index = {topic: n for n, topic in enumerate(self.topics)}
        # [produced..., acked...]; the Array's own lock guards both halves.
        self._counts: Any = _SPAWN.Array("q", [already] * (2 * len(self.topics)))
        self.failures: list[str] = []

    @classmethod
    def of(cls, topics: Sequence[str], already: int = 0) -> Acks:
        """Counts for ``topics``, each holding ``already`` acked records."""
        return cls(topics, already)

    @classmethod
    def fixed(cls, counts: dict[str, int]) -> Acks:
        """Counts that never change: ``counts[topic]`` records produced and acked (a static
        table holding exactly those rows)."""
        acks = cls(list(counts))
        with acks._counts.get_lock():
            for topic, n in acks._index.items():
                acks._counts[n] = acks._counts[len(acks.topics) + n] = counts[topic]
        return acks

    @property
    def produced(self) -> dict[str, int]:
        """Records handed to the producer, by topic."""
        with self._counts.get_lock():
            return {t: int(self._counts[n]) for t, n in self._index.items()}

    @property
    def acked(self) -> dict[str, int]:
        """Records Kafka acknowledged, by topic."""
        offset = len(self.topics)
        with self._counts.get_lock():
            return {t: int(self._counts[offset + n]) for t, n in self._index.items()}

    def add_produced(self, topic: str, count: int = 1) -> None:
        """Count ``count`` more records handed to the producer for ``topic``."""
        with self._counts.get_lock():
            self._counts[self._index[topic]] += count

    def add_acked(self, topic: str) -> None:
        """Count one more acknowledged record of ``topic``."""
        with self._counts.get_lock():
            self._counts[len(self.topics) + self._index[topic]] += 1

    def snapshot(self, topic: str) -> tuple[int, int]:
        """(acked, produced) of ``topic`` now."""
        n = self._index[topic]
        with self._counts.get_lock():
            return int(self._counts[len(self.topics) + n]), int(self._counts[n])

    def __getstate__(self) -> dict[str, Any]:
        # Client processes read the counts; the failures stay with the producing process.
        return {**self.__dict__, "failures": []}


class Producer:
    """Produces ``rate`` records/s spread over ``topics`` in a thread (``with``-block), acks=all,
    counting into ``acks``; ``value_bytes`` per record."""

    def __init__(
        self, bootstrap: str, topics: Sequence[str], acks: Acks, rate: float, value_bytes: int = 100
    ) -> None:
        from confluent_kafka import Producer as KafkaProducer

        self.topics = list(topics)
        self.acks = acks
        self.rate = rate
        self.value = b"x" * value_bytes
        self._producer: Any = KafkaProducer(
            {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.acks.failures.append(str(error))
        else:
            self.acks.add_acked(message.topic())

    def produce(self, topic: str, count: int) -> None:
        """Produce ``count`` records to ``topic`` now (no wait for their acks)."""
        for _ in range(count):
            self.acks.add_produced(topic)
            while True:
                try:
                    self._producer.produce(topic, self.value, on_delivery=self._delivered)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        self._producer.poll(0)

    def _run(self) -> None:
        began, sent = time.monotonic(), 0
        while not self._stop.is_set():
            due = int((time.monotonic() - began) * self.rate)
            for i in range(sent, due):
                self.produce(self.topics[i % len(self.topics)], 1)
            sent = max(sent, due)
            self._producer.poll(0.02)

    def flush(self, timeout: float = 60) -> None:
        """Wait until every record produced so far is acknowledged."""
        left = self._producer.flush(timeout)
        if left:
            raise RuntimeError(f"{left} records still unacknowledged after {timeout} s")

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.close()

    def close(self) -> None:
        """Wait for every ack, then let the Kafka client go (its threads end with it)."""
        if self._producer is not None:
            self.flush()
            self._producer = None


# --------------------------------------------------------------------------- clients

#: Per partition: (partition, rows, largest offset, distinct offsets).
Partitions = list[tuple[int, int, int, int]]
#: The columns the clients read (and the physical copies hold).
COPIED = ("kafka_partition", "kafka_offset")


class DuckDBClient:
    """One DuckDB connection with the ISK catalog attached as ``isk``."""

    engine = "duckdb"

    def __init__(self, catalog_url: str, threads: int | None = None) -> None:
        from bergstream.devstack.quickstart.clients import SqlSession, offline_duckdb

        self.connection = offline_duckdb()
        if threads is not None:
            self.connection.execute(f"SET threads = {int(threads)}")
        self.connection.execute(SqlSession.attach_sql(catalog_url))

    def query(self, topic: str) -> Partitions:
        """Count, largest and distinct offsets per partition of ``merged.<topic>``."""
        return self._grouped(f'isk.merged."{topic}"')

    def _grouped(self, source: str) -> Partitions:
        """Count, largest and distinct offsets per partition of the rows of ``source``."""
        rows = self.connection.execute(
            "SELECT kafka_partition, count(*), max(kafka_offset), count(DISTINCT kafka_offset) "
            f"FROM {source} GROUP BY kafka_partition"
        ).fetchall()
        return [tuple(int(v) for v in row) for row in rows]  # type: ignore[misc]

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()


class PyIcebergClient:
    """A PyIceberg RestCatalog on ISK: each query loads the table and scans it (S3 settings from
    the table's vended config, as any client)."""

    engine = "pyiceberg"

    def __init__(self, catalog_url: str, threads: int | None = None) -> None:
        from pyiceberg.catalog.rest import RestCatalog

        if threads is not None:  # PyIceberg's scan pool reads this when it is first made
            os.environ["PYICEBERG_MAX_WORKERS"] = str(int(threads))

        self.catalog = RestCatalog(f"isk-{uuid.uuid4().hex[:6]}", uri=catalog_url)

    def query(self, topic: str) -> Partitions:
        """Count, largest and distinct offsets per partition of ``merged.<topic>``."""
        return self._grouped(self.catalog.load_table(("merged", topic)))

    @staticmethod
    def _grouped(table: Any) -> Partitions:
        """Scan ``table``'s partition and offset columns and group them per partition."""
        rows = table.scan(selected_fields=COPIED).to_arrow()
        grouped = rows.group_by("kafka_partition").aggregate(
            [
                ("kafka_offset", "count"),
                ("kafka_offset", "max"),
                ("kafka_offset", "count_distinct"),
            ]
        )
        return [
            (int(r["kafka_partition"]), int(r["kafka_offset_count"]),
             int(r["kafka_offset_max"]), int(r["kafka_offset_count_distinct"]))
            for r in grouped.to_pylist()
        ]  # fmt: skip

    def close(self) -> None:
        """Nothing to close (HTTP sessions close with the process)."""


#: A client's target: ISK's catalog URL, or this prefix and the JSON of :class:`PhysicalCopies`.
PHYSICAL = "physical:"


@dataclass
class PhysicalCopies:
    """The topics' rows as ISK served them, written as Iceberg tables of their own (a SQLite
    catalog, local files, one data file per ``chunk_records`` rows): the baseline the clients
    also query, with no ISK between them and the files."""

    catalog_uri: str
    warehouse: str
    metadata: dict[str, str]  # topic -> metadata file of its table

    def target(self) -> str:
        """The clients' target string."""
        return PHYSICAL + json.dumps(vars(self))

    @classmethod
    def of_target(cls, target: str) -> PhysicalCopies:
        """The copies a target string names."""
        return cls(**json.loads(target.removeprefix(PHYSICAL)))

    def catalog(self) -> Any:
        """Their PyIceberg catalog."""
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog("physical", uri=self.catalog_uri, warehouse=self.warehouse)


def copy_physically(
    catalog_url: str, topics: Sequence[str], workdir: Path, chunk_records: int
) -> tuple[PhysicalCopies, dict[str, int]]:
    """Read each ``merged.<topic>`` through ISK once and write its rows (the columns the
    clients read) to ``physical.<topic>``; the copies and their row counts."""
    from pyiceberg.catalog.rest import RestCatalog

    source = RestCatalog("copy", uri=catalog_url)
    folder = workdir / "physical"
    folder.mkdir()
    copies = PhysicalCopies(f"sqlite:///{folder / 'catalog.db'}", str(folder), {})
    catalog = copies.catalog()
    catalog.create_namespace("physical")
    counts: dict[str, int] = {}
    for topic in topics:
        rows = source.load_table(("merged", topic)).scan(selected_fields=COPIED).to_arrow()
        rows = rows.sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
        table = catalog.create_table(("physical", topic), schema=rows.schema)
        for start in range(0, rows.num_rows, chunk_records):
            table.append(rows.slice(start, chunk_records))
        copies.metadata[topic] = catalog.load_table(("physical", topic)).metadata_location
        counts[topic] = rows.num_rows
    return copies, counts


class PhysicalDuckDBClient(DuckDBClient):
    """DuckDB reading the physical copies' files with ``iceberg_scan`` (no catalog)."""

    def __init__(self, target: str, threads: int | None = None) -> None:
        from bergstream.devstack.quickstart.clients import offline_duckdb

        self.copies = PhysicalCopies.of_target(target)
        self.connection = offline_duckdb()
        if threads is not None:
            self.connection.execute(f"SET threads = {int(threads)}")

    def query(self, topic: str) -> Partitions:
        """The same query as on ISK, on ``physical.<topic>``'s files."""
        return self._grouped(f"iceberg_scan('{self.copies.metadata[topic]}')")


class PhysicalPyIcebergClient(PyIcebergClient):
    """PyIceberg on the physical copies' SQLite catalog: each query loads and scans a table."""

    def __init__(self, target: str, threads: int | None = None) -> None:
        if threads is not None:
            os.environ["PYICEBERG_MAX_WORKERS"] = str(int(threads))
        self.catalog = PhysicalCopies.of_target(target).catalog()

    def query(self, topic: str) -> Partitions:
        """The same query as on ISK, on ``physical.<topic>``."""
        return self._grouped(self.catalog.load_table(("physical", topic)))


def make_client(engine: str, target: str, threads: int | None) -> DuckDBClient | PyIcebergClient:
    """``engine``'s client of ``target`` (ISK's catalog URL, or :data:`PHYSICAL` copies) with
    ``threads`` engine threads (None: the engine's default)."""
    if target.startswith(PHYSICAL):
        physical = {"duckdb": PhysicalDuckDBClient, "pyiceberg": PhysicalPyIcebergClient}
        return physical[engine](target, threads)
    return {"duckdb": DuckDBClient, "pyiceberg": PyIcebergClient}[engine](target, threads)


def check(partitions: Partitions, acked_at_start: int, produced_at_end: int) -> str | None:
    """Why a query's answer is wrong, or None: per partition, rows = largest offset + 1 =
    distinct offsets; in total at least ``acked_at_start``, at most ``produced_at_end``."""
    for partition, rows, largest, distinct in partitions:
        if not rows == largest + 1 == distinct:
            return (
                f"partition {partition}: {rows} rows, {distinct} distinct offsets, largest "
                f"offset {largest} (duplicates or gaps)"
            )
    total = sum(rows for _, rows, _, _ in partitions)
    if total < acked_at_start:
        return f"{total} rows, but {acked_at_start} records were acked before the query"
    if total > produced_at_end:
        return f"{total} rows, more than the {produced_at_end} records produced"
    return None


@dataclass
class Query:
    """One query of the load: its engine, topic, seconds, rows and error (None: correct); when
    it started (``time.monotonic()``, one clock for every process) and its place in its
    client's sequence (0: the client's first)."""

    engine: str
    topic: str
    seconds: float
    rows: int
    error: str | None
    started: float = 0.0
    sequence: int = 0


def client_loop(
    number: int,
    engines: Sequence[str],
    catalog_url: str,
    topics: Sequence[str],
    acks: Acks,
    deadline: float,
    out: list[Query],
    clients: dict[str, DuckDBClient | PyIcebergClient] | None = None,
    limit: int | None = None,
    close: bool = True,
) -> None:
    """Run queries until ``deadline`` (or ``limit`` of them), cycling through ``engines`` and
    ``topics`` (starting at ``number``); append each to ``out``. ``clients``: engines' clients
    made beforehand (the rest are made on first use); closed at the end unless not ``close``."""
    clients = {} if clients is None else clients
    turn = number
    try:
        while time.monotonic() < deadline and (limit is None or turn - number < limit):
            engine = engines[turn % len(engines)]
            topic = topics[turn % len(topics)]
            turn += 1
            acked, _ = acks.snapshot(topic)
            started, began = time.monotonic(), time.perf_counter()
            rows, error = 0, None
            try:
                if engine not in clients:
                    clients[engine] = make_client(engine, catalog_url, None)
                answer = clients[engine].query(topic)
                rows = sum(r for _, r, _, _ in answer)
                error = check(answer, acked, acks.snapshot(topic)[1])
            except Exception as failure:  # every failure is reported, none stops the load
                error = f"{type(failure).__name__}: {failure}"
            seconds = time.perf_counter() - began
            out.append(Query(engine, topic, seconds, rows, error, started, turn - number - 1))
    finally:
        for client in clients.values() if close else ():
            client.close()


def probe_load_tables(
    catalog_url: str, topics: Sequence[str], deadline: float, out: list[float]
) -> None:
    """Time a bare LoadTable of the topics in turn, one every half second, until ``deadline``."""
    turn = 0
    while time.monotonic() < deadline:
        began = time.perf_counter()
        try:
            load_table_bytes(catalog_url, topics[turn % len(topics)])
        except OSError:
            pass  # the clients report ISK's errors; this only times LoadTable
        else:
            out.append(time.perf_counter() - began)
        turn += 1
        time.sleep(max(0.0, 0.5 - (time.perf_counter() - began)))


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def summarize(queries: Sequence[Query], seconds: float) -> dict[str, Any]:
    """Queries/s and p50/p99 latency (ms) of ``queries`` run in ``seconds``."""
    times = [q.seconds for q in queries] or [0.0]
    return {
        "queries": len(queries),
        "queries_s": round(len(queries) / seconds, 2),
        "p50_ms": round(1000 * statistics.median(times), 1),
        "p99_ms": round(1000 * percentile(times, 0.99), 1),
    }


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _client_process(
    number: int,
    engines: Sequence[str],
    catalog_url: str,
    topics: Sequence[str],
    acks: Acks,
    seconds: float,
    ready: Any,
    go: Any,
    results: Any,
    threads: int | None = None,
) -> None:
    """One client in a process of its own, as a real user's: its engines' clients made and
    warmed up first (imports, connections and one query per engine before the clock), then
    queries for ``seconds`` from ``go``; puts its queries, the CPU seconds they took and the
    warm-up queries' errors on ``results``. ``threads``: each engine's threads (None: its
    default, one per core).

    Why the warm-up: a process's first PyIceberg scan imports and builds what every later one
    reuses. Measured at full size with 16 clients, the six slowest queries of the phase were
    the PyIceberg clients' first ones, all started at once (5.1-5.8 s, 3.6 s for the median
    first query against 1.8 s for the others), and the same on the physical copies with no
    ISK (5.8-6.1 s): a start-up cost of the clients, not a cost of serving 16 of them."""
    clients = {engine: make_client(engine, catalog_url, threads) for engine in engines}
    warm_up: list[Query] = []
    client_loop(
        number, engines, catalog_url, topics, acks, math.inf, warm_up, clients,
        limit=len(engines), close=False,
    )  # fmt: skip
    ready.put(number)
    go.wait()
    began = _own_cpu_seconds()
    out: list[Query] = []
    client_loop(
        number, engines, catalog_url, topics, acks, time.monotonic() + seconds, out, clients
    )
    warm_up_errors = [f"{q.engine} {q.topic} (warm-up): {q.error}" for q in warm_up if q.error]
    results.put(
        ([tuple(vars(q).values()) for q in out], _own_cpu_seconds() - began, warm_up_errors)
    )


def _run_in_processes(
    catalog_url: str,
    topics: Sequence[str],
    acks: Acks,
    clients: int,
    seconds: float,
    threads: int | None = None,
) -> tuple[Any, Callable[[], tuple[list[Query], float, list[str]]]]:
    """Start ``clients`` client processes and wait until each is ready; return the event that
    starts them and a function collecting (queries, their CPU seconds, the warm-up queries'
    errors)."""
    ready, go, results = _SPAWN.Queue(), _SPAWN.Event(), _SPAWN.Queue()
    processes = [
        _SPAWN.Process(
            target=_client_process,
            args=(n, ENGINES if clients == 1 else (ENGINES[n % 2],), catalog_url, topics, acks,
                  seconds, ready, go, results, threads),
            daemon=True,
        )
        for n in range(clients)
    ]  # fmt: skip
    for process in processes:
        process.start()
    for _ in processes:
        ready.get(timeout=300)

    def collect() -> tuple[list[Query], float, list[str]]:
        queries: list[Query] = []
        cpu = 0.0
        warm_up_errors: list[str] = []
        for _ in processes:
            rows, used, errors = results.get(timeout=seconds + 900)
            queries.extend(Query(*row) for row in rows)
            cpu += used
            warm_up_errors += errors
        for process in processes:
            process.join(60)
        return queries, cpu, warm_up_errors

    return go, collect


def _combined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two phases of one client as one: counts, seconds and CPU added, rates and CPU per query
    from the sums, p50 and p99 the mean of the two (the latencies themselves are not kept)."""
    combined = dict(second)
    for key in ("queries", "seconds", "client_cpu_s", "isk_cpu_s", "rows_read"):
        if key in first and key in second:  # no ISK CPU in a phase on the physical copies
            combined[key] = round(first[key] + second[key], 3)
    count = max(combined["queries"], 1)
    combined["queries_s"] = round(combined["queries"] / combined["seconds"], 2)
    combined["client_cpu_per_query_s"] = round(combined["client_cpu_s"] / count, 3)
    if "isk_cpu_s" in combined:
        combined["isk_cpu_per_query_s"] = round(combined["isk_cpu_s"] / count, 4)
    for key in ("p50_ms", "p99_ms"):
        combined[key] = round((first[key] + second[key]) / 2, 1)
    combined["errors"] = first["errors"] + second["errors"]
    return combined


def run_clients(
    catalog_url: str,
    topics: Sequence[str],
    acks: Acks,
    clients: int,
    seconds: float,
    processes: bool = False,
    isk_pid: int | None = None,
    client_threads: int | None = None,
) -> dict[str, Any]:
    """``clients`` concurrent clients for ``seconds`` (half DuckDB, half PyIceberg; a single
    client alternates them): figures overall and per engine, rows read and every error. With
    ``processes`` each client runs in a process of its own (as real users do; the bench), else
    as a thread of this one (the load test). With ``isk_pid``, ISK's CPU seconds in the phase
    and per query; the clients' CPU per query beside them. ``client_threads``: each process
    client's engine threads (None: the engine's default)."""
    queries: list[Query] = []
    go: Any = None
    collect: Callable[[], tuple[list[Query], float, list[str]]] | None = None
    warm_up_errors: list[str] = []
    threads: list[threading.Thread] = []
    if processes:
        go, collect = _run_in_processes(catalog_url, topics, acks, clients, seconds, client_threads)
    deadline = time.monotonic() + seconds
    if not processes:
        threads = [
            threading.Thread(
                target=client_loop,
                args=(n, ENGINES if clients == 1 else (ENGINES[n % 2],), catalog_url, topics,
                      acks, deadline, queries),
                daemon=True,
            )
            for n in range(clients)
        ]  # fmt: skip
    probe_times: list[float] = []
    if not catalog_url.startswith(PHYSICAL):  # the physical copies have no ISK to probe
        threads.append(
            threading.Thread(
                target=probe_load_tables,
                args=(catalog_url, topics, deadline, probe_times),
                daemon=True,
            )
        )
    isk_began = cpu_seconds(isk_pid) if isk_pid is not None else 0.0
    began, cpu = time.monotonic(), time.process_time()
    if go is not None:
        go.set()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if collect is not None:
        queries, client_cpu, warm_up_errors = collect()
    elapsed = time.monotonic() - began  # queries started before the deadline end after it
    isk_cpu = cpu_seconds(isk_pid) - isk_began if isk_pid is not None else None
    result = {"clients": clients, "seconds": round(elapsed, 1), **summarize(queries, elapsed)}
    if collect is None:
        # Thread clients share this process (and its GIL, and the producer's thread): its CPU
        # seconds tell whether they, not ISK, were the bottleneck.
        client_cpu = time.process_time() - cpu
        result["client_process_cpu_s"] = round(client_cpu, 1)
    count = max(len(queries), 1)
    result["client_cpu_s"] = round(client_cpu, 1)
    result["client_cpu_per_query_s"] = round(client_cpu / count, 3)
    if isk_cpu is not None:
        result["isk_cpu_s"] = round(isk_cpu, 1)
        result["isk_cpu_per_query_s"] = round(isk_cpu / count, 4)
    # ISK's own share of a query: a bare LoadTable (plain HTTP, no engine) timed meanwhile.
    result["probe_load_table"] = summarize(
        [Query("probe", "", t, 0, None) for t in probe_times], elapsed
    )
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    for engine in ENGINES:
        mine = [q for q in queries if q.engine == engine]
        result[engine] = summarize(mine, elapsed)
    # Where the tail is: each client's first query apart, and the slowest queries as (engine,
    # place in its client's sequence, seconds into the phase when it started, seconds).
    result["first_queries"] = summarize([q for q in queries if q.sequence == 0], elapsed)
    result["later_queries"] = summarize([q for q in queries if q.sequence > 0], elapsed)
    slowest = sorted(queries, key=lambda q: q.seconds)[-6:]
    result["slowest"] = [
        (q.engine, q.sequence, round(q.started - began, 1), round(q.seconds, 2)) for q in slowest
    ]
    result["rows_read"] = sum(q.rows for q in queries)
    result["errors"] = warm_up_errors + [
        f"{q.engine} {q.topic}: {q.error}" for q in queries if q.error
    ]
    kinds: dict[str, int] = {}
    for q in queries:
        if q.error:
            kind = f"{q.engine}: {q.error.replace(q.topic, '<topic>')[:90]}"
            kinds[kind] = kinds.get(kind, 0) + 1
    result["error_kinds"] = kinds
    return result


def first_loads(catalog_url: str, topics: Sequence[str]) -> float:
    """Seconds of one LoadTable of each ``merged`` table in turn (indexes built on the way)."""
    began = time.perf_counter()
    for topic in topics:
        load_table_bytes(catalog_url, topic)
    return time.perf_counter() - began


def load_table(catalog_url: str, topic: str) -> bytes:
    """The LoadTable response of ``merged.<topic>`` (its metadata inline) now."""
    url = f"{catalog_url}/v1/namespaces/merged/tables/{topic}"
    with urllib.request.urlopen(url, timeout=3600) as response:
        return response.read()


def load_table_bytes(catalog_url: str, topic: str) -> int:
    """Bytes of the LoadTable response of ``merged.<topic>`` now."""
    return len(load_table(catalog_url, topic))


def data_files(catalog_url: str, topic: str) -> int:
    """Data files of the current snapshot of ``merged.<topic>`` now (its summary's count)."""
    metadata = json.loads(load_table(catalog_url, topic))["metadata"]
    current = metadata.get("current-snapshot-id")
    for snapshot in metadata.get("snapshots", []):
        if snapshot["snapshot-id"] == current:
            return int(snapshot["summary"].get("total-data-files", 0))
    return 0


# --------------------------------------------------------------------------- the bench


@contextlib.contextmanager
def profiled(pid: int, prefix: Path | None, label: str, seconds: float) -> Iterator[None]:
    """Record ``pid`` with py-spy (collapsed stacks, GIL and idle excluded) while the block runs,
    into ``<prefix>-<label>.txt``; nothing without ``prefix``."""
    if prefix is None:
        yield
        return
    spy = str(Path(sys.executable).parent / "py-spy")
    out = Path(f"{prefix}-{label}.txt")
    recorder = subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "50",
         "--duration", str(int(seconds) + 5), "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT, not SIGTERM
        recorder.wait(30)
        print(f"profile of {label}: {out}", flush=True)


def start_isk(workdir: Path, config_text: str) -> subprocess.Popen[bytes]:
    """``bergstream run`` on ``config_text``, once it printed its ready line."""
    config = workdir / "isk.yaml"
    config.write_text(config_text)
    log = workdir / "isk.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [BERGSTREAM, "run", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, "BERGSTREAM_HOME": str(workdir / "home")},
        )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if "bergstream: ready" in log.read_text(errors="replace"):
            return process
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    process.wait()
    raise RuntimeError(f"ISK did not start:\n{log.read_text(errors='replace')[-4000:]}")


def main() -> None:
    """Run the benchmark and print its JSON summary (last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--records", type=int, default=200_000, help="per topic, before the load")
    parser.add_argument("--record-size", type=int, default=200)
    parser.add_argument("--chunk-records", type=int, default=20_000, help="ISK chunk_records")
    parser.add_argument("--rate", type=float, default=2000, help="records/s produced during load")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60, help="of the N-client phase")
    parser.add_argument("--single-seconds", type=float, default=30, help="of the 1-client phase")
    parser.add_argument("--quick", action="store_true", help="20k records, 20 s + 20 s")
    parser.add_argument(
        "--client-threads",
        type=int,
        default=1,
        help="threads of each client's engine (DuckDB's threads, PyIceberg's max-workers); 0: "
        "the engine's default, one per core (see the module doc)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="record ISK with py-spy in each phase: PREFIX-1-before.txt, PREFIX-N.txt, "
        "PREFIX-1-after.txt (collapsed stacks; py-spy must be installed)",
    )
    parser.add_argument(
        "--coalesce-files",
        type=int,
        help="ISK's coalesce_files (default: ISK's; 0 keeps every small file a load makes)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    if args.quick:
        args.records, args.chunk_records, args.seconds, args.single_seconds = 20_000, 5000, 20, 20

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchkit import create_topic, perf_produce, remove_workdir, stop_process

    from bergstream.devstack.stack import stack_down, stack_up
    from bergstream.devstack.stack.ports import free_ports

    workdir = Path(tempfile.mkdtemp(prefix="bench-isk-load-"))
    home = workdir / "home"
    process: subprocess.Popen[bytes] | None = None
    try:
        kafka = stack_up(home=home, components={"kafka"}).as_dict()["BERGSTREAM_KAFKA_BOOTSTRAP"]
        topics = [f"isk-load-{n}" for n in range(args.topics)]
        for topic in topics:
            create_topic(kafka, topic, 3)
            perf_produce(kafka, topic, args.records, args.record_size)
        ports = free_ports(3)
        cache = f'{{type: local, config: {{directory: "{workdir / "cache"}"}}}}'
        process = start_isk(
            workdir,
            isk_yaml(
                kafka, workdir, ports, args.chunk_records, cache, coalesce_files=args.coalesce_files
            ),
        )
        catalog_url = f"http://127.0.0.1:{ports[0]}"
        first_s = first_loads(catalog_url, topics)
        print(f"first loads of {len(topics)} merged tables: {first_s:.1f} s", flush=True)
        baseline = proc_status(process.pid)["VmRSS"]
        before = scrape(ports[2])
        acks = Acks.of(topics, args.records)
        phases: list[dict[str, Any]] = []
        with RssSampler(process.pid) as rss, Producer(kafka, topics, acks, args.rate):
            # One client before and after the N clients: the tables grow all along (records are
            # produced), so the N-client phase is compared with one client's at the same sizes
            # on average (before: the N clients read 1.5x the rows per query of the one client
            # that ran before them).
            plan = ((1, args.single_seconds / 2), (args.clients, args.seconds),
                    (1, args.single_seconds / 2))  # fmt: skip
            for number, (clients, seconds) in enumerate(plan):
                if number == 2:
                    time.sleep(3)  # the N client processes gone, and ISK done with their queries
                label = ("1-before", f"{clients}", "1-after")[number]
                with profiled(process.pid, args.profile, label, seconds):
                    phase = run_clients(
                        catalog_url, topics, acks, clients, seconds, processes=True,
                        isk_pid=process.pid, client_threads=args.client_threads or None,
                    )  # fmt: skip
                # What the next phase's queries read: the tables' data files now.
                phase["data_files_after"] = sum(data_files(catalog_url, t) for t in topics)
                print(f"{clients} client(s): {json.dumps(phase)[:600]}", flush=True)
                print(f"data files after it: {phase['data_files_after']}", flush=True)
                phases.append(phase)
            # The baseline: the same clients and queries on a physical copy of the tables (as
            # ISK served them now), with no ISK between clients and files; records are still
            # produced and indexed, as in the phases above.
            copies, copied = copy_physically(catalog_url, topics, workdir, args.chunk_records)
            physical_acks = Acks.fixed(copied)
            physical_phases: list[dict[str, Any]] = []
            for number, (clients, seconds) in enumerate(plan):
                if number == 2:
                    time.sleep(3)
                phase = run_clients(
                    copies.target(), topics, physical_acks, clients, seconds, processes=True,
                    client_threads=args.client_threads or None,
                )  # fmt: skip
                print(f"physical, {clients} client(s): {json.dumps(phase)[:400]}", flush=True)
                physical_phases.append(phase)
        reads = kafka_reads(before, scrape(ports[2]))
        status = proc_status(process.pid)
        load_bytes = load_table_bytes(catalog_url, topics[0])
        files_at_end = {topic: data_files(catalog_url, topic) for topic in topics}
        before, many, after = phases
        single = _combined(before, after)
        summary = {
            "topics": len(topics),
            "records_per_topic": args.records,
            "record_bytes": args.record_size,
            "chunk_records": args.chunk_records,
            "rate": args.rate,
            "client_threads": args.client_threads or "default",
            "produced_during_load": sum(acks.acked.values()) - args.records * len(topics),
            "first_loads_s": round(first_s, 2),
            "single": single | {"errors": len(single["errors"])},
            "concurrent": many | {"errors": len(many["errors"])},
            "kafka_reads_during_load": reads,
            "load_table_bytes_at_end": load_bytes,
            "data_files_at_end": files_at_end,
            "isk_rss_mb": {
                "baseline": round(baseline / 2**20, 1),
                "peak_sampled": round(rss.peak / 2**20, 1),
                "peak_hwm": round(status["VmHWM"] / 2**20, 1),
            },
            "error_examples": (single["errors"] + many["errors"])[:5],
            "producer_failures": acks.failures[:5],
        }
        # The goals (issue 34), as ratios within this run: queries/s at N clients over one
        # client's (>= 1.0), ISK's CPU per query at N over one's (<= 1.2), the N-client p99
        # over the one-client p50 (<= 16).
        summary["p99_n_to_p50_1"] = round(many["p99_ms"] / max(single["p50_ms"], 1e-9), 2)
        summary["ratio_16_to_1"] = round(many["queries_s"] / max(single["queries_s"], 1e-9), 3)
        summary["isk_cpu_per_query_ratio"] = round(
            many["isk_cpu_per_query_s"] / max(single["isk_cpu_per_query_s"], 1e-9), 3
        )
        # The same per row read (a query's work grows with its table).
        summary["rows_s_ratio"] = round(
            (many["rows_read"] / many["seconds"])
            / max(single["rows_read"] / single["seconds"], 1e-9),
            3,
        )
        summary["isk_cpu_per_row_ratio"] = round(
            (many["isk_cpu_s"] / max(many["rows_read"], 1))
            / max(single["isk_cpu_s"] / max(single["rows_read"], 1), 1e-12),
            3,
        )
        physical_single = _combined(physical_phases[0], physical_phases[2])
        physical_many = physical_phases[1]
        summary["physical"] = {
            "rows": copied,
            "single": physical_single | {"errors": len(physical_single["errors"])},
            "concurrent": physical_many | {"errors": len(physical_many["errors"])},
            "p99_n_to_p50_1": round(
                physical_many["p99_ms"] / max(physical_single["p50_ms"], 1e-9), 2
            ),
            "ratio_16_to_1": round(
                physical_many["queries_s"] / max(physical_single["queries_s"], 1e-9), 3
            ),
        }
        print(
            f"physical copies, no ISK ({args.clients} clients / 1): queries/s "
            f"{summary['physical']['ratio_16_to_1']}, p99 over one client's p50 "
            f"{summary['physical']['p99_n_to_p50_1']}"
        )
        print(
            f"{args.clients} clients / 1: queries/s {summary['ratio_16_to_1']} (goal >= 1.0), "
            f"ISK CPU per query {summary['isk_cpu_per_query_ratio']} (goal <= 1.2), p99 over "
            f"one client's p50 {summary['p99_n_to_p50_1']} (goal <= 16); per row read: rows/s "
            f"{summary['rows_s_ratio']}, ISK CPU {summary['isk_cpu_per_row_ratio']}"
        )
        print(json.dumps(summary))
        if physical_single["errors"] or physical_many["errors"]:
            raise SystemExit("errors on the physical copies (see physical's errors)")
        if single["errors"] or many["errors"] or acks.failures:
            raise SystemExit("errors during the load (see error_examples)")
    finally:
        stop_process(process)
        stack_down(home=home)
        remove_workdir(workdir, args.keep)


if __name__ == "__main__":
    main()
