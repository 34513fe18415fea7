"""The README's first command, as a user runs it, on a fresh BERGSTREAM_HOME; plus the pieces
it is built from (ports, generated config, the attached ``bergstream run``, the extra check)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.config import load_config
from bergstream.core.plugins import load_registry
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
from bergstream.devstack.stack import attach_process, attached_processes, stack_down
from bergstream.devstack.stack.ports import free_port_block, free_ports, port_is_open
from bergstream.devstack.stack.procs import pid_alive, spawn_detached
from tests.support import REPO

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")


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
        quickstart_config("127.0.0.1:9092", "payments", ports, tmp_path / "quickstart"),
    )
    config = load_config(path, registry=load_registry())
    assert [c.name for c in config.virtual_clusters] == ["ksi"]
    assert config.virtual_clusters[0].gateway.port == 19092
    assert [s.type for s in config.services] == ["isk"]
    assert config.lake is not None and config.lake.namespace == "coldset"
    assert str(tmp_path / "quickstart" / "lake") in str(config.lake.catalog.uri)


def test_written_config_is_checked_like_config_check(tmp_path: Path) -> None:
    ports = QuickstartPorts(18181, 19000, 19092)
    config = quickstart_config("127.0.0.1:9092", "payments", ports, tmp_path / "quickstart")
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
    with pytest.raises(QuickstartConfigError) as raised:
        write_checked_config(path, broken)
    problems = raised.value.problems
    assert len(problems) == 2, problems
    assert any("virtual_clusters[0].filters[0].config.read_ahead" in p for p in problems)
    assert any("services[0].config.chunk_records" in p for p in problems)
    assert "does not pass `bergstream config check`" in str(raised.value)
    assert str(path) in str(raised.value)


def test_payments_spread_over_the_span_keyed_by_partition() -> None:
    records = list(payments(0, 3000, 3000, first_ms=1_000, span_ms=3_000_000, partitions=3))
    stamps = [r.timestamp_ms for r in records]
    assert stamps == sorted(stamps) and stamps[0] == 1_000 and stamps[-1] < 3_001_000
    by_key: dict[bytes, set[int]] = {}
    for record in records:
        by_key.setdefault(record.key, set()).add(record.partition)
        value = json.loads(record.value)
        assert {"id", "amount", "currency"} <= value.keys()
        assert dict(record.headers)["content-type"] == b"application/json"
    assert all(len(parts) == 1 for parts in by_key.values())
    assert {r.partition for r in records} == {0, 1, 2}
    assert len({json.loads(r.value)["id"] for r in records}) == 3000


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
    done = subprocess.run([*kcat, "-f", "%p %o %s\\n"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    offsets: dict[int, list[int]] = {}
    for line in done.stdout.splitlines():
        partition, offset, value = line.split(" ", 2)
        offsets.setdefault(int(partition), []).append(int(offset))
        assert json.loads(value)["id"].startswith("pay-")
    assert sum(len(seen) for seen in offsets.values()) == 5
    assert all(seen == list(range(len(seen))) for seen in offsets.values()), offsets

    attach = _search(r"(ATTACH '' AS isk .*);", out)[1]
    select = _search(r"(SELECT count\(\*\) FROM isk\.\w+\.payments);", out)[1]
    connection = offline_duckdb()
    try:
        connection.execute(attach)
        assert connection.execute(select).fetchone() == (rows,)
    finally:
        connection.close()

    uri = _search(r'RestCatalog\("isk", uri="([^"]+)"\)', out)[1]
    table = _search(r'catalog\.load_table\("([^"]+)"\)', out)[1]
    scanned = RestCatalog("isk", uri=uri).load_table(table).scan(selected_fields=("kafka_offset",))
    assert scanned.to_arrow().num_rows == rows


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path: Path) -> None:
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
            r"Kafka; ([\d,]+) distinct payment ids",
            out,
        )
        assert _number(origin[1]) == cold
        assert _number(origin[2]) == produced - cold + 1
        assert _number(origin[3]) == produced + 1

        for needle in (
            f"bootstrap 127.0.0.1:{proxy}",
            f"ENDPOINT 'http://127.0.0.1:{catalog}'",
            f'RestCatalog("isk", uri="http://127.0.0.1:{catalog}")',
            "spark.sql.catalog.isk.cache-enabled=false",
            "Stop everything with: bergstream stack down",
        ):
            assert needle in out

        _printed_instructions_work(out, produced + 1)

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
