"""The example third-party plugin runs bergstream's conformance suite from its own pytest (its
own rootdir and config, as in its repository), and registers its cache backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bergstream.core.backends import ServiceContext
from tests.support import REPO

EXAMPLE = REPO / "examples" / "plugin-example"


def test_the_example_plugin_passes_the_conformance_suite_from_its_own_pytest(
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
    assert "16 passed" in result.stdout, result.stdout


def test_the_example_plugin_registers_its_cache_and_keeps_its_filter(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import bergstream_example_plugin as example

        from bergstream.core.plugins import load_registry

        registry = load_registry([example], entry_points=False)
        registration = registry.get("cache backend", "example-sqlite")
        assert registry.get("filter", "add-header").name == "add-header"
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
