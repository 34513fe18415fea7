"""The settings of the ``isk`` service and of its ``hotset-parquet`` synthesizer: the models the
plugin registers, pydantic only, so that loading the plugins (every ``bergstream`` command does)
imports neither the gateway nor pyarrow."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)

from bergstream.core.api import (
    Bootstrap,
    CacheBackendChoice,
    FileSynthesizerChoice,
    IndexBackendChoice,
    KafkaClientSettings,
    StrictModel,
)
from bergstream.plugins.isk_gateway.files.parquet_options import ParquetCompression
from bergstream.plugins.isk_gateway.http.config import IskHttpConfig
from bergstream.plugins.isk_gateway.http.principals import (
    IskPrincipalConfig,
    merge_principal_kafka,
    principals_errors,
    secret_free_errors,
)

__all__ = ["HotsetDataSynthesizerConfig", "IskBuffersConfig", "IskServiceConfig"]

_CLUSTER_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class IskBuffersConfig(StrictModel):
    """Memory the ``isk`` service keeps for its large buffers (``buffers:``): records received
    from Kafka, decoded columns and the Parquet files it builds."""

    retained_bytes: int = Field(
        2 << 30,
        ge=0,
        description="bytes of memory kept for large buffers once touched, reused instead of "
        "given back to the kernel (0: none; buffers then come from the allocator and large "
        "ones go back to the kernel when freed)",
    )
    pretouch: bool = Field(
        False,
        description="write all of retained_bytes once at start, before the service is ready: "
        "the start takes longer and the memory is resident from then on, and no query pays "
        "for fresh pages (on a virtual machine whose host reclaims freed memory, 2.5 s per "
        "GiB measured here)",
    )


class IskServiceConfig(StrictModel):
    """Settings of the ``isk`` service (``services[].config`` with ``type: isk``)."""

    cluster: str = Field("local", min_length=1, description="cluster name used in file keys")
    # The same check as the built-in hotset-parquet synthesizer's, which gets this value.
    kafka_bootstrap: Bootstrap = Field(description="host:port[,host:port...] of Kafka")
    kafka_client: KafkaClientSettings = Field(
        default_factory=KafkaClientSettings,
        description="how ISK connects to Kafka (librdkafka key names: security.protocol, "
        "sasl.*, ssl.*, properties_file); PLAINTEXT when unset",
    )
    http: IskHttpConfig
    index: IndexBackendChoice = Field(
        default_factory=lambda: IndexBackendChoice(type="sqlite"), description="the chunk index"
    )
    cache: CacheBackendChoice = Field(
        default_factory=lambda: CacheBackendChoice(type="local"),
        description="the cache of synthesized files",
    )
    chunk_records: int = Field(100_000, gt=0, description="offsets per indexed chunk")
    coalesce_files: int = Field(
        4,
        ge=0,
        description="a run of this many consecutive small chunks of the newest chunk window"
        " (each under chunk_records / coalesce_files offsets: one per watermark a LoadTable"
        " served), and the chunks of a window the newest has left, are read and indexed again"
        " as one file in the background (0 or 1: never)",
    )
    synthesizers: list[FileSynthesizerChoice] = Field(
        default_factory=list,
        description="registered file synthesizers asked, in order, before the built-in "
        "hotset-parquet to build a file missing from the cache",
    )
    partition_time: Literal["day", "hour"] = Field(
        "day",
        description="time unit of the hotset's partition spec (kafka_partition, "
        "day|hour(kafka_timestamp)); chunks never cross one",
    )
    parquet_compression: ParquetCompression = Field(
        "snappy",
        description="codec of the hotset's Parquet files: snappy (default) is fast to write and "
        "read; zstd makes files about 40% smaller at about twice the CPU of a cold query",
    )
    index_interval_seconds: float = Field(
        30.0,
        ge=0,
        description="how often the background indexer brings every topic's chunk index up to "
        "date (0: only on LoadTable)",
    )
    snapshot_interval_seconds: float = Field(
        60.0,
        ge=0,
        description="how often a table served since start is loaded again to record a snapshot "
        "when Kafka has new records (0: snapshots only on LoadTable)",
    )
    snapshot_max_age_seconds: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="how long a hotset or merged table's history keeps a snapshot for time "
        "travel (the current one is always kept)",
    )
    snapshot_max_count: int = Field(
        500,
        ge=1,
        description="how many snapshots a hotset or merged table's history keeps at most",
    )

    principals: list[IskPrincipalConfig] = Field(
        default_factory=list,
        description="who may use the catalog and the S3 gateway, each with the Kafka "
        "credentials whose rights decide what it sees (none: one identity, kafka_client, for "
        "everyone, as before)",
    )
    authorization_cache_seconds: float = Field(
        10.0,
        ge=0,
        description="how long Kafka's answer to which topics a principal may read is kept "
        "(a revoked ACL takes effect within this time; 0: asked on every request)",
    )
    buffers: IskBuffersConfig = Field(
        default_factory=IskBuffersConfig,
        description="memory kept for large buffers (records, columns, Parquet files)",
    )

    def listeners(self) -> list[tuple[str, str, int]]:
        """The catalog's and the S3 gateway's sockets, for ``config check``'s port check."""
        return [
            ("ISK catalog", self.http.catalog_host, self.http.catalog_port),
            ("ISK S3 gateway", self.http.s3_host, self.http.s3_port),
        ]

    @field_validator("cluster")
    @classmethod
    def _valid_cluster(cls, value: str) -> str:
        if not set(value) <= _CLUSTER_CHARS:
            raise ValueError("cluster must be letters, digits, '.', '_' or '-'")
        return value

    @model_validator(mode="before")
    @classmethod
    def _principals_kafka(cls, data: Any) -> Any:
        """Each principal's Kafka settings made whole from the service's ``kafka_client``."""
        if not isinstance(data, dict) or not isinstance(data.get("principals"), list):
            return data
        raw = data.get("kafka_client")
        try:
            service = (
                raw
                if isinstance(raw, KafkaClientSettings)
                else KafkaClientSettings.model_validate(raw if raw is not None else {})
            )
        except ValidationError:
            return data  # reported under kafka_client itself
        merged = [merge_principal_kafka(entry, service) for entry in data["principals"]]
        return {**data, "principals": merged}

    @model_validator(mode="after")
    def _unambiguous_principals(self) -> IskServiceConfig:
        problems = principals_errors(self.principals, self.http.client_id is not None)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _secret_free(
        cls, data: Any, handler: ModelWrapValidatorHandler[IskServiceConfig]
    ) -> IskServiceConfig:
        # Defined last, so it wraps the others: their errors' inputs hold the whole block.
        return secret_free_errors(data, handler, cls.__name__)


class HotsetDataSynthesizerConfig(StrictModel):
    """Settings of ``hotset-parquet`` (the ``isk`` service fills them from its own)."""

    cluster: str = Field(min_length=1, description="cluster name in the keys it builds")
    kafka_bootstrap: Bootstrap = Field(description="host:port list of the Kafka cluster")
    kafka_client: KafkaClientSettings = Field(
        default_factory=KafkaClientSettings,
        description="how it connects to Kafka (librdkafka key names); PLAINTEXT when unset",
    )
    unit: Literal["day", "hour"] = Field("day", description="time unit the hotset is cut by")
    compression: ParquetCompression = Field(
        "snappy", description="Parquet codec of the files it writes"
    )
