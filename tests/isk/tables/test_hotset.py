"""HotsetProvider over an in-process log of real record batches: chunking, the index, deterministic
metadata, PyIceberg reading the table through provider.read_file, strict keys."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.files.hotset_layout import layout_name
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.paths import key_from_uri, parse_key
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile, NoSuchNamespace, NoSuchTable
from bergstream.plugins.isk_gateway.tables.store import FileStore
from tests.isk.tables.hotset_cases import T0, expected_rows, make_provider
from tests.kits.fake_log import DAY_MS, FakeLog
from tests.kits.hotset_reader import scan_rows

MIDNIGHT = (T0 // DAY_MS + 1) * DAY_MS


async def test_namespaces_and_tables(tmp_path: Path, log: FakeLog) -> None:
    provider = make_provider(tmp_path, log)
    assert await provider.list_namespaces() == ["hotset"]
    assert await provider.list_tables("hotset") == ["orders"]
    with pytest.raises(NoSuchNamespace):
        await provider.list_tables("coldset")
    with pytest.raises(NoSuchTable):
        await provider.load_table("hotset", "missing")
    with pytest.raises(NoSuchNamespace):
        await provider.load_table("nope", "orders")
    with pytest.raises(NoSuchTable):
        await provider.load_table("hotset", "__consumer_offsets")


async def test_empty_topic_has_no_snapshot(tmp_path: Path, log: FakeLog) -> None:
    provider = make_provider(tmp_path, log)
    loaded = await provider.load_table("hotset", "orders")
    assert "current-snapshot-id" not in loaded.metadata
    assert loaded.metadata["snapshots"] == [] and loaded.metadata["refs"] == {}
    assert await scan_rows(provider, loaded) == []


async def test_table_reads_back_as_the_records(tmp_path: Path, log: FakeLog) -> None:
    # partition 0: 25 records crossing midnight at record 13; partition 1: 4 records
    records = {
        0: log.produce("orders", 0, 25, lambda i: MIDNIGHT - 13 + i),
        1: log.produce("orders", 1, 4, lambda i: T0 + i, per_batch=2),
    }
    provider = make_provider(tmp_path, log, chunk_records=10)
    loaded = await provider.load_table("hotset", "orders")
    metadata = loaded.metadata
    snapshot_id = metadata["current-snapshot-id"]
    assert 0 < snapshot_id < 2**63
    assert metadata["refs"] == {"main": {"snapshot-id": snapshot_id, "type": "branch"}}
    (snapshot,) = metadata["snapshots"]
    assert snapshot["sequence-number"] == 1
    assert snapshot["summary"]["total-records"] == "29"
    assert snapshot["timestamp-ms"] == T0  # its oldest record's (partition 1's first)

    assert await scan_rows(provider, loaded) == expected_rows(records)

    # chunks: p0 [0,10) [10,13) cut at midnight, [13,20) up to the next multiple of 10, tail
    # [20,25); p1 tail [0,4)
    keys = [key for key, _size in await provider.list_keys("c1/hotset/orders/data/", 100)]
    ranges = sorted((parse_key(k).partition, parse_key(k).start, parse_key(k).end) for k in keys)
    assert ranges == [(0, 0, 10), (0, 10, 13), (0, 13, 20), (0, 20, 25), (1, 0, 4)]
    days = {(parse_key(k).partition, parse_key(k).start): parse_key(k).bucket for k in keys}
    assert days[(0, 10)] + 1 == days[(0, 13)] == MIDNIGHT // DAY_MS
    indexed = provider.index.chunks(f"orders#{provider.layout}", 0)
    # The served tail is sealed too: the next snapshot cuts its chunks there.
    assert [(c.start_offset, c.end_offset) for c in indexed] == [
        (0, 10), (10, 13), (13, 20), (20, 25)
    ]  # fmt: skip
    tail = provider.index.chunks(f"orders#{provider.layout}", 1)
    assert [(c.start_offset, c.end_offset) for c in tail] == [(0, 4)]

    # file sizes in the manifests equal the bytes served; stats prune by offset
    table_files = await scan_files(provider, loaded)
    for path, size in table_files:
        assert len(await provider.read_file(key_from_uri("gw", path))) == size
    pruned = await scan_rows(
        provider, loaded, row_filter="kafka_offset >= 20 and kafka_partition = 0"
    )
    assert [row["kafka_offset"] for row in pruned] == list(range(20, 25))


async def scan_files(provider: HotsetProvider, loaded) -> list[tuple[str, int]]:
    from tests.kits.hotset_reader import open_table

    table = open_table(provider, loaded, asyncio.get_running_loop())

    def run() -> list[tuple[str, int]]:
        return [(t.file.file_path, t.file.file_size_in_bytes) for t in table.scan().plan_files()]

    return await asyncio.to_thread(run)


async def test_same_state_gives_identical_files(tmp_path: Path, log: FakeLog) -> None:
    log.produce("orders", 0, 23, lambda i: T0 + i * 1000)
    log.produce("orders", 1, 7, lambda i: T0 + i)
    first = make_provider(tmp_path, log, name="a")
    second = make_provider(tmp_path, log, name="b")  # its own index and cache: built anew
    one = await first.load_table("hotset", "orders")
    two = await second.load_table("hotset", "orders")
    fetches = log.fetches
    again = await first.load_table("hotset", "orders")  # from the index this time
    assert log.fetches == fetches  # sealed chunks from the index, the tail remembered
    assert one == two == again
    keys = [k for k, _ in await first.list_keys("c1/hotset/orders/", 1000)]
    assert keys == [k for k, _ in await second.list_keys("c1/hotset/orders/", 1000)]
    assert any(k.endswith(".avro") for k in keys)
    for key in keys:
        assert await first.read_file(key) == await second.read_file(key)
        assert await first.file_size(key) == len(await first.read_file(key))

    # new records: a new snapshot id; the sealed chunks are kept, the tail is re-chunked
    log.produce("orders", 1, 5, lambda i: T0 + i)
    three = await first.load_table("hotset", "orders")
    assert three.metadata["current-snapshot-id"] != one.metadata["current-snapshot-id"]
    assert len(await scan_rows(first, three)) == 35


async def test_data_files_rebuild_from_the_key_alone(tmp_path: Path, log: FakeLog) -> None:
    records = {0: log.produce("orders", 0, 12, lambda i: T0 + i), 1: []}
    built = make_provider(tmp_path, log, name="a")
    loaded = await built.load_table("hotset", "orders")
    fresh = make_provider(tmp_path, log, name="b")  # never loaded the table, empty cache
    data_keys = [k for k, _ in await built.list_keys("c1/hotset/orders/data/", 100)]
    assert data_keys
    for key in data_keys:
        assert await fresh.read_file(key) == await built.read_file(key)
    rows = []
    for key in data_keys:
        rows += pq.read_table(io.BytesIO(await fresh.read_file(key))).to_pylist()
    assert rows == expected_rows(records)
    assert loaded.metadata_location.endswith(".metadata.json")
    # metadata files are only known to the gateway that built them (or its cache)
    with pytest.raises(NoSuchFile):
        await fresh.read_file(key_from_uri("gw", loaded.metadata_location))


@pytest.mark.parametrize(
    "key",
    [
        "c1/hotset/orders/data/p=0/day=2023-11-15/0-10.parquet",  # wrong day for the rows
        "c1/hotset/orders/data/p=0/day=-/0-10.parquet",  # rows, but the key says none
        "c1/hotset/orders/data/p=0/day=2023-11-14/0-99.parquet",  # beyond the log end
        "c1/hotset/orders/data/p=5/day=2023-11-14/0-10.parquet",  # no such partition
        "c1/hotset/nope/data/p=0/day=2023-11-14/0-10.parquet",  # no such topic
        "c2/hotset/orders/data/p=0/day=2023-11-14/0-10.parquet",  # another cluster
        "c1/hotset/orders/data/p=0/day=2023-11-14/0-10.parquet.x",
        "c1/hotset/orders/metadata/1-00000000-0000-0001-0000-000000000000.metadata.json",
    ],
)
async def test_made_up_keys_are_refused(tmp_path: Path, log: FakeLog, key: str) -> None:
    log.produce("orders", 0, 12, lambda i: T0 + i)
    provider = make_provider(tmp_path, log)
    assert (await provider.read_file("c1/hotset/orders/data/p=0/day=2023-11-14/0-10.parquet"))[
        :4
    ] == b"PAR1"
    with pytest.raises(NoSuchFile):
        await provider.read_file(key)


async def test_log_start_drops_chunks_kafka_no_longer_has(tmp_path: Path, log: FakeLog) -> None:
    log.produce("orders", 0, 30, lambda i: T0 + i)
    provider = make_provider(tmp_path, log)
    await provider.load_table("hotset", "orders")
    log.log_start[("orders", 0)] = 15  # retention deleted [0, 15)
    loaded = await provider.load_table("hotset", "orders")
    rows = await scan_rows(provider, loaded)
    assert [row["kafka_offset"] for row in rows] == list(range(15, 30))
    indexed = provider.index.chunks(f"orders#{provider.layout}", 0)
    assert [c.start_offset for c in indexed] == [0, 10, 20]


async def test_hour_unit_cuts_chunks_by_hour_and_partitions_by_hour(
    tmp_path: Path, log: FakeLog
) -> None:
    hour_ms = 3_600_000
    top_of_hour = (T0 // hour_ms + 1) * hour_ms
    records = {0: log.produce("orders", 0, 12, lambda i: top_of_hour - 5 + i), 1: []}
    provider = make_provider(tmp_path, log, unit="hour")
    loaded = await provider.load_table("hotset", "orders")
    assert await scan_rows(provider, loaded) == expected_rows(records)
    (spec,) = loaded.metadata["partition-specs"]
    assert [f["transform"] for f in spec["fields"]] == ["identity", "hour"]
    keys = [k for k, _ in await provider.list_keys("c1/hotset/orders/data/", 100)]
    parsed = sorted((parse_key(k) for k in keys), key=lambda k: k.start)
    # cut at the top of the hour (offset 5) although a day-cut chunk would hold 10 offsets, and
    # at the next multiple of 10
    assert [(k.start, k.end, k.unit) for k in parsed] == [
        (0, 5, "hour"), (5, 10, "hour"), (10, 12, "hour")
    ]  # fmt: skip
    assert parsed[1].bucket == parsed[0].bucket + 1 == top_of_hour // hour_ms
    assert "/hour=" in keys[0] and "/day=" not in keys[0]
    # the index keeps hour chunks apart from day chunks of the same topic
    assert provider.index.chunks(f"orders#{layout_name('day', 'snappy')}", 0) == []
    hour_chunks = provider.index.chunks(f"orders#{provider.layout}", 0)
    assert [(c.start_offset, c.end_offset) for c in hour_chunks] == [(0, 5), (5, 10), (10, 12)]
    # a file rebuilds from its hour key alone, byte for byte
    fresh = make_provider(tmp_path, log, name="b", unit="hour")
    for key in keys:
        assert await fresh.read_file(key) == await provider.read_file(key)
    pruned = await scan_rows(
        provider, loaded, row_filter=f"kafka_timestamp >= {top_of_hour * 1000}"
    )
    assert [row["kafka_offset"] for row in pruned] == list(range(5, 12))


class HeldLookups(FileStore):
    """A store whose cache lookups after the first return (with what they found) only once a
    file was kept: the lookup of a reader that came second ends after the first reader's build
    finished, the interleaving that made a second reader build the file again."""

    def __init__(self, cache: LocalDiskCache, cache_prefix: str) -> None:
        super().__init__(cache, cache_prefix=cache_prefix)
        self.lookups = 0
        self.kept = asyncio.Event()

    async def get(self, key: str) -> bytes | memoryview | None:
        self.lookups += 1
        ordinal = self.lookups
        data = await super().get(key)
        if ordinal > 1:
            await asyncio.wait_for(self.kept.wait(), 10)
        return data

    async def keep(self, key: str, data: bytes | memoryview, write_behind: bool = False) -> None:
        await super().keep(key, data, write_behind)
        self.kept.set()


def fresh_with_held_lookups(tmp_path: Path, log: FakeLog) -> HotsetProvider:
    """A provider with an empty cache (every file must be built) and :class:`HeldLookups`."""
    cache = LocalDiskCache(tmp_path / "cache-held", 1 << 28)
    store = HeldLookups(cache, cache_prefix=layout_name("day", "snappy"))
    return make_provider(tmp_path, log, name="held", store=store)


async def test_concurrent_reads_of_a_missing_file_build_it_once(
    tmp_path: Path, log: FakeLog
) -> None:
    log.produce("orders", 0, 12, lambda i: T0 + i)
    built = make_provider(tmp_path, log, name="a")
    await built.load_table("hotset", "orders")
    (key, *_rest) = [k for k, _ in await built.list_keys("c1/hotset/orders/data/", 100)]
    fresh = fresh_with_held_lookups(tmp_path, log)
    before = log.fetches
    results = await asyncio.gather(*(fresh.read_file(key) for _ in range(8)))
    assert log.fetches - before == 1
    assert all(data == results[0] for data in results)
    assert results[0] == await built.read_file(key)
    assert await fresh.read_range(key, 4, 10) == results[0][4:10]
    assert await fresh.read_file(key) == results[0]  # held now: no lookup, no build
    assert log.fetches - before == 1


async def test_a_cancelled_reader_does_not_fail_the_readers_waiting_for_it(
    tmp_path: Path, log: FakeLog
) -> None:
    log.produce("orders", 0, 12, lambda i: T0 + i)
    built = make_provider(tmp_path, log, name="a")
    await built.load_table("hotset", "orders")
    (key, *_rest) = [k for k, _ in await built.list_keys("c1/hotset/orders/data/", 100)]
    fresh = make_provider(tmp_path, log, name="b")
    looking = asyncio.Event()
    release = asyncio.Event()
    lookup = fresh.store.get

    async def held_first_lookup(wanted: str) -> bytes | memoryview | None:
        if not looking.is_set():
            looking.set()
            await release.wait()  # the first reader waits here until it is cancelled
        return await lookup(wanted)

    fresh.store.get = held_first_lookup  # type: ignore[method-assign]
    first = asyncio.create_task(fresh.read_file(key))
    await looking.wait()
    second = asyncio.create_task(fresh.read_file(key))  # joins the first reader's lookup
    await asyncio.sleep(0)
    first.cancel()
    assert await asyncio.wait_for(second, 10) == await built.read_file(key)
    assert first.cancelled()


async def test_configured_synthesizers_build_missing_files_first(
    tmp_path: Path, log: FakeLog
) -> None:
    from bergstream.plugins.isk_gateway.files.hotset_parquet import HotsetDataSynthesizer

    class Counting(HotsetDataSynthesizer):
        built: list[str] = []

        async def synthesize(self, path: str) -> bytes:
            self.built.append(path)
            return await super().synthesize(path)

    log.produce("orders", 0, 12, lambda i: T0 + i)
    built = make_provider(tmp_path, log, name="a")
    await built.load_table("hotset", "orders")
    keys = [k for k, _ in await built.list_keys("c1/hotset/orders/data/", 100)]
    counting = Counting(log, "c1")
    fresh = make_provider(
        tmp_path, log, name="b", synthesizers=[counting, HotsetDataSynthesizer(log, "c1")]
    )
    for key in keys:
        assert await fresh.read_file(key) == await built.read_file(key)
    assert counting.built == keys
    unhandled = make_provider(
        tmp_path, log, name="c", synthesizers=[HotsetDataSynthesizer(log, "c1", unit="hour")]
    )
    with pytest.raises(NoSuchFile, match="no file synthesizer handles it"):
        await unhandled.read_file(keys[0])


async def test_sequential_cold_reads_build_the_next_file_ahead(
    tmp_path: Path, log: FakeLog
) -> None:
    log.produce("orders", 0, 60, lambda i: T0 + i)
    built = make_provider(tmp_path, log, chunk_records=10, name="a")
    await built.load_table("hotset", "orders")
    fresh = make_provider(tmp_path, log, chunk_records=10, name="b")
    await fresh.load_table("hotset", "orders")  # lists the files; builds only the tail
    keys = sorted(
        (k for k, _ in await fresh.list_keys("c1/hotset/orders/data/", 100)),
        key=lambda k: parse_key(k).start,
    )
    assert len(keys) == 6
    for key in keys:  # a fresh cache: nothing held
        fresh.store._memory.pop(key, None)
        fresh.cache.delete(fresh.store.cache_key(key))

    async def settle() -> None:
        for _ in range(50):
            if not fresh.files._read_ahead_tasks:
                return
            await asyncio.sleep(0.01)

    await fresh.read_file(keys[0])
    await settle()
    assert not fresh.store.holds(keys[1])  # one cold read is no scan yet
    await fresh.read_file(keys[3])
    await settle()
    assert not fresh.store.holds(keys[4])  # a jump is no scan either
    await fresh.read_file(keys[4])  # keys[3] then keys[4]: sequential
    await settle()
    assert fresh.store.holds(keys[5])  # built ahead, before anyone asked
    before = log.fetches
    assert await fresh.read_file(keys[5]) == await built.read_file(keys[5])
    assert log.fetches == before
    assert not fresh.store.holds(keys[1]) and not fresh.store.holds(keys[2])


async def cold_provider(
    tmp_path: Path, log: FakeLog, name: str
) -> tuple[HotsetProvider, list[str]]:
    """A provider that listed ``orders`` (chunks of 10) but holds none of its files, and the
    files in scan order (partition, then offset)."""
    fresh = make_provider(tmp_path, log, chunk_records=10, name=name)
    await fresh.load_table("hotset", "orders")
    keys = sorted(
        (k for k, _ in await fresh.list_keys("c1/hotset/orders/data/", 100)),
        key=lambda k: (parse_key(k).partition, parse_key(k).start),
    )
    for key in keys:
        fresh.store._memory.pop(key, None)
        fresh.cache.delete(fresh.store.cache_key(key))
    return fresh, keys


async def settled(provider: HotsetProvider) -> None:
    """Wait until no read-ahead build runs."""
    for _ in range(200):
        if not provider.files._read_ahead_tasks:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("read-ahead builds did not end")


async def test_a_scan_on_two_threads_reads_ahead_into_the_next_partition(
    tmp_path: Path, log: FakeLog
) -> None:
    """An engine scanning on two threads asks for two files at once, then the next ones: the
    two files after the pair are built ahead, across the partition boundary."""
    log.produce("orders", 0, 20, lambda i: T0 + i)
    log.produce("orders", 1, 30, lambda i: T0 + i)
    built = make_provider(tmp_path, log, chunk_records=10, name="a")
    await built.load_table("hotset", "orders")
    fresh, keys = await cold_provider(tmp_path, log, "b")
    assert [(parse_key(k).partition, parse_key(k).start) for k in keys] == [
        (0, 0), (0, 10), (1, 0), (1, 10), (1, 20)
    ]  # fmt: skip
    await asyncio.gather(fresh.read_file(keys[0]), fresh.read_file(keys[1]))
    await settled(fresh)
    assert fresh.store.holds(keys[2]) and fresh.store.holds(keys[3])  # partition 1, ahead
    assert not fresh.store.holds(keys[4])  # two files ahead, not more
    before = log.fetches
    assert await fresh.read_file(keys[2]) == await built.read_file(keys[2])
    assert log.fetches == before  # served as built ahead
    await settled(fresh)
    assert fresh.store.holds(keys[4])  # using a file built ahead keeps two ahead
    assert await fresh.read_file(keys[4]) == await built.read_file(keys[4])


async def test_neighbours_read_in_reverse_order_are_a_scan_too(
    tmp_path: Path, log: FakeLog
) -> None:
    """Two threads' reads of neighbouring files may reach ISK in either order."""
    log.produce("orders", 0, 50, lambda i: T0 + i)
    make_provider(tmp_path, log, chunk_records=10, name="a")
    fresh, keys = await cold_provider(tmp_path, log, "b")
    await fresh.read_file(keys[1])
    await fresh.read_file(keys[0])
    await settled(fresh)
    assert fresh.store.holds(keys[2]) and fresh.store.holds(keys[3])  # after the later one
    assert not fresh.store.holds(keys[4])


async def test_a_read_ahead_waits_for_a_free_core(tmp_path: Path, log: FakeLog) -> None:
    """With as many client builds in flight as cores, a read-ahead build waits for one to end:
    a guess never takes a core from a file a client waits for."""
    log.produce("orders", 0, 40, lambda i: T0 + i)
    built = make_provider(tmp_path, log, chunk_records=10, name="a")
    await built.load_table("hotset", "orders")
    fresh, keys = await cold_provider(tmp_path, log, "b")
    fresh.files._cores = 1
    await fresh.read_file(keys[0])
    release = asyncio.Event()
    synthesize = fresh.files._synthesize
    started: list[str] = []

    async def held(key: str) -> bytes:
        started.append(key)
        if key == keys[1]:
            await release.wait()  # the client's build of keys[1] takes its time
        return await synthesize(key)

    fresh.files._synthesize = held  # type: ignore[method-assign]
    reading = asyncio.create_task(fresh.read_file(keys[1]))  # sequential: reads ahead
    await asyncio.sleep(0.2)
    assert started == [keys[1]]  # the read-ahead of keys[2] waits: the one core is taken
    release.set()
    assert await reading == await built.read_file(keys[1])
    await settled(fresh)
    assert started == [keys[1], keys[2], keys[3]]
    assert fresh.store.holds(keys[2]) and fresh.store.holds(keys[3])


async def test_gateways_of_other_codecs_share_a_cache_and_index_without_mixing(
    tmp_path: Path, log: FakeLog
) -> None:
    """The same key is a file of another size under another codec: each layout keeps its own
    index entries and cache entries, so neither ever serves the other's bytes or sizes."""
    import io

    import pyarrow.parquet as pq

    log.produce("orders", 0, 25, lambda i: T0 + i)
    index, cache = SqliteIndex(tmp_path / "shared.db"), LocalDiskCache(tmp_path / "shared", 1 << 28)
    sizes = {}
    for compression in ("snappy", "zstd", "snappy"):
        provider = HotsetProvider(
            log, index, cache, bucket="gw", cluster="c1", chunk_records=10, compression=compression
        )
        loaded = await provider.load_table("hotset", "orders")
        assert [r["kafka_offset"] for r in await scan_rows(provider, loaded)] == list(range(25))
        listed = dict(await provider.list_keys("c1/hotset/orders/data/", 100))
        for key, size in listed.items():
            data = await provider.read_file(key)
            assert len(data) == size
            codec = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(6).compression
            assert codec.lower() == compression
        sizes.setdefault(compression, listed)
        assert sizes[compression] == listed  # the same layout again: the same files
    assert sizes["snappy"].keys() == sizes["zstd"].keys()
    assert sizes["snappy"] != sizes["zstd"]
