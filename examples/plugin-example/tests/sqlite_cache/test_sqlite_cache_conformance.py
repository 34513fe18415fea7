"""bergstream's backend conformance suite, run against this plugin's cache from its own pytest.

Two ways to use it; pick one. Both need only a *case*: how to open the backend on a fresh
location (a directory pytest provides) and how to corrupt a stored entry behind its back.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from bergstream_example_plugin.sqlite_cache.cache import SqliteCache

from bergstream.core.api import CACHE_CHECKS, CacheCase, CacheCheck, CacheConformance, check_id


def corrupt(location: Path, key: str) -> None:
    """Flip a byte of the stored data without going through the cache."""
    with sqlite3.connect(location / "cache.sqlite") as connection:
        (data,) = connection.execute("SELECT data FROM entries WHERE key = ?", (key,)).fetchone()
        damaged = bytes([data[0] ^ 0xFF]) + bytes(data[1:])
        connection.execute("UPDATE entries SET data = ? WHERE key = ?", (damaged, key))


CASE = CacheCase(
    "example-sqlite", open=lambda location: SqliteCache(location / "cache.sqlite"), corrupt=corrupt
)


# 1. One parametrized test over every check.
@pytest.mark.parametrize("check", CACHE_CHECKS, ids=check_id)
def test_conformance(check: CacheCheck, tmp_path: Path) -> None:
    check(CASE, tmp_path / "cache")


# 2. Or inherit the ready-made class: one test method per check, the case as a fixture.
class TestSqliteCacheConformance(CacheConformance):
    """One test per cache check, all on :data:`CASE`."""

    @pytest.fixture
    def cache_case(self) -> CacheCase:
        """The case every inherited test runs."""
        return CASE
