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

from bergstream.core.api import (
    CacheBackend,
    FileSynthesizer,
    FileSynthesizerChoice,
    IndexBackend,
    LakeConfigError,
    ReadinessCheck,
    ResolvedLake,
    ServiceContext,
    StatusSection,
    TopicCodecsResolver,
    choice_settings,
    kafka_check,
    lake_checks,
    registry_check,
    resolve_lake,
)
from bergstream.plugins.isk_gateway.files.batch_decoder import warm_up
from bergstream.plugins.isk_gateway.files.hotset_layout import layout_name
from bergstream.plugins.isk_gateway.files.hotset_parquet import HotsetDataSynthesizer
from bergstream.plugins.isk_gateway.http.principals import (
    PrincipalDirectory,
)
from bergstream.plugins.isk_gateway.http.server import IskHttpService
from bergstream.plugins.isk_gateway.kafka.authorization import TopicAuthorizer
from bergstream.plugins.isk_gateway.kafka.buffers import install_arena
from bergstream.plugins.isk_gateway.kafka.reader import KafkaReader
from bergstream.plugins.isk_gateway.settings import IskServiceConfig
from bergstream.plugins.isk_gateway.status import IskStatus
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
        self.status = IskStatus(self)
        self._sampler: asyncio.Task[None] | None = None

    def readiness_checks(self) -> list[ReadinessCheck]:
        """Kafka, and with a lake its catalog and S3 bucket, and the Schema Registry when
        ``codecs:`` names one (``GET /readyz``)."""
        checks = [kafka_check(self.config.kafka_bootstrap)]
        if self.lake is not None:
            checks += lake_checks(self.lake)
        registry = self.context.config.codecs.schema_registry
        if registry is not None:
            checks.append(registry_check(registry))
        return checks

    async def status_sections(self, authorization: str | None) -> list[StatusSection]:
        """This gateway's part of the status page (:mod:`.status`)."""
        return await self.status.sections(authorization)

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
            if c.buffers.retained_bytes:
                await self._install_arena()
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
                coalesce_files=c.coalesce_files,
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
        self._sampler = asyncio.create_task(self.status.run_sampler())
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

    async def _install_arena(self) -> None:
        """The process's buffer arena of ``buffers.retained_bytes``, written once if
        ``buffers.pretouch``; a region the system refuses leaves large buffers to the
        allocator, with a warning."""
        settings = self.config.buffers
        try:
            arena = install_arena(settings.retained_bytes)
        except OSError as error:
            log.warning(
                "isk: no buffer arena of %d MiB (%s): large buffers come from the allocator; "
                "lower buffers.retained_bytes",
                settings.retained_bytes >> 20,
                error,
            )
            return
        if settings.pretouch and not arena.high_water_bytes:  # pieces out: too late
            await asyncio.to_thread(arena.pretouch)

    async def stop(self) -> None:
        """Close the listeners, the backends and the Kafka connections; safe to call twice."""
        for task in (self._indexer, self._recorder, self._sampler):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._indexer = self._recorder = self._sampler = None
        http, self.http = self.http, None
        if http is not None:
            await http.stop()
        self.provider = None
        if self.hotset is not None:  # files built for clients reach the cache before it closes
            with contextlib.suppress(Exception):
                await self.hotset.indexer.close()
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
