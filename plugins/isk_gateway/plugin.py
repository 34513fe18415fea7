"""Registers the ``isk`` service (an ISK gateway) and its ``hotset-parquet`` file synthesizer
through the ``bergstream`` entry-point group."""

from __future__ import annotations

from bergstream.core.api import FileSynthesizerRegistration, ServiceRegistration, hookimpl
from bergstream.plugins.isk_gateway.files.hotset_parquet import (
    HotsetDataSynthesizerConfig,
    create_hotset_data_synthesizer,
)
from bergstream.plugins.isk_gateway.service import IskServiceConfig, create_isk_service


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
