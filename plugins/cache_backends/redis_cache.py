"""The ``redis`` cache backend: metadata and small files in Redis, shared by gateway replicas.

Each entry is one string value ``<prefix><key>`` holding the data behind a verified header
(:mod:`.entries`); ``get`` checks it, and deletes and misses a corrupt entry. ``SET`` replaces a
value whole, so concurrent writers of one key are harmless; ``put_if_absent`` is ``SET ... NX``.
``ttl_seconds`` becomes the key's expiry (``SET ... EX``); the total size is bounded by the
server (``maxmemory`` with an eviction policy such as ``allkeys-lru``). An entry above
``max_entry_bytes`` is refused with :class:`~.entries.CacheEntryTooLargeError` naming the key,
its size and the setting: Redis holds small files, large data files belong in the ``local`` or
``s3`` cache.
"""

from __future__ import annotations

import logging

import redis

from bergstream.plugins.cache_backends.entries import (
    HEADER_BYTES,
    CacheEntryTooLargeError,
    check_key,
    seal,
    unseal,
)

__all__ = ["RedisCache"]

log = logging.getLogger(__name__)

_MAX_KEY = 4096


class RedisCache:
    """A :class:`~bergstream.core.api.CacheBackend` on a Redis server."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "bergstream:cache:",
        ttl_seconds: int | None = None,
        max_entry_bytes: int = 8 * 1024**2,
    ) -> None:
        """Use ``client`` (connections are made on first use), keys under ``prefix``."""
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be > 0, got {ttl_seconds}")
        if max_entry_bytes <= 0:
            raise ValueError(f"max_entry_bytes must be > 0, got {max_entry_bytes}")
        self.client = client
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds
        self.max_entry_bytes = max_entry_bytes
        self.corrupt_entries = 0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: float = 1.0,
        timeout: float = 5.0,
        **settings: object,
    ) -> RedisCache:
        """A cache on the server at ``url`` (``redis://host:port/db``), with socket timeouts."""
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout,
            socket_timeout=timeout,
            retry_on_timeout=False,
        )
        return cls(client, **settings)  # type: ignore[arg-type]

    def _name(self, key: str) -> bytes:
        return (self.prefix + check_key(key, _MAX_KEY)).encode()

    def get(self, key: str) -> bytes | None:
        """The verified bytes under ``key``; None if absent, expired or corrupt (then the key is
        deleted). Connection errors are raised."""
        name = self._name(key)
        blob = self.client.get(name)
        if blob is None:
            return None
        entry = unseal(blob)  # type: ignore[arg-type]
        if entry is None:
            self.corrupt_entries += 1
            log.warning("redis cache: %r failed verification; deleted", name.decode())
            self.client.delete(name)
            return None
        return entry.data

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key`` (one ``SET``, with ``EX`` if a TTL is set); raise
        :class:`CacheEntryTooLargeError` if it is above ``max_entry_bytes``."""
        self.client.set(self._sized_name(key, data), seal(data), ex=self.ttl_seconds)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` unless it is there (one ``SET ... NX``); True if stored."""
        name = self._sized_name(key, data)
        return bool(self.client.set(name, seal(data), ex=self.ttl_seconds, nx=True))

    def _sized_name(self, key: str, data: bytes | memoryview) -> bytes:
        """The Redis key of ``key``; raise :class:`CacheEntryTooLargeError` if ``data`` is above
        ``max_entry_bytes``."""
        name = self._name(key)
        if len(data) + HEADER_BYTES > self.max_entry_bytes:
            raise CacheEntryTooLargeError(
                f"redis cache: entry {key!r} is {len(data)} bytes (+{HEADER_BYTES} header), above "
                f"max_entry_bytes={self.max_entry_bytes} (cache.config.max_entry_bytes); "
                "not cached (raise the limit, or use the local or s3 cache for large files)"
            )
        return name

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        self.client.delete(self._name(key))

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()
