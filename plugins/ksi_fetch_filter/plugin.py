"""Registers the ``ksi`` filter through the ``bergstream`` entry-point group."""

from __future__ import annotations

from bergstream.core.api import FilterRegistration, hookimpl
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.filter import KsiFactory


@hookimpl
def register_filters() -> list[FilterRegistration]:
    """Register the ``ksi`` filter."""
    return [
        FilterRegistration(
            name="ksi",
            factory=KsiFactory,
            config_model=KsiConfig,
            description="serve offsets Kafka deleted from the Iceberg coldset (KSI)",
        )
    ]
