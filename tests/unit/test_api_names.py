"""Every name of ``bergstream.core.api`` loads lazily, and each one alone in a fresh interpreter:
a name that resolves only after another has loaded its module is found here, not by a
plugin that happens to import it first."""

from __future__ import annotations

import subprocess
import sys
import types

from bergstream.core import api


def test_every_name_resolves() -> None:
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert missing == []


def test_module_names_resolve_first_in_a_fresh_interpreter() -> None:
    modules = [n for n in api.__all__ if isinstance(getattr(api, n), types.ModuleType)]
    assert "record_batch" in modules
    failed = {}
    for name in modules:
        run = subprocess.run(
            [sys.executable, "-c", f"from bergstream.core.api import {name}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if run.returncode:
            failed[name] = run.stderr.strip().splitlines()[-1:]
    assert failed == {}
