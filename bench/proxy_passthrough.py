"""Produce and consume throughput direct to Kafka and through the proxy, in the same run.

Uses Kafka's own perf tools (ProducerPerformance, ConsumerPerformance) from the stack's jars, 1 KB
records, and a pass-through proxy run as `bergstream run -c` (as a user runs it). Each
measurement moves --records x --record-size bytes (default 1M x 1 KB = 1 GB); direct and proxied
runs alternate --rounds times and the best of each is compared, since the machine is shared.

    .venv/bin/python bench/proxy_passthrough.py [--records 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from benchkit import create_topic, perf_produce

from bergstream.devstack.stack import kafka_tool_command, stack_down, stack_up
from bergstream.devstack.stack.ports import free_port_block

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
VERBOSITY: list[str] = []


def start_proxy(kafka: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A pass-through proxy in front of ``kafka``; returns the process and its bootstrap."""
    port = free_port_block(4)
    config = workdir / "proxy.yaml"
    config.write_text(
        textwrap.dedent(f"""
        virtual_clusters:
          - name: bench
            target: {{bootstrap: "{kafka}"}}
            gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0, broker_count: 3}}
    """)
    )
    log = open(workdir / "proxy.log", "wb")  # noqa: SIM115 - lives as long as the process
    process = subprocess.Popen([BERGSTREAM, *VERBOSITY, "run", "-c", str(config)], stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if b"bergstream: ready" in (workdir / "proxy.log").read_bytes():
            return process, f"127.0.0.1:{port}"
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError("proxy did not start: " + (workdir / "proxy.log").read_text())


def consume(bootstrap: str, topic: str, records: int) -> float:
    """Fetch MB/s of Kafka's ConsumerPerformance reading ``records`` from ``topic``."""
    result = subprocess.run(
        kafka_tool_command(
            "consumer-perf-test",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--messages",
            str(records),
            "--timeout",
            "120000",
            "--group",
            f"bench-{uuid.uuid4().hex[:8]}",
        ),
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    for header_line, value_line in itertools.pairwise(lines):
        header = [h.strip() for h in header_line.split(",")]
        if "fetch.MB.sec" in header:
            row = dict(zip(header, (v.strip() for v in value_line.split(",")), strict=False))
            return float(row["fetch.MB.sec"])
    raise RuntimeError(f"consumer-perf-test printed no figures:\n{result.stdout}\n{result.stderr}")


def main() -> None:
    """Run the benchmark and print the figures and ratios (JSON on the last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    home = workdir / "home"
    env = stack_up(home=home, components={"kafka"}).as_dict()
    kafka = env["BERGSTREAM_KAFKA_BOOTSTRAP"]
    proxy, proxied = start_proxy(kafka, workdir)
    results: dict[str, list[float]] = {
        k: [] for k in ("produce_direct", "produce_proxy", "consume_direct", "consume_proxy")
    }
    total_gb = 0.0
    try:
        for round_ in range(args.rounds):
            for mode, bootstrap in (("direct", kafka), ("proxy", proxied)):
                topic = f"bench-{mode}-{round_}"
                create_topic(kafka, topic, args.partitions)
                mbps = perf_produce(
                    bootstrap, topic, args.records, args.record_size, "max.request.size=10485760"
                )
                results[f"produce_{mode}"].append(mbps)
                print(f"round {round_}: produce {mode:6s} {mbps:8.1f} MB/s", flush=True)
            source = f"bench-direct-{round_}"
            for mode, bootstrap in (("direct", kafka), ("proxy", proxied)):
                mbps = consume(bootstrap, source, args.records)
                results[f"consume_{mode}"].append(mbps)
                print(f"round {round_}: consume {mode:6s} {mbps:8.1f} MB/s", flush=True)
            total_gb += 4 * args.records * args.record_size / 1e9
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(30)
        stack_down(home=home)

    best = {k: max(v) for k, v in results.items()}
    summary = {
        "records_per_run": args.records,
        "record_bytes": args.record_size,
        "total_gb_moved": round(total_gb, 2),
        **{f"{k}_mb_s": round(v, 1) for k, v in best.items()},
        "produce_ratio": round(best["produce_proxy"] / best["produce_direct"], 3),
        "consume_ratio": round(best["consume_proxy"] / best["consume_direct"], 3),
        "proxy_exit_code": proxy.returncode,
    }
    print(
        f"produce: direct {best['produce_direct']:.1f} MB/s, proxy "
        f"{best['produce_proxy']:.1f} MB/s, ratio {summary['produce_ratio']:.3f}"
    )
    print(
        f"consume: direct {best['consume_direct']:.1f} MB/s, proxy "
        f"{best['consume_proxy']:.1f} MB/s, ratio {summary['consume_ratio']:.3f} (goal >= 0.9)"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
