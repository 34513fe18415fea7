"""The ``add-header`` filter: its config, its factory and the filter itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.api import (
    ApiKey,
    FilterContext,
    FilterFactory,
    Forward,
    ProxyFilter,
    map_records,
    with_header,
)


class AddHeaderConfig(BaseModel):
    """Settings of the ``add-header`` filter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header: str = Field("x-bergstream", min_length=1, description="header key to append")
    value: str = Field(description="header value (UTF-8)")


class AddHeaderFilter(ProxyFilter):
    """Appends ``header: value`` to every record of every Produce request; all other traffic
    passes as bytes, never decoded."""

    request_api_keys = frozenset({ApiKey.PRODUCE})

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
