"""Two ISK instances sharing an ``s3`` cache backend (the stack's S3 server) and the same root
keys behind one load balancer: a client may get LoadTable from one and every file from the
other. For one log state both serve byte-identical metadata and files, including files only the
other instance built, without reading Kafka again."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bergstream.devstack.stack.ports import free_ports
from tests.support import ProxyProcess, start_bergstream_run

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import isk_load  # bench/ is not a package: the load bench and these tests share this module

pytestmark = pytest.mark.slow

CHUNK_RECORDS = 8
RATE = 40  # records/s produced while the rounds run


@dataclass
class Instance:
    """One running ISK: its process, catalog URL and S3 endpoint."""

    process: ProxyProcess
    catalog_url: str
    s3_url: str
    metrics_port: int

    def catalog(self) -> Any:
        """A PyIceberg RestCatalog on this instance (S3 settings from each table's config)."""
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog(f"isk-{uuid.uuid4().hex[:6]}", uri=self.catalog_url)


@pytest.fixture(scope="module")
def instances(
    stack_env: dict[str, str], kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Instance, Instance]]:
    """Two ``bergstream run`` processes, each with its own index, one shared S3 cache bucket
    (and each its own empty lake, so ``merged`` tables are served too)."""
    bucket = f"isk-shared-{uuid.uuid4().hex[:8]}"
    cache = (
        f'{{type: s3, config: {{endpoint: "{stack_env["BERGSTREAM_S3_ENDPOINT"]}", '
        f'access_key: "{stack_env["BERGSTREAM_S3_ACCESS_KEY"]}", '
        f'secret_key: "{stack_env["BERGSTREAM_S3_SECRET_KEY"]}", '
        f'region: "{stack_env.get("BERGSTREAM_S3_REGION", "us-east-1")}", bucket: "{bucket}"}}}}'
    )
    started: list[Instance] = []
    try:
        for name in ("one", "two"):
            workdir = tmp_path_factory.mktemp(f"isk-{name}")
            ports = free_ports(3)
            config = workdir / "isk.yaml"
            config.write_text(
                isk_load.isk_yaml(
                    kafka_bootstrap, workdir, ports, CHUNK_RECORDS, cache, 30.0, lake=True
                )
            )
            process = start_bergstream_run(
                config, kafka_bootstrap, {"BERGSTREAM_HOME": str(workdir / "home")}, f"ISK {name}"
            )
            started.append(
                Instance(
                    process,
                    f"http://127.0.0.1:{ports[0]}",
                    f"http://127.0.0.1:{ports[1]}",
                    ports[2],
                )
            )
        yield started[0], started[1]
    finally:
        for instance in started:
            code = instance.process.stop()
            print(instance.process.log()[-5000:], file=sys.stderr)
            assert code == 0, f"ISK exited with {code}"


def through(table: Any, instance: Instance) -> Any:
    """``table`` (loaded from any instance) with its files read through ``instance``'s S3
    endpoint, with the credentials LoadTable vended, as a client behind a load balancer."""
    from pyiceberg.io import load_file_io
    from pyiceberg.table import Table

    io = load_file_io(
        {**table.io.properties, "s3.endpoint": instance.s3_url}, table.metadata_location
    )
    return Table(table.name(), table.metadata, table.metadata_location, io, table.catalog)


def file_bytes(table: Any) -> dict[str, bytes]:
    """Every file of ``table``'s current snapshot, by path, read through its FileIO: the
    metadata file, the manifest list, the manifests and the data files."""
    paths = [table.metadata_location]
    snapshot = table.current_snapshot()
    if snapshot is not None:
        paths.append(snapshot.manifest_list)
        paths += [m.manifest_path for m in snapshot.manifests(table.io)]
        paths += [task.file.file_path for task in table.scan().plan_files()]
    return {path: table.io.new_input(path).open().read() for path in paths}


def metadata_differences(first: Any, second: Any) -> list[str]:
    """The top-level fields in which two loaded tables' metadata differ, with both values."""
    a, b = first.metadata.model_dump(mode="json"), second.metadata.model_dump(mode="json")
    return [
        f"{k}: {a.get(k)!r} != {b.get(k)!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def checked_rows(table: Any, acked_at_start: int, produced_now: int) -> int:
    """The rows of ``table`` (read through its FileIO), checked as the load test checks them."""
    rows = table.scan(selected_fields=("kafka_partition", "kafka_offset")).to_arrow()
    grouped = rows.group_by("kafka_partition").aggregate(
        [("kafka_offset", "count"), ("kafka_offset", "max"), ("kafka_offset", "count_distinct")]
    )
    partitions = [
        (int(r["kafka_partition"]), int(r["kafka_offset_count"]),
         int(r["kafka_offset_max"]), int(r["kafka_offset_count_distinct"]))
        for r in grouped.to_pylist()
    ]  # fmt: skip
    problem = isk_load.check(partitions, acked_at_start, produced_now)
    assert problem is None, problem
    return rows.num_rows


def test_files_of_one_instance_are_served_by_the_other(
    instances: tuple[Instance, Instance], kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    one, two = instances
    topic = new_topic(partitions=2, prefix="two")
    acks = isk_load.Acks.of([topic])
    producer = isk_load.Producer(kafka_bootstrap, [topic], acks, RATE)
    producer.produce(topic, 37)
    producer.close()
    # Only instance one has loaded the table: instance two serves its metadata, manifests and
    # data files, byte for byte, from the shared cache.
    loaded = one.catalog().load_table(f"hotset.{topic}")
    from_one = file_bytes(through(loaded, one))
    before = isk_load.scrape(two.metrics_port)
    from_two = file_bytes(through(loaded, two))
    assert from_one.keys() == from_two.keys() and len(from_one) >= 4
    differing = [path for path in from_one if from_one[path] != from_two[path]]
    assert not differing, differing
    assert checked_rows(through(loaded, two), 37, 37) == 37
    # Instance two found them all in the shared cache: it rebuilt none from Kafka (its
    # background indexer may index the topic meanwhile: that is counted as purpose "index").
    after = isk_load.scrape(two.metrics_port)
    serve = 'bergstream_isk_kafka_read_bytes_total{cluster="load",purpose="serve"}'
    assert after.get(serve, 0.0) == before.get(serve, 0.0), (before.get(serve), after.get(serve))
    # The same log state loaded from instance two: the same metadata, to the byte.
    again = two.catalog().load_table(f"hotset.{topic}")
    assert again.metadata_location == loaded.metadata_location
    assert metadata_differences(again, loaded) == []


@pytest.mark.parametrize("namespace", ["hotset", "merged"])
def test_a_client_alternating_between_instances_reads_every_record(
    instances: tuple[Instance, Instance],
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    namespace: str,
) -> None:
    """Records are produced throughout; each round loads the table from one instance and reads
    its files through the other, in turn. Every answer holds each acked record once, none of
    the files one instance built is rebuilt from Kafka by the other, and both serve one
    snapshot history: the same metadata for the same log state, and each later state an
    APPEND (after a REPLACE when one rebuilt small files as one) on top of every snapshot
    either served before."""
    one, two = instances
    topic = new_topic(partitions=2, prefix="alt")
    acks = isk_load.Acks.of([topic])
    serve = 'bergstream_isk_kafka_read_bytes_total{cluster="load",purpose="serve"}'
    seen: list[int] = []  # snapshot ids served so far, by either instance
    with isk_load.Producer(kafka_bootstrap, [topic], acks, RATE):
        counts: list[int] = []
        for round_ in range(8):
            loads, reads = (one, two) if round_ % 2 == 0 else (two, one)
            acked_at_start, _ = acks.snapshot(topic)
            table = loads.catalog().load_table(f"{namespace}.{topic}")
            other = reads.catalog().load_table(f"{namespace}.{topic}")
            for loaded in (table, other):
                ids = [s.snapshot_id for s in loaded.metadata.snapshots]
                assert ids[: len(seen)] == seen, (round_, seen, ids)
                # APPENDs, and REPLACEs of small files either rebuilt as one (the same rows)
                operations = {s.summary.operation.value for s in loaded.metadata.snapshots}
                assert operations <= {"append", "replace"}, (round_, operations)
                seen = ids
            if other.metadata.current_snapshot_id == table.metadata.current_snapshot_id:
                assert other.metadata_location == table.metadata_location
                assert metadata_differences(other, table) == []
            # Every file the loading instance built is in the shared cache: the reading one
            # serves them without fetching from Kafka.
            before = isk_load.scrape(reads.metrics_port)
            rows = checked_rows(through(table, reads), acked_at_start, acks.snapshot(topic)[1])
            after = isk_load.scrape(reads.metrics_port)
            assert after.get(serve, 0.0) == before.get(serve, 0.0), (round_, before, after)
            counts.append(rows)
            time.sleep(0.5)
    assert not acks.failures, acks.failures[:3]
    assert counts == sorted(counts) and counts[-1] > counts[0], counts
    # Once production stops, both serve the last state as one metadata file, byte for byte.
    last_one = one.catalog().load_table(f"{namespace}.{topic}")
    last_two = two.catalog().load_table(f"{namespace}.{topic}")
    assert last_one.metadata_location == last_two.metadata_location
    assert file_bytes(through(last_one, one)) == file_bytes(through(last_two, two))
