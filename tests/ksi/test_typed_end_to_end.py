"""KSI on typed tables, on the real stack (Kafka, S3, the Apicurio Schema Registry): Avro values
and keys produced with confluent-kafka's AvroSerializer, plus hand-made non-canonical and
undecodable records and tombstones, over two schema versions; the typed coldset written the way
the pipeline writes it (to an S3 warehouse); DeleteRecords; then clients read through
``bergstream run`` with the ksi filter and get every record byte for byte, and an Avro
deserializer reads the same values as it did from Kafka. A table missing a schema in its
properties is served with the schema from the registry."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from bergstream.core.api import (
    SCHEMA_PROPERTY_PREFIX,
    LakeConfig,
    Record,
    ResolvedLake,
    SchemaRegistryClient,
    SideCodecs,
    TopicCodecs,
    load_catalog,
    resolve_lake,
)
from bergstream.core.typed.schema_registry import SchemaRegistrySettings
from bergstream.plugins.value_codecs.avro.codec import AvroCodec
from tests.kits.avro_wire import (
    KEY_SCHEMA,
    PAYMENT_V1,
    key_bytes,
    payment,
    payment_v2,
    value_bytes,
)
from tests.kits.ksi_stack import (
    Seen,
    seen_from_aiokafka,
    seen_from_confluent,
    start_ksi_proxy,
)
from tests.ksi.typed_kit import contract_rows, write_typed
from tests.support import ProxyProcess

pytestmark = pytest.mark.slow

PARTITIONS = 2
PER_VERSION = 320
TOPIC_CONFIG = {"retention.ms": "-1", "message.timestamp.after.max.ms": "9223372036854775807"}


@dataclass
class Topic:
    """A typed topic: what Kafka held before the delete, and what an Avro deserializer made of
    each value."""

    name: str
    seen: list[Seen] = field(default_factory=list)
    decoded: dict[tuple[int, int], Any] = field(default_factory=dict)


@dataclass
class World:
    registry_url: str
    proxy: ProxyProcess
    topics: list[Topic]


def _lake(home: Path, stack_env: dict[str, str]) -> tuple[ResolvedLake, str]:
    """An S3 warehouse in the stack's S3 server (bucket created), as a config and as YAML."""
    bucket = f"ksi-typed-{uuid.uuid4().hex[:8]}"
    s3 = {
        "endpoint": stack_env["BERGSTREAM_S3_ENDPOINT"],
        "access_key": stack_env["BERGSTREAM_S3_ACCESS_KEY"],
        "secret_key": stack_env["BERGSTREAM_S3_SECRET_KEY"],
        "region": stack_env["BERGSTREAM_S3_REGION"],
    }
    catalog = {"uri": f"sqlite:///{home}/lake/catalog.db", "warehouse": f"s3://{bucket}/wh"}
    config = LakeConfig(
        kafka_bootstrap=stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"],
        catalog=catalog,  # type: ignore[arg-type]
        s3=s3,  # type: ignore[arg-type]
    )
    _create_bucket(bucket, s3)
    yaml = "lake:\n" + textwrap.indent(
        json.dumps(config.model_dump(mode="json", exclude_defaults=True)), "  "
    )
    return resolve_lake(config, home=home), yaml


def _create_bucket(bucket: str, s3: dict[str, str]) -> None:
    from pyarrow import fs

    endpoint = urlparse(s3["endpoint"])
    filesystem = fs.S3FileSystem(
        access_key=s3["access_key"],
        secret_key=s3["secret_key"],
        region=s3["region"],
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
        allow_bucket_creation=True,
    )
    filesystem.create_dir(bucket)


class Producer:
    """Produces a typed topic's records: canonical ones through confluent-kafka's serializers,
    the others made by hand."""

    def __init__(self, bootstrap: str, registry_url: str, topic: str) -> None:
        from confluent_kafka import Producer as KafkaProducer
        from confluent_kafka.schema_registry import SchemaRegistryClient as Confluent

        self.topic = topic
        self.client = Confluent({"url": registry_url})
        self.producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def serializer(self, schema: Any, sample: Any, key: bool = False) -> tuple[Any, int]:
        """A serializer of ``schema`` (registered by serializing ``sample``) and its id."""
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        avro = AvroSerializer(self.client, json.dumps(schema))
        context = SerializationContext(self.topic, MessageField.KEY if key else MessageField.VALUE)

        def serialize(value: Any) -> bytes:
            return avro(value, context)  # type: ignore[no-any-return]

        return serialize, int.from_bytes(serialize(sample)[1:5], "big")

    def produce(self, start: int, stop: int, version: int, key_serializer: Any) -> int:
        """Produce records ``start:stop`` with value schema ``version``; returns its id."""
        schema = PAYMENT_V1 if version == 1 else payment_v2()
        serialize, schema_id = self.serializer(schema, payment(start, version))
        key_serialize, key_id = key_serializer
        for index in range(start, stop):
            self.producer.produce(
                self.topic,
                key=key_bytes(index, key_id, key_serialize),
                value=value_bytes(index, schema_id, version, serialize),
                partition=index % PARTITIONS,
                timestamp=1_600_000_000_000 + index,
                headers=[("i", str(index).encode()), ("dup", b"1"), ("dup", None)],
            )
        assert self.producer.flush(60) == 0
        return schema_id


def _consume_kafka(bootstrap: str, topic: Topic, registry_url: str, count: int) -> list[Any]:
    """Every record of ``topic`` straight from Kafka (the ground truth), with its timestamp
    type; what an AvroDeserializer makes of each value goes into ``topic.decoded``."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic.name, p, 0) for p in range(PARTITIONS)])
    out = []
    deadline = time.monotonic() + 120
    try:
        while len(out) < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                assert message.error() is None, message.error()
                out.append(message)
    finally:
        consumer.close()
    assert len(out) == count
    deserialize = _deserializer(registry_url, topic.name)
    topic.seen = sorted(seen_from_confluent(m) for m in out)
    for message in out:
        topic.decoded[(message.partition(), message.offset())] = deserialize(message.value())
    return [
        (
            m.partition(),
            1 if m.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME else 0,
            Record(
                offset=m.offset(),
                timestamp=m.timestamp()[1],
                key=m.key(),
                value=m.value(),
                headers=tuple(m.headers() or ()),
            ),
        )
        for m in out
    ]


def _deserializer(registry_url: str, topic: str) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient as Confluent
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    avro = AvroDeserializer(Confluent({"url": registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)

    def deserialize(value: bytes | None) -> Any:
        try:
            return avro(value, context)
        except Exception as error:  # an undecodable value: what matters is that it is the same
            return f"error: {type(error).__name__}"

    return deserialize


def _delete_all(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    ends = [
        probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        for p in range(PARTITIONS)
    ]
    probe.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, p, end) for p, end in enumerate(ends)])
    for future in futures.values():
        future.result(timeout=60)


def _boundary(rows: list[Any]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for partition, _, record in rows:
        ends[partition] = max(ends.get(partition, 0), record.offset + 1)
    return ends


def _registry(url: str) -> SchemaRegistryClient:
    """A new client (its subject cache would hide a version registered since)."""
    return SchemaRegistryClient(SchemaRegistrySettings(url=url))


@pytest.fixture(scope="module")
def world(stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from confluent_kafka.admin import AdminClient, NewTopic

    home = tmp_path_factory.mktemp("ksi-typed-e2e")
    bootstrap = stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"]
    registry_url = stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]
    lake, lake_yaml = _lake(home, stack_env)
    names = [f"ksi-typed-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(n, num_partitions=PARTITIONS, replication_factor=1, config=TOPIC_CONFIG)
            for n in names
        ]
    )
    for future in futures.values():
        future.result(timeout=30)
    topics = []
    for name in names:
        topic = Topic(name)
        producer = Producer(bootstrap, registry_url, name)
        keys = producer.serializer(KEY_SCHEMA, "probe", key=True)
        codecs = TopicCodecs(
            name,
            SideCodecs({"AVRO": AvroCodec()}, f"{name}-value"),
            SideCodecs({"AVRO": AvroCodec()}, f"{name}-key"),
        )
        # Version 1 only, copied to the coldset; then version 2 registered, produced, copied.
        producer.produce(0, PER_VERSION, 1, keys)
        first = _consume_kafka(bootstrap, topic, registry_url, PER_VERSION)
        write_typed(
            lake, name, contract_rows(first), codecs, _registry(registry_url), _boundary(first),
            rows_per_file=100,
        )  # fmt: skip
        version_2 = producer.produce(PER_VERSION, 2 * PER_VERSION, 2, keys)
        both = _consume_kafka(bootstrap, topic, registry_url, 2 * PER_VERSION)
        known = {(p, r.offset) for p, _, r in first}
        second = [row for row in both if (row[0], row[2].offset) not in known]
        layout = write_typed(
            lake, name, contract_rows(second), codecs, _registry(registry_url), _boundary(both)
        )
        assert layout.value is not None and version_2 in layout.value.schemas
        _delete_all(bootstrap, name)
        topics.append(topic)
    # The second topic's table lost its version 2 schema: KSI must ask the registry for it.
    table = load_catalog(lake).load_table(lake.table_identifier(names[1]))
    assert f"{SCHEMA_PROPERTY_PREFIX}{version_2}" in table.properties
    with table.transaction() as transaction:
        transaction.remove_properties(f"{SCHEMA_PROPERTY_PREFIX}{version_2}")
    codecs_yaml = textwrap.dedent(
        f"""
        codecs:
          schema_registry: {{url: "{registry_url}"}}
          topics:
            - {{match: "*", value: registry, key: registry}}
        """
    )
    proxy = start_ksi_proxy(home, bootstrap, names, lake_yaml + codecs_yaml)
    try:
        yield World(registry_url, proxy, topics)
    finally:
        proxy.stop()


async def _aiokafka_read(bootstrap: str, topic: str, count: int) -> list[Seen]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        got: list[Seen] = []
        deadline = time.monotonic() + 120
        while len(got) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            for messages in batches.values():
                got.extend(seen_from_aiokafka(m) for m in messages)
        return got
    finally:
        await consumer.stop()


def _confluent_read(bootstrap: str, topic: str, count: int) -> list[Any]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + 120
    try:
        while len(out) < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                assert message.error() is None, message.error()
                out.append(message)
    finally:
        consumer.close()
    return out


def test_aiokafka_reads_every_record_byte_for_byte(world: World) -> None:
    for topic in world.topics:
        got = asyncio.run(_aiokafka_read(world.proxy.bootstrap, topic.name, len(topic.seen)))
        assert sorted(got) == topic.seen
    assert "coldset failed" not in world.proxy.log()


def test_confluent_kafka_reads_every_record_and_the_same_avro_values(world: World) -> None:
    for topic in world.topics:
        messages = _confluent_read(world.proxy.bootstrap, topic.name, len(topic.seen))
        assert sorted(seen_from_confluent(m) for m in messages) == topic.seen
        deserialize = _deserializer(world.registry_url, topic.name)
        decoded = {(m.partition(), m.offset()): deserialize(m.value()) for m in messages}
        assert decoded == topic.decoded
        outcomes = [v for v in decoded.values() if isinstance(v, dict)]
        assert len(outcomes) > len(decoded) // 2  # most values are real Avro records
        assert any(isinstance(v, str) and v.startswith("error") for v in decoded.values())
