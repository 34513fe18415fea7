"""ISK's layout of a topic of plain JSON values over an in-process log: the telling values kept
per block fold to the layout of every record at once, a load after new records reads only
those, retention drops what left the log, a Kafka error is retriable and keeps what was read,
and a digest resolves again in a gateway that never served the topic (a restart)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pytest

from bergstream.core.api import StoredSchemas, TopicCodecsResolver, build_layout_of_shapes
from bergstream.core.records import Record
from bergstream.plugins.isk_gateway.kafka.reader import FetchedRange
from bergstream.plugins.isk_gateway.tables import layouts as layouts_module
from bergstream.plugins.isk_gateway.tables.lake_schemas import CONTRACT_BASE
from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts
from bergstream.plugins.isk_gateway.tables.provider import ProviderUnavailable
from tests.kits.avro_registry import typed_context
from tests.kits.fake_log import FakeLog

TOPIC = "orders"


class RecordingLog(FakeLog):
    """A fake log that records the ranges fetched and can fail on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges: list[tuple[int, int, int]] = []
        self.down = False

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        if self.down:
            raise ProviderUnavailable("Fetch: broker not available")
        self.ranges.append((partition, start, end))
        return await super().fetch(topic, partition, start, end)


def value(i: int) -> bytes:
    item: dict[str, object] = {"id": i, "amount": i * 1.5 if i % 4 else i}
    if i % 3 == 0:
        item["note"] = f"n{i}"
    if i >= 50:
        item["late"] = True
    return json.dumps(item, separators=(",", ":")).encode()


def append(log: FakeLog, partition: int, numbers: range) -> None:
    start = log.end(TOPIC, partition)
    records = [Record(start + n, 1_714_564_800_000 + i, None, value(i), ())
               for n, i in enumerate(numbers)]  # fmt: skip
    for first in range(0, len(records), 3):
        log.append(TOPIC, partition, records[first : first + 3])


def layouts_of(tmp_path: Path, log: FakeLog) -> TopicLayouts:
    context = typed_context(tmp_path, {"topics": [{"match": TOPIC, "value": "json"}]})
    return TopicLayouts(TopicCodecsResolver(context), source=log)


def whole_fold(tmp_path: Path, values: list[bytes]) -> object:
    """The layout of all ``values`` folded at once."""
    codecs = TopicCodecsResolver(
        typed_context(tmp_path, {"topics": [{"match": TOPIC, "value": "json"}]})
    ).for_topic(TOPIC)
    assert codecs is not None
    array = pa.array(values, pa.large_binary())
    schema, last = CONTRACT_BASE.schema, CONTRACT_BASE.last_column_id
    return build_layout_of_shapes(schema, last, codecs, StoredSchemas(), array).layout.fingerprint


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layouts_module, "BLOCK_OFFSETS", 10)
    monkeypatch.setattr(layouts_module, "_READ_OFFSETS", 4)


def test_blocks_fold_like_the_whole_log(tmp_path: Path) -> None:
    log = RecordingLog()
    log.create(TOPIC, 2)
    append(log, 0, range(0, 23))
    append(log, 1, range(30, 37))
    layouts = layouts_of(tmp_path, log)

    typed = asyncio.run(layouts.resolve(TOPIC))
    assert typed is not None
    every = [value(i) for i in [*range(0, 23), *range(30, 37)]]  # partition then offset order
    assert typed.layout.fingerprint == whole_fold(tmp_path, every)
    assert [f.name for f in typed.schema.fields][-3:] == ["id", "amount", "note"]
    assert {(p, s, e) for p, s, e in log.ranges} >= {(0, 0, 4), (0, 20, 23), (1, 0, 4)}

    # new records: only they are read; no new shape, the same layout
    log.ranges.clear()
    append(log, 0, range(23, 26))
    again = asyncio.run(layouts.resolve(TOPIC))
    assert again is typed
    assert log.ranges == [(0, 23, 26)]

    # a new key: a new column and a new digest; the old digest is still served here, and the new
    # one resolves in a gateway that never served the topic
    append(log, 1, range(50, 53))
    evolved = asyncio.run(layouts.resolve(TOPIC))
    assert evolved is not None and evolved.digest != typed.digest
    assert "late" in [f.name for f in evolved.schema.fields]
    assert asyncio.run(layouts.by_digest(TOPIC, typed.digest)) is typed
    fresh = layouts_of(tmp_path, log)
    assert asyncio.run(fresh.by_digest(TOPIC, evolved.digest)).layout == evolved.layout

    # retention: blocks below the log start are dropped, a cut block is read again
    log.ranges.clear()
    log.log_start[(TOPIC, 0)] = 12
    cut = asyncio.run(layouts.resolve(TOPIC))
    assert cut is not None
    assert log.ranges == [(0, 12, 16), (0, 16, 20)]
    kept = [value(i) for i in [*range(12, 26), *range(30, 37), *range(50, 53)]]
    assert cut.layout.fingerprint == whole_fold(tmp_path, kept)


def test_a_kafka_error_is_retriable_and_keeps_what_was_read(tmp_path: Path) -> None:
    log = RecordingLog()
    log.create(TOPIC, 1)
    append(log, 0, range(0, 15))
    layouts = layouts_of(tmp_path, log)
    assert asyncio.run(layouts.resolve(TOPIC)) is not None
    append(log, 0, range(15, 18))
    log.down = True
    with pytest.raises(ProviderUnavailable):
        asyncio.run(layouts.resolve(TOPIC))
    log.down = False
    log.ranges.clear()
    assert asyncio.run(layouts.resolve(TOPIC)) is not None
    assert log.ranges == [(0, 15, 18)]
