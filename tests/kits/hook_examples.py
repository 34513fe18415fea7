"""The examples of docs/hooks.md as code: each hook's ``python`` example executed as a module,
its registration loaded into a registry, and a service context to build what it registers (the
docs tests run them; the backend tests run the example index through the conformance suite)."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

from bergstream.core.backends import ServiceContext
from bergstream.core.config import BergstreamConfig
from bergstream.core.plugins import load_registry
from tests.support import REPO

HOOKS_MD = REPO / "docs" / "hooks.md"


def python_blocks(text: str) -> list[str]:
    """The ``python`` code blocks of a Markdown text."""
    return re.findall(r"```python\n(.*?)```", text, re.S)


def hook_example(name: str) -> types.ModuleType:
    """The ``python`` example of hook ``name`` in docs/hooks.md, executed as a module."""
    text = HOOKS_MD.read_text()
    section = text.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
    blocks = python_blocks(section)
    assert len(blocks) == 1, f"hook {name}: expected one python example, found {len(blocks)}"
    module = types.ModuleType(f"hooks_md_{name}")
    exec(compile(blocks[0], f"docs/hooks.md ({name})", "exec"), module.__dict__)
    return module


def registered(name: str, kind: str) -> tuple[Any, Any]:
    """Load the example of hook ``name``; its only registration of ``kind`` and its config."""
    registry = load_registry([hook_example(name)], entry_points=False)
    (registration,) = registry.registrations(kind).values()
    return registration, registration.config_model.model_validate({})


def context() -> ServiceContext:
    """A service context with an empty config and the registry of no plugin."""
    return ServiceContext(BergstreamConfig(), load_registry(entry_points=False), Path("/tmp"))
