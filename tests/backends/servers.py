"""Helpers of the backend tests: S3 settings from the stack's environment, conformance cases
for the network caches, and Redis / SeaweedFS servers of a test's own that it may kill."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import redis
from minio import Minio

from bergstream.core.testing.backends import CacheCase
from bergstream.devstack.stack import stack_down, stack_up
from bergstream.devstack.stack.env import StackEnv
from bergstream.plugins.cache_backends.redis_cache import RedisCache
from bergstream.plugins.cache_backends.s3_cache import S3Cache, minio_client

TEST_BUCKET = "bergstream-test-cache"


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3 server."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str

    @classmethod
    def from_env(cls, env: dict[str, str]) -> S3Settings:
        """From the ``BERGSTREAM_S3_*`` variables ``bergstream stack env`` prints."""
        return cls(
            env["BERGSTREAM_S3_ENDPOINT"],
            env["BERGSTREAM_S3_ACCESS_KEY"],
            env["BERGSTREAM_S3_SECRET_KEY"],
            env["BERGSTREAM_S3_REGION"],
        )

    def client(self, **timeouts: float) -> Minio:
        """A Minio client with the backend's settings (short timeouts, no retries)."""
        return minio_client(
            self.endpoint, self.access_key, self.secret_key, self.region, **timeouts
        )


def prefix_of(location: Path) -> str:
    """A key prefix unique to a test location (network caches keep no files there)."""
    return f"c-{hashlib.sha1(str(location).encode()).hexdigest()[:16]}/"


def s3_case(settings: S3Settings, **options: object) -> CacheCase:
    """The conformance case of the ``s3`` backend on ``settings``."""

    def open_cache(location: Path) -> S3Cache:
        return S3Cache(settings.client(), TEST_BUCKET, prefix=prefix_of(location), **options)  # type: ignore[arg-type]

    def corrupt(location: Path, key: str) -> None:
        import io

        client = settings.client()
        name = prefix_of(location) + key
        response = client.get_object(TEST_BUCKET, name)
        blob = bytearray(response.read())
        response.close()
        response.release_conn()
        blob[-1] ^= 0xFF
        client.put_object(TEST_BUCKET, name, io.BytesIO(bytes(blob)), len(blob))

    return CacheCase("s3", open_cache, corrupt)


def redis_case(url: str, **options: object) -> CacheCase:
    """The conformance case of the ``redis`` backend on the server at ``url``."""

    def prefix(location: Path) -> str:
        return "bergstream-test:" + prefix_of(location)

    def open_cache(location: Path) -> RedisCache:
        return RedisCache.from_url(url, prefix=prefix(location), **options)

    def corrupt(location: Path, key: str) -> None:
        client = redis.Redis.from_url(url)
        name = prefix(location) + key
        blob = bytearray(client.get(name))  # type: ignore[arg-type]
        blob[len(blob) // 2] ^= 0x01
        client.set(name, bytes(blob))
        client.close()

    return CacheCase("redis", open_cache, corrupt)


class OwnServer:
    """A Redis or SeaweedFS server of one test (its own stack home, ports and PID), started
    and stopped by the same code as ``bergstream stack up/down``, so the test can kill it
    without touching the session's servers."""

    def __init__(self, home: Path, component: str) -> None:
        """Prepare a server of ``component`` (``redis`` or ``s3``) living in ``home``."""
        self.home = home
        self.component = component
        self.env: StackEnv | None = None

    def start(self) -> StackEnv:
        """Start (or restart, on the same ports when free) the server; return its address."""
        self.env = stack_up(home=self.home, components={self.component})
        return self.env

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) by its PID."""
        stack_down(home=self.home)
