"""Registers the ``local``, ``s3`` and ``redis`` cache backends through the ``bergstream``
entry-point group."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from bergstream.core.api import CacheBackendRegistration, LogComponent, StrictModel, hookimpl

if TYPE_CHECKING:
    from bergstream.core.api import ServiceContext
    from bergstream.plugins.cache_backends.local_disk import LocalDiskCache
    from bergstream.plugins.cache_backends.redis_cache import RedisCache
    from bergstream.plugins.cache_backends.s3_cache import S3Cache


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
    from bergstream.plugins.cache_backends.local_disk import LocalDiskCache

    directory = config.directory or context.home / "isk" / "cache"
    return LocalDiskCache(directory, max_bytes=config.max_bytes)


class S3CacheConfig(StrictModel):
    """Settings of the ``s3`` cache backend (any S3-compatible server: MinIO, SeaweedFS, AWS)."""

    endpoint: str = Field(min_length=1, description="http[s]://host:port of the S3 server")
    access_key: str = Field(min_length=1, description="access key of the S3 server")
    secret_key: SecretStr = Field(description="the matching secret key")
    region: str = Field("us-east-1", min_length=1, description="region used in signatures")
    bucket: str = Field(
        "bergstream-cache",
        pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        description="bucket holding the entries (shared by gateways using the same one)",
    )
    prefix: str = Field(
        "isk/",
        pattern=r"^[^/].*$|^$",
        description="object name prefix of every entry (several caches can share a bucket)",
    )
    create_bucket: bool = Field(True, description="create the bucket on first write if missing")
    ttl_seconds: float | None = Field(
        7 * 24 * 3600.0, gt=0, description="entries older than this are misses (None: no TTL)"
    )
    max_bytes: int | None = Field(
        None,
        ge=1024**2,
        description="best-effort size bound; the oldest objects (LastModified) go first",
    )
    connect_timeout_seconds: float = Field(2.0, gt=0, description="TCP connect timeout")
    read_timeout_seconds: float = Field(30.0, gt=0, description="timeout waiting for a response")


def create_s3_cache(config: S3CacheConfig, context: ServiceContext) -> S3Cache:
    """A cache on ``config.bucket``; nothing is sent to the server before the first call."""
    from bergstream.plugins.cache_backends.s3_cache import S3Cache, minio_client

    client = minio_client(
        config.endpoint,
        config.access_key,
        config.secret_key.get_secret_value(),
        config.region,
        connect_timeout=config.connect_timeout_seconds,
        read_timeout=config.read_timeout_seconds,
    )
    return S3Cache(
        client,
        config.bucket,
        prefix=config.prefix,
        ttl_seconds=config.ttl_seconds,
        max_bytes=config.max_bytes,
        create_bucket=config.create_bucket,
    )


class RedisCacheConfig(StrictModel):
    """Settings of the ``redis`` cache backend (metadata and small files)."""

    url: str = Field(
        "redis://127.0.0.1:6379/0",
        pattern=r"^(redis|rediss|unix)://",
        description="redis://[user:password@]host:port/db of the server",
    )
    prefix: str = Field("bergstream:isk:", description="prefix of every key")
    ttl_seconds: int | None = Field(
        24 * 3600, gt=0, description="expiry of each entry (SET ... EX; None: no expiry)"
    )
    max_entry_bytes: int = Field(
        8 * 1024**2,
        ge=1024,
        le=512 * 1024**2,
        description="larger entries are not cached (an error names the key and its size)",
    )
    connect_timeout_seconds: float = Field(1.0, gt=0, description="TCP connect timeout")
    timeout_seconds: float = Field(5.0, gt=0, description="timeout of each command")


def create_redis_cache(config: RedisCacheConfig, context: ServiceContext) -> RedisCache:
    """A cache on the server at ``config.url``; connections are made on first use."""
    from bergstream.plugins.cache_backends.redis_cache import RedisCache

    return RedisCache.from_url(
        config.url,
        connect_timeout=config.connect_timeout_seconds,
        timeout=config.timeout_seconds,
        prefix=config.prefix,
        ttl_seconds=config.ttl_seconds,
        max_entry_bytes=config.max_entry_bytes,
    )


@hookimpl
def register_cache_backends() -> list[CacheBackendRegistration]:
    """Register the ``local``, ``s3`` and ``redis`` cache backends."""
    return [
        CacheBackendRegistration(
            name="local",
            factory=create_local_cache,
            config_model=LocalDiskCacheConfig,
            description="verified, size-bounded (LRU) cache of synthesized files on local disk",
        ),
        CacheBackendRegistration(
            name="s3",
            factory=create_s3_cache,
            config_model=S3CacheConfig,
            description="verified cache in an S3 bucket (MinIO, SeaweedFS, AWS), shared by "
            "gateway replicas; TTL and best-effort size bound",
        ),
        CacheBackendRegistration(
            name="redis",
            factory=create_redis_cache,
            config_model=RedisCacheConfig,
            description="verified cache of metadata and small files in Redis; TTL and a "
            "per-entry size limit",
        ),
    ]


@hookimpl
def register_log_components() -> list[LogComponent]:
    """The cache backends log as ``cache``."""
    return [
        LogComponent(logger="bergstream.cache", component="cache"),
        LogComponent(logger="bergstream.plugins.cache_backends", component="cache"),
    ]
