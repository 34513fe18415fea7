"""Every setting of every built-in cache and index backend is documented in
docs/configuration.md, in a table row naming the backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from bergstream.core.plugins import load_registry
from bergstream.plugins.cache_backends import plugin as caches
from bergstream.plugins.index_backends import plugin as indexes

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
REGISTRY = load_registry([caches, indexes], entry_points=False)


def _registrations() -> list[object]:
    found = []
    for kind, label in (("cache backend", "cache"), ("index backend", "index")):
        for name in ("local", "s3", "redis") if label == "cache" else ("sqlite", "rocksdb"):
            registration = REGISTRY.get(kind, name)
            keys = list(registration.config_model.model_fields)
            found.append(pytest.param(label, name, keys, id=f"{label}-{name}"))
    return found


@pytest.mark.parametrize(("label", "name", "keys"), _registrations())
def test_every_backend_setting_is_documented(label: str, name: str, keys: list[str]) -> None:
    rows = [
        line for line in DOCS.read_text().splitlines() if line.startswith(f"| {label} `{name}`")
    ]
    missing = [key for key in keys if not any(f"`config.{key}`" in row for row in rows)]
    assert not missing, f"{label} {name!r}: undocumented settings {missing} in {DOCS.name}"
