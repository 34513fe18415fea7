"""Registers the ``isk`` service (an ISK gateway) through the ``bergstream`` entry-point group."""

from __future__ import annotations

from bergstream.core.hookspecs import hookimpl
from bergstream.core.registrations import ServiceRegistration
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
