"""Registers the ``add-header`` filter: the module the entry point names."""

from __future__ import annotations

from bergstream.core.api import FilterRegistration, hookimpl
from bergstream_example_plugin.add_header_filter.filter import AddHeaderConfig, AddHeaderFactory


@hookimpl
def register_filters() -> list[FilterRegistration]:
    """Register the ``add-header`` filter."""
    return [
        FilterRegistration(
            name="add-header",
            factory=AddHeaderFactory,
            config_model=AddHeaderConfig,
            description="append a header to every produced record",
        )
    ]
