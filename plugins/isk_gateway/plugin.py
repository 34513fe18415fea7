"""Registers the ``isk`` service (an ISK gateway) and its ``hotset-parquet`` file synthesizer
through the ``bergstream`` entry-point group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bergstream.core.api import (
    FileSynthesizerRegistration,
    LogComponent,
    ServiceRegistration,
    hookimpl,
)
from bergstream.plugins.isk_gateway.settings import HotsetDataSynthesizerConfig, IskServiceConfig

if TYPE_CHECKING:
    from bergstream.core.api import FileSynthesizer, Service, ServiceContext


def create_isk_service(config: IskServiceConfig, context: ServiceContext) -> Service:
    """The ``isk`` service (the gateway's modules load here, not when plugins are listed)."""
    from bergstream.plugins.isk_gateway.service import create_isk_service as create

    return create(config, context)


def create_hotset_data_synthesizer(
    config: HotsetDataSynthesizerConfig, context: ServiceContext
) -> FileSynthesizer:
    """The ``hotset-parquet`` synthesizer (loaded on first use, like the service)."""
    from bergstream.plugins.isk_gateway.files.hotset_parquet import (
        create_hotset_data_synthesizer as create,
    )

    return create(config, context)


@hookimpl
def register_services() -> list[ServiceRegistration]:
    """Register the ``isk`` service."""
    return [
        ServiceRegistration(
            name="isk",
            factory=create_isk_service,
            config_model=IskServiceConfig,
            description="ISK gateway: Iceberg REST catalog and S3 gateway serving Kafka topics",
        )
    ]


@hookimpl
def register_file_synthesizers() -> list[FileSynthesizerRegistration]:
    """Register ``hotset-parquet``, the builder of hotset data files from their keys."""
    return [
        FileSynthesizerRegistration(
            name="hotset-parquet",
            factory=create_hotset_data_synthesizer,
            config_model=HotsetDataSynthesizerConfig,
            description="hotset data files (Parquet) rebuilt from Kafka from their keys alone",
        )
    ]


@hookimpl
def register_log_components() -> list[LogComponent]:
    """ISK's loggers log as ``isk``; its cache and index wrappers as ``cache`` and ``index``."""
    return [
        LogComponent(logger="bergstream.isk", component="isk"),
        LogComponent(logger="bergstream.isk.cache", component="cache"),
        LogComponent(logger="bergstream.isk.index", component="index"),
        LogComponent(logger="bergstream.plugins.isk_gateway", component="isk"),
    ]
