"""Helpers of the pipeline tests (and of ISK's hotset property test): produce exactly, consume
everything back as ground truth, and read a table back with PyIceberg and with Spark."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from bergstream.core.lake import ResolvedLake, load_catalog
from bergstream.core.records import Record
from bergstream.core.typed.row_contract import RowRecord, row_to_record

#: Topic settings for tests: keep every record (retention by time would delete old timestamps
#: such as 0 at once), accept any timestamp and records up to 4 MiB.
TOPIC_CONFIG = {
    "retention.ms": "-1",
    "message.timestamp.after.max.ms": "9223372036854775807",
    "max.message.bytes": "4194304",
}


@dataclass(frozen=True)
class Produced:
    """One record as produced: where it went and what it held."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None


def s3_settings(stack_env: dict[str, str]) -> dict[str, str]:
    """``lake.s3`` settings of the stack's S3 server."""
    return {
        "endpoint": stack_env["BERGSTREAM_S3_ENDPOINT"],
        "access_key": stack_env["BERGSTREAM_S3_ACCESS_KEY"],
        "secret_key": stack_env["BERGSTREAM_S3_SECRET_KEY"],
        "region": stack_env["BERGSTREAM_S3_REGION"],
    }


def produce(bootstrap: str, topic: str, records: list[Produced], **config: Any) -> None:
    """Produce ``records`` in order with aiokafka (idempotent, so no duplicates on retry; unlike
    librdkafka it keeps a timestamp of 0 as 0). ``config`` goes to AIOKafkaProducer."""
    asyncio.run(_produce(bootstrap, topic, records, config))


async def _produce(
    bootstrap: str, topic: str, records: list[Produced], config: dict[str, Any]
) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        max_request_size=4_000_000,
        linger_ms=5,
        **config,
    )
    await producer.start()
    try:
        pending: list[Any] = []
        for record in records:
            if record.key is None and record.value is None:
                # send() refuses a record with neither key nor value; a batch takes it.
                await asyncio.gather(*pending)
                pending = []
                batch = producer.create_batch()
                batch.append(
                    key=None, value=None, timestamp=record.timestamp, headers=list(record.headers)
                )
                await (await producer.send_batch(batch, topic, partition=record.partition))
                continue
            pending.append(
                await producer.send(
                    topic,
                    key=record.key,
                    value=record.value,
                    partition=record.partition,
                    timestamp_ms=record.timestamp,
                    headers=list(record.headers),
                )
            )
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def consume_all(bootstrap: str, topic: str, partitions: int) -> list[RowRecord]:
    """Every committed record of ``topic`` (read_committed, from each partition's log start to
    its end), by partition then offset, as :class:`RowRecord`: the ground truth. aiokafka keeps
    header keys byte for byte (librdkafka cuts them at a NUL)."""
    return asyncio.run(_consume_all(bootstrap, topic, partitions))


async def _consume_all(bootstrap: str, topic: str, count: int) -> list[RowRecord]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        fetch_max_bytes=16_000_000,
        max_partition_fetch_bytes=8_000_000,
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        out: list[RowRecord] = []
        deadline = time.monotonic() + 120
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, f"consuming {topic} took over 120 s"
            batches = await consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                out.extend(
                    RowRecord(
                        tp.partition,
                        message.timestamp_type,
                        Record(
                            offset=message.offset,
                            timestamp=message.timestamp,
                            key=message.key,
                            value=message.value,
                            headers=tuple(message.headers),
                        ),
                    )
                    for message in messages
                )
        return sorted(out, key=lambda r: (r.partition, r.record.offset))
    finally:
        await consumer.stop()


def table_rows_pyiceberg(lake: ResolvedLake, topic: str) -> list[dict[str, Any]]:
    """The table's rows read with PyIceberg, by partition then offset."""
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    rows = table.scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


def table_rows_spark(spark: Any, lake: ResolvedLake, topic: str) -> list[dict[str, Any]]:
    """The table's rows read with Spark (timestamps as µs, so no local time zone gets in)."""
    from pyspark.sql import functions as F

    frame = spark.table(lake.spark_table_name(topic)).withColumn(
        "kafka_timestamp", F.unix_micros("kafka_timestamp")
    )
    rows = [_plain(row.asDict(recursive=True)) for row in frame.collect()]
    return sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


def records_of(rows: list[dict[str, Any]]) -> list[RowRecord]:
    """Rows converted back to records."""
    return [row_to_record(row) for row in rows]


def _plain(value: Any) -> Any:
    """Spark's bytearrays as bytes, inside dicts and lists too."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def produce_transactions(
    bootstrap: str, topic: str, steps: list[tuple[str, list[Produced]]]
) -> None:
    """Produce each step's records in a transaction of its own, then commit or abort it as the
    step says (``"commit"`` or ``"abort"``); one transactional producer for all the steps."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    for outcome, records in steps:
        producer.begin_transaction()
        for record in records:
            producer.produce(
                topic,
                key=record.key,
                value=record.value,
                partition=record.partition,
                headers=list(record.headers) or None,
                timestamp=record.timestamp or 0,
            )
        producer.flush(30)
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
