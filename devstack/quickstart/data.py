"""The quickstart's demo data on Kafka: a ``payments`` topic with payments spread over the last
day, their values Avro of a registered schema (:mod:`.schema`), produced fast in whole record
batches, and the cold part deleted as retention would. Every client here is aiokafka (a runtime
dependency)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .schema import CURRENCIES, METHODS, PaymentFields

__all__ = [
    "CHUNK",
    "Payment",
    "customer_key",
    "delete_below",
    "kafka_offsets",
    "payment_fields",
    "payments",
    "produce_one",
    "produce_payments",
    "recreate_topic",
]

_CUSTOMERS = 3000
_BATCH_BYTES = 512 * 1024  # well below the broker's message.max.bytes (1 MB)
#: Payments encoded per call of the (vectorized) encoder.
CHUNK = 20_000

#: Turns payment fields into framed values, in order (``PaymentCodec.encode``).
Encode = Callable[[Sequence[PaymentFields]], list[bytes]]


@dataclass(frozen=True)
class Payment:
    """One record of the demo topic: ``value`` is ``fields`` encoded."""

    index: int
    partition: int
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    fields: PaymentFields


def payment_fields(index: int, timestamp_ms: int) -> tuple[PaymentFields, int]:
    """Payment ``index`` (the same every run) paid at ``timestamp_ms``, and its customer."""
    rng = random.Random(index)
    customer = rng.randrange(_CUSTOMERS)
    amount_cents = round(rng.lognormvariate(3.5, 1.0) * 100)
    currency = CURRENCIES[rng.randrange(len(CURRENCIES))]
    fields = PaymentFields(
        id=f"pay-{index:07d}",
        customer=customer,
        amount_cents=amount_cents,
        currency=currency,
        method=METHODS[customer % len(METHODS)],
        paid_at_ms=timestamp_ms,
    )
    return fields, customer


def customer_key(customer: int) -> bytes:
    """The record key of a customer's payments."""
    return f"customer-{customer:04d}".encode()


def payments(
    start: int,
    stop: int,
    total: int,
    first_ms: int,
    span_ms: int,
    partitions: int,
    encode: Encode,
) -> Iterator[Payment]:
    """Payments ``start`` to ``stop - 1`` of ``total`` spread evenly over ``span_ms`` from
    ``first_ms`` (CreateTime), keyed by customer, values made by ``encode`` :data:`CHUNK` at a
    time; a customer's payments share a partition."""
    for chunk_start in range(start, stop, CHUNK):
        indexes = range(chunk_start, min(stop, chunk_start + CHUNK))
        stamps = [first_ms + index * span_ms // total for index in indexes]
        made = [payment_fields(index, stamp) for index, stamp in zip(indexes, stamps, strict=True)]
        values = encode([fields for fields, _ in made])
        for index, stamp, (fields, customer), value in zip(
            indexes, stamps, made, values, strict=True
        ):
            headers: tuple[tuple[str, bytes], ...] = (("source", b"bergstream-quickstart"),)
            if index % 10 == 0:
                headers += (("retry", b"1"),)
            yield Payment(
                index=index,
                partition=customer % partitions,
                timestamp_ms=stamp,
                key=customer_key(customer),
                value=value,
                headers=headers,
                fields=fields,
            )


async def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` if it exists and create it anew with ``partitions`` partitions and no
    time retention (its records carry timestamps up to a day old)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if topic in await admin.list_topics():
            await admin.delete_topics([topic])
        deadline = time.monotonic() + 60
        while True:
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            topic,
                            num_partitions=partitions,
                            replication_factor=1,
                            topic_configs={"retention.ms": "-1", "retention.bytes": "-1"},
                        )
                    ]
                )
                return
            except TopicAlreadyExistsError:  # the deletion is still under way
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {topic} was not deleted within 60 s") from None
                await asyncio.sleep(0.5)
    finally:
        await admin.close()


async def produce_payments(bootstrap: str, topic: str, records: Iterator[Payment]) -> int:
    """Produce ``records`` in whole record batches per partition (idempotent, acks=all) and
    wait for every ack; returns how many were produced."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.producer.message_accumulator import BatchBuilder

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        max_batch_size=_BATCH_BYTES,
        linger_ms=5,
    )
    await producer.start()
    count = 0
    pending: list[asyncio.Future[object]] = []
    batches: dict[int, BatchBuilder] = {}
    try:

        async def send(partition: int) -> None:
            batch = batches.pop(partition)
            batch.close()
            pending.append(await producer.send_batch(batch, topic, partition=partition))

        for record in records:
            while True:
                batch = batches.get(record.partition)
                if batch is None:
                    batch = batches[record.partition] = producer.create_batch()
                meta = batch.append(
                    key=record.key,
                    value=record.value,
                    timestamp=record.timestamp_ms,
                    headers=list(record.headers),
                )
                if meta is not None:
                    break
                await send(record.partition)
            count += 1
        for partition in list(batches):
            await send(partition)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count


async def produce_one(bootstrap: str, topic: str, payment: Payment) -> tuple[int, int]:
    """Produce one record and wait for its ack; returns its (partition, offset)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            topic,
            key=payment.key,
            value=payment.value,
            partition=payment.partition,
            timestamp_ms=payment.timestamp_ms,
            headers=list(payment.headers),
        )
    finally:
        await producer.stop()
    return meta.partition, meta.offset


async def kafka_offsets(
    bootstrap: str, topic: str, partitions: int
) -> tuple[dict[int, int], dict[int, int]]:
    """Kafka's (log start, end offset) per partition of ``topic``, as the broker reports them."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return (
        {tp.partition: offset for tp, offset in starts.items()},
        {tp.partition: offset for tp, offset in ends.items()},
    )


async def delete_below(bootstrap: str, topic: str, boundary: dict[int, int]) -> dict[int, int]:
    """Kafka's DeleteRecords, as retention would: every partition's log start moves to its
    boundary offset. Returns the new log start per partition."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        result = await admin.delete_records(
            {TopicPartition(topic, p): RecordsToDelete(offset) for p, offset in boundary.items()},
            timeout_ms=60_000,
        )
    finally:
        await admin.close()
    return {tp.partition: low for tp, low in result.items()}
