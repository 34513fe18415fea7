"""The ``local`` cache backend: the conformance suite (:mod:`bergstream.core.testing.backends`),
then what is specific to it. The network caches are tested in test_network_caches.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from bergstream.core.backends import ServiceContext
from bergstream.core.plugins import load_registry
from bergstream.core.testing.backends import CACHE_CHECKS, CacheCase, check_id
from bergstream.plugins.cache_backends import plugin
from bergstream.plugins.cache_backends.local_disk import CacheKeyError, LocalDiskCache


def _corrupt_local(location: Path, key: str) -> None:
    path = location / f"{key}.bsc"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))


CASES = [
    CacheCase("local", lambda location: LocalDiskCache(location, 1 << 24), _corrupt_local),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("check", CACHE_CHECKS, ids=check_id)
def test_cache_contract(
    case: CacheCase, check: Callable[[CacheCase, Path], None], tmp_path: Path
) -> None:
    check(case, tmp_path / "cache")


# --------------------------------------------------------------------------- local specifics


@pytest.mark.parametrize(
    "key", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\\b", "a/\x00", "x.bsc/y"]
)
def test_keys_that_would_escape_are_refused(tmp_path: Path, key: str) -> None:
    cache = LocalDiskCache(tmp_path, 1 << 20)
    with pytest.raises(CacheKeyError, match="cache key"):
        cache.put(key, b"x")
    with pytest.raises(CacheKeyError):
        cache.get(key)


def test_a_symlink_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = LocalDiskCache(root, 1 << 20)
    (root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CacheKeyError, match="outside"):
        cache.put("link/file", b"x")
    assert not list(outside.iterdir())


def test_truncated_and_foreign_files_are_misses_and_deleted(tmp_path: Path) -> None:
    cache = LocalDiskCache(tmp_path, 1 << 20)
    cache.put("a", b"y" * 100)
    entry = tmp_path / "a.bsc"
    entry.write_bytes(entry.read_bytes()[:50])
    assert cache.get("a") is None and not entry.exists()
    (tmp_path / "b.bsc").write_bytes(b"not a cache entry")
    assert cache.get("b") is None and cache.corrupt_entries == 2


def test_least_recently_used_entries_are_evicted(tmp_path: Path) -> None:
    cache = LocalDiskCache(tmp_path, max_bytes=10_000)
    for i in range(4):
        cache.put(f"k{i}", bytes(2000))
        os.utime(tmp_path / f"k{i}.bsc", (1000 + i, 1000 + i))
    assert cache.get("k0") == bytes(2000)  # a hit makes k0 the most recent
    cache.put("k4", bytes(2000))  # 5 entries > 10_000 bytes: evict down to 9_000
    assert cache.get("k1") is None
    assert all(cache.get(f"k{i}") is not None for i in (0, 2, 3, 4))
    total = sum(path.stat().st_size for path in tmp_path.glob("*.bsc"))
    assert total <= 10_000


def test_the_bound_holds_across_instances_sharing_the_directory(tmp_path: Path) -> None:
    LocalDiskCache(tmp_path, 1 << 20).put("old", bytes(6000))
    os.utime(tmp_path / "old.bsc", (1, 1))
    cache = LocalDiskCache(tmp_path, max_bytes=10_000)  # counts the existing entry
    cache.put("new", bytes(6000))
    assert cache.get("old") is None and cache.get("new") == bytes(6000)


def test_an_entry_larger_than_the_bound_is_not_kept(tmp_path: Path) -> None:
    cache = LocalDiskCache(tmp_path, max_bytes=1000)
    cache.put("small", b"s")
    cache.put("big", bytes(5000))
    assert cache.get("big") is None and cache.get("small") == b"s"


def test_no_temporary_files_are_left_behind(tmp_path: Path) -> None:
    cache = LocalDiskCache(tmp_path, 1 << 20)
    for i in range(5):
        cache.put("d/k", bytes(i))
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["k.bsc"]


# --------------------------------------------------------------------------- registration


def _context(home: Path) -> ServiceContext:
    fake: Any = SimpleNamespace()
    return ServiceContext(config=fake, plugins=fake, home=home)


def test_the_plugin_registers_local_with_a_typed_config(tmp_path: Path) -> None:
    registration = load_registry([plugin], entry_points=False).get("cache backend", "local")
    config = registration.config_model.model_validate({"max_bytes": 2**21})
    cache = registration.factory(config, _context(tmp_path))
    assert isinstance(cache, LocalDiskCache)
    assert cache.directory == tmp_path / "isk" / "cache" and cache.max_bytes == 2**21
    with pytest.raises(ValidationError, match="max_byte"):
        registration.config_model.model_validate({"max_byte": 5})
    with pytest.raises(ValidationError, match="max_bytes"):
        registration.config_model.model_validate({"max_bytes": 5})


def test_an_entry_written_with_sha256_is_still_verified(tmp_path: Path) -> None:
    """Entries of the earlier format (magic BSC1, SHA-256) are served, and a corrupt one is
    refused like any other."""
    import hashlib
    import struct

    cache = LocalDiskCache(tmp_path, 1 << 20)
    data = b"parquet bytes"
    entry = tmp_path / "old" / "file.parquet.bsc"
    entry.parent.mkdir()
    header = struct.pack(">4s32sQ", b"BSC1", hashlib.sha256(data).digest(), len(data))
    entry.write_bytes(header + data)
    assert cache.get("old/file.parquet") == data
    entry.write_bytes(header + b"parquet bytez")
    assert cache.get("old/file.parquet") is None
    assert not entry.exists()
