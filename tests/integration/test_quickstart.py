"""The README's first command, as a user runs it, on a fresh BERGSTREAM_HOME; plus the pieces
it is built from (ports, generated config, the payments' Avro values and their schema in the
registry, the attached ``bergstream run``, the extra check)."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest

from bergstream.core.api import (
    RegisteredSchema,
    SchemaRegistryClient,
    ServiceContext,
    TopicCodecsResolver,
)
from bergstream.core.config import load_config
from bergstream.core.plugins import load_registry
from bergstream.core.typed.schema_registry import SchemaRegistrySettings
from bergstream.devstack.quickstart.clients import (
    MissingExtraError,
    duckdb_extension_paths,
    offline_duckdb,
)
from bergstream.devstack.quickstart.config import (
    QuickstartConfigError,
    quickstart_config,
    write_checked_config,
    write_config,
)
from bergstream.devstack.quickstart.data import kafka_offsets, payments
from bergstream.devstack.quickstart.ports import PROXY_PORTS, QuickstartPorts, choose_ports
from bergstream.devstack.quickstart.schema import (
    CURRENCIES,
    PAYMENT_SCHEMA,
    PaymentCodec,
    PaymentFields,
)
from bergstream.devstack.stack import attach_process, attached_processes, stack_down
from bergstream.devstack.stack.ports import free_port_block, free_ports, port_is_open
from bergstream.devstack.stack.procs import pid_alive, spawn_detached
from bergstream.devstack.stack.trino import TrinoServer, create_catalog_sql
from tests.support import REPO

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
#: A registry URL for configs that are only written and checked (nothing contacts it).
REGISTRY_URL = "http://127.0.0.1:8081/apis/ccompat/v7"


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _search(pattern: str, out: str) -> re.Match[str]:
    match = re.search(pattern, out)
    assert match, f"no line matching {pattern!r} in:\n{out}"
    return match


# --------------------------------------------------------------------------- the pieces


def test_taken_ports_are_replaced_by_free_ones() -> None:
    catalog, s3 = free_ports(2)
    proxy = free_port_block(PROXY_PORTS)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", proxy + 2))  # one of the proxy's broker ports
        holder.listen()
        chosen = choose_ports(catalog, s3, proxy)
    assert (chosen.catalog, chosen.s3) == (catalog, s3)
    assert chosen.proxy != proxy and chosen.moved == ("proxy",)
    taken = set(range(chosen.proxy, chosen.proxy + PROXY_PORTS))
    assert not {chosen.catalog, chosen.s3} & taken


def test_ports_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another process of the run may take a free port before choose_ports checks it (then it
    # is rightly moved): a few fresh attempts, one of which must keep every port asked for.
    results = []
    for _attempt in range(5):
        catalog, s3 = free_ports(2)
        proxy = free_port_block(PROXY_PORTS)
        monkeypatch.setenv("BERGSTREAM_ISK_CATALOG_PORT", str(catalog))
        monkeypatch.setenv("BERGSTREAM_ISK_S3_PORT", str(s3))
        monkeypatch.setenv("BERGSTREAM_PROXY_PORT", str(proxy))
        results.append((choose_ports(), QuickstartPorts(catalog, s3, proxy)))
        if results[-1][0] == results[-1][1]:
            break
    assert results[-1][0] == results[-1][1], results
    monkeypatch.setenv("BERGSTREAM_PROXY_PORT", "nineteen")
    with pytest.raises(ValueError, match="BERGSTREAM_PROXY_PORT"):
        choose_ports()


def test_generated_config_is_valid_for_the_installed_plugins(tmp_path: Path) -> None:
    ports = QuickstartPorts(18181, 19000, 19092)
    path = write_config(
        tmp_path / "quickstart.yaml",
        quickstart_config(
            "127.0.0.1:9092", REGISTRY_URL, "payments", ports, tmp_path / "quickstart"
        ),
    )
    config = load_config(path, registry=load_registry())
    assert config.codecs.schema_registry is not None
    assert config.codecs.schema_registry.url == REGISTRY_URL
    [rule] = config.codecs.topics
    assert (rule.match, rule.value, rule.key) == ("payments", "registry", "raw")
    assert rule.value_subject_for("payments") == "payments-value"
    assert [c.name for c in config.virtual_clusters] == ["ksi"]
    assert config.virtual_clusters[0].gateway.port == 19092
    assert [s.type for s in config.services] == ["isk"]
    assert config.lake is not None and config.lake.namespace == "coldset"
    assert str(tmp_path / "quickstart" / "lake") in str(config.lake.catalog.uri)


def test_written_config_is_checked_like_config_check(tmp_path: Path) -> None:
    ports = QuickstartPorts(18181, 19000, 19092)
    config = quickstart_config(
        "127.0.0.1:9092", REGISTRY_URL, "payments", ports, tmp_path / "quickstart"
    )
    path = tmp_path / "quickstart.yaml"
    loaded = write_checked_config(path, config)
    assert loaded.source == str(path)
    assert [f.type for f in loaded.virtual_clusters[0].filters] == ["ksi"]
    assert loaded.virtual_clusters[0].filters[0].settings is not None
    assert loaded.services[0].settings is not None

    # Keys the plugins do not accept, as after a plugin renamed a setting: the quickstart stops
    # with every problem before it starts anything on the file.
    broken: dict[str, Any] = json.loads(json.dumps(config))
    broken["virtual_clusters"][0]["filters"][0]["config"]["read_ahead"] = 2
    broken["services"][0]["config"]["chunk_records"] = "many"
    broken["codecs"]["topics"][0]["value"] = "avroo"
    with pytest.raises(QuickstartConfigError) as raised:
        write_checked_config(path, broken)
    problems = raised.value.problems
    assert len(problems) == 3, problems
    assert any("virtual_clusters[0].filters[0].config.read_ahead" in p for p in problems)
    assert any("services[0].config.chunk_records" in p for p in problems)
    assert any("codecs.topics[0].value" in p and "avroo" in p for p in problems)
    assert "does not pass `bergstream config check`" in str(raised.value)
    assert str(path) in str(raised.value)


def _local_codec(tmp_path: Path, schema_id: int = 7) -> PaymentCodec:
    """The payment codec the quickstart config picks for its topic, on a schema given here
    (no registry is contacted)."""
    ports = QuickstartPorts(18181, 19000, 19092)
    config = write_checked_config(
        tmp_path / "quickstart.yaml",
        quickstart_config("127.0.0.1:9092", REGISTRY_URL, "payments", ports, tmp_path / "qs"),
    )
    resolver = TopicCodecsResolver(ServiceContext(config, load_registry(), tmp_path))
    codecs = resolver.for_topic("payments")
    assert codecs is not None and codecs.value is not None
    schema = RegisteredSchema(schema_id, "AVRO", json.dumps(PAYMENT_SCHEMA))
    codec = codecs.value.codec_for(schema)
    assert codec is not None
    return PaymentCodec(schema, codec, "payments-value")


def _avro(value: bytes, schema_id: int = 7) -> dict[str, Any]:
    """A framed value decoded by fastavro, independently of the codec under test."""
    assert value[0] == 0 and int.from_bytes(value[1:5], "big") == schema_id
    record: dict[str, Any] = fastavro.schemaless_reader(
        io.BytesIO(value[5:]), fastavro.parse_schema(PAYMENT_SCHEMA), None
    )
    return record


def test_payments_are_avro_spread_over_the_span_keyed_by_partition(tmp_path: Path) -> None:
    codec = _local_codec(tmp_path)
    records = list(
        payments(
            0, 30_500, 30_500, first_ms=1_000, span_ms=3_000_000, partitions=3, encode=codec.encode
        )
    )
    stamps = [r.timestamp_ms for r in records]
    assert stamps == sorted(stamps) and stamps[0] == 1_000 and stamps[-1] < 3_001_000
    by_key: dict[bytes, set[int]] = {}
    for record in records[::97]:
        value = _avro(record.value)
        fields = record.fields
        assert value["id"] == fields.id == f"pay-{record.index:07d}"
        assert value["amount"] == Decimal(fields.amount_cents).scaleb(-2)
        assert (value["customer"], value["currency"], value["method"]) == (
            fields.customer,
            fields.currency,
            fields.method,
        )
        assert value["paid_at"] == datetime.fromtimestamp(record.timestamp_ms / 1000, UTC)
        assert dict(record.headers)["source"] == b"bergstream-quickstart"
    for record in records:
        by_key.setdefault(record.key, set()).add(record.partition)
    assert all(len(parts) == 1 for parts in by_key.values())
    assert {r.partition for r in records} == {0, 1, 2}
    assert {r.fields.currency for r in records} == set(CURRENCIES)
    assert len({r.value for r in records}) == len(records)
    # The same payments every run: the demo's totals do not change.
    again = payments(
        0, 10, 30_500, first_ms=1_000, span_ms=3_000_000, partitions=3, encode=codec.encode
    )
    assert [r.value for r in again] == [r.value for r in records[:10]]


def test_payment_values_decode_back_and_foreign_ones_are_counted(tmp_path: Path) -> None:
    codec = _local_codec(tmp_path)
    fields = [
        PaymentFields("pay-a", 1, 123_456_789_012, "CHF", "sepa", 1_700_000_000_123),
        PaymentFields("pay-b", 2**40, 1, "SEK", "wallet", 0),
        PaymentFields("pay-c", 0, 0, "EUR", "card", 1_800_000_000_000),
    ]
    values = codec.encode(fields)
    assert [_avro(v)["amount"] for v in values] == [
        Decimal("1234567890.12"),
        Decimal("0.01"),
        Decimal("0.00"),
    ]
    other = b"\x00\x00\x00\x00\x08" + values[0][5:]  # framed with another schema id
    truncated = values[1][:-3]
    decoded = codec.decode([*values, other, b"{}", truncated])
    assert (decoded.other_schema, decoded.undecodable) == (2, 1)
    rows = decoded.payments.to_pylist()
    assert [row["id"] for row in rows] == ["pay-a", "pay-b", "pay-c"]
    assert rows[1]["customer"] == 2**40 and rows[0]["amount"] == Decimal("1234567890.12")
    assert rows[0]["paid_at"] == datetime.fromtimestamp(1_700_000_000.123, UTC)


@pytest.mark.slow
def test_payment_schema_is_registered_in_the_stack_registry(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    config = write_checked_config(
        tmp_path / "quickstart.yaml",
        quickstart_config(
            stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"],
            registry_url,
            topic,
            QuickstartPorts(18181, 19000, 19092),
            tmp_path / "qs",
        ),
    )
    codec = PaymentCodec.register(config, topic, tmp_path)
    assert codec.subject == f"{topic}-value"
    client = SchemaRegistryClient(SchemaRegistrySettings(url=registry_url))
    [version] = client.subject_schemas(f"{topic}-value")
    assert version.schema_id == codec.schema_id and version.schema_type == "AVRO"
    assert json.loads(version.schema)["fields"] == json.loads(json.dumps(PAYMENT_SCHEMA["fields"]))
    # A second quickstart run registers the same schema again: same id, no new version.
    assert PaymentCodec.register(config, topic, tmp_path).schema_id == codec.schema_id
    assert (
        len(
            SchemaRegistryClient(SchemaRegistrySettings(url=registry_url)).subject_schemas(
                f"{topic}-value"
            )
        )
        == 1
    )
    fields = PaymentFields("pay-x", 5, 4200, "GBP", "card", 1_700_000_000_000)
    [value] = codec.encode([fields])
    assert _avro(value, codec.schema_id)["amount"] == Decimal("42.00")
    assert codec.decode([value]).payments.to_pylist()[0]["currency"] == "GBP"


def test_stack_down_stops_an_attached_process(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "home" / "quickstart"
    cwd.mkdir(parents=True)
    argv = ["sleep", "300"]
    pid = spawn_detached(argv, cwd=cwd, log_file=home / "logs" / "sleep.log")
    attach_process("quickstart", pid, cwd, home / "logs" / "sleep.log", argv, "sleep", home=home)
    assert attached_processes(home)["quickstart"].running()
    assert stack_down(home) == ["quickstart"]
    assert not pid_alive(pid)
    assert attached_processes(home) == {}
    assert stack_down(home) == []


def test_a_quiet_step_says_it_is_still_working() -> None:
    from bergstream.devstack.quickstart.run import _Steps

    lines: list[str] = []
    steps = _Steps(2, lines.append, quiet_seconds=0.5)
    with steps.step("slow", " (downloading)") as say:
        time.sleep(1.8)
        say("result")
    with steps.step("fast"):
        pass
    assert lines[0] == "[1/2] slow"
    assert any("still working" in line and "(downloading)" in line for line in lines[1:-3])
    assert lines[-4].strip() == "result"
    assert re.fullmatch(r"\s+done in \d+\.\d s", lines[-3])
    assert lines[-2:] == ["[2/2] fast", lines[-1]] and "done in 0.0 s" in lines[-1]


def test_missing_duckdb_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "duckdb_extension_iceberg" else real(name, *a),
    )
    with pytest.raises(MissingExtraError, match=r"duckdb-extension-iceberg.*\.\[quickstart\]"):
        duckdb_extension_paths()


# --------------------------------------------------------------------------- end to end


def _printed_instructions_work(out: str, rows: int) -> None:
    """Run the kcat command, the DuckDB statements and the PyIceberg lines the quickstart
    printed for the user, exactly as printed."""
    from pyiceberg.catalog.rest import RestCatalog

    kcat = shlex.split(_search(r"(?m)^\s+(kcat .*)$", out)[1])
    done = subprocess.run(kcat, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    offsets: dict[int, list[int]] = {}
    for line in done.stdout.splitlines():
        partition, offset, key, size, unit = line.split(" ")
        offsets.setdefault(int(partition), []).append(int(offset))
        assert key.startswith("customer-") and unit == "bytes" and int(size) > 5
    assert sum(len(seen) for seen in offsets.values()) == 5
    assert all(seen == list(range(len(seen))) for seen in offsets.values()), offsets

    attach = _search(r"(ATTACH '' AS isk .*);", out)[1]
    select = _search(r"(SELECT count\(\*\) FROM isk\.\w+\.payments);", out)[1]
    sums = _search(r"(SELECT currency, sum\(amount\) FROM isk\.\w+\.payments .*);", out)[1]
    connection = offline_duckdb()
    try:
        connection.execute(attach)
        assert connection.execute(select).fetchone() == (rows,)
        totals = dict(connection.execute(sums).fetchall())
        assert set(totals) == set(CURRENCIES)
        assert all(isinstance(total, Decimal) and total > 0 for total in totals.values())
    finally:
        connection.close()

    uri = _search(r'RestCatalog\("isk", uri="([^"]+)"\)', out)[1]
    table = _search(r'catalog\.load_table\("([^"]+)"\)', out)[1]
    scanned = RestCatalog("isk", uri=uri).load_table(table).scan(selected_fields=("kafka_offset",))
    assert scanned.to_arrow().num_rows == rows


def _printed_trino_settings_work(out: str, rows: int, trino: TrinoServer) -> None:
    """Create the catalog the quickstart printed for Trino, property for property, in the
    session's Trino 476 (under a name of its own: other tests add catalogs there too), and run
    the printed query on it."""
    block = _search(r"(?ms)^  Trino .*?\n((?:    [a-z0-9.-]+=\S+\n)+)    trino> (.*?);$", out)
    properties = dict(line.strip().split("=", 1) for line in block[1].splitlines())
    assert properties["iceberg.rest-catalog.vended-credentials-enabled"] == "true"
    assert not any("access-key" in key or "secret" in key for key in properties)
    catalog = f"quickstart_{uuid.uuid4().hex[:8]}"
    query = block[2]
    assert query.startswith("SELECT count(*) FROM isk."), query
    trino.query(create_catalog_sql(catalog, properties))
    try:
        assert trino.query(query.replace(" isk.", f" {catalog}.", 1)).scalar() == rows
    finally:
        trino.query(f"DROP CATALOG {catalog}")


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path: Path, trino: TrinoServer) -> None:
    catalog, s3 = free_ports(2)
    proxy = free_port_block(PROXY_PORTS)
    home = tmp_path / "home"
    env = {
        **os.environ,
        "BERGSTREAM_HOME": str(home),
        "BERGSTREAM_ISK_CATALOG_PORT": str(catalog),
        "BERGSTREAM_ISK_S3_PORT": str(s3),
        "BERGSTREAM_PROXY_PORT": str(proxy),
    }
    try:
        started = time.monotonic()
        result = subprocess.run(
            [BERGSTREAM, "quickstart"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=840,
        )
        seconds = time.monotonic() - started
        out = result.stdout
        assert result.returncode == 0, out + result.stderr
        print(out, f"\n(quickstart took {seconds:.0f} s)")
        for step in range(1, 10):
            assert f"[{step}/9] " in out

        produced = 300_000
        cold = _number(_search(r"coldset\.payments: ([\d,]+) rows; boundary", out)[1])
        assert cold == 210_000
        boundary = {
            int(p): _number(o)
            for p, o in re.findall(r"p(\d)=([\d,]+)", _search(r"boundary \(next offset.*", out)[0])
        }
        assert sum(boundary.values()) == cold

        counts = _search(
            r"([\d,]+) rows = ([\d,]+) cold \(from the coldset\) \+ ([\d,]+) hot \(from Kafka\); "
            r"produced ([\d,]+)",
            out,
        )
        total, cold_rows, hot_rows, said_produced = (_number(g) for g in counts.groups())
        assert said_produced == produced
        assert total == produced, "the merged table covers every record produced"
        assert cold_rows == cold and hot_rows == produced - cold
        namespaces = _search(
            r"coldset ([\d,]+) \(the pipeline's table\) \+ hotset ([\d,]+) \(what Kafka still "
            r"holds\) = merged ([\d,]+)",
            out,
        )
        assert [_number(g) for g in namespaces.groups()] == [cold, produced - cold, produced]
        typed = _search(
            r"([\d,]+) rows have the Avro value's fields as columns \(([\d,]+) cold, ([\d,]+) "
            r"hot\), schema id (\d+); ([\d,]+) kept as raw bytes",
            out,
        )
        assert [_number(g) for g in typed.groups()[:3]] == [produced, cold, produced - cold]
        assert _number(typed[5]) == 0
        schema_id = int(typed[4])
        assert f"Avro schema registered under subject payments-value: schema id {schema_id}" in out
        sums = re.findall(r"(?m)^\s+([A-Z]{3})\s+([\d,]+) payments\s+([\d,.]+)$", out)
        assert {c for c, _, _ in sums} == set(CURRENCIES)
        assert sum(_number(n) for _, n, _ in sums) == produced
        assert "the same counts and totals as the payments produced, to the cent" in out

        live = _search(
            r"the next query \(started \d+ ms after the ack.* sees it: ([\d,]+) rows", out
        )
        assert _number(live[1]) == produced + 1

        ksi = _search(
            r"auto_offset_reset=earliest: ([\d,]+) records in .* first offsets p0=0 p1=0 p2=0, "
            r".*, 0 gaps",
            out,
        )
        assert _number(ksi[1]) == produced + 1
        origin = _search(
            r"([\d,]+) records below Kafka's log start .* came from the coldset, ([\d,]+) from "
            r"Kafka",
            out,
        )
        assert _number(origin[1]) == cold
        assert _number(origin[2]) == produced - cold + 1
        same = _search(
            r"([\d,]+) values byte-identical to those produced; decoded as Avro \(schema id "
            r"(\d+)\): ([\d,]+) distinct payment ids, ([\d,]+) of another schema, ([\d,]+) "
            r"undecodable",
            out,
        )
        assert _number(same[1]) == produced + 1 and int(same[2]) == schema_id
        assert [_number(g) for g in same.groups()[2:]] == [produced + 1, 0, 0]

        for needle in (
            f"bootstrap 127.0.0.1:{proxy}",
            f"ENDPOINT 'http://127.0.0.1:{catalog}'",
            f"schema id {schema_id} (subject payments-value) in the Schema Registry",
            f'RestCatalog("isk", uri="http://127.0.0.1:{catalog}")',
            "spark.sql.catalog.isk.cache-enabled=false",
            "Stop everything with: bergstream stack down",
        ):
            assert needle in out

        _printed_instructions_work(out, produced + 1)
        _printed_trino_settings_work(out, produced + 1, trino)

        # What the output claims holds afterwards: Kafka really lost the cold offsets, and
        # ISK, KSI and the stack keep running for the user's own clients.
        stack_env = subprocess.run(
            [BERGSTREAM, "stack", "env"], env=env, capture_output=True, text=True, check=True
        ).stdout
        kafka = _search(r"BERGSTREAM_KAFKA_BOOTSTRAP=(\S+)", stack_env)[1]
        assert asyncio.run(kafka_offsets(kafka, "payments", 3))[0] == boundary
        assert attached_processes(home)["quickstart"].running()
        assert all(port_is_open(port) for port in (catalog, s3, proxy))
    finally:
        down = subprocess.run(
            [BERGSTREAM, "stack", "down"], env=env, capture_output=True, text=True, timeout=180
        )
    assert down.returncode == 0, down.stderr
    assert "quickstart" in down.stdout and "kafka" in down.stdout
    assert not any(port_is_open(port) for port in (catalog, s3, proxy))
