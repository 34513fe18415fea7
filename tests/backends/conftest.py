"""Fixtures of the backend tests: the session stack's S3 server and Redis, as settings."""

from __future__ import annotations

import pytest

from tests.backends.servers import S3Settings


@pytest.fixture(scope="session")
def s3_settings(stack_env: dict[str, str]) -> S3Settings:
    """Endpoint and keys of the stack's S3 server (SeaweedFS)."""
    return S3Settings.from_env(stack_env)


@pytest.fixture(scope="session")
def redis_url(stack_env: dict[str, str]) -> str:
    """``redis://`` URL of the stack's Redis. Each test keeps its keys under a prefix of its
    own; nothing is flushed (both xdist workers share the stack, which the run stops)."""
    return stack_env["BERGSTREAM_REDIS_URL"]
