"""Example bergstream plugin: the ``add-header`` proxy filter and the ``example-sqlite`` cache.

Shows the three parts of a filter plugin: a typed config model, a factory created once per virtual
cluster, and a filter created once per client connection; and a cache backend for ISK
(:mod:`.sqlite_cache`) with its config model and factory, checked by bergstream's conformance
suite in ``tests/test_conformance.py``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.backends import ServiceContext
from bergstream.core.hookspecs import hookimpl
from bergstream.core.proxy.api import FilterContext, FilterFactory, Forward, ProxyFilter
from bergstream.core.records import map_records, with_header
from bergstream.core.registrations import CacheBackendRegistration, FilterRegistration
from bergstream_example_plugin.sqlite_cache import SqliteCache

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


class SqliteCacheConfig(BaseModel):
    """Settings of the ``example-sqlite`` cache backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path | None = Field(
        None, description="the SQLite file (default $BERGSTREAM_HOME/isk/example-cache.sqlite)"
    )


def create_sqlite_cache(config: SqliteCacheConfig, context: ServiceContext) -> SqliteCache:
    """Open the cache file at ``config.path``, or under the home directory by default."""
    return SqliteCache(config.path or context.home / "isk" / "example-cache.sqlite")


@hookimpl
def register_cache_backends() -> list[CacheBackendRegistration]:
    """Register the ``example-sqlite`` cache backend (ISK: ``cache: {type: example-sqlite}``)."""
    return [
        CacheBackendRegistration(
            name="example-sqlite",
            factory=create_sqlite_cache,
            config_model=SqliteCacheConfig,
            description="example: verified cache entries in one SQLite file",
        )
    ]
