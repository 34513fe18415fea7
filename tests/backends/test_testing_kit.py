"""The conformance kit is importable without pytest or plugins, and catches broken backends."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bergstream.core.testing.backends import (
    CACHE_CHECKS,
    CacheCase,
    ConformanceError,
    check_id,
    run_cache_conformance,
)
from bergstream.plugins.cache_backends.local_disk import LocalDiskCache


def test_importing_the_kit_imports_neither_pytest_nor_plugins() -> None:
    code = (
        "import sys, bergstream.core.testing.backends\n"
        "bad = [m for m in sys.modules if m == 'pytest' or m.startswith('bergstream.plugins')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


HEADER = struct.calcsize(">4sIQ")  # the local cache's entry header: magic, CRC-32C, length


class ServesCorruptEntries(LocalDiskCache):
    """A cache that forgets to verify: reads the entry file and returns what follows the
    header, whatever it is."""

    def get(self, key: str) -> bytes | None:
        path = self._entry_path(key)
        return path.read_bytes()[HEADER:] if path.exists() else None


def _corrupt(location: Path, key: str) -> None:
    path = location / f"{key}.bsc"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_check_ids_are_the_check_names() -> None:
    assert [check_id(c) for c in CACHE_CHECKS][:2] == ["cache_round_trip", "cache_missing_key"]


class OverwritesWhenAbsent(LocalDiskCache):
    """A ``put_if_absent`` that checks and then writes: not atomic, and it even overwrites."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.put(key, data)
        return True


@pytest.mark.parametrize(
    ("cache", "check", "message"),
    [
        (ServesCorruptEntries, "cache_corruption_is_a_miss", "a corrupted entry was served"),
        (OverwritesWhenAbsent, "cache_put_if_absent", "an existing key was stored"),
    ],
)
def test_a_broken_cache_fails_exactly_the_check_it_breaks(
    tmp_path: Path, cache: type[LocalDiskCache], check: str, message: str
) -> None:
    case = CacheCase(cache.__name__, lambda location: cache(location, 1 << 24), _corrupt)
    with pytest.raises(ConformanceError, match=check) as caught:
        run_cache_conformance(case, tmp_path)
    assert message in str(caught.value)
    assert "fails 1 of" in str(caught.value)
