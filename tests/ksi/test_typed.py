"""KSI serves typed coldset tables byte for byte: values (and keys) held as columns come back as
the exact bytes produced, from the schemas the table keeps in its properties, through schema
evolution; raw tables stay as they are. Local lake, the real avro codec, no registry."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from bergstream.core.api import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    SCHEMA_PROPERTY_PREFIX,
    VALUE_SCHEMA_ID_COLUMN,
    BergstreamConfig,
    CodecsSettings,
    Record,
    RegisteredSchema,
    ResolvedLake,
    SideCodecs,
    StoredSchemas,
    TopicCodecRule,
    TopicCodecs,
    batch_info,
    load_catalog,
    load_registry,
    read_records,
    split_batches,
)
from bergstream.core.typed.schema_registry import SchemaRegistrySettings
from bergstream.plugins.ksi_fetch_filter.coldset import ColdsetError
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.planner import FetchAsk, plan_fetch
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from bergstream.plugins.ksi_fetch_filter.typed import Reencoder, TypedTables
from bergstream.plugins.value_codecs.avro.codec import AvroCodec
from tests.kits.avro_wire import KEY_SCHEMA, PAYMENT_V1, key_bytes, payment_v2, value_bytes
from tests.kits.coldset_tables import make_lake, make_record, write_cold
from tests.ksi.typed_kit import KafkaRow, contract_rows, write_typed

TOPIC = "t"
V1, V2, KEY = 11, 12, 21
PER_VERSION = 400  # records per schema version, over two partitions


@dataclass
class World:
    lake: ResolvedLake
    expected: dict[int, list[tuple[int, Record]]]  # partition -> (timestamp type, record)


def _schemas() -> list[RegisteredSchema]:
    return [
        RegisteredSchema(V1, "AVRO", json.dumps(PAYMENT_V1), subject="t-value", version=1),
        RegisteredSchema(V2, "AVRO", json.dumps(payment_v2()), subject="t-value", version=2),
        RegisteredSchema(KEY, "AVRO", json.dumps(KEY_SCHEMA), subject="t-key", version=1),
    ]


def _rows(start: int, stop: int, version: int) -> list[KafkaRow]:
    out = []
    for index in range(start, stop):
        partition = index % 2
        kind = LOG_APPEND_TIME if partition == 1 and index % 40 < 20 else CREATE_TIME
        out.append(
            (
                partition,
                kind,
                Record(
                    offset=index // 2,
                    timestamp=1_700_000_000_000 + (index // 20) * 1000,
                    key=key_bytes(index, KEY),
                    value=value_bytes(index, V1 if version == 1 else V2, version),
                    headers=(("h", str(index).encode()), ("dup", None)) if index % 3 else (),
                ),
            )
        )
    return out


def _write(lake: ResolvedLake) -> World:
    codecs = TopicCodecs(
        TOPIC,
        SideCodecs({"AVRO": AvroCodec()}, "t-value"),
        SideCodecs({"AVRO": AvroCodec()}, "t-key"),
    )
    v1, v2, key = _schemas()
    first = _rows(0, PER_VERSION, 1)
    half = PER_VERSION // 2
    write_typed(
        lake, TOPIC, contract_rows(first), codecs, StoredSchemas().add([v1, key]),
        {0: half, 1: half}, rows_per_file=70,
    )  # fmt: skip
    second = _rows(PER_VERSION, 2 * PER_VERSION, 2)
    write_typed(
        lake, TOPIC, contract_rows(second), codecs, StoredSchemas().add([v1, v2, key]),
        {0: PER_VERSION, 1: PER_VERSION}, rows_per_file=90,
    )  # fmt: skip
    expected: dict[int, list[tuple[int, Record]]] = {0: [], 1: []}
    for partition, kind, record in first + second:
        expected[partition].append((kind, record))
    return World(lake, expected)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return _write(make_lake(tmp_path_factory.mktemp("ksi-typed")))


def _store(
    lake: ResolvedLake, config: BergstreamConfig | None = None, **settings: Any
) -> ColdStore:
    typed = TypedTables(config or BergstreamConfig(lake=lake.config), load_registry())
    return ColdStore(lake, KsiConfig(topics=[TOPIC], **settings), typed=typed)


def _read_all(store: ColdStore, partition: int) -> list[tuple[int, Record]]:
    cold = store.table(TOPIC)
    assert cold is not None
    seen: list[tuple[int, Record]] = []
    offset = 0
    while (read := cold.read(partition, offset)) is not None:
        rows = read.segment.records(read.start, read.stop)
        seen.extend(rows)
        offset = rows[-1][1].offset + 1
    return seen


def test_the_table_is_typed_and_holds_every_kind_of_record(world: World) -> None:
    table = load_catalog(world.lake).load_table(world.lake.table_identifier(TOPIC))
    rows = table.scan().to_arrow()
    ids = rows.column(VALUE_SCHEMA_ID_COLUMN)
    rebuilt = pc.and_(pc.is_valid(ids), pc.is_null(rows.column("kafka_value")))
    kept = pc.and_(pc.is_valid(ids), pc.is_valid(rows.column("kafka_value")))
    assert pc.sum(rebuilt).as_py() > PER_VERSION  # most values live only in columns
    assert pc.sum(kept).as_py() > 50  # non-canonical and undecodable ones keep their bytes
    assert set(pc.unique(ids).to_pylist()) == {V1, V2, 999_999, None}
    rebuilt_v2 = pc.and_(rebuilt, pc.equal(ids, V2))
    assert pc.sum(rebuilt_v2).as_py() > PER_VERSION // 2  # version 2 rows are typed too
    assert pc.sum(pc.is_valid(rows.column("channel"))).as_py() > PER_VERSION // 2
    assert "channel" in rows.column_names and "amount" in rows.column_names
    assert pc.sum(pc.is_valid(rows.column("key"))).as_py() > PER_VERSION
    props = {k for k in table.properties if k.startswith(SCHEMA_PROPERTY_PREFIX)}
    assert props == {f"{SCHEMA_PROPERTY_PREFIX}{i}" for i in (V1, V2, KEY)}


@pytest.mark.parametrize(
    "rule",
    [None, {"match": "*", "value": "avro", "key": "avro"}, {"match": TOPIC, "value": "raw"}],
    ids=["no-codecs-section", "avro-rule", "raw-rule"],
)
def test_every_record_comes_back_byte_for_byte(world: World, rule: dict[str, str] | None) -> None:
    config = BergstreamConfig(
        lake=world.lake.config,
        codecs=CodecsSettings(topics=[] if rule is None else [TopicCodecRule(**rule)]),
    )
    store = _store(world.lake, config)
    try:
        for partition in (0, 1):
            assert _read_all(store, partition) == world.expected[partition]
    finally:
        store.close()


def test_fetches_carry_the_original_records_and_timestamp_types(world: World) -> None:
    store = _store(world.lake)
    try:
        for partition in (0, 1):
            got: list[tuple[int, Record]] = []
            offset = 0
            while True:
                ask = FetchAsk(TOPIC, partition, offset, 16_384)
                answer = plan_fetch(store, [ask], 1 << 20, 4096)[(TOPIC, partition)]
                if not answer.record_count:
                    break
                assert answer.records is not None and answer.next_offset is not None
                for batch in split_batches(answer.records):
                    kind = batch_info(batch).timestamp_type
                    got.extend((kind, record) for record in read_records(batch))
                offset = answer.next_offset
            assert got == world.expected[partition]
    finally:
        store.close()


def test_each_slice_is_encoded_once(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original: Callable[..., Any] = Reencoder.__call__

    def counting(self: Reencoder, rows: Any) -> Any:
        calls.append(rows.num_rows)
        return original(self, rows)

    monkeypatch.setattr(Reencoder, "__call__", counting)
    store = _store(world.lake, read_ahead_segments=0)
    try:
        first = [_read_all(store, p) for p in (0, 1)]
        encoded = len(calls)
        assert encoded == len(store.segments)  # one call per cached slice
        assert sum(calls) == 2 * PER_VERSION
        again = [_read_all(store, p) for p in (0, 1)]
        assert len(calls) == encoded  # served from the cache: no encoding per fetch
        assert again == first
    finally:
        store.close()


def _copy_without(tmp: Path, schema_id: int) -> ResolvedLake:
    lake = make_lake(tmp)
    _write(lake)
    table = load_catalog(lake).load_table(lake.table_identifier(TOPIC))
    with table.transaction() as transaction:
        transaction.remove_properties(f"{SCHEMA_PROPERTY_PREFIX}{schema_id}")
    return lake


def test_a_schema_neither_stored_nor_registered_fails_the_read(tmp_path: Path) -> None:
    lake = _copy_without(tmp_path, V2)
    store = _store(lake, read_ahead_segments=0)
    try:
        cold = store.table(TOPIC)
        assert cold is not None
        read = cold.read(0, 0)  # version 1 rows still come back
        assert read is not None
        assert read.segment.records(read.start, read.stop)[0][1] == _rows(0, 1, 1)[0][2]
        read = cold.read(0, PER_VERSION // 2)
        assert read is not None
        with pytest.raises(ColdsetError, match=f"unknown schema id {V2}"):
            read.segment.records(read.start, read.stop)
        # A fetch gets a retriable error for the partition, never other bytes.
        answer = plan_fetch(store, [FetchAsk(TOPIC, 0, PER_VERSION // 2, 1 << 20)], 1 << 20, 4096)
        assert answer[(TOPIC, 0)].records is None
        assert f"unknown schema id {V2}" in (answer[(TOPIC, 0)].error or "")
    finally:
        store.close()


def test_an_unreachable_registry_is_a_retriable_failure(tmp_path: Path) -> None:
    lake = _copy_without(tmp_path, V2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    registry = SchemaRegistrySettings(url=f"http://127.0.0.1:{port}", timeout_seconds=2)
    config = BergstreamConfig(lake=lake.config, codecs=CodecsSettings(schema_registry=registry))
    store = _store(lake, config, read_ahead_segments=0)
    try:
        cold = store.table(TOPIC)
        assert cold is not None
        read = cold.read(1, PER_VERSION // 2)
        assert read is not None
        with pytest.raises(ColdsetError, match="registry is unavailable"):
            read.segment.records(read.start, read.stop)
    finally:
        store.close()


def test_a_raw_table_has_no_encoder(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    write_cold(lake, TOPIC, [(0, 0, make_record(o)) for o in range(30)], {0: 30})
    store = _store(lake)
    try:
        cold = store.table(TOPIC)
        assert cold is not None
        assert cold.encoder() is None
        assert [r for _, r in _read_all(store, 0)] == [make_record(o) for o in range(30)]
    finally:
        store.close()


def test_read_ahead_encodes_the_next_row_groups_in_the_background(world: World) -> None:
    store = _store(world.lake, read_ahead_segments=2)
    try:
        answer = plan_fetch(store, [FetchAsk(TOPIC, 0, 0, 1024)], 1024, 1024)[(TOPIC, 0)]
        assert answer.record_count and answer.next_offset is not None
        deadline = time.monotonic() + 30
        ahead: list[Any] = []
        while time.monotonic() < deadline:
            ahead = [
                piece
                for key, (piece, _) in list(store.segments._entries.items())
                if key[2] == 0 and piece.offsets[0] >= answer.next_offset
            ]
            if ahead and all(piece.source.ready for piece in ahead):
                break
            time.sleep(0.05)
        assert ahead and all(piece.source.ready for piece in ahead)  # no fetch read them
    finally:
        store.close()


def test_offsets_for_times_need_no_encoding(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original: Callable[..., Any] = Reencoder.__call__
    monkeypatch.setattr(
        Reencoder, "__call__", lambda self, rows: calls.append(1) or original(self, rows)
    )
    store = _store(world.lake, read_ahead_segments=0)
    try:
        cold = store.table(TOPIC)
        assert cold is not None
        record = world.expected[1][300][1]
        first = next(r for _, r in world.expected[1] if r.timestamp >= record.timestamp)
        assert cold.offset_for_timestamp(1, record.timestamp) == (first.offset, first.timestamp)
        assert calls == []
    finally:
        store.close()
