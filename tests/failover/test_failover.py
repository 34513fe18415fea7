"""Failover on the secured 3-broker stack: a broker leading some of the topic's partitions is
SIGKILLed and started again (on its ports, by ``stack_up``) in the middle of (1) a consume
through the KSI proxy spanning cold and hot offsets while records are produced through it, (2) a
loop of ISK ``merged`` queries while records are produced, (3) a continuous ``bergstream pipeline
run``. Each ends with every record exactly once; the proxy, ISK and the pipeline stay up.

The stack is the session's ``secure_stack``, shared with other tests: each test brings the
killed broker back and waits until the cluster is whole (3 brokers, every replica of its topic
in sync) before it ends, failed or not."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bergstream.devstack.stack import kafka_security, stack_status, stack_up
from bergstream.devstack.stack.env import StackEnv
from bergstream.devstack.stack.ports import free_port_block, free_ports
from bergstream.devstack.stack.procs import pid_alive
from tests.kits.ksi_stack import pipeline_once
from tests.support import (
    BERGSTREAM,
    ProxyProcess,
    secure_lake_yaml,
    start_bergstream_run,
    with_reauthentication,
    write_proxy_config,
)

pytestmark = pytest.mark.slow

PARTITIONS = 3
#: (partition, offset, key, value): a record as compared between Kafka, clients and tables.
Row = tuple[int, int, bytes | None, bytes | None]


# --------------------------------------------------------------------------- the cluster


def _props(path: str | Path) -> dict[str, str]:
    lines = Path(path).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def admin_conf(stack: StackEnv, **extra: Any) -> dict[str, Any]:
    """confluent-kafka settings of the stack's admin user, straight to the brokers."""
    return {**_props(stack.as_dict()["BERGSTREAM_KAFKA_CONFIG"]), **extra}


def proxy_client_conf(stack: StackEnv, bootstrap: str, **extra: Any) -> dict[str, Any]:
    """confluent-kafka settings of the admin user toward a proxy (SASL over plain TCP)."""
    props = _props(stack.as_dict()["BERGSTREAM_KAFKA_CONFIG"])
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": props["sasl.mechanisms"],
        "sasl.username": props["sasl.username"],
        "sasl.password": props["sasl.password"],
        **extra,
    }


def leaders(stack: StackEnv, topic: str) -> dict[int, int]:
    """partition -> node id of its leader, as the brokers say."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient(admin_conf(stack)).list_topics(topic, timeout=30)
    return {p: part.leader for p, part in meta.topics[topic].partitions.items()}


def wait_whole(stack: StackEnv, topic: str, timeout: float = 180) -> float:
    """Wait until the 3 brokers are registered and every partition of ``topic`` has a leader
    and 3 in-sync replicas; the seconds it took."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_conf(stack))
    began = time.monotonic()
    last = "no answer"
    while time.monotonic() - began < timeout:
        try:
            meta = admin.list_topics(topic, timeout=10)
            parts = meta.topics[topic].partitions.values()
            last = f"brokers {sorted(meta.brokers)}, isr {[sorted(p.isrs) for p in parts]}"
            if sorted(meta.brokers) == [1, 2, 3] and all(
                p.leader > 0 and len(p.isrs) == 3 for p in parts
            ):
                return time.monotonic() - began
        except Exception as error:  # the cluster may not answer yet
            last = repr(error)
        time.sleep(0.5)
    raise AssertionError(f"the cluster is not whole after {timeout:.0f} s: {last}")


def restart_kafka(stack: StackEnv) -> StackEnv:
    """``stack_up`` again: the dead node starts on its previous ports, with the same broker
    settings as the session fixture's (its short re-authentication interval)."""
    reauthenticating = with_reauthentication(kafka_security.server_security_properties)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kafka_security, "server_security_properties", reauthenticating)
        return stack_up(stack.home, {"kafka"}, brokers=3, security="sasl_ssl")


def node_pids(stack: StackEnv) -> dict[int, int]:
    return {node["node_id"]: node["pid"] for node in stack_status(stack.home)["kafka"]["nodes"]}


@dataclass
class Outage:
    """One broker killed (SIGKILL) and started again; what happened, for the report."""

    stack: StackEnv
    topic: str
    node: int
    killed_at: float = 0.0
    restarted_at: float = 0.0
    restart_seconds: float = 0.0
    whole_seconds: float = 0.0
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def kill(self) -> None:
        pid = node_pids(self.stack)[self.node]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(pid), f"broker {self.node} (pid {pid}) survived SIGKILL"
        self.killed_at = time.monotonic()

    def restart(self) -> None:
        began = time.monotonic()
        env = restart_kafka(self.stack)
        self.restarted_at = time.monotonic()
        self.restart_seconds = self.restarted_at - began
        assert env.kafka_bootstrap == self.stack.kafka_bootstrap, "the ports moved"

    def kill_then_restart(self, down_seconds: float) -> None:
        """Kill, wait ``down_seconds``, restart (run in a thread; errors kept for the test)."""
        self.started = True
        try:
            self.kill()
            time.sleep(down_seconds)
            self.restart()
        except BaseException as error:  # re-raised by the test
            self.error = error
        finally:
            self.done.set()

    def summary(self) -> str:
        down = self.restarted_at - self.killed_at if self.restarted_at else float("nan")
        return (
            f"broker {self.node} down {down:.1f} s (restart took {self.restart_seconds:.1f} s), "
            f"cluster whole {self.whole_seconds:.1f} s after"
        )


@contextlib.contextmanager
def broker_outage(stack: StackEnv, topic: str, node: int) -> Iterator[Outage]:
    """An :class:`Outage` of ``node``; on exit (failed or not) the node runs again and the
    cluster is whole."""
    outage = Outage(stack, topic, node)
    try:
        yield outage
    finally:
        if outage.started:
            outage.done.wait(300)
        alive = all(pid_alive(pid) for pid in node_pids(stack).values())
        if not alive:
            restart_kafka(stack)
        outage.whole_seconds = wait_whole(stack, topic)
        print(f"\n{outage.summary()}")
    if outage.error is not None:
        raise outage.error


# --------------------------------------------------------------------------- records


def value_of(tag: str, i: int) -> bytes:
    return f"{tag}-{i}-".encode() + b"x" * (40 + i % 80)


def key_of(i: int) -> bytes | None:
    return None if i % 37 == 0 else f"k{i}".encode()


def produce_now(conf: dict[str, Any], topic: str, tag: str, count: int) -> list[Row]:
    """Produce ``count`` records (idempotent, acks=all) round robin over the partitions; the
    acknowledged rows."""
    from confluent_kafka import Producer

    acked: list[Row] = []
    failures: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(error)
        else:
            acked.append((message.partition(), message.offset(), message.key(), message.value()))

    producer = Producer({**conf, "enable.idempotence": True, "linger.ms": 5})
    for i in range(count):
        producer.produce(
            topic,
            key=key_of(i),
            value=value_of(tag, i),
            partition=i % PARTITIONS,
            on_delivery=delivered,
        )
        producer.poll(0)
    assert producer.flush(120) == 0 and not failures, failures
    return acked


class Producing(threading.Thread):
    """Produces ``count`` records at about ``rate`` per second (idempotent, acks=all, long
    delivery timeout, so a broker's outage delays records but loses none); ``acked`` grows as
    deliveries are confirmed."""

    def __init__(self, conf: dict[str, Any], topic: str, tag: str, count: int, rate: float):
        super().__init__(daemon=True)
        self.conf, self.topic, self.tag, self.count, self.rate = conf, topic, tag, count, rate
        self.acked: list[Row] = []
        self.failures: list[Any] = []
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def snapshot(self) -> set[Row]:
        with self.lock:
            return set(self.acked)

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.failures.append(error)
            return
        row = (message.partition(), message.offset(), message.key(), message.value())
        with self.lock:
            self.acked.append(row)

    def run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer(
                {
                    **self.conf,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "message.timeout.ms": 180_000,
                }
            )
            began = time.monotonic()
            for i in range(self.count):
                ahead = began + i / self.rate - time.monotonic()
                if ahead > 0:
                    producer.poll(ahead)
                producer.produce(
                    self.topic,
                    key=key_of(i),
                    value=value_of(self.tag, i),
                    partition=i % PARTITIONS,
                    on_delivery=self._delivered,
                )
                producer.poll(0)
            left = producer.flush(200)
            if left:
                self.failures.append(f"{left} records not delivered")
        except BaseException as error:  # re-raised by the test
            self.error = error

    def finish(self, timeout: float = 300) -> list[Row]:
        """Wait for the end; every acknowledged row (fails on any lost record)."""
        self.join(timeout)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        assert not self.failures, self.failures[:5]
        assert len(self.acked) == self.count
        return list(self.acked)


def with_offsets_from(acked: list[Row] | set[Row], got: list[Row]) -> list[Row]:
    """``acked`` with each unknown offset (``None``) taken from the row of ``got`` holding the
    same partition, key and value (values are unique in these tests).

    An idempotent producer whose retried batch the broker had already written gets the
    acknowledgement (DUPLICATE_SEQUENCE_NUMBER) without the offset, as happens when a leader
    dies between writing a batch and answering: librdkafka then reports the offset as unknown.
    """
    offsets = {(p, k, v): o for p, o, k, v in got}
    return [(p, offsets.get((p, k, v)) if o is None else o, k, v) for p, o, k, v in acked]


def assert_exactly(got: list[Row], expected: list[Row]) -> None:
    """``got`` holds every row of ``expected`` once and nothing else (a short diff if not);
    expected rows acknowledged without an offset are matched by partition, key and value."""
    expected = with_offsets_from(expected, got)
    keys = [(r[0], r[1]) for r in got]
    duplicates = len(keys) - len(set(keys))
    missing = set(expected) - set(got)
    extra = set(got) - set(expected)
    assert (duplicates, len(missing), len(extra)) == (0, 0, 0), (
        f"{len(got)} rows for {len(expected)} records: {duplicates} duplicated, "
        f"{len(missing)} missing (e.g. {sorted(missing, key=repr)[:3]}), "
        f"{len(extra)} unexpected (e.g. {sorted(extra, key=repr)[:3]})"
    )
    assert sorted(got) == sorted(expected)


def log_problems(process: ProxyProcess) -> str:
    """How many WARNING/ERROR lines a ``bergstream run`` process logged, and a few of them."""
    lines = [
        line.strip()
        for line in process.stderr_lines
        if " WARNING " in line or " ERROR " in line or "Traceback" in line
    ]
    return f"{len(lines)} warning/error lines {sorted(set(line[-200:] for line in lines))[:4]}"


def table_rows(rows: list[dict[str, Any]]) -> list[Row]:
    return [
        (r["kafka_partition"], r["kafka_offset"], r["kafka_key"], r["kafka_value"]) for r in rows
    ]


# --------------------------------------------------------------------------- configs


def delete_below(stack: StackEnv, topic: str, offset: int) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_conf(stack))
    futures = admin.delete_records([TopicPartition(topic, p, offset) for p in range(PARTITIONS)])
    for future in futures.values():
        assert future.result(timeout=60).low_watermark == offset


def end_offsets(stack: StackEnv, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(admin_conf(stack, **{"group.id": f"w-{uuid.uuid4().hex[:8]}"}))
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def topic_for(new_secure_topic: Callable[..., str], stack: StackEnv) -> str:
    """A new 3-partition topic (replication 3) whose leaders are spread, the cluster whole."""
    topic = new_secure_topic(partitions=PARTITIONS, prefix="fo")
    wait_whole(stack, topic, timeout=60)
    return topic


# --------------------------------------------------------------------------- (1) KSI


COLD_RECORDS = 3000
DELETED_BELOW = 400
HOT_RECORDS = 3000


def start_ksi(stack: StackEnv, home: Path, topic: str, lake: str) -> ProxyProcess:
    port = free_port_block(5)
    config = write_proxy_config(
        home / "ksi.yaml", "ksi", port, f'[{{type: ksi, config: {{topics: ["{topic}"]}}}}]', lake
    )
    return start_bergstream_run(config, f"127.0.0.1:{port}", stack.as_dict(), "the ksi proxy")


def test_consume_through_ksi_across_a_broker_restart(
    secure_stack: StackEnv, new_secure_topic: Callable[..., str], tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient

    began = time.monotonic()
    topic = topic_for(new_secure_topic, secure_stack)
    cold = produce_now(admin_conf(secure_stack), topic, "cold", COLD_RECORDS)
    lake = secure_lake_yaml(tmp_path, 10)
    (tmp_path / "lake.yaml").write_text(lake)
    assert pipeline_once(secure_stack, tmp_path / "lake.yaml", topic)
    delete_below(secure_stack, topic, DELETED_BELOW)
    proxy = start_ksi(secure_stack, tmp_path, topic, lake)
    setup = time.monotonic() - began
    errors: list[str] = []
    got: list[Row] = []
    try:
        through = proxy_client_conf(secure_stack, proxy.bootstrap)
        # Every broker has its own proxy port (address rewriting), leaders on all three.
        meta = AdminClient(through).list_topics(topic, timeout=30)
        port = int(proxy.bootstrap.rsplit(":", 1)[1])
        assert {b.port for b in meta.brokers.values()} <= set(range(port + 1, port + 5))
        assert len({b.port for b in meta.brokers.values()}) == 3
        victim = leaders(secure_stack, topic)[0]
        producer = Producing(through, topic, "hot", HOT_RECORDS, rate=250)
        consumer = Consumer(
            {
                **through,
                "group.id": f"g-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "max.partition.fetch.bytes": 8192,
                "error_cb": lambda error: errors.append(str(error)),
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        read = dict.fromkeys(range(PARTITIONS), 0)
        at_kill: dict[int, int] = {}
        at_restart: int | None = None
        with broker_outage(secure_stack, topic, victim) as outage:
            producer.start()
            chaos = threading.Thread(target=outage.kill_then_restart, args=(5,), daemon=True)
            stalled_since = time.monotonic()
            try:
                while True:
                    if read[0] >= 150 and chaos.ident is None:
                        # Mid-consume: partition 0, led by the victim, still in its cold offsets.
                        at_kill = dict(read)
                        chaos.start()
                    if outage.done.is_set() and at_restart is None:
                        at_restart = len(got)
                    expected = COLD_RECORDS + len(producer.acked)
                    if not producer.is_alive() and outage.done.is_set() and len(got) >= expected:
                        break
                    message = consumer.poll(0.5)
                    if message is None:
                        assert time.monotonic() - stalled_since < 120, (
                            f"no record for 120 s after {len(got)}; errors {errors[-5:]}"
                        )
                        continue
                    if message.error():
                        error = message.error()
                        assert not error.fatal(), error
                        assert error.code() != KafkaError.OFFSET_OUT_OF_RANGE, error
                        errors.append(str(error))
                        continue
                    stalled_since = time.monotonic()
                    got.append(
                        (message.partition(), message.offset(), message.key(), message.value())
                    )
                    read[message.partition()] += 1
                    time.sleep(0.002)  # a consumer doing some work: the outage lands mid-read
                # Nothing more arrives (no duplicate after the last expected record).
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    message = consumer.poll(0.5)
                    if message is not None and not message.error():
                        got.append(
                            (message.partition(), message.offset(), message.key(), message.value())
                        )
            finally:
                consumer.close()
                hot = producer.finish()
        assert chaos.ident is not None, "the broker was never killed"
        assert at_kill[0] < DELETED_BELOW, f"partition 0 was past its cold offsets: {at_kill}"
        assert proxy.process.poll() is None, proxy.log()[-4000:]
        assert_exactly(got, cold + hot)
        cold_read = sum(1 for r in got if r[1] < DELETED_BELOW)
        assert cold_read == DELETED_BELOW * PARTITIONS
        # The outage landed mid-consume: records were read after the kill. Whether any remain
        # for after the restart depends on how fast the other brokers took over the partition.
        assert sum(at_kill.values()) < len(got)
        assert at_restart is not None
        print(
            f"\n(1) setup {setup:.1f} s, consume {time.monotonic() - began - setup:.1f} s: "
            f"{len(got)} records ({cold_read} cold); broker {victim} (leader of partition 0) "
            f"killed with {at_kill} read per partition, {len(got) - at_restart} records read "
            f"after its restart; {len(errors)} client errors: {sorted(set(errors))[:6]}; "
            f"proxy log: {log_problems(proxy)}"
        )
    finally:
        code = proxy.stop()
        if code != 0:
            print(proxy.log()[-6000:])
    assert code == 0, f"the proxy exited with {code}"


# --------------------------------------------------------------------------- (2) ISK merged


ISK_INITIAL = 900
ISK_DELETED_BELOW = 100
ISK_PRODUCED = 1500


@dataclass
class Isk:
    process: ProxyProcess
    catalog_url: str

    def catalog(self) -> Any:
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("isk", uri=self.catalog_url)


def isk_config(stack: StackEnv, workdir: Path) -> tuple[Path, int]:
    catalog_port, s3_port = free_ports(2)
    config = workdir / "isk.yaml"
    config.write_text(
        f"""
services:
  - type: isk
    config:
      cluster: failover
      kafka_bootstrap: ${{BERGSTREAM_KAFKA_BOOTSTRAP}}
      kafka_client:
        properties_file: ${{BERGSTREAM_KAFKA_CONFIG:-}}
      chunk_records: 64
      index_interval_seconds: 2
      http:
        catalog_port: {catalog_port}
        s3_port: {s3_port}
        access_key: failover
        secret_key: failover-secret
      index: {{type: sqlite, config: {{path: "{workdir / "index.sqlite"}"}}}}
      cache: {{type: local, config: {{directory: "{workdir / "cache"}"}}}}
"""
        + secure_lake_yaml(workdir / "home", 10)
    )
    return config, catalog_port


def test_isk_merged_queries_across_a_broker_restart(
    secure_stack: StackEnv, new_secure_topic: Callable[..., str], tmp_path: Path
) -> None:
    began = time.monotonic()
    topic = topic_for(new_secure_topic, secure_stack)
    initial = produce_now(admin_conf(secure_stack), topic, "before", ISK_INITIAL)
    config, catalog_port = isk_config(secure_stack, tmp_path)
    assert pipeline_once(secure_stack, config, topic)
    delete_below(secure_stack, topic, ISK_DELETED_BELOW)
    process = start_bergstream_run(
        config,
        f"127.0.0.1:{catalog_port}",
        {**secure_stack.as_dict(), "BERGSTREAM_HOME": str(tmp_path / "home")},
        "the isk service",
    )
    isk = Isk(process, f"http://127.0.0.1:{catalog_port}")
    setup = time.monotonic() - began
    failures: list[str] = []
    queries: list[tuple[set[Row], list[Row]]] = []  # (acked before, rows read)
    try:
        table = isk.catalog().load_table(f"merged.{topic}")
        summary = table.metadata.current_snapshot().summary
        assert json.loads(summary["bergstream.kafka-offsets"]) == {
            str(p): ISK_INITIAL // PARTITIONS for p in range(PARTITIONS)
        }
        assert_exactly(table_rows(table.scan().to_arrow().to_pylist()), initial)
        victim = leaders(secure_stack, topic)[1]
        producer = Producing(admin_conf(secure_stack), topic, "during", ISK_PRODUCED, rate=60)
        with broker_outage(secure_stack, topic, victim) as outage:
            producer.start()
            chaos = threading.Thread(target=outage.kill_then_restart, args=(5,), daemon=True)
            after_restart = while_down = 0
            failed_at: list[float] = []
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline:
                if len(queries) == 2 and chaos.ident is None:
                    chaos.start()
                if outage.done.is_set() and not producer.is_alive() and after_restart >= 2:
                    break
                acked = producer.snapshot()
                restarted = outage.done.is_set()
                try:
                    table = isk.catalog().load_table(f"merged.{topic}")
                    rows = table_rows(table.scan().to_arrow().to_pylist())
                except Exception as error:  # counted; must be transient
                    failures.append(f"{type(error).__name__}: {str(error)[:200]}")
                    failed_at.append(time.monotonic() - outage.killed_at)
                    time.sleep(0.5)
                    continue
                queries.append((acked, rows))
                after_restart += restarted
                if outage.killed_at and not outage.restarted_at:
                    while_down += 1
            else:
                pytest.fail(f"the query loop did not end: {len(queries)} queries, {failures[-3:]}")
            produced = producer.finish()
        assert chaos.ident is not None
        assert process.process.poll() is None, process.log()[-4000:]
        final = isk.catalog().load_table(f"merged.{topic}")
        final_rows = table_rows(final.scan().to_arrow().to_pylist())
        assert_exactly(final_rows, initial + produced)
        everything = set(initial) | set(with_offsets_from(produced, final_rows))
        for acked, rows in queries:
            keys = [(r[0], r[1]) for r in rows]
            assert len(keys) == len(set(keys)), "a query returned a record twice"
            assert set(rows) <= everything, "a query returned a record never produced"
            missed = set(with_offsets_from(acked, rows)) - set(rows)
            assert not missed, f"a query missed {len(missed)} acked records"
        print(
            f"\n(2) setup {setup:.1f} s, loop {time.monotonic() - began - setup:.1f} s: "
            f"{len(queries)} queries answered ({while_down} while broker {victim} was down), "
            f"{len(failures)} failed, {min(failed_at, default=0):.1f}-"
            f"{max(failed_at, default=0):.1f} s after the kill (restart "
            f"{outage.restarted_at - outage.killed_at:.1f} s after): {sorted(set(failures))[:4]}"
            f"; isk log: {log_problems(process)}"
        )
    finally:
        code = process.stop()
        if code != 0:
            print(process.log()[-6000:])
    assert code == 0


# --------------------------------------------------------------------------- (3) the pipeline


PIPE_INITIAL = 600
PIPE_PRODUCED = 1800


def lake_table(config: Path, stack: StackEnv, topic: str) -> Any:
    """The topic's table in the config's lake, read with PyIceberg."""
    from bergstream.core.api import load_catalog, load_config, resolve_lake

    lake = resolve_lake(load_config(config, env=stack.as_dict()).lake, config.parent)  # type: ignore[arg-type]
    return load_catalog(lake).load_table(lake.table_identifier(topic))


def boundary_of(config: Path, stack: StackEnv, topic: str) -> dict[int, int]:
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from bergstream.core.api import table_boundary

    try:
        return dict(table_boundary(lake_table(config, stack, topic)))
    except (NoSuchTableError, NoSuchNamespaceError):
        return {}


def test_continuous_pipeline_across_a_broker_restart(
    secure_stack: StackEnv, new_secure_topic: Callable[..., str], tmp_path: Path
) -> None:
    began = time.monotonic()
    topic = topic_for(new_secure_topic, secure_stack)
    initial = produce_now(admin_conf(secure_stack), topic, "first", PIPE_INITIAL)
    config = tmp_path / "lake.yaml"
    config.write_text(secure_lake_yaml(tmp_path, trigger_seconds=2))
    log = tmp_path / "pipeline.log"
    with open(log, "w") as out:
        pipeline = subprocess.Popen(
            [BERGSTREAM, "pipeline", "run", "-c", str(config), "--topic", topic],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **secure_stack.as_dict(), "SPARK_LOCAL_IP": "127.0.0.1"},
        )

    def log_tail() -> str:
        return log.read_text(errors="replace")[-6000:]

    def caught_up(ends: dict[int, int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        boundary: dict[int, int] = {}
        while time.monotonic() < deadline:
            assert pipeline.poll() is None, f"the pipeline exited:\n{log_tail()}"
            boundary = boundary_of(config, secure_stack, topic)
            if boundary == ends:
                return
            time.sleep(1)
        raise AssertionError(f"table at {boundary}, Kafka at {ends}:\n{log_tail()}")

    try:
        caught_up(end_offsets(secure_stack, topic), timeout=400)
        first_batch = time.monotonic() - began
        victim = leaders(secure_stack, topic)[2]
        producer = Producing(admin_conf(secure_stack), topic, "during", PIPE_PRODUCED, rate=80)
        with broker_outage(secure_stack, topic, victim) as outage:
            producer.start()
            time.sleep(5)  # some micro-batches before the outage
            outage.kill_then_restart(5)
            produced = producer.finish()
        ends = end_offsets(secure_stack, topic)
        assert sum(ends.values()) == PIPE_INITIAL + PIPE_PRODUCED  # the topic: no duplicate
        caught_up(ends, timeout=300)
        assert pipeline.poll() is None, log_tail()
        pipeline.send_signal(signal.SIGTERM)
        code = pipeline.wait(120)
        assert code == 0, f"the pipeline exited with {code}:\n{log_tail()}"
        rows = table_rows(lake_table(config, secure_stack, topic).scan().to_arrow().to_pylist())
        assert_exactly(rows, initial + produced)
        print(
            f"\n(3) pipeline up and caught up {first_batch:.1f} s, whole run "
            f"{time.monotonic() - began:.1f} s: {len(rows)} rows, broker {victim} killed"
        )
    finally:
        if pipeline.poll() is None:
            pipeline.send_signal(signal.SIGTERM)
            try:
                pipeline.wait(120)
            except subprocess.TimeoutExpired:
                pipeline.kill()
                pipeline.wait()
