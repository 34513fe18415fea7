"""The example third-party plugin runs its own tests (bergstream's cache conformance suite and
filter test kit) from its own pytest (its own rootdir and config, as in its repository), and each
of its capabilities registers on its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bergstream.core.api import ServiceContext, load_registry
from tests.support import REPO

EXAMPLE = REPO / "examples" / "plugin-example"


def test_the_example_plugin_passes_its_own_tests_from_its_own_pytest(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path),
        ],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # 18 cache conformance checks, 2 of the cache's registration, 3 Produce versions through
    # the filter and 1 of its registration.
    assert "24 passed" in result.stdout, result.stdout


def test_each_capability_of_the_example_plugin_registers_on_its_own(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from bergstream_example_plugin.add_header_filter import plugin as add_header
        from bergstream_example_plugin.sqlite_cache import plugin as sqlite_cache

        filters = load_registry([add_header], entry_points=False)
        assert filters.get("filter", "add-header").name == "add-header"
        assert filters.registrations("cache backend") == {}
        registry = load_registry([sqlite_cache], entry_points=False)
        assert registry.registrations("filter") == {}
        registration = registry.get("cache backend", "example-sqlite")
        config = registration.config_model.model_validate({"path": str(tmp_path / "c.db")})
        fake: Any = SimpleNamespace()
        context = ServiceContext(config=fake, plugins=fake, home=tmp_path)
        cache = registration.factory(config, context)
        cache.put("k", b"v")
        assert cache.get("k") == b"v"
        cache.close()
    finally:
        sys.path.remove(str(EXAMPLE))
        for name in [n for n in sys.modules if n.startswith("bergstream_example_plugin")]:
            del sys.modules[name]
