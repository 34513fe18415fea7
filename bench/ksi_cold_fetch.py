"""KSI cold fetch: consume a topic served cold from Iceberg through the ksi filter, against the
same records consumed hot from Kafka directly, in one run.

Starts its own Kafka (the local stack, under a temporary home), fills a topic with Kafka's
ProducerPerformance (default 1M records of 1 KB over 3 partitions), copies it into the coldset
with ``bergstream pipeline run --once``, then times:

- **hot**: confluent-kafka reading every record straight from Kafka;
- **cold**: after DeleteRecords up to each partition's end (nothing left in Kafka), the same
  consumer reading every record through ``bergstream run`` with the ksi filter.

MB/s counts record values (records x record size); the cold figures add the proxy's CPU
seconds during the cold read, in all and per record. Prints one JSON object.

    .venv/bin/python bench/ksi_cold_fetch.py [--records 1000000] [--record-size 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from benchkit import cpu_seconds, stop_process

from bergstream.devstack.stack import kafka_tool_command, stack_down, stack_up
from bergstream.devstack.stack.ports import free_port_block

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")


def create_and_fill(kafka: str, topic: str, partitions: int, records: int, size: int) -> None:
    """Create ``topic`` (no retention) and produce ``records`` values of ``size`` bytes."""
    subprocess.run(
        kafka_tool_command(
            "topics", "--bootstrap-server", kafka, "--create", "--topic", topic,
            "--partitions", str(partitions), "--replication-factor", "1",
            "--config", "retention.ms=-1",
        ),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    subprocess.run(
        kafka_tool_command(
            "producer-perf-test", "--topic", topic, "--num-records", str(records),
            "--record-size", str(size), "--throughput", "-1",
            "--producer-props", f"bootstrap.servers={kafka}", "acks=1", "linger.ms=20",
            "batch.size=262144",
        ),
        check=True, capture_output=True, timeout=1800,
    )  # fmt: skip


def consume(bootstrap: str, topic: str, records: int) -> float:
    """Seconds confluent-kafka takes to read ``records`` records of ``topic`` from offset 0."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    started = None
    deadline = time.monotonic() + 3600
    try:
        while seen < records and time.monotonic() < deadline:
            batch = consumer.consume(10_000, 1.0)
            if batch and started is None:
                started = time.monotonic()
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
            seen += len(batch)
    finally:
        consumer.close()
    if seen < records or started is None:
        raise RuntimeError(f"read {seen} of {records} records")
    return time.monotonic() - started


def delete_all(kafka: str, topic: str, partitions: int) -> None:
    """DeleteRecords up to each partition's high watermark."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    probe = Consumer({"bootstrap.servers": kafka, "group.id": "bench-probe"})
    ends = [
        probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        for p in range(partitions)
    ]
    probe.close()
    admin = AdminClient({"bootstrap.servers": kafka})
    futures = admin.delete_records([TopicPartition(topic, p, end) for p, end in enumerate(ends)])
    for future in futures.values():
        future.result(timeout=120)


def main() -> None:
    """Run the benchmark and print its JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--cache-mb", type=int, default=512, help="ksi cache_max_bytes in MiB")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="ksi-bench-"))
    topic = "ksi-bench"
    proxy: subprocess.Popen[str] | None = None
    try:
        env = stack_up(home=home, components={"kafka"}).as_dict()
        kafka = env["BERGSTREAM_KAFKA_BOOTSTRAP"]
        create_and_fill(kafka, topic, args.partitions, args.records, args.record_size)
        lake = textwrap.dedent(
            f"""
            lake:
              kafka_bootstrap: "{kafka}"
              catalog: {{type: sql, uri: "sqlite:///{home}/lake/catalog.db",
                        warehouse: "{home}/lake/warehouse"}}
              pipeline: {{checkpoint_dir: "{home}/lake/checkpoints",
                         spark_conf: {{spark.driver.memory: 2g}}}}
            """
        )
        (home / "lake.yaml").write_text(lake)
        began = time.monotonic()
        subprocess.run(
            [BERGSTREAM, "pipeline", "run", "-c", str(home / "lake.yaml"), "--topic", topic,
             "--once"],
            check=True, capture_output=True, timeout=3600,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
        pipeline_seconds = time.monotonic() - began
        hot = consume(kafka, topic, args.records)
        delete_all(kafka, topic, args.partitions)
        port = free_port_block(4)
        config = home / "ksi.yaml"
        config.write_text(
            textwrap.dedent(
                f"""
                virtual_clusters:
                  - name: bench
                    target: {{bootstrap: "{kafka}"}}
                    gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0,
                              broker_count: 3}}
                    filters:
                      - type: ksi
                        config: {{topics: [{topic}], cache_max_bytes: {args.cache_mb << 20}}}
                """
            )
            + lake
        )
        proxy = subprocess.Popen(
            [BERGSTREAM, "run", "-c", str(config)], stderr=subprocess.PIPE, text=True
        )
        assert proxy.stderr is not None
        for line in proxy.stderr:
            if "bergstream: ready" in line:
                break
        else:
            raise RuntimeError("the proxy did not start")
        proxy_cpu = cpu_seconds(proxy.pid)
        cold = consume(f"127.0.0.1:{port}", topic, args.records)
        proxy_cpu = cpu_seconds(proxy.pid) - proxy_cpu
        megabytes = args.records * args.record_size / 1e6
        result = {
            "records": args.records,
            "record_size": args.record_size,
            "partitions": args.partitions,
            "pipeline_seconds": round(pipeline_seconds, 1),
            "hot": {
                "seconds": round(hot, 2),
                "records_per_s": round(args.records / hot),
                "mb_per_s": round(megabytes / hot, 1),
            },
            "cold": {
                "seconds": round(cold, 2),
                "records_per_s": round(args.records / cold),
                "mb_per_s": round(megabytes / cold, 1),
                "proxy_cpu_seconds": round(proxy_cpu, 2),
                "proxy_cpu_us_per_record": round(proxy_cpu / args.records * 1e6, 2),
            },
            "cold_to_hot_ratio": round(hot / cold, 3),
        }
        print(json.dumps(result, indent=2))
    finally:
        stop_process(proxy)
        stack_down(home=home)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
