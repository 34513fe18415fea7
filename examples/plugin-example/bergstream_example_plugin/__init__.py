"""Example bergstream plugin: the ``add-header`` proxy filter.

Shows the three parts of a filter plugin: a typed config model, a factory created once per virtual
cluster, and a filter created once per client connection.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.hookspecs import hookimpl
from bergstream.core.proxy.api import FilterContext, FilterFactory, Forward, ProxyFilter
from bergstream.core.records import map_records, with_header
from bergstream.core.registrations import FilterRegistration

PRODUCE = 0


class AddHeaderConfig(BaseModel):
    """Settings of the ``add-header`` filter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header: str = Field("x-bergstream", min_length=1, description="header key to append")
    value: str = Field(description="header value (UTF-8)")


class AddHeaderFilter(ProxyFilter):
    """Appends ``header: value`` to every record of every Produce request."""

    request_api_keys = frozenset({PRODUCE})

    def __init__(self, config: AddHeaderConfig) -> None:
        self._key = config.header
        self._value = config.value.encode()

    async def on_request(self, header: Any, request: Any, context: FilterContext) -> Forward:
        """Rewrite the record batches of a Produce request with the extra header."""
        topics = tuple(
            replace(
                topic,
                partition_data=tuple(
                    replace(
                        part,
                        records=map_records(
                            part.records, lambda r: with_header(r, self._key, self._value)
                        ),
                    )
                    if part.records
                    else part
                    for part in topic.partition_data
                ),
            )
            for topic in request.topic_data
        )
        return Forward(replace(request, topic_data=topics))


class AddHeaderFactory(FilterFactory[AddHeaderConfig]):
    """Creates one :class:`AddHeaderFilter` per client connection."""

    def create_filter(self) -> ProxyFilter:
        """A new filter for one connection."""
        return AddHeaderFilter(self.config)


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
