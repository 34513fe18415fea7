"""KSI with a large assignment: Fetch requests naming 10,000 partitions through the ``ksi``
filter, against requests naming 100, in one run: latency per request and the proxy's CPU per
request.

Starts its own Kafka (the local stack, under a temporary home) and, for each ``--partitions``
count (default 100 and 10,000), a topic of that many partitions holding 3 records each; the
first record of every partition is copied into the topic's coldset table (PyIceberg, one
append whose boundary covers every partition) and deleted from Kafka (DeleteRecords), so a
fetch from offset 0 is served cold for offset 0 and by Kafka from 1 on, as a consumer replaying
history sees it. ``bergstream run`` serves both topics through one virtual cluster with the
ksi filter. Then, per count, ``--requests`` times each (a raw Fetch v11 over one connection,
``max_wait_ms`` 0, read_committed):

- **replay**: every partition from offset 0 (one cold record and two hot ones each);
- **caught up**: every partition from its end (nothing to return: what a consumer's idle
  fetches cost).

Printed per count and kind: median and p90 latency (ms) and the proxy's CPU ms per request and
per thousand partitions; ``ratio`` (last key of the JSON on the last line) is the median replay
latency per partition at the largest count over that at the smallest (1.0: a request costs in
proportion to its partitions, nothing more).

    .venv/bin/python bench/ksi_partitions.py [--partitions 100 10000] [--requests 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bergstream.core.lake import LakeCatalogConfig, LakeConfig, load_catalog, resolve_lake
from bergstream.core.records import Record
from bergstream.core.typed.row_contract import (
    BOUNDARY_PROPERTY,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    SORT_ORDER,
    format_boundary,
    record_to_row,
)
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.devstack.stack.ports import free_port_block
from tests.kits.coldset_tables import TEST_SPEC

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
RECORDS = 3
T0 = 1_700_000_000_000


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_topic(kafka: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``RECORDS`` records per partition (timestamps T0 + offset)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka})
    settings = {"retention.ms": "-1", "message.timestamp.after.max.ms": "9223372036854775807"}
    future = admin.create_topics(
        [NewTopic(topic, partitions, 1, config=settings)], operation_timeout=300
    )[topic]
    future.result(timeout=600)
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 50})
    for partition in range(partitions):
        for offset in range(RECORDS):
            producer.produce(
                topic, b"v%d" % offset, key=b"k", partition=partition, timestamp=T0 + offset
            )
        producer.poll(0)
    producer.flush(600)


def copy_first_records(lake: Any, topic: str, partitions: int) -> None:
    """The first record of each partition into the topic's table, boundary 1 everywhere."""
    import pyarrow as pa

    catalog = load_catalog(lake)
    catalog.create_namespace_if_not_exists(lake.namespace)
    table = catalog.create_table(
        lake.table_identifier(topic), ROW_SCHEMA, partition_spec=TEST_SPEC, sort_order=SORT_ORDER
    )
    rows = [
        record_to_row(p, Record(0, T0, b"k", b"v0", ()), 0)  # CreateTime
        for p in range(partitions)
    ]
    table.append(
        pa.Table.from_pylist(rows, schema=ROW_ARROW_SCHEMA),
        snapshot_properties={
            BOUNDARY_PROPERTY: format_boundary(dict.fromkeys(range(partitions), 1))
        },
    )


def delete_first_records(kafka: str, topic: str, partitions: int) -> None:
    """DeleteRecords before offset 1 in every partition."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka})
    futures = admin.delete_records(
        [TopicPartition(topic, p, 1) for p in range(partitions)], operation_timeout=300
    )
    for future in futures.values():
        future.result(timeout=600)


async def fetches(
    bootstrap: str, topic: str, partitions: int, offset: int, requests: int, proxy_pid: int
) -> dict[str, float]:
    """``requests`` Fetch requests of every partition of ``topic`` from ``offset``: latency
    and the proxy's CPU."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.fetch import FetchRequest

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=120_000)
    await client.bootstrap()
    try:
        node = client.cluster.brokers().pop().nodeId
        request = FetchRequest(
            0, 0, 256 << 20, 1, [(topic, [(p, offset, 1 << 20) for p in range(partitions)])]
        )
        response = await client.send(node, request)  # warm: connection, KSI's table and files
        returned = sum(len(part[-1] or b"") > 0 for _, parts in response.topics for part in parts)
        times: list[float] = []
        cpu_before = cpu_seconds(proxy_pid)
        for _ in range(requests):
            began = time.perf_counter()
            await client.send(node, request)
            times.append(time.perf_counter() - began)
        cpu = cpu_seconds(proxy_pid) - cpu_before
    finally:
        await client.close()
    ordered = sorted(times)
    return {
        "median_ms": round(1000 * statistics.median(times), 2),
        "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2),
        "proxy_cpu_ms_per_request": round(1000 * cpu / requests, 2),
        "proxy_cpu_ms_per_1000_partitions": round(1000 * cpu / requests / partitions * 1000, 2),
        "partitions_with_records": returned,
    }


def main() -> None:
    """Run the benchmark; print the figures and the ratio (JSON on the last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    counts = sorted(args.partitions)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ksi-partitions-"))
    home = workdir / "home"
    proxy: subprocess.Popen[str] | None = None
    try:
        kafka = stack_up(home=home, components={"kafka"}).as_dict()["BERGSTREAM_KAFKA_BOOTSTRAP"]
        lake = resolve_lake(
            LakeConfig(
                kafka_bootstrap=kafka,
                catalog=LakeCatalogConfig(
                    uri=f"sqlite:///{workdir / 'catalog.db'}", warehouse=str(workdir / "wh")
                ),
            ),
            home=home,
        )
        topics = {count: f"ksi-partitions-{count}" for count in counts}
        for count, topic in topics.items():
            began = time.monotonic()
            make_topic(kafka, topic, count)
            copy_first_records(lake, topic, count)
            delete_first_records(kafka, topic, count)
            print(f"{topic}: ready in {time.monotonic() - began:.1f} s", flush=True)
        port = free_port_block(2)
        config = workdir / "ksi.yaml"
        names = ", ".join(topics.values())
        config.write_text(
            textwrap.dedent(
                f"""
                virtual_clusters:
                  - name: bench
                    target: {{bootstrap: "{kafka}"}}
                    gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0,
                              broker_count: 1}}
                    filters:
                      - type: ksi
                        config: {{topics: [{names}]}}
                lake:
                  kafka_bootstrap: "{kafka}"
                  catalog: {{type: sql, uri: "sqlite:///{workdir / "catalog.db"}",
                            warehouse: "{workdir / "wh"}"}}
                """
            )
        )
        proxy = subprocess.Popen(
            [BERGSTREAM, "run", "-c", str(config)],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "BERGSTREAM_HOME": str(home)},
        )
        assert proxy.stderr is not None
        for line in proxy.stderr:
            if "bergstream: ready" in line:
                break
        else:
            raise RuntimeError("the proxy did not start")
        rows: dict[str, Any] = {}
        for count, topic in topics.items():
            replay = asyncio.run(
                fetches(f"127.0.0.1:{port}", topic, count, 0, args.requests, proxy.pid)
            )
            idle = asyncio.run(
                fetches(f"127.0.0.1:{port}", topic, count, RECORDS, args.requests, proxy.pid)
            )
            assert replay["partitions_with_records"] == count, replay
            rows[str(count)] = {"replay": replay, "caught_up": idle}
            for kind, figures in (("replay", replay), ("caught up", idle)):
                print(
                    f"{count:>6,} partitions, {kind}: median {figures['median_ms']} ms, p90 "
                    f"{figures['p90_ms']} ms, proxy CPU {figures['proxy_cpu_ms_per_request']} ms "
                    f"per request ({figures['proxy_cpu_ms_per_1000_partitions']} ms per 1,000 "
                    "partitions)",
                    flush=True,
                )
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(30)
        stack_down(home=home)
        shutil.rmtree(workdir, ignore_errors=True)
    small, large = rows[str(counts[0])]["replay"], rows[str(counts[-1])]["replay"]
    ratio = (large["median_ms"] / counts[-1]) / (small["median_ms"] / counts[0])
    print(
        f"replay latency per partition at {counts[-1]:,} partitions / at {counts[0]:,}: {ratio:.2f}"
    )
    print(json.dumps({"counts": rows, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
