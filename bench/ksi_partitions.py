"""KSI with a large assignment: Fetch requests naming 10,000 partitions through the ``ksi``
filter, against requests naming 100, in one run: latency per request and the proxy's CPU per
request.

Starts its own Kafka (the local stack, under a temporary home) and, for each ``--partitions``
count (default 100 and 10,000), topics of 100 partitions holding 3 records each (one topic, or
100: Kafka refuses to create 10,000 partitions in one request); the first record of every
partition is copied into its topic's coldset table (PyIceberg, one
append whose boundary covers every partition) and deleted from Kafka (DeleteRecords), so a
fetch from offset 0 is served cold for offset 0 and by Kafka from 1 on, as a consumer replaying
history sees it. ``bergstream run`` serves both topics through one virtual cluster with the
ksi filter. Then, per count, ``--requests`` times each (a raw Fetch over one connection naming
every partition of the count's topics, ``max_wait_ms`` 0, read_committed):

- **replay**: every partition from offset 0 (one cold record and two hot ones each);
- **caught up**: every partition from its end (nothing to return: what a consumer's idle
  fetches cost).

Printed per count and kind: the first request's latency (ms: it plans the tables and reads the
files), median and p90 latency (ms) of the others and the proxy's CPU ms per request and per
thousand partitions; ``ratio`` (last key of the JSON on the last line) is the median replay
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

from benchkit import cpu_seconds

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


#: Partitions per topic.
PER_TOPIC = 100


def make_topics(kafka: str, topics: list[str], partitions: int) -> None:
    """Create ``topics`` with ``RECORDS`` records per partition (timestamps T0 + offset)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka})
    settings = {"retention.ms": "-1", "message.timestamp.after.max.ms": "9223372036854775807"}
    for first in range(0, len(topics), 10):  # 1,000 partitions per request
        futures = admin.create_topics(
            [NewTopic(t, partitions, 1, config=settings) for t in topics[first : first + 10]],
            operation_timeout=300,
        )
        for future in futures.values():
            future.result(timeout=600)
    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 50, "acks": "all"})
    for topic in topics:  # new topics' partitions may take a moment to have leaders
        deadline = time.monotonic() + 120
        while True:
            known = producer.list_topics(topic, timeout=30).topics.get(topic)
            if (
                known is not None
                and len(known.partitions) == partitions
                and all(info.leader >= 0 for info in known.partitions.values())
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: no leaders after 120 s")
            time.sleep(0.5)
    failures: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is not None:
            failures.append(str(error))

    for topic in topics:
        for partition in range(partitions):
            for offset in range(RECORDS):
                producer.produce(
                    topic,
                    b"v%d" % offset,
                    key=b"k",
                    partition=partition,
                    timestamp=T0 + offset,
                    on_delivery=delivered,
                )
            producer.poll(0)
    if producer.flush(600) or failures:
        raise RuntimeError(f"producing failed: {failures[:3]}")


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
    bootstrap: str, topics: list[str], partitions: int, offset: int, requests: int, proxy_pid: int
) -> dict[str, float]:
    """``requests`` Fetch requests of every partition of ``topics`` (``partitions`` each) from
    ``offset``: latency and the proxy's CPU."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.fetch import FetchRequest

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=120_000)
    await client.bootstrap()
    try:
        node = client.cluster.brokers().pop().nodeId
        wanted = [(t, [(p, offset, 1 << 20) for p in range(partitions)]) for t in topics]
        request = FetchRequest(0, 0, 256 << 20, 1, wanted)
        # Warm: connection, KSI's tables and files (its answer says how many partitions had
        # records); timed apart: the Fetch that plans the tables and reads their files first.
        began = time.perf_counter()
        response = await client.send(node, request)
        first = time.perf_counter() - began
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
        "first_ms": round(1000 * first, 2),
        "median_ms": round(1000 * statistics.median(times), 2),
        "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2),
        "proxy_cpu_ms_per_request": round(1000 * cpu / requests, 2),
        "proxy_cpu_ms_per_1000_partitions": round(
            1000 * cpu / requests / (partitions * len(topics)) * 1000, 2
        ),
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
    proxy: subprocess.Popen[bytes] | None = None
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
        per = {count: min(count, PER_TOPIC) for count in counts}
        topics = {
            count: [f"ksi-p{count}-{i}" for i in range(max(count // PER_TOPIC, 1))]
            for count in counts
        }
        for count, names in topics.items():
            began = time.monotonic()
            make_topics(kafka, names, per[count])
            for topic in names:
                copy_first_records(lake, topic, per[count])
                delete_first_records(kafka, topic, per[count])
            print(
                f"{len(names)} topic(s) of {per[count]} partitions: ready in "
                f"{time.monotonic() - began:.1f} s",
                flush=True,
            )
        port = free_port_block(2)
        config = workdir / "ksi.yaml"
        names = '"ksi-p*"'
        config.write_text(
            textwrap.dedent(
                f"""
                virtual_clusters:
                  - name: bench
                    target: {{bootstrap: "{kafka}"}}
                    gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 1,
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
        log = workdir / "proxy.log"
        with log.open("wb") as stderr:  # a file: a full pipe would stall the proxy's logging
            proxy = subprocess.Popen(
                [BERGSTREAM, "run", "-c", str(config)],
                stderr=stderr,
                env={**os.environ, "BERGSTREAM_HOME": str(home)},
            )
        deadline = time.monotonic() + 120
        while "bergstream: ready" not in log.read_text(errors="replace"):
            if proxy.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        rows: dict[str, Any] = {}
        for count, names_of in topics.items():
            replay = asyncio.run(
                fetches(f"127.0.0.1:{port}", names_of, per[count], 0, args.requests, proxy.pid)
            )
            idle = asyncio.run(
                fetches(
                    f"127.0.0.1:{port}", names_of, per[count], RECORDS, args.requests, proxy.pid
                )
            )
            if replay["partitions_with_records"] != count:
                # The warm-up fetch's answer: partitions whose cold read failed (KSI's read
                # timeout) got a retriable error instead of records; the timings still count.
                print(
                    f"{count:,} partitions: the first replay fetch returned records for "
                    f"{replay['partitions_with_records']:,} (the others: retriable errors)",
                    flush=True,
                )
            rows[str(count)] = {"replay": replay, "caught_up": idle}
            for kind, figures in (("replay", replay), ("caught up", idle)):
                print(
                    f"{count:>6,} partitions, {kind}: first {figures['first_ms']} ms, median "
                    f"{figures['median_ms']} ms, p90 "
                    f"{figures['p90_ms']} ms, proxy CPU {figures['proxy_cpu_ms_per_request']} ms "
                    f"per request ({figures['proxy_cpu_ms_per_1000_partitions']} ms per 1,000 "
                    "partitions)",
                    flush=True,
                )
    except BaseException:
        if (workdir / "proxy.log").exists():
            print((workdir / "proxy.log").read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
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
