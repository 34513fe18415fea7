"""What the pipeline asks Kafka before it starts: a topic's partitions and their log start
offsets. Uses Kafka's Java admin client inside Spark's JVM (the one the Kafka source ships), with
the same client settings as the source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bergstream.pipeline.session import PipelineSetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["TopicOffsets", "kafka_client_properties", "topic_offsets"]

_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class TopicOffsets:
    """Partitions of a topic with their first and next (read-committed) offsets."""

    topic: str
    log_start: dict[int, int]
    end: dict[int, int]

    @property
    def partitions(self) -> list[int]:
        """Partition numbers, ascending."""
        return sorted(self.log_start)


def kafka_client_properties(bootstrap: str, options: dict[str, str]) -> dict[str, str]:
    """Kafka client settings: the bootstrap list plus ``lake.pipeline.kafka_options``."""
    return {"bootstrap.servers": bootstrap, **options}


def _list_offsets(
    jvm: Any, admin: Any, topic: str, partitions: list[int], spec: Any
) -> dict[int, int]:
    wanted = jvm.java.util.HashMap()
    for partition in partitions:
        wanted.put(jvm.org.apache.kafka.common.TopicPartition(topic, partition), spec)
    options = jvm.org.apache.kafka.clients.admin.ListOffsetsOptions(
        jvm.org.apache.kafka.common.IsolationLevel.READ_COMMITTED
    )
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    result = admin.listOffsets(wanted, options).all().get(_TIMEOUT_SECONDS, seconds)
    return {int(tp.partition()): int(info.offset()) for tp, info in dict(result).items()}


def topic_offsets(
    spark: SparkSession, bootstrap: str, options: dict[str, str], topic: str
) -> TopicOffsets:
    """Partitions, log start and read-committed end offsets of ``topic``; raises
    :class:`PipelineSetupError` when the topic does not exist or Kafka cannot be reached."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    props = jvm.java.util.Properties()
    for key, value in kafka_client_properties(bootstrap, options).items():
        props.put(key, value)
    props.put("request.timeout.ms", "30000")
    props.put("default.api.timeout.ms", str(_TIMEOUT_SECONDS * 1000))
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    try:
        try:
            names = jvm.java.util.Collections.singletonList(topic)
            described = admin.describeTopics(names).allTopicNames().get(_TIMEOUT_SECONDS, seconds)
        except Exception as error:
            text = str(error)
            if "UnknownTopicOrPartition" in text:
                raise PipelineSetupError(
                    f"topic '{topic}' does not exist on Kafka at {bootstrap}: create it, or "
                    "check --topic and lake.kafka_bootstrap"
                ) from None
            raise PipelineSetupError(
                f"cannot describe topic '{topic}' on Kafka at {bootstrap}: "
                f"{text.splitlines()[0] if text else error!r}"
            ) from None
        description = described.get(topic)
        partitions = sorted(int(info.partition()) for info in description.partitions())
        offset_spec = jvm.org.apache.kafka.clients.admin.OffsetSpec
        log_start = _list_offsets(jvm, admin, topic, partitions, offset_spec.earliest())
        end = _list_offsets(jvm, admin, topic, partitions, offset_spec.latest())
    finally:
        admin.close()
    return TopicOffsets(topic, log_start, end)
