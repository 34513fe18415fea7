"""The pipeline on a real Spark standalone cluster (a master and two workers started from the
installed PySpark on 127.0.0.1): ``bergstream pipeline run`` with ``lake.pipeline.master:
spark://...`` as the driver, the jars served to the executors by it. One executor JVM is killed
with SIGKILL while the run copies a backlog batch after batch: Spark reruns its tasks, the worker
starts another executor, and the table still holds every record of the topic exactly once. A
typed topic's batches decode in the executors' Python workers, which read Kafka themselves."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bergstream.core.lake import LakeConfig
from bergstream.devstack.stack.ports import free_ports
from bergstream.pipeline.settings import resolve_pipeline_lake
from tests.kits.lake import consume_all, table_rows_pyiceberg
from tests.pipeline.spark_cluster import Executor, StandaloneCluster

pytestmark = pytest.mark.slow

BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
PARTITIONS = 4
RECORDS = 240_000
PER_BATCH = 12_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers (one core, 1.5 GB each); everything stopped by PID after."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start_master()
        cluster.add_worker()
        cluster.add_worker()
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.executor_pids(), "executors outlived their workers"


def _config(path: Path, bootstrap: str, home: Path, master: str, extra: str = "") -> Path:
    """A lake on ``master`` (``extra``: more YAML after the ``lake:`` section)."""
    path.write_text(
        textwrap.dedent(
            f"""
            lake:
              kafka_bootstrap: "{bootstrap}"
              catalog:
                uri: sqlite:///{home}/lake/catalog.db
                warehouse: {home}/lake/warehouse
              pipeline:
                master: {master}
                max_offsets_per_trigger: {PER_BATCH}
                checkpoint_dir: {home}/lake/checkpoints
                spark_conf:
                  spark.driver.memory: 1g
                  spark.executor.memory: 1g
            """
        )
        + extra
    )
    return path


def _produce(bootstrap: str, topic: str, count: int, value: Callable[[int], bytes]) -> None:
    """``count`` records, round robin over the partitions, idempotent (no duplicates)."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}
    )
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value(i), f"k{i}".encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "records left unsent"


def _start(config: Path, topic: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [BERGSTREAM, "pipeline", "run", "-c", str(config), "--topic", topic, "--once"],
            stdout=subprocess.PIPE,
            stderr=out,
            start_new_session=True,
        )


def _summary(process: subprocess.Popen[bytes], log: Path, timeout: float) -> dict[str, object]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise AssertionError(f"the run took over {timeout}s:\n{log.read_text()[-5000:]}") from None
    assert process.returncode == 0, log.read_text()[-5000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def _commits(log: Path) -> int:
    return sum(1 for line in log.read_bytes().splitlines() if line.startswith(b"batch "))


def _task_ticks(pid: int) -> int:
    """CPU ticks the task threads of executor ``pid`` have used so far (Spark names them
    ``Executor task launch worker ...``; Linux keeps 15 characters)."""
    total = 0
    for thread in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if not (thread / "comm").read_text().startswith("Executor task"):
                continue
            fields = (thread / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def _running_a_task(cluster: StandaloneCluster) -> list[Executor]:
    """The executors whose task threads burn CPU now (over 50 ms): running a task."""
    executors = cluster.executors()
    before = {e.pid: _task_ticks(e.pid) for e in executors}
    time.sleep(0.05)
    return [e for e in executors if _task_ticks(e.pid) - before[e.pid] >= 2]


def _kill_executors_mid_task(
    cluster: StandaloneCluster,
    process: subprocess.Popen[bytes],
    log: Path,
    rng: random.Random,
) -> list[tuple[int, str]]:
    """Once the run has committed two batches and both workers run an executor, SIGKILL an
    executor that runs a task, after a random pause; again (at most eight kills) while the
    driver reports no task lost (the task ended between look and kill). Returns (PID, worker)
    of each executor killed."""
    deadline = time.monotonic() + 300

    def wait(condition: Callable[[], bool], what: str) -> None:
        while not condition():
            assert process.poll() is None, f"the run ended {what}:\n{log.read_text()[-5000:]}"
            assert time.monotonic() < deadline, (
                f"waited for {what}:\n{log.read_text()[-3000:]}\n{cluster.logs()}"
            )
            time.sleep(0.01)

    busy: list[Executor] = []

    def running() -> bool:
        busy[:] = _running_a_task(cluster)
        return bool(busy)

    def task_lost() -> bool:
        return b"Lost task" in log.read_bytes()

    killed: list[tuple[int, str]] = []
    while True:
        wait(
            lambda: (
                task_lost()
                or (_commits(log) >= 2 and len({e.worker for e in cluster.executors()}) == 2)
            ),
            "two commits on two executors",
        )
        if task_lost():
            return killed
        assert len(killed) < 8, f"{len(killed)} kills and not one landed in a task"
        time.sleep(rng.uniform(0.0, 1.0))
        wait(running, "an executor running a task")
        victim = rng.choice(busy)
        os.kill(victim.pid, signal.SIGKILL)
        killed.append((victim.pid, victim.worker))
        wait(lambda: len(_lost_executors(log.read_text())) == len(killed), "the loss noticed")


def _lost_executors(text: str) -> set[str]:
    """Ids of the executors the driver's log says it lost."""
    return set(re.findall(r"Lost executor (\d+) on", text))


@pytest.mark.timeout(900)
def test_executor_killed_mid_run_table_is_topic_exactly_once(
    cluster: StandaloneCluster,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    home = tmp_path / "home"
    config = _config(tmp_path / "lake.yaml", kafka_bootstrap, home, cluster.url)
    topic = create_topic(PARTITIONS, prefix="cluster")
    began = time.monotonic()
    _produce(kafka_bootstrap, topic, RECORDS, lambda i: f"value-{i}-".encode() * 6)
    print(f"produced {RECORDS:,} records in {time.monotonic() - began:.1f} s")

    log = tmp_path / "pipeline.log"
    began = time.monotonic()
    process = _start(config, topic, log)
    killed = _kill_executors_mid_task(cluster, process, log, rng)
    commits_before_kill = _commits(log)
    summary = _summary(process, log, timeout=600)
    seconds = time.monotonic() - began
    text = log.read_text()
    print(
        f"killed executor(s) {killed} after {commits_before_kill} commit(s); "
        f"run {seconds:.1f} s, {summary['batches']} batches, "
        f"{len(re.findall(r'Lost task', text))} task(s) lost and rerun"
    )

    # The kill landed in a running task and Spark noticed: it lost the executor and its task
    # (rerun elsewhere), and the worker that ran it started another executor for the application.
    batches = summary["batches"]
    assert isinstance(batches, int) and commits_before_kill < batches, "finished before the kill"
    assert len(_lost_executors(text)) == len(killed), text[-5000:]
    assert re.search(r"Lost task \S+ in stage .*ExecutorLostFailure", text), text[-5000:]
    for pid, worker in killed:
        assert pid not in cluster.executor_pids()
        worker_log = (cluster.root / f"{worker}.log").read_text()
        app = re.escape(worker_log.split("Asked to launch executor ")[-1].split("/")[0])
        ended = re.search(
            rf"Executor {app}/\d+ finished with state EXITED .*exitStatus 137", worker_log
        )
        assert ended, worker_log[-3000:]
        relaunched = re.findall(rf"Asked to launch executor {app}/\d+", worker_log[ended.end() :])
        assert relaunched, f"{worker} started no executor after the kill:\n{worker_log[-3000:]}"

    lake = resolve_pipeline_lake(LakeConfig(kafka_bootstrap=kafka_bootstrap), home=home)
    truth = consume_all(kafka_bootstrap, topic, PARTITIONS)
    rows = table_rows_pyiceberg(lake, topic)
    keys = [(r["kafka_partition"], r["kafka_offset"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate rows"
    assert len(rows) == len(truth) == RECORDS
    for partition in range(PARTITIONS):
        offsets = [offset for p, offset in keys if p == partition]
        assert offsets == list(range(len(offsets))), f"a gap in partition {partition}"
    for row, record in zip(rows, truth, strict=True):
        assert (row["kafka_partition"], row["kafka_offset"]) == (
            record.partition,
            record.record.offset,
        )
        assert (row["kafka_key"], row["kafka_value"]) == (record.record.key, record.record.value)
    assert summary["records"] == RECORDS
    assert _ran_on(cluster) >= 1
    assert summary["boundary"] == {str(p): RECORDS // PARTITIONS for p in range(PARTITIONS)}


@pytest.mark.timeout(600)
def test_typed_topic_decodes_in_the_executors(
    cluster: StandaloneCluster,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """JSON values typed by a ``codecs:`` rule: the executors' Python workers (this venv's
    interpreter, ``PYSPARK_PYTHON``) fetch the batch from Kafka with confluent-kafka and decode
    it with bergstream's codecs."""
    home = tmp_path / "home"
    topic = create_topic(PARTITIONS, prefix="cluster-typed")
    codecs = f"codecs:\n  topics:\n    - match: {topic}\n      value: json\n"
    config = _config(tmp_path / "lake.yaml", kafka_bootstrap, home, cluster.url, codecs)
    count = 20_000
    _produce(
        kafka_bootstrap,
        topic,
        count,
        lambda i: json.dumps({"id": i, "name": f"n{i}", "amount": i / 4}).encode(),
    )
    log = tmp_path / "pipeline.log"
    summary = _summary(_start(config, topic, log), log, timeout=480)
    assert summary["records"] == count, log.read_text()[-5000:]

    from bergstream.core.lake import load_catalog

    lake = resolve_pipeline_lake(LakeConfig(kafka_bootstrap=kafka_bootstrap), home=home)
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    rows = table.scan(selected_fields=("kafka_partition", "kafka_offset", "id", "name", "amount"))
    got = sorted(rows.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(count))
    assert all(r["name"] == f"n{r['id']}" and r["amount"] == r["id"] / 4 for r in got)
    assert all(r["kafka_partition"] == r["id"] % PARTITIONS for r in got)
    assert _ran_on(cluster) >= 1


def _ran_on(cluster: StandaloneCluster) -> int:
    """How many pipeline applications this cluster has completed."""
    state = cluster.state() or {}
    return sum(app.get("name") == "bergstream-pipeline" for app in state.get("completedapps", []))


@pytest.mark.timeout(300)
def test_a_master_nobody_answers_at_fails_naming_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    """No master answers: the run exits at once (Spark alone would try three times, 20 s
    apart) with the master's URL and what to check, not a Py4J traceback."""
    [port] = free_ports(1)
    master = f"spark://127.0.0.1:{port}"
    config = _config(tmp_path / "lake.yaml", kafka_bootstrap, tmp_path / "home", master)
    done = subprocess.run(
        [BERGSTREAM, "pipeline", "run", "-c", str(config), "--topic", "t", "--once"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: cannot start the Spark application on master {master}: ")
    assert "check lake.pipeline.master, that the cluster is up" in last
    assert "no master answers" in last and "refused" in last.lower()
    assert "Traceback" not in done.stderr
