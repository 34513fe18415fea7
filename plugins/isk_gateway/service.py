"""The ``isk`` service: one ISK gateway (REST catalog + S3 gateway) over one Kafka cluster.

It wires the pieces together: a :class:`.kafka.reader.KafkaReader`, an index backend and a cache
backend chosen by ``{type, config}`` among the registered plugins (never imported from their
plugins; the config loader resolves and validates these choices like every choice of the file,
so ``bergstream config check`` refuses what this service would), the ``hotset`` provider and,
when the config has a ``lake:`` section, the ``coldset`` and ``merged`` providers, a router over
them, the :class:`.http.server.IskHttpService` in front, and the
:class:`.tables.background_index.BackgroundIndexer` keeping the chunk index of every topic up to
date. The typed layouts of the topics the config's ``codecs:`` section types
(:class:`.tables.layouts.TopicLayouts`, with the process's shared Schema Registry client) are
shared by the tables, the indexer and the built-in synthesizer.

With ``principals``, each catalog and S3 request runs as the principal its credentials name, and
sees only the topics Kafka lets that principal's own Kafka user DESCRIBE and READ
(:class:`.kafka.authorization.TopicAuthorizer`); the data is still read with the service's
``kafka_client``, once the principal's right to read it is confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    CacheBackend,
    CacheBackendChoice,
    FileSynthesizer,
    FileSynthesizerChoice,
    IndexBackend,
    IndexBackendChoice,
    KafkaClientSettings,
    LakeConfigError,
    ResolvedLake,
    ServiceContext,
    StrictModel,
    TopicCodecsResolver,
    choice_settings,
    resolve_lake,
)
from bergstream.plugins.isk_gateway.files.batch_decoder import warm_up
from bergstream.plugins.isk_gateway.files.hotset_layout import layout_name
from bergstream.plugins.isk_gateway.files.hotset_parquet import HotsetDataSynthesizer
from bergstream.plugins.isk_gateway.files.synthesis import ParquetCompression
from bergstream.plugins.isk_gateway.http.principals import (
    IskPrincipalConfig,
    PrincipalDirectory,
    merge_principal_kafka,
    principals_errors,
    secret_free_errors,
)
from bergstream.plugins.isk_gateway.http.server import IskHttpConfig, IskHttpService
from bergstream.plugins.isk_gateway.kafka.authorization import TopicAuthorizer
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from bergstream.plugins.isk_gateway.tables.background_index import BackgroundIndexer
from bergstream.plugins.isk_gateway.tables.coldset import ColdsetProvider
from bergstream.plugins.isk_gateway.tables.current import CurrentProvider
from bergstream.plugins.isk_gateway.tables.history import HistorySettings
from bergstream.plugins.isk_gateway.tables.hotset import HotsetProvider
from bergstream.plugins.isk_gateway.tables.lake_schemas import LakeSchemas
from bergstream.plugins.isk_gateway.tables.lake_states import LakeStates
from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts
from bergstream.plugins.isk_gateway.tables.merged import MergedProvider
from bergstream.plugins.isk_gateway.tables.paths import (
    COLDSET,
    CURRENT,
    HOTSET,
    MERGED,
    REJECTED,
)
from bergstream.plugins.isk_gateway.tables.provider import ProviderUnavailable, TableProvider
from bergstream.plugins.isk_gateway.tables.rejected import RejectedProvider
from bergstream.plugins.isk_gateway.tables.router import NamespaceRouter
from bergstream.plugins.isk_gateway.tables.snapshot_recorder import SnapshotRecorder
from bergstream.plugins.isk_gateway.tables.store import FileStore

__all__ = ["IskService", "IskServiceConfig", "create_isk_service"]

log = logging.getLogger("bergstream.isk")

_CLUSTER_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


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


def _built_in_synthesizer(config: IskServiceConfig) -> FileSynthesizerChoice:
    """The ``hotset-parquet`` choice with the service's own cluster, Kafka and time unit."""
    return FileSynthesizerChoice(
        type="hotset-parquet",
        config={
            "cluster": config.cluster,
            "kafka_bootstrap": config.kafka_bootstrap,
            "kafka_client": config.kafka_client,
            "unit": config.partition_time,
            "compression": config.parquet_compression,
        },
    )


class IskService:
    """A :class:`~bergstream.core.api.Service` running one ISK gateway."""

    name = "isk"

    def __init__(self, config: IskServiceConfig, context: ServiceContext) -> None:
        self.config = config
        self.context = context
        # The loader validated the configured choices; choice_settings validates the built-in
        # one (and any choice of a config loaded without a registry) before anything starts.
        plugins = context.plugins
        self._index_registration = plugins.get("index backend", config.index.type)
        self._cache_registration = plugins.get("cache backend", config.cache.type)
        self._index_settings = choice_settings(config.index, plugins)
        self._cache_settings = choice_settings(config.cache, plugins)
        self._synthesizer_choices = [
            (plugins.get("file synthesizer", choice.type), choice_settings(choice, plugins))
            for choice in [*config.synthesizers, _built_in_synthesizer(config)]
        ]
        self.synthesizers: list[FileSynthesizer] = []
        self.lake: ResolvedLake | None = None
        if context.config.lake is not None:
            try:
                self.lake = resolve_lake(context.config.lake, context.home)
            except LakeConfigError as error:
                raise ValueError(f"isk: {error}") from None
        self._indexer: asyncio.Task[None] | None = None
        self._recorder: asyncio.Task[None] | None = None
        self.reader: KafkaReader | None = None
        self.index: IndexBackend | None = None
        self.cache: CacheBackend | None = None
        self.layouts = TopicLayouts(
            TopicCodecsResolver(context),
            LakeSchemas(self.lake) if self.lake is not None else None,
        )
        self.hotset: HotsetProvider | None = None
        self.merged: MergedProvider | None = None
        self.provider: NamespaceRouter | None = None
        self.http: IskHttpService | None = None

    @property
    def catalog_url(self) -> str | None:
        """``http(s)://host:port`` of the REST catalog once started."""
        return self.http.catalog_url if self.http else None

    @property
    def s3_url(self) -> str | None:
        """``http(s)://host:port`` of the S3 gateway once started."""
        return self.http.s3_url if self.http else None

    async def start(self) -> None:
        """Connect to Kafka, open the backends, then bind the catalog and S3 listeners."""
        if self.http is not None:
            return
        c = self.config
        try:
            await asyncio.to_thread(warm_up)
            self.reader = KafkaReader(
                c.kafka_bootstrap,
                client_id=f"bergstream-isk-{c.cluster}",
                settings=c.kafka_client,
            )
            try:
                await self.reader.start()
            except ProviderUnavailable as error:
                # A gateway that starts before Kafka (or with credentials not yet granted)
                # stays up: requests needing Kafka answer 503 with this reason and retry.
                log.warning(
                    "isk: %s; serving anyway: requests that need Kafka answer 503 until it is "
                    "reachable",
                    error,
                )
            self.index = await asyncio.to_thread(
                self._index_registration.factory, self._index_settings, self.context
            )
            from bergstream.plugins.isk_gateway.tables.resilient_cache import ResilientCache

            self.cache = ResilientCache(
                await asyncio.to_thread(
                    self._cache_registration.factory, self._cache_settings, self.context
                ),
                name=c.cache.type,
            )
            self.synthesizers = [
                registration.factory(settings, self.context)
                for registration, settings in self._synthesizer_choices
            ]
            for synthesizer in self.synthesizers:  # one layout cache for tables and files
                if isinstance(synthesizer, HotsetDataSynthesizer):
                    synthesizer.layouts = self.layouts
            store = FileStore(
                self.cache, cache_prefix=layout_name(c.partition_time, c.parquet_compression)
            )
            self.hotset = HotsetProvider(
                self.reader,
                self.index,
                self.cache,
                bucket=c.http.bucket,
                cluster=c.cluster,
                chunk_records=c.chunk_records,
                store=store,
                unit=c.partition_time,
                synthesizers=self.synthesizers,
                compression=c.parquet_compression,
                layouts=self.layouts,
                history=HistorySettings(c.snapshot_max_age_seconds, c.snapshot_max_count),
            )
            providers: dict[str, TableProvider] = {HOTSET: self.hotset}
            coldset = None
            if self.lake is not None:
                coldset = ColdsetProvider(self.lake, store, c.http.bucket, c.cluster)
                providers[COLDSET] = coldset
                self.merged = MergedProvider(self.hotset, coldset)
                providers[MERGED] = self.merged
            current = CurrentProvider(
                self.hotset,
                coldset,
                LakeStates(self.lake) if self.lake is not None else None,
                self.context.config.tables,
                c.parquet_compression,
            )
            providers[CURRENT] = current
            providers[REJECTED] = RejectedProvider(current)
            self.provider = NamespaceRouter(providers, store)
            http = IskHttpService(c.http, self.provider, self._principal_directory())
            await http.start()
            self.http = http
        except BaseException:
            await self.stop()
            raise
        assert self.reader is not None and self.hotset is not None
        if c.index_interval_seconds > 0:
            indexer = BackgroundIndexer(
                self.reader, self.hotset.indexer, self.merged, c.index_interval_seconds
            )
            self._indexer = asyncio.create_task(indexer.run())
        if c.snapshot_interval_seconds > 0 and self.provider is not None:
            # Through the router, so a recorder's load of a table joins clients' loads of it:
            # one load of a table runs at a time, and none serves older offsets than another.
            router = self.provider
            recorder = SnapshotRecorder(
                self.hotset.histories,
                {namespace: router for namespace in router.providers},
                c.snapshot_interval_seconds,
            )
            self._recorder = asyncio.create_task(recorder.run())
        namespaces = ", ".join(await self.provider.list_namespaces())
        log.info("isk: catalog %s, s3 %s, namespaces %s", self.catalog_url, self.s3_url, namespaces)

    def _principal_directory(self) -> PrincipalDirectory | None:
        """The configured principals, each deciding with its own Kafka credentials; None
        without principals."""
        c = self.config
        if not c.principals:
            return None
        authorizer = TopicAuthorizer(
            c.kafka_bootstrap,
            ttl_seconds=c.authorization_cache_seconds,
            client_id=f"bergstream-isk-{c.cluster}-authz",
        )
        return PrincipalDirectory(
            c.principals,
            root_access_key=c.http.access_key,
            root_secret=c.http.secret_key.get_secret_value(),
            token_ttl_seconds=c.http.token_ttl_seconds,
            readable=authorizer.readable,
        )

    async def stop(self) -> None:
        """Close the listeners, the backends and the Kafka connections; safe to call twice."""
        for task in (self._indexer, self._recorder):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._indexer = self._recorder = None
        http, self.http = self.http, None
        if http is not None:
            await http.stop()
        self.provider = None
        if self.hotset is not None:  # files built for clients reach the cache before it closes
            with contextlib.suppress(Exception):
                await self.hotset.store.flush()
        self.hotset = None
        self.merged = None
        synthesizers, self.synthesizers = self.synthesizers, []
        for synthesizer in synthesizers:
            close = getattr(synthesizer, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        cache, self.cache = self.cache, None
        if cache is not None:
            await asyncio.to_thread(_close_quietly, cache, "cache")
        index, self.index = self.index, None
        if index is not None:
            await asyncio.to_thread(_close_quietly, index, "index")
        reader, self.reader = self.reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.close()


def _close_quietly(backend: CacheBackend | IndexBackend, what: str) -> None:
    try:
        backend.close()
    except Exception:
        log.exception("closing the %s backend failed", what)


def create_isk_service(config: IskServiceConfig, context: ServiceContext) -> IskService:
    """The ``isk`` service factory (``services[]`` with ``type: isk``)."""
    return IskService(config, context)
