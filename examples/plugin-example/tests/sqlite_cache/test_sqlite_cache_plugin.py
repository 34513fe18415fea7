"""The ``example-sqlite`` registration: its config model and its factory, as ISK calls them."""

from __future__ import annotations

from pathlib import Path

import pytest
from bergstream_example_plugin.sqlite_cache import plugin
from pydantic import ValidationError

from bergstream.core.api import BergstreamConfig, ServiceContext, load_registry


def test_the_factory_opens_the_configured_file_or_one_under_the_home_directory(
    tmp_path: Path,
) -> None:
    registry = load_registry([plugin], entry_points=False)
    registration = registry.get("cache backend", "example-sqlite")
    context = ServiceContext(BergstreamConfig(), registry, tmp_path / "home")

    default = registration.factory(registration.config_model.model_validate({}), context)
    chosen = registration.factory(
        registration.config_model.model_validate({"path": str(tmp_path / "c.sqlite")}), context
    )
    try:
        assert default.path == tmp_path / "home" / "isk" / "example-cache.sqlite"
        assert chosen.path == tmp_path / "c.sqlite"
        chosen.put("k", b"v")
        assert (chosen.get("k"), default.get("k")) == (b"v", None)
    finally:
        default.close()
        chosen.close()


def test_the_config_refuses_unknown_keys() -> None:
    registry = load_registry([plugin], entry_points=False)
    registration = registry.get("cache backend", "example-sqlite")
    with pytest.raises(ValidationError, match="colour"):
        registration.config_model.model_validate({"colour": "red"})
