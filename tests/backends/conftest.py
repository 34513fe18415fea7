"""Fixtures of the backend tests: the session stack's S3 server and Redis, as settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.backends.servers import S3Settings, flush_redis_prefix


@pytest.fixture(scope="session")
def s3_settings(stack_env: dict[str, str]) -> S3Settings:
    """Endpoint and keys of the stack's S3 server (SeaweedFS)."""
    return S3Settings.from_env(stack_env)


@pytest.fixture(scope="session")
def redis_url(stack_env: dict[str, str]) -> Iterator[str]:
    """``redis://`` URL of the stack's Redis; the test keys are removed at the end."""
    url = stack_env["BERGSTREAM_REDIS_URL"]
    yield url
    flush_redis_prefix(url, "bergstream-test:")
