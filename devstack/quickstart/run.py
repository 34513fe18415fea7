"""``bergstream quickstart``: one dataset through Kafka and Iceberg, end to end, on real components.

It starts the local stack, registers the payment's Avro schema in its Schema Registry, fills a
``payments`` topic with a day of payments (Avro values in Confluent framing), copies the older
part into the Iceberg coldset with the lake pipeline, deletes that part from Kafka as retention
would, starts ISK and KSI (``bergstream run`` on a generated config, left running), and then shows
a DuckDB query over the ``merged`` namespace covering cold and hot data (the value's fields are
plain columns: it sums ``amount`` per ``currency``), a record produced now in the next query, and
a Kafka consumer reading through KSI from offset 0 across the boundary, byte for byte.

Spark, ISK and KSI run in ``bergstream`` subprocesses, so this module imports no plugin; the
config it writes for them is first checked against the installed plugins as ``bergstream config
check`` does (:func:`~bergstream.devstack.quickstart.config.write_checked_config`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from bergstream.devstack.quickstart.clients import (
    MissingExtraError,
    SqlSession,
    read_from_offset_zero,
    require_quickstart_extra,
)
from bergstream.devstack.quickstart.config import (
    ISK_ACCESS_KEY,
    ISK_SECRET_KEY,
    quickstart_config,
    write_checked_config,
)
from bergstream.devstack.quickstart.data import (
    Payment,
    customer_key,
    delete_below,
    kafka_offsets,
    payments,
    produce_one,
    produce_payments,
    recreate_topic,
)
from bergstream.devstack.quickstart.ports import QuickstartPorts, choose_ports
from bergstream.devstack.quickstart.schema import PaymentCodec, PaymentFields
from bergstream.devstack.stack.trino import TRINO_VERSION, iceberg_rest_catalog_properties

__all__ = [
    "NAMESPACE",
    "QuickstartError",
    "QuickstartOptions",
    "QuickstartResult",
    "run_quickstart",
]

#: The ISK namespace the demo queries: coldset plus the hotset beyond the boundary.
NAMESPACE = "merged"
#: Name of the ``bergstream run`` process recorded with the stack (``stack down`` stops it).
RUN_NAME = "quickstart"
_READY = "bergstream: ready"
#: What a Spark user adds to read through ISK (the versions the pipeline pins in pipeline/jars.py).
SPARK_PACKAGES = (
    "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.11.0,"
    "org.apache.iceberg:iceberg-aws-bundle:1.11.0"
)
_PIPELINE_LINES = ("copying topic", "batch ", "done:", "warning:")
_INDENT = "      "

Echo = Callable[[str], None]


class QuickstartError(RuntimeError):
    """A quickstart step failed; the message says which and where its log is."""


@dataclass(frozen=True)
class QuickstartOptions:
    """What the quickstart produces and where it listens."""

    records: int = 300_000
    hours: float = 24.0
    cold_fraction: float = 0.7
    partitions: int = 3
    topic: str = "payments"
    catalog_port: int | None = None
    s3_port: int | None = None
    proxy_port: int | None = None


@dataclass
class QuickstartResult:
    """The numbers the quickstart printed."""

    produced: int = 0
    cold: int = 0
    hot: int = 0
    boundary: dict[int, int] = field(default_factory=dict)
    merged_rows: int = 0
    merged_cold_rows: int = 0
    live_visible_after_queries: int = 0
    typed_rows: int = 0
    ksi_records: int = 0
    ksi_from_coldset: int = 0
    ksi_identical: int = 0
    seconds: float = 0.0


@dataclass
class _Ledger:
    """What was produced: every value (to compare what KSI returns byte for byte), and the
    count and total amount in cents per currency (to check the DuckDB sums)."""

    values: set[bytes] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    cents: Counter[str] = field(default_factory=Counter)

    def note(self, record: Payment) -> None:
        """Note one record produced."""
        self.values.add(record.value)
        self.counts[record.fields.currency] += 1
        self.cents[record.fields.currency] += record.fields.amount_cents

    def record(self, records: Iterable[Payment]) -> Iterator[Payment]:
        """Pass ``records`` through, noting each."""
        for record in records:
            self.note(record)
            yield record


class _Steps:
    """Numbered step lines with their duration: ``[3/9] title`` ... ``done in 4.2 s``; a step
    silent for ``quiet_seconds`` says it is still working (and ``hint``, e.g. why it may take
    long)."""

    def __init__(self, total: int, echo: Echo, quiet_seconds: float = 20.0) -> None:
        self.total = total
        self.index = 0
        self.echo = echo
        self.quiet_seconds = quiet_seconds

    @contextlib.contextmanager
    def step(self, title: str, hint: str = "") -> Iterator[Echo]:
        self.index += 1
        self.echo(f"[{self.index}/{self.total}] {title}")
        started = last = time.monotonic()
        finished = threading.Event()

        def say(line: str) -> None:
            nonlocal last
            last = time.monotonic()
            self.echo(_INDENT + line)

        def heartbeat() -> None:
            while not finished.wait(1.0):
                if time.monotonic() - last >= self.quiet_seconds:
                    say(f"... still working, {time.monotonic() - started:.0f} s{hint}")

        beating = threading.Thread(target=heartbeat, daemon=True)
        beating.start()
        try:
            yield say
        finally:
            finished.set()
            beating.join()
        self.echo(f"{_INDENT}done in {time.monotonic() - started:.1f} s")


def _bergstream() -> str:
    beside = Path(sys.executable).parent / "bergstream"
    if beside.is_file():
        return str(beside)
    found = shutil.which("bergstream")
    if found is None:
        raise QuickstartError("the `bergstream` command is not on PATH; install bergstream")
    return found


def _offsets(offsets: dict[int, int]) -> str:
    return " ".join(f"p{p}={o:,}" for p, o in sorted(offsets.items()))


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


# --------------------------------------------------------------------------- the pipeline


def _run_pipeline(config: Path, topic: str, log: Path, say: Echo) -> dict[str, object]:
    """``bergstream pipeline run --once`` as a subprocess; its progress lines are shown, every
    line goes to ``log``; returns its JSON summary."""
    env = {**os.environ}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    argv = [_bergstream(), "pipeline", "run", "-c", str(config), "--topic", topic, "--once"]
    log.parent.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"==== {' '.join(argv)}\n")
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        stdout: list[str] = []
        reader = threading.Thread(target=lambda: stdout.extend(process.stdout or ()), daemon=True)
        reader.start()
        assert process.stderr is not None
        for line in process.stderr:
            out.write(line)
            tail = [*tail[-39:], line.rstrip()]
            if line.startswith(_PIPELINE_LINES):
                say("pipeline: " + line.rstrip())
        code = process.wait()
        reader.join()
        out.writelines(stdout)
    if code != 0:
        raise QuickstartError(
            f"the lake pipeline failed (exit {code}); full log: {log}\n" + "\n".join(tail)
        )
    summaries = [line for line in stdout if line.startswith("{")]
    if not summaries:
        raise QuickstartError(f"the lake pipeline printed no summary; full log: {log}")
    summary: dict[str, object] = json.loads(summaries[-1])
    return summary


# --------------------------------------------------------------------------- ISK + KSI


def _start_run(config: Path, home: Path, cwd: Path, timeout: float = 120) -> int:
    """Start ``bergstream run -c config`` detached (it outlives this command), record it with
    the stack so ``stack down`` stops it, and wait for its ready line; returns its PID."""
    from bergstream.devstack.stack import attach_process
    from bergstream.devstack.stack.procs import pid_alive, spawn_detached

    log = home / "logs" / "quickstart-run.log"
    start = log.stat().st_size if log.exists() else 0
    argv = [_bergstream(), "run", "-c", str(config)]
    pid = spawn_detached(argv, cwd=cwd, log_file=log, env=dict(os.environ))
    attach_process(RUN_NAME, pid, cwd, log, argv, comm="bergstream", home=home)
    deadline = time.monotonic() + timeout
    while True:
        with open(log, encoding="utf-8", errors="replace") as text:
            text.seek(start)
            written = text.read()
        if _READY in written:
            return pid
        if not pid_alive(pid):
            raise QuickstartError(f"`bergstream run -c {config}` exited:\n{written[-3000:]}")
        if time.monotonic() > deadline:
            raise QuickstartError(
                f"`bergstream run -c {config}` not ready after {timeout:.0f} s; log: {log}"
            )
        time.sleep(0.2)


# --------------------------------------------------------------------------- the demo


def _table(topic: str) -> str:
    return f'isk.{NAMESPACE}."{topic}"'


def _count_sql(topic: str, boundary: dict[int, int]) -> str:
    values = ", ".join(f"({p}, {o})" for p, o in sorted(boundary.items()))
    return (
        f"WITH boundary(kafka_partition, next_offset) AS (VALUES {values})\n"
        "SELECT count(*) AS total_rows,\n"
        "       count(*) FILTER (WHERE kafka_offset < next_offset) AS cold_rows,\n"
        "       epoch_ms(min(kafka_timestamp)) AS oldest, "
        "epoch_ms(max(kafka_timestamp)) AS newest\n"
        f"FROM {_table(topic)} JOIN boundary USING (kafka_partition)"
    )


def _namespaces_sql(topic: str) -> str:
    return "\nUNION ALL ".join(
        f"SELECT '{namespace}' AS namespace, count(*) AS total_rows "
        f'FROM isk.{namespace}."{topic}"'
        for namespace in ("coldset", "hotset", "merged")
    )


def _currency_sql(topic: str) -> str:
    return (
        "SELECT currency, count(*) AS payments, sum(amount) AS amount\n"
        f"FROM {_table(topic)} GROUP BY currency ORDER BY currency"
    )


def _typed_sql(topic: str, boundary: dict[int, int]) -> str:
    values = ", ".join(f"({p}, {o})" for p, o in sorted(boundary.items()))
    return (
        f"WITH boundary(kafka_partition, next_offset) AS (VALUES {values})\n"
        "SELECT count(amount) AS typed_rows,\n"
        "       count(amount) FILTER (WHERE kafka_offset < next_offset) AS typed_cold,\n"
        "       count(kafka_value) AS kept_bytes, min(kafka_value_schema_id) AS schema_id\n"
        f"FROM {_table(topic)} JOIN boundary USING (kafka_partition)"
    )


def _live_sql(topic: str, payment_id: str) -> str:
    return (
        "SELECT count(*) AS total_rows,\n"
        f"       count(*) FILTER (WHERE id = '{payment_id}') AS found\n"
        f"FROM {_table(topic)}"
    )


def _show_sql(sql: str, say: Echo) -> None:
    for number, line in enumerate(sql.splitlines()):
        say(("SQL> " if number == 0 else "     ") + line)


async def _query_counts(
    session: SqlSession, topic: str, result: QuickstartResult, ledger: _Ledger, say: Echo
) -> int:
    """Count the table's rows, split at the boundary, show that every row has the value's
    fields as columns, and sum payments per currency (checked against what was produced)."""
    count_sql = _count_sql(topic, result.boundary)
    _show_sql(count_sql, say)
    rows, cold_rows, oldest, newest = (await asyncio.to_thread(session.rows, count_sql))[0]
    result.merged_rows, result.merged_cold_rows = rows, cold_rows
    say(
        f"{rows:,} rows = {cold_rows:,} cold (from the coldset) + {rows - cold_rows:,} hot "
        f"(from Kafka); produced {result.produced:,}"
    )
    if rows:
        say(f"record timestamps {_when(oldest)} .. {_when(newest)}")
    namespaces_sql = _namespaces_sql(topic)
    _show_sql(namespaces_sql, say)
    counts = dict(await asyncio.to_thread(session.rows, namespaces_sql))
    say(
        f"coldset {counts['coldset']:,} (the pipeline's table) + hotset {counts['hotset']:,} "
        f"(what Kafka still holds) = merged {counts['merged']:,}"
    )
    typed_sql = _typed_sql(topic, result.boundary)
    _show_sql(typed_sql, say)
    typed, typed_cold, kept, schema_id = (await asyncio.to_thread(session.rows, typed_sql))[0]
    result.typed_rows = typed
    say(
        f"{typed:,} rows have the Avro value's fields as columns ({typed_cold:,} cold, "
        f"{typed - typed_cold:,} hot), schema id {schema_id}; {kept:,} kept as raw bytes"
    )
    _check_typed(rows, cold_rows, typed, typed_cold, kept)
    currency_sql = _currency_sql(topic)
    _show_sql(currency_sql, say)
    sums = await asyncio.to_thread(session.rows, currency_sql)
    for currency, count, amount in sums:
        say(f"  {currency}  {count:>9,} payments  {amount:>16,.2f}")
    expected = {
        (currency, ledger.counts[currency], Decimal(ledger.cents[currency]).scaleb(-2))
        for currency in ledger.counts
    }
    if {(currency, count, Decimal(amount)) for currency, count, amount in sums} != expected:
        raise QuickstartError(
            f"DuckDB's totals per currency {sums} differ from the payments produced {expected}"
        )
    say("the same counts and totals as the payments produced, to the cent")
    return int(rows)


def _check_typed(rows: int, cold_rows: int, typed: int, typed_cold: int, kept: int) -> None:
    """Every row must have the value's columns, and no bytes kept beside them (the values were
    encoded canonically); else say which side failed and where its log is."""
    problems = []
    if typed_cold != cold_rows:
        problems.append(
            f"{cold_rows - typed_cold:,} of {cold_rows:,} cold rows lack the value's columns: "
            "the lake pipeline did not decode them (log: quickstart-pipeline.log)"
        )
    if typed - typed_cold != rows - cold_rows:
        problems.append(
            f"{rows - cold_rows - typed + typed_cold:,} of {rows - cold_rows:,} hot rows lack "
            "the value's columns: ISK did not decode them (log: quickstart-run.log)"
        )
    if kept and not problems:
        problems.append(f"{kept:,} rows kept their bytes, yet every value is canonical Avro")
    if problems:
        raise QuickstartError("; ".join(problems))


async def _live_record(
    session: SqlSession,
    topic: str,
    proxy: str,
    rows: int,
    result: QuickstartResult,
    codec: PaymentCodec,
    ledger: _Ledger,
    say: Echo,
) -> None:
    """Produce one payment (Avro) through the KSI proxy and query until it shows (at most
    60 s)."""
    now_ms = int(time.time() * 1000)
    live_id = f"pay-live-{now_ms}"
    fields = PaymentFields(
        id=live_id,
        customer=0,
        amount_cents=4200,
        currency="EUR",
        method="card",
        paid_at_ms=now_ms,
    )
    live = Payment(
        index=result.produced,
        partition=0,
        timestamp_ms=now_ms,
        key=customer_key(0),
        value=codec.encode([fields])[0],
        headers=(("source", b"bergstream-quickstart"),),
        fields=fields,
    )
    ledger.note(live)
    partition, offset = await produce_one(proxy, topic, live)
    acked = time.perf_counter()
    say(f"produced {live_id} through {proxy}: partition {partition}, offset {offset:,}, acked")
    live_sql = _live_sql(topic, live_id)
    _show_sql(live_sql, say)
    found, attempts, now_rows, started, took = 0, 0, 0, 0.0, 0.0
    while not found and time.perf_counter() < acked + 60:
        attempts += 1
        started = time.perf_counter() - acked
        now_rows, found = (await asyncio.to_thread(session.rows, live_sql))[0]
        took = time.perf_counter() - acked - started
    if not found:
        raise QuickstartError(f"{live_id} did not appear in {attempts} queries within 60 s")
    result.live_visible_after_queries = attempts
    which = "the next query" if attempts == 1 else f"query {attempts} after the ack"
    say(
        f"{which} (started {started * 1000:.0f} ms after the ack, took {took * 1000:.0f} ms) "
        f"sees it: {now_rows:,} rows (+{now_rows - rows})"
    )


def _instructions(
    ports: QuickstartPorts, topic: str, config: Path, codec: PaymentCodec, registry: str, echo: Echo
) -> None:
    catalog = f"http://127.0.0.1:{ports.catalog}"
    table = f"{NAMESPACE}.{topic}"
    lines = [
        "",
        "Connect your own tools (ISK and KSI keep running):",
        "",
        f"  Kafka clients: bootstrap 127.0.0.1:{ports.proxy} (KSI: offset 0 onwards, cold and hot)",
        f"    kcat -b 127.0.0.1:{ports.proxy} -C -t {topic} -o beginning -e -c 5 "
        "-f '%p %o %k %S bytes\\n'",
        f"  Values are Avro in Confluent framing, schema id {codec.schema_id} (subject "
        f"{codec.subject}) in the Schema Registry",
        f"    {registry}  (for Avro deserializers, e.g. confluent-kafka's AvroDeserializer)",
        "",
        "  DuckDB 1.5.5 (online: INSTALL iceberg; LOAD iceberg; offline: LOAD the files of the",
        "  duckdb-extension-{parquet,avro,httpfs,iceberg} wheels, in that order):",
        f"    {SqlSession.attach_sql(catalog)};",
        f"    SELECT count(*) FROM isk.{table};",
        f"    SELECT currency, sum(amount) FROM isk.{table} GROUP BY currency;",
        "",
        "  PyIceberg:",
        "    from pyiceberg.catalog.rest import RestCatalog",
        f'    catalog = RestCatalog("isk", uri="{catalog}")',
        f'    catalog.load_table("{table}").scan().to_arrow()',
        "",
        "  Spark 4.0 (pip install pyspark==4.0.0; the jars come from Maven Central):",
        f"    pyspark --packages {SPARK_PACKAGES} \\",
        "      --conf spark.sql.catalog.isk=org.apache.iceberg.spark.SparkCatalog \\",
        "      --conf spark.sql.catalog.isk.type=rest \\",
        f"      --conf spark.sql.catalog.isk.uri={catalog} \\",
        "      --conf spark.sql.catalog.isk.io-impl=org.apache.iceberg.aws.s3.S3FileIO \\",
        "      --conf spark.sql.catalog.isk.cache-enabled=false",
        f'    >>> spark.sql("SELECT count(*) FROM isk.{table}").show()',
        "",
        f"  Trino {TRINO_VERSION} (on Java 24+), etc/catalog/isk.properties (the S3 keys are "
        "vended with each table;",
        "  Trino takes the S3 endpoint, region and path-style addressing only from here):",
        *(
            f"    {key}={value}"
            for key, value in iceberg_rest_catalog_properties(
                catalog, f"http://127.0.0.1:{ports.s3}"
            ).items()
        ),
        f"    trino> SELECT count(*) FROM isk.{table};",
        "",
        f"  S3 gateway: http://127.0.0.1:{ports.s3}, region us-east-1; each LoadTable vends "
        "a key, secret and session token for that table's files only, expiring in an hour;",
        f"  the operator's root key (never vended) is {ISK_ACCESS_KEY} / {ISK_SECRET_KEY}",
        f"  Namespaces: hotset (Kafka only), coldset (the pipeline's table), "
        f"merged (both); config: {config}",
        "",
        "Stop everything with: bergstream stack down",
    ]
    for line in lines:
        echo(line)


async def run_quickstart(options: QuickstartOptions, echo: Echo) -> QuickstartResult:
    """Run the quickstart, printing numbered steps through ``echo``; returns the numbers shown.
    The stack and the ``bergstream run`` process of ISK and KSI keep running afterwards."""
    from bergstream.devstack.stack import StackPaths, stack_up, stop_attached

    began = time.perf_counter()
    try:
        extensions = require_quickstart_extra()
    except MissingExtraError as error:
        raise QuickstartError(str(error)) from None
    result = QuickstartResult()
    topic, parts = options.topic, options.partitions
    total = options.records
    cold = int(total * options.cold_fraction)
    span_ms = int(options.hours * 3_600_000)
    first_ms = int(time.time() * 1000) - span_ms
    paths = StackPaths.resolve()
    workdir = paths.home / "quickstart"
    config_path = paths.home / "quickstart.yaml"
    steps = _Steps(9, echo)
    ledger = _Ledger()
    echo(f"bergstream quickstart in {paths.home}")

    with steps.step(
        "Start the local stack: Kafka (KRaft), SeaweedFS S3, Redis, Schema Registry (Apicurio)",
        " (a first run downloads Kafka's jars and Apicurio Registry from Maven Central)",
    ) as say:
        env = await asyncio.to_thread(stack_up, paths.home)
        os.environ.update(env.as_dict())
        kafka, registry_url = env.kafka_bootstrap, env.schema_registry_url
        assert kafka is not None and registry_url is not None
        if stop_attached(paths.home, {RUN_NAME}):
            say("stopped the previous quickstart's ISK and KSI")
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        say(f"Kafka {kafka}, S3 {env.s3_endpoint}, Redis {env.redis_url}")
        say(f"Schema Registry {registry_url}")

    ports = choose_ports(options.catalog_port, options.s3_port, options.proxy_port)
    config = write_checked_config(
        config_path, quickstart_config(kafka, registry_url, topic, ports, workdir)
    )
    proxy = f"127.0.0.1:{ports.proxy}"
    catalog_url = f"http://127.0.0.1:{ports.catalog}"

    with steps.step(
        f"Register the Avro schema; produce the older {cold:,} payments of the last "
        f"{options.hours:g} h"
    ) as say:
        codec = await asyncio.to_thread(PaymentCodec.register, config, topic, paths.home)
        say(
            f"Avro schema registered under subject {codec.subject}: schema id {codec.schema_id} "
            "(id, customer, amount decimal(12,2), currency, method, paid_at timestamp-millis)"
        )
        await recreate_topic(kafka, topic, parts)
        result.cold = await produce_payments(
            kafka,
            topic,
            ledger.record(payments(0, cold, total, first_ms, span_ms, parts, codec.encode)),
        )
        newest = first_ms + (cold - 1) * span_ms // total
        say(
            f"topic '{topic}' ({parts} partitions, retention.ms=-1): {result.cold:,} records, "
            f"CreateTime {_when(first_ms)} .. {_when(newest)}, keys, headers, values Avro "
            f"in Confluent framing (magic byte 0, schema id {codec.schema_id})"
        )

    with steps.step(
        "Copy them into the Iceberg coldset with the lake pipeline (Spark)",
        " (a first run downloads Spark's jars from Maven Central)",
    ) as say:
        summary = await asyncio.to_thread(
            _run_pipeline, config_path, topic, paths.home / "logs" / "quickstart-pipeline.log", say
        )
        raw_boundary = summary.get("boundary")
        assert isinstance(raw_boundary, dict)
        result.boundary = {int(p): int(o) for p, o in raw_boundary.items()}
        copied = summary.get("records")
        if copied != result.cold:
            raise QuickstartError(f"the pipeline copied {copied} records, not {result.cold:,}")
        say(
            f"coldset.{topic}: {result.cold:,} rows; boundary (next offset per partition) "
            f"{_offsets(result.boundary)}"
        )

    with steps.step(f"Produce the newer {total - cold:,} payments (they stay in Kafka)") as say:
        result.hot = await produce_payments(
            kafka,
            topic,
            ledger.record(payments(cold, total, total, first_ms, span_ms, parts, codec.encode)),
        )
        result.produced = result.cold + result.hot
        _, ends = await kafka_offsets(kafka, topic, parts)
        say(
            f"{result.hot:,} records up to {_when(first_ms + span_ms)}; "
            f"end offsets {_offsets(ends)}"
        )

    with steps.step("Delete the copied records from Kafka, as retention would") as say:
        log_start = await delete_below(kafka, topic, result.boundary)
        say(f"DeleteRecords: Kafka's log start is now {_offsets(log_start)}")
        say(f"offsets below it exist only in the coldset; Kafka holds {result.hot:,} records")

    with steps.step("Start ISK (Iceberg REST catalog + S3 gateway) and KSI (Kafka proxy)") as say:
        if ports.moved:
            say(f"port(s) taken, moved to free ones: {', '.join(ports.moved)}")
        pid = await asyncio.to_thread(_start_run, config_path, paths.home, workdir)
        say(f"bergstream run -c {config_path}  (pid {pid}, log {paths.logs}/quickstart-run.log)")
        say(f"ISK catalog {catalog_url}, S3 gateway http://127.0.0.1:{ports.s3}, KSI proxy {proxy}")

    session = await asyncio.to_thread(SqlSession, catalog_url, extensions)
    try:
        with steps.step(f"Query {NAMESPACE}.{topic} with DuckDB through ISK") as say:
            rows = await _query_counts(session, topic, result, ledger, say)
        with steps.step("Produce one payment now through KSI; query again") as say:
            await _live_record(session, topic, proxy, rows, result, codec, ledger, say)
    finally:
        session.close()

    with steps.step("Consume through KSI from offset 0 with a plain Kafka consumer") as say:
        kafka_start, ends = await kafka_offsets(kafka, topic, parts)
        read = await read_from_offset_zero(proxy, topic, ends, kafka_start)
        result.ksi_records, result.ksi_from_coldset = read.records, read.below_log_start
        firsts = " ".join(f"p{p}={read.first.get(p, '-')}" for p in range(parts))
        lasts = _offsets({p: read.last[p] for p in read.last})
        say(
            f"aiokafka at {proxy}, auto_offset_reset=earliest: {read.records:,} records in "
            f"{read.seconds:.1f} s, first offsets {firsts}, last {lasts}, {read.gaps} gaps"
        )
        say(
            f"{read.below_log_start:,} records below Kafka's log start ({_offsets(kafka_start)}) "
            f"came from the coldset, {read.records - read.below_log_start:,} from Kafka"
        )
        result.ksi_identical = sum(1 for value in read.values if value in ledger.values)
        decoded = await asyncio.to_thread(codec.decode, read.values)
        ids = decoded.payments.field("id").unique()
        say(
            f"{result.ksi_identical:,} values byte-identical to those produced; decoded as "
            f"Avro (schema id {codec.schema_id}): {len(ids):,} distinct payment ids, "
            f"{decoded.other_schema:,} of another schema, {decoded.undecodable:,} undecodable"
        )

    result.seconds = time.perf_counter() - began
    echo(f"quickstart finished in {result.seconds:.0f} s")
    _instructions(ports, topic, config_path, codec, registry_url, echo)
    return result
