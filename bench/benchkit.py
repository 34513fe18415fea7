"""What the benchmarks share: topics and load made with Kafka's own tools from the stack's jars.

Benchmarks run as scripts (`python bench/NAME.py`), so this module is imported from bench/.
"""

from __future__ import annotations

import re
import subprocess

from bergstream.core.stack import kafka_tool_command


def create_topic(kafka: str, topic: str, partitions: int) -> None:
    """Create ``topic`` directly on Kafka with ``partitions`` partitions."""
    subprocess.run(
        kafka_tool_command(
            "topics",
            "--bootstrap-server",
            kafka,
            "--create",
            "--topic",
            topic,
            "--partitions",
            str(partitions),
            "--replication-factor",
            "1",
        ),
        check=True,
        capture_output=True,
        timeout=60,
    )


def perf_produce(bootstrap: str, topic: str, records: int, size: int, *props: str) -> float:
    """Produce ``records`` values of ``size`` bytes with Kafka's ProducerPerformance (acks=1,
    batched; ``props`` adds producer properties) and return its MB/s."""
    out = subprocess.run(
        kafka_tool_command(
            "producer-perf-test",
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--record-size",
            str(size),
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={bootstrap}",
            "acks=1",
            "linger.ms=20",
            "batch.size=524288",
            *props,
        ),
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    ).stdout
    final = [line for line in out.splitlines() if "records sent" in line][-1]
    found = re.search(r"\(([\d.]+) MB/sec\)", final)
    if found is None:
        raise RuntimeError(f"producer-perf-test printed no MB/sec:\n{out}")
    return float(found.group(1))
