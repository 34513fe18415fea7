"""Registers the ``local`` cache backend through the ``bergstream`` entry-point group."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.backends import ServiceContext
from bergstream.core.hookspecs import hookimpl
from bergstream.core.registrations import CacheBackendRegistration
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache


class LocalDiskCacheConfig(BaseModel):
    """Settings of the ``local`` cache backend (``caches[].config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    directory: Path | None = Field(
        None, description="where entries live (default $BERGSTREAM_HOME/isk/cache)"
    )
    max_bytes: int = Field(
        10 * 1024**3, ge=1024**2, description="size bound; least recently used entries go first"
    )


def create_local_cache(config: LocalDiskCacheConfig, context: ServiceContext) -> LocalDiskCache:
    """Open the cache at ``config.directory``, or under the home directory by default."""
    directory = config.directory or context.home / "isk" / "cache"
    return LocalDiskCache(directory, max_bytes=config.max_bytes)


@hookimpl
def register_cache_backends() -> list[CacheBackendRegistration]:
    """Register the ``local`` cache backend."""
    return [
        CacheBackendRegistration(
            name="local",
            factory=create_local_cache,
            config_model=LocalDiskCacheConfig,
            description="verified, size-bounded (LRU) cache of synthesized files on local disk",
        )
    ]
