"""What the pipeline asks Kafka before it starts: a topic's partitions and their log start
offsets. Uses Kafka's Java admin client inside Spark's JVM (the one the Kafka source ships), with
the same client settings as the source."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bergstream.core.api import KafkaSettingsError
from bergstream.pipeline.session import PipelineSetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bergstream.core.api import LakeConfig

__all__ = [
    "TopicOffsets",
    "admin_client",
    "kafka_client_properties",
    "list_topics",
    "refused_message",
    "source_client_properties",
    "topic_offsets",
    "topics_offsets",
]

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


def kafka_client_properties(lake: LakeConfig, options: dict[str, str]) -> dict[str, str]:
    """Java Kafka client settings: ``lake.kafka_client`` (TLS, SASL), the bootstrap list, then
    ``lake.pipeline.kafka_options`` over them. Raises :class:`PipelineSetupError` when a PEM
    file of ``lake.kafka_client`` cannot be read."""
    try:
        java = lake.kafka_client.java()
    except KafkaSettingsError as error:
        raise PipelineSetupError(f"lake.kafka_client: {error}") from None
    return {**java, "bootstrap.servers": lake.kafka_bootstrap, **options}


#: Spark's Kafka source reads each partition's offset range with a consumer that, past the
#: range's last record, waits ``fetch.max.wait.ms`` (Kafka's default 500 ms) for data it will
#: not use. Every task pays it once: measured here, counting 20k records of 50 topics of 2
#: partitions (100 tasks, local[2]) took 14.7 s with the default and 2.3 s with 10 ms; 100
#: partitions of one topic, 10.8 s. A few more fetch requests at a range's end cost nothing.
SOURCE_CONSUMER_DEFAULTS = {"fetch.max.wait.ms": "10"}


def source_client_properties(lake: LakeConfig, options: dict[str, str]) -> dict[str, str]:
    """The Kafka consumer settings of the pipeline's Spark source:
    :func:`kafka_client_properties` over :data:`SOURCE_CONSUMER_DEFAULTS`
    (``lake.pipeline.kafka_options`` may set them otherwise)."""
    return {**SOURCE_CONSUMER_DEFAULTS, **kafka_client_properties(lake, options)}


def _java_causes(error: BaseException) -> dict[str, str]:
    """Simple class name -> message of the Java exception behind a Py4J error and of its
    causes; empty for an error that did not come from the JVM."""
    java = getattr(error, "java_exception", None)
    causes: dict[str, str] = {}
    while java is not None and len(causes) < 10:
        try:
            name = str(java.getClass().getName()).rsplit(".", 1)[-1]
            causes.setdefault(name, str(java.getMessage() or ""))
            cause = java.getCause()
        except Exception:  # the JVM went away: what was gathered will do
            break
        java = None if cause is None or cause.equals(java) else cause
    return causes


def _identity(lake: LakeConfig, options: dict[str, str]) -> str:
    """Who the pipeline is to Kafka, for messages (no secret)."""
    client = lake.kafka_client
    protocol = options.get("security.protocol", client.security_protocol)
    if client.uses_sasl and "sasl.jaas.config" not in options:
        kind = {"OAUTHBEARER": "OAuth client", "GSSAPI": "Kerberos principal"}
        who = kind.get(client.sasl_mechanism or "", "user")
        return f"{who} '{client.principal}', {client.sasl_mechanism} over {protocol}"
    if client.ssl_certificate_location is not None and "ssl.keystore.key" not in options:
        return f"client certificate {client.ssl_certificate_location}, {protocol}"
    return f"security.protocol {protocol}"


def refused_message(
    error: BaseException, topic: str, lake: LakeConfig, options: dict[str, str]
) -> str | None:
    """What to tell a user whose Kafka refused the pipeline's client: authorization of
    ``topic`` or authentication (SASL or TLS) failed; None for any other error."""
    causes = _java_causes(error)
    text = str(error)
    # The Java client's exception names, and librdkafka's words for the same (a typed batch's
    # workers read with librdkafka).
    for name, words in (
        ("TopicAuthorizationException", "Topic authorization failed"),
        ("SaslAuthenticationException", "SASL authentication error"),
        ("SslAuthenticationException", "SSL handshake failed"),
    ):
        if name not in causes and (name in text or words in text):
            causes[name] = ""
    where = f"Kafka at {lake.kafka_bootstrap} ({_identity(lake, options)})"
    if "TopicAuthorizationException" in causes:
        return (
            f"authorization failed for topic '{topic}' on {where}: the user may not describe "
            "or read it; grant it DESCRIBE and READ on the topic (ACLs), or set "
            "lake.kafka_client to a user that has them"
        )
    if "SaslAuthenticationException" in causes:
        reason = causes["SaslAuthenticationException"] or "the broker refused the credentials"
        return (
            f"authentication failed on {where}: {reason}; check lake.kafka_client's "
            "sasl.mechanism and its login (sasl.username and sasl.password, the "
            "sasl.oauthbearer.* client or the sasl.kerberos.* principal and keytab, or its "
            "properties_file)"
        )
    if "SslAuthenticationException" in causes:
        reason = causes["SslAuthenticationException"] or "the TLS handshake failed"
        return (
            f"TLS handshake failed with {where}: {reason}; check lake.kafka_client's "
            "security.protocol and ssl.* settings (ssl.ca.location: the CA of the brokers' "
            "certificates; ssl.certificate.location and ssl.key.location for mutual TLS)"
        )
    return None


def _reason(error: BaseException) -> str:
    """The innermost Java message behind ``error`` (not Py4J's "An error occurred while
    calling ..."), else the error's first line."""
    causes = _java_causes(error)
    if causes:
        name, message = list(causes.items())[-1]
        return f"{name}: {message}" if message else name
    text = str(error)
    return text.splitlines()[0] if text else repr(error)


def _list_offsets(
    jvm: Any, admin: Any, topic: str, partitions: list[int], spec: Any
) -> dict[int, int]:
    found = _list_topics_offsets(jvm, admin, {topic: partitions}, spec)
    return {partition: offset for (_, partition), offset in found.items()}


def _list_topics_offsets(
    jvm: Any, admin: Any, partitions: dict[str, list[int]], spec: Any
) -> dict[tuple[str, int], int]:
    """Read-committed offsets of ``spec`` for every partition of ``partitions`` (topic: its
    partitions), in one request per leader."""
    wanted = jvm.java.util.HashMap()
    for topic, numbers in partitions.items():
        for partition in numbers:
            wanted.put(jvm.org.apache.kafka.common.TopicPartition(topic, partition), spec)
    options = jvm.org.apache.kafka.clients.admin.ListOffsetsOptions(
        jvm.org.apache.kafka.common.IsolationLevel.READ_COMMITTED
    )
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    result = admin.listOffsets(wanted, options).all().get(_TIMEOUT_SECONDS, seconds)
    return {
        (str(tp.topic()), int(tp.partition())): int(info.offset())
        for tp, info in dict(result).items()
    }


def _describe_failed(
    error: BaseException, topic: str, lake: LakeConfig, options: dict[str, str]
) -> str:
    """Why ``topic`` could not be described, for the user: refused, missing, or unreachable."""
    refused = refused_message(error, topic, lake, options)
    if refused is not None:
        return refused
    if "UnknownTopicOrPartition" in str(error):
        return (
            f"topic '{topic}' does not exist on Kafka at {lake.kafka_bootstrap}: create it, or "
            "check --topic and lake.kafka_bootstrap"
        )
    return (
        f"cannot describe topic '{topic}' on Kafka at {lake.kafka_bootstrap}: {_reason(error)} "
        "(check lake.kafka_bootstrap and lake.kafka_client against the brokers' listeners)"
    )


def _admin(jvm: Any, lake: LakeConfig, options: dict[str, str]) -> Any:
    props = jvm.java.util.Properties()
    for key, value in kafka_client_properties(lake, options).items():
        props.put(key, value)
    props.put("request.timeout.ms", "30000")
    props.put("default.api.timeout.ms", str(_TIMEOUT_SECONDS * 1000))
    return jvm.org.apache.kafka.clients.admin.Admin.create(props)


def list_topics(spark: SparkSession, lake: LakeConfig, options: dict[str, str]) -> set[str]:
    """The names of the cluster's topics the pipeline's client may describe (Kafka's internal
    topics left out); raises :class:`PipelineSetupError` when Kafka cannot be reached or
    refuses the client."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    admin = _admin(jvm, lake, options)
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    try:
        listing = jvm.org.apache.kafka.clients.admin.ListTopicsOptions().listInternal(False)
        names = admin.listTopics(listing).names().get(_TIMEOUT_SECONDS, seconds)
        return {str(name) for name in names}
    except Exception as error:
        refused = refused_message(error, "*", lake, options)
        if refused is not None:
            raise PipelineSetupError(refused) from None
        raise PipelineSetupError(
            f"cannot list the topics of Kafka at {lake.kafka_bootstrap}: {_reason(error)} "
            "(check lake.kafka_bootstrap and lake.kafka_client against the brokers' listeners)"
        ) from None
    finally:
        admin.close()


@contextlib.contextmanager
def admin_client(spark: SparkSession, lake: LakeConfig, options: dict[str, str]) -> Iterator[Any]:
    """One Java Kafka admin client for several :func:`topic_offsets` calls (thread-safe), closed
    at the end of the block."""
    admin = _admin(spark.sparkContext._jvm, lake, options)  # type: ignore[attr-defined]
    try:
        yield admin
    finally:
        admin.close()


def topic_offsets(
    spark: SparkSession,
    lake: LakeConfig,
    options: dict[str, str],
    topic: str,
    admin: Any | None = None,
) -> TopicOffsets:
    """Partitions, log start and read-committed end offsets of ``topic``; raises
    :class:`PipelineSetupError` when the topic does not exist, Kafka cannot be reached or
    refuses the client (:func:`refused_message`). ``admin``: a client of
    :func:`admin_client` (else one is made and closed)."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    own = admin is None
    if admin is None:
        admin = _admin(jvm, lake, options)
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    try:
        try:
            names = jvm.java.util.Collections.singletonList(topic)
            described = admin.describeTopics(names).allTopicNames().get(_TIMEOUT_SECONDS, seconds)
        except Exception as error:
            raise PipelineSetupError(_describe_failed(error, topic, lake, options)) from None
        description = described.get(topic)
        partitions = sorted(int(info.partition()) for info in description.partitions())
        offset_spec = jvm.org.apache.kafka.clients.admin.OffsetSpec
        log_start = _list_offsets(jvm, admin, topic, partitions, offset_spec.earliest())
        end = _list_offsets(jvm, admin, topic, partitions, offset_spec.latest())
    finally:
        if own:
            admin.close()
    return TopicOffsets(topic, log_start, end)


def topics_offsets(
    spark: SparkSession,
    lake: LakeConfig,
    options: dict[str, str],
    topics: list[str],
    admin: Any,
) -> tuple[dict[str, TopicOffsets], dict[str, str]]:
    """:func:`topic_offsets` of many topics in three requests (one describe, then the log
    starts and the ends of all their partitions), not three per topic: 50 topics one by one
    took 6.6 s of py4j and Kafka round trips here, four at a time. Returns the offsets of the
    topics that could be read, and why each other one could not (topic: message).
    ``admin``: a client of :func:`admin_client`."""
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    failures: dict[str, str] = {}
    partitions: dict[str, list[int]] = {}
    names = jvm.java.util.ArrayList()
    for topic in topics:
        names.add(topic)
    futures = admin.describeTopics(names).topicNameValues()
    for topic in topics:
        try:
            description = futures.get(topic).get(_TIMEOUT_SECONDS, seconds)
        except Exception as error:
            failures[topic] = _describe_failed(error, topic, lake, options)
            continue
        partitions[topic] = sorted(int(info.partition()) for info in description.partitions())
    if not partitions:
        return {}, failures
    offset_spec = jvm.org.apache.kafka.clients.admin.OffsetSpec
    try:
        starts = _list_topics_offsets(jvm, admin, partitions, offset_spec.earliest())
        ends = _list_topics_offsets(jvm, admin, partitions, offset_spec.latest())
    except Exception:
        # One partition's failure fails the whole request: each topic alone says which.
        found: dict[str, TopicOffsets] = {}
        for topic in partitions:
            try:
                found[topic] = topic_offsets(spark, lake, options, topic, admin)
            except PipelineSetupError as error:
                failures[topic] = str(error)
        return found, failures
    offsets = {
        topic: TopicOffsets(
            topic,
            {p: starts[(topic, p)] for p in numbers},
            {p: ends[(topic, p)] for p in numbers},
        )
        for topic, numbers in partitions.items()
    }
    return offsets, failures
