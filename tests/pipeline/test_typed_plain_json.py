"""Plain JSON values (the ``json`` codec, no registry) whose keys appear, disappear and change
type over three pipeline runs: each top-level key becomes a column the first time it is seen,
with the type its batch shows (integers and numbers together make a double); a later value the
column cannot hold (Iceberg cannot widen a long or a double in place) keeps its bytes with the
cause, as a registered schema the table cannot take does. PyIceberg and Spark read what the
values mean; ISK's hotset files hold the coldset's rows; a fourth batch only in Kafka (a new
key) reads through ISK's ``merged`` exactly as the coldset holds it once the pipeline copied it
(same base, same declarations); after DeleteRecords of everything, KSI serves every record byte
for byte from the coldset."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.api import VALUE_ERROR_COLUMN, VALUE_SCHEMA_ID_COLUMN
from bergstream.pipeline import typed_batch
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import run_pipeline
from bergstream.pipeline.typed import topic_typing
from tests.kits.avro_registry import typed_context
from tests.kits.isk_gateway import start_gateway
from tests.kits.ksi_stack import start_ksi_proxy
from tests.kits.lake import Produced, consume_all, produce, table_rows_spark
from tests.pipeline.property_kit import (
    by_position_seen,
    coldset_file_rows,
    delete_everything,
    hotset_rows_of_codecs,
    lake_yaml,
    read_all,
    read_through_ksi,
    take_all_records,
)
from tests.pipeline.typed_kit import FIRST_MS, coldset, sorted_rows

pytestmark = pytest.mark.slow

PARTS = 2
CURRENCIES = ("EUR", "USD", "JPY")


def compact(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def first_batch() -> list[bytes]:
    """id, currency, amount (whole, then fractional: a double), and odd ones."""
    values = [
        compact({"id": i, "currency": CURRENCIES[i % 3],
                 "amount": i * 10 if i < 4 else i * 10 + (i % 2) * 0.5})
        for i in range(12)
    ]  # fmt: skip
    values[4] = compact({"id": 4, "currency": "EUR", "amount": 40})  # "40": reads 40.0
    values.append(b'{"id": 12, "currency": "EUR", "amount": 1.5}')  # spaced
    values.append(b"[1,2]")  # not an object
    values.append(b'{"id":')  # not JSON
    return values


def second_batch() -> list[bytes]:
    """note and tags appear, amount disappears from some, an id turns into a string."""
    values = []
    for i in range(15, 27):
        value: dict[str, Any] = {"id": i, "currency": CURRENCIES[i % 3]}
        if i % 3:
            value["amount"] = i + 0.25
        if i % 2:
            value["note"] = f"order {i} ✓"
        value["tags"] = [f"t{j}" for j in range(i % 3)]
        values.append(compact(value))
    values.append(compact({"id": "X-27", "currency": "EUR", "amount": 2.5}))  # long column
    return values


def third_batch() -> list[bytes]:
    """flag and a nested meta object appear; amount turns into a string in one."""
    values = [
        compact({"id": i, "amount": i * 1.5, "flag": i % 2 == 0,
                 "meta": {"src": "web" if i % 2 else "app", "n": i}})
        for i in range(30, 40)
    ]  # fmt: skip
    values.append(compact({"id": 40, "amount": "12.50"}))  # double column
    return values


def fourth_batch() -> list[bytes]:
    """region appears (only in Kafka until the pipeline runs again), one value is spaced."""
    values = [
        compact({"id": i, "currency": CURRENCIES[i % 3], "amount": i + 0.75,
                 "region": "eu" if i % 2 else "us"})
        for i in range(41, 49)
    ]  # fmt: skip
    values.append(b'{"id": 49, "region": "apac"}')
    return values


def produce_batch(bootstrap: str, topic: str, batch: list[bytes], start: int) -> None:
    produce(bootstrap, topic, [
        Produced(n % PARTS, b"k%d" % n, v, (("n", b"%d" % n),), FIRST_MS + n)
        for n, v in enumerate(batch, start)
    ])  # fmt: skip


def expected_row(text: bytes, columns: list[str]) -> dict[str, Any]:
    """What the table holds for one value: its columns, its kept bytes, whether it failed."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        return {"failed": True, "shaped": False, "kept": text, **dict.fromkeys(columns)}
    if isinstance(value.get("id"), str) or isinstance(value.get("amount"), str):
        # refused shapes
        return {"failed": True, "shaped": True, "kept": text, **dict.fromkeys(columns)}
    row = {c: value.get(c) for c in columns}
    if isinstance(row["amount"], int):
        row["amount"] = float(row["amount"])
    canonical = text == compact(value) and not isinstance(value.get("amount"), int)
    return {"failed": False, "shaped": True, "kept": None if canonical else text, **row}


def assert_hotset_is_coldset(
    home: Path, bootstrap: str, codecs: dict[str, Any], topic: str, lake: PipelineLake
) -> None:
    """ISK's hotset files hold the coldset's rows (its layout: the coldset's schema folded with
    the shapes of every record in Kafka, in one window: what the pipeline's batches made)."""
    table = coldset(lake, topic)
    hot_schema, by_hotset = hotset_rows_of_codecs(home, bootstrap, codecs, topic, lake)
    assert hot_schema.as_struct() == table.schema().as_struct()
    cold_files = coldset_file_rows(table)
    assert len(by_hotset) == len(cold_files)
    for hot_row, cold_row in zip(by_hotset, cold_files, strict=True):
        # a file written before a column existed has no such column: it reads as null
        padded = {**dict.fromkeys(hot_row), **cold_row}
        assert hot_row == padded, {
            k: (v, padded.get(k)) for k, v in hot_row.items() if v != padded.get(k)
        }


def test_plain_json_keys_appear_disappear_and_change_type(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first batch's first two rows make columns its later rows do not fit (integer
    # amounts, then fractions): the whole batch is folded, as any batch with new keys is.
    monkeypatch.setattr(typed_batch, "SAMPLE_ROWS", 2)
    topic = create_topic(PARTS, prefix="typed-plain-json")
    codecs = {"topics": [{"match": topic, "value": "json"}]}  # no registry at all
    typing = topic_typing(typed_context(tmp_path, codecs), topic)
    assert typing is not None
    produced: list[bytes] = []
    reports: list[str] = []
    for batch in (first_batch(), second_batch(), third_batch()):
        produce_batch(kafka_bootstrap, topic, batch, len(produced))
        produced.extend(batch)
        result = run_pipeline(spark, lake, topic, once=True, report=reports.append, codecs=typing)
        assert result.records == len(batch)
    assert sum("folding its shapes" in line for line in reports) == 3, reports

    table = coldset(lake, topic)
    schema = table.schema()
    columns = ["id", "currency", "amount", "note", "tags", "flag", "meta"]
    # columns in the order their keys were first met (the driver folds partition by partition)
    assert sorted(f.name for f in schema.fields[-len(columns) :]) == sorted(columns)
    types = {c: str(schema.find_field(c).field_type) for c in columns}
    assert types["id"] == "long" and types["amount"] == "double"
    assert types["tags"].startswith("list<string>") and types["flag"] == "boolean"
    assert types["meta"].startswith("struct<")

    rows = sorted_rows(table.scan().to_arrow())
    assert len(rows) == len(produced)
    for row in rows:
        number = int(row["kafka_headers"][0]["value"])
        want = expected_row(produced[number], columns)
        where = f"record {number}: {produced[number]!r}"
        assert (row[VALUE_ERROR_COLUMN] is not None) == want["failed"], (where, row)
        assert row["kafka_value"] == want["kept"], where
        assert {c: row[c] for c in columns} == {c: want[c] for c in columns}, where
        assert (row[VALUE_SCHEMA_ID_COLUMN] is not None) == want["shaped"], where
    causes = {row[VALUE_ERROR_COLUMN] for row in rows if row[VALUE_ERROR_COLUMN]}
    assert any("long" in c and "string" in c for c in causes), causes
    assert any("double" in c and "string" in c for c in causes), causes
    assert "value: not a JSON object but an array" in causes

    spark_columns = ["kafka_partition", "kafka_offset", "kafka_value", VALUE_SCHEMA_ID_COLUMN,
                     VALUE_ERROR_COLUMN, *columns[:-1]]  # fmt: skip
    by_spark = table_rows_spark(spark, lake, topic)
    assert [[r[c] for c in spark_columns] for r in by_spark] == [
        [r[c] for c in spark_columns] for r in rows
    ]

    assert_hotset_is_coldset(tmp_path, kafka_bootstrap, codecs, topic, lake)

    config = lake_yaml(lake, codecs)

    # A fourth batch only in Kafka: ISK's merged serves every record, the new key a column; the
    # pipeline then copies the batch into the very schema and rows merged showed.
    fourth = fourth_batch()
    produce_batch(kafka_bootstrap, topic, fourth, len(produced))
    produced.extend(fourth)
    (tmp_path / "gateway").mkdir()
    gateway = start_gateway(
        kafka_bootstrap, tmp_path / "gateway", chunk_records=5, extra=config,
        index_interval_seconds=0,
    )  # fmt: skip
    try:
        merged = gateway.catalog().load_table(f"merged.{topic}")
        merged_schema = merged.schema()
        merged_rows = sorted_rows(merged.scan().to_arrow())
    finally:
        code = gateway.process.stop()
    assert code == 0, gateway.process.log()[-3000:]
    assert str(merged_schema.find_field("region").field_type) == "string"
    assert len(merged_rows) == len(produced)
    first_hot = len(produced) - len(fourth)
    hot = [r for r in merged_rows if int(r["kafka_headers"][0]["value"]) >= first_hot]
    assert sorted(r["region"] for r in hot) == sorted(["eu", "us"] * 4 + ["apac"])
    assert all(r[VALUE_ERROR_COLUMN] is None for r in hot)
    result = run_pipeline(spark, lake, topic, once=True, report=lambda line: None, codecs=typing)
    assert result.records == len(fourth)
    table = coldset(lake, topic)
    assert table.schema().as_struct() == merged_schema.as_struct()
    assert sorted_rows(table.scan().to_arrow()) == merged_rows

    # KSI gives every record back byte for byte from the coldset alone.
    records = consume_all(kafka_bootstrap, topic, PARTS)
    seen = by_position_seen(records)
    ends = {p: 1 + max(r.record.offset for r in records if r.partition == p) for p in range(PARTS)}
    delete_everything(kafka_bootstrap, topic, ends)
    proxy = start_ksi_proxy(tmp_path, kafka_bootstrap, [topic], config)
    try:
        got = read_all(proxy.bootstrap, topic, PARTS, len(seen))
    finally:
        proxy.stop()
    assert got == seen, proxy.log()[-3000:]


def test_plain_json_later_batch_reads_in_one_pass(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first batch whose rows fit the columns of its first rows (the sample) is read in one
    pass, as is a later batch whose keys all have columns: new shapes that fit (keys left out,
    keys in another order) are decoded, one that does not fit keeps its bytes with the cause
    the fold gives, and the new shapes' declarations reach the table's properties, so KSI
    rebuilds those values from the coldset. A batch with a new key is folded first. ISK, which
    folds the whole log at once, makes the same table."""
    monkeypatch.setattr(typed_batch, "SAMPLE_ROWS", 2)
    topic = create_topic(PARTS, prefix="typed-plain-json-later")
    codecs = {"topics": [{"match": topic, "value": "json"}]}
    typing = topic_typing(typed_context(tmp_path, codecs), topic)
    assert typing is not None
    first = [compact({"id": i, "currency": CURRENCIES[i % 3], "amount": i + 0.5}) for i in range(6)]
    later = [
        compact({"id": 6, "currency": "EUR"}),  # amount left out
        compact({"amount": 7.5, "id": 7, "currency": "USD"}),  # another order
        compact({"id": "X-8", "currency": "JPY"}),  # a string for the long column
        b'{"id": 9, "currency": "EUR"}',  # spaced: kept
        compact({"id": 10}),
    ]
    newer = [compact({"id": 11, "currency": "EUR", "amount": 1.25, "note": "new key"})]
    columns = ["id", "currency", "amount"]
    produced: list[bytes] = []
    reports: list[list[str]] = []
    for batch in (first, later, newer):
        produce_batch(kafka_bootstrap, topic, batch, len(produced))
        produced.extend(batch)
        lines: list[str] = []
        result = run_pipeline(spark, lake, topic, once=True, report=lines.append, codecs=typing)
        assert result.records == len(batch)
        reports.append(lines)
    folding = [any("folding its shapes" in line for line in lines) for lines in reports]
    assert folding == [False, False, True], reports

    table = coldset(lake, topic)
    assert [f.name for f in table.schema().fields[-4:]] == [*columns, "note"]
    rows = {int(r["kafka_headers"][0]["value"]): r for r in table.scan().to_arrow().to_pylist()}
    assert len(rows) == len(produced)
    for number in range(6, 11):
        row, value = rows[number], json.loads(produced[number])
        refused = isinstance(value["id"], str)
        assert (row[VALUE_ERROR_COLUMN] is not None) == refused, row
        if refused:
            assert "does not fit the table" in row[VALUE_ERROR_COLUMN], row
            assert row["kafka_value"] == produced[number]
            continue
        assert {c: row[c] for c in columns} == {c: value.get(c) for c in columns}, row
        canonical = produced[number] == compact(value)
        assert row["kafka_value"] == (None if canonical else produced[number]), row
    properties = table.properties
    shaped = {r[VALUE_SCHEMA_ID_COLUMN] for r in rows.values() if r[VALUE_ERROR_COLUMN] is None}
    assert all(f"bergstream.schema.{i}" in properties for i in shaped), (shaped, properties)
    assert rows[11]["note"] == "new key"
    assert_hotset_is_coldset(tmp_path, kafka_bootstrap, codecs, topic, lake)

    held = take_all_records(kafka_bootstrap, topic, PARTS)
    served, log = read_through_ksi(
        tmp_path, kafka_bootstrap, topic, lake_yaml(lake, codecs), PARTS, len(held)
    )
    assert served == held, log[-3000:]
