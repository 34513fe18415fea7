"""Registers the ``ksi`` filter through the ``bergstream`` entry-point group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bergstream.core.api import FilterRegistration, LogComponent, hookimpl
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig

if TYPE_CHECKING:
    from bergstream.core.api import FilterFactoryContext
    from bergstream.plugins.ksi_fetch_filter.filter import KsiFactory


def create_ksi_factory(config: KsiConfig, context: FilterFactoryContext) -> KsiFactory:
    """The ``ksi`` filter factory of one virtual cluster (the filter's modules load here, not
    when plugins are listed)."""
    from bergstream.plugins.ksi_fetch_filter.filter import KsiFactory

    return KsiFactory(config, context)


@hookimpl
def register_filters() -> list[FilterRegistration]:
    """Register the ``ksi`` filter."""
    return [
        FilterRegistration(
            name="ksi",
            factory=create_ksi_factory,
            config_model=KsiConfig,
            description="serve offsets Kafka deleted from the Iceberg coldset (KSI)",
        )
    ]


@hookimpl
def register_log_components() -> list[LogComponent]:
    """KSI's loggers log as ``ksi``."""
    return [
        LogComponent(logger="bergstream.ksi", component="ksi"),
        LogComponent(logger="bergstream.plugins.ksi_fetch_filter", component="ksi"),
    ]
