"""Registers the ``example-sqlite`` cache backend: the module the entry point names."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.api import CacheBackendRegistration, ServiceContext, hookimpl
from bergstream_example_plugin.sqlite_cache.cache import SqliteCache


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
