"""The import rules of docs/architecture.md, checked on every module's imports (ast).

- core imports no plugin, no pipeline, no dev stack and never pyspark;
- core's typed engine (``bergstream.core.typed``) imports from the rest of core only its base
  (``bergstream.core.typed.BASE``), never core's runtimes;
- a plugin package (each of plugins/*, the pipeline, the dev stack, each capability of the
  example plugin) reaches core only through the public module ``bergstream.core.api`` and never
  imports another plugin package (so the pipeline and the dev stack import no plugin).

Every import counts: at module level, inside functions, under ``TYPE_CHECKING``, relative ones
(resolved against the module's package) and ``importlib.import_module("...")`` with a literal
name. ``from package import name`` names the submodule ``package.name`` when there is one, so
``from bergstream.core import config`` is caught like ``import bergstream.core.config``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from bergstream.core.typed import BASE as TYPED_BASE
from tests.unit.import_reader import (
    EXAMPLE,
    EXAMPLE_PACKAGE,
    PACKAGES,
    PUBLIC,
    ROOT,
    Package,
    imports,
    module_name,
    owner,
)

TYPED = "bergstream.core.typed"


def broken_rule(importer: Package, module: str) -> str | None:
    """Why ``importer`` may not import ``module``, or None when it may."""
    target = owner(module)
    if importer.kind == "core":
        if module == "pyspark" or module.startswith("pyspark."):
            return "core never imports pyspark"
        if target is not None and target.kind != "core":
            return "core imports no plugin, pipeline or dev stack"
        if (
            importer.name == TYPED
            and target is not None
            and target.name != TYPED
            and module not in TYPED_BASE | {"bergstream.core"}
        ):
            return (
                "the typed engine imports from core only its base "
                "(bergstream.core.typed.BASE), not core's runtimes"
            )
        return None
    if target is None or target is importer:
        return None
    if target.kind == "core":
        return None if module == PUBLIC else f"a plugin reaches core only through {PUBLIC}"
    return "a plugin package never imports another plugin package"


def files(package: Package, packages: Iterable[Package] = PACKAGES.values()) -> list[Path]:
    """The Python files of ``package``, without those of a package nested in its folder."""
    nested = [p.folder for p in packages if p.folder != package.folder]
    return sorted(
        path
        for folder in (package.folder, *package.extra)
        for path in folder.rglob("*.py")
        if not any(path.is_relative_to(f) and f.is_relative_to(folder) for f in nested)
    )


def violations(package: Package, packages: Iterable[Package] = PACKAGES.values()) -> list[str]:
    """Every forbidden import in ``package``, as ``path:line: imports module: reason``."""
    out = set()
    for path in files(package, packages):
        module = module_name(path, package)
        text = path.read_text(encoding="utf-8")
        for line, imported in imports(text, module, is_package=path.name == "__init__.py"):
            reason = broken_rule(package, imported)
            if reason:
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                out.add(f"{shown}:{line}: imports {imported}: {reason}")
    return sorted(out)


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_imports_follow_the_rules(name: str) -> None:
    """Each package imports only what docs/architecture.md allows it."""
    assert violations(PACKAGES[name]) == []


def test_every_package_is_checked() -> None:
    """A new plugin folder or example capability is picked up, and the packages hold code."""
    assert {"bergstream.plugins.ksi_fetch_filter", "bergstream.plugins.isk_gateway"} <= set(
        PACKAGES
    )
    assert {
        "bergstream_example_plugin.add_header_filter",
        "bergstream_example_plugin.sqlite_cache",
    } <= set(PACKAGES)
    for package in PACKAGES.values():
        assert (package.folder / "__init__.py").exists(), package.name
        for folder in package.extra:
            assert any(folder.glob("test_*.py")), folder
    # A file belongs to the most specific package: the example's capabilities are not checked
    # as part of the top package, and each capability's tests are checked with it.
    assert files(PACKAGES["bergstream_example_plugin"]) == [EXAMPLE_PACKAGE / "__init__.py"]
    add_header = files(PACKAGES["bergstream_example_plugin.add_header_filter"])
    assert EXAMPLE / "tests" / "add_header_filter" / "test_add_header_filter.py" in add_header
    assert not [path for path in add_header if "sqlite" in str(path)]


def test_the_reader_finds_every_kind_of_import() -> None:
    source = """
from __future__ import annotations
import os.path
from typing import TYPE_CHECKING
from . import sibling
from .. import filter
from ..config import KsiConfig
from bergstream.core import config, api
import importlib
if TYPE_CHECKING:
    from bergstream.core.lake import ResolvedLake

def later():
    from bergstream.plugins import isk_gateway
    return importlib.import_module("bergstream.core.records")
"""
    module = "bergstream.plugins.ksi_fetch_filter.sub.mod"
    found = sorted(name for _, name in imports(source, module))
    assert found == sorted(
        [
            "__future__",
            "os.path",
            "typing",
            "bergstream.plugins.ksi_fetch_filter.sub",  # no such submodule: the package itself
            "bergstream.plugins.ksi_fetch_filter.filter",
            "bergstream.plugins.ksi_fetch_filter.config",
            "bergstream.core.config",
            "bergstream.core.api",
            "importlib",
            "bergstream.core.lake",
            "bergstream.plugins.isk_gateway",
            "bergstream.core.records",
        ]
    )
    # In a package's __init__, ``.`` is the package itself.
    init = imports("from . import plugin", "bergstream.plugins.ksi_fetch_filter", is_package=True)
    assert init == [(1, "bergstream.plugins.ksi_fetch_filter.plugin")]


def test_the_rules_catch_what_they_forbid() -> None:
    core = PACKAGES["bergstream.core"]
    isk = PACKAGES["bergstream.plugins.isk_gateway"]
    pipeline = PACKAGES["bergstream.pipeline"]
    example = PACKAGES["bergstream_example_plugin.add_header_filter"]
    assert broken_rule(core, "bergstream.plugins.isk_gateway.service")
    assert broken_rule(core, "bergstream.pipeline.session")
    assert broken_rule(core, "bergstream.devstack.stack")
    assert broken_rule(core, "bergstream_example_plugin.sqlite_cache")
    assert broken_rule(core, "pyspark.sql")
    typed = PACKAGES[TYPED]
    assert broken_rule(typed, "bergstream.core.proxy.server")
    assert broken_rule(typed, "bergstream.core.config")
    assert broken_rule(typed, "bergstream.core.records") is None
    assert broken_rule(typed, "bergstream.core.typed.row_contract") is None
    assert broken_rule(core, "bergstream.core.typed.typed_rows") is None
    assert broken_rule(isk, "bergstream.core.config")
    assert broken_rule(isk, "bergstream.core")  # the package itself is not the public module
    assert broken_rule(isk, "bergstream.plugins.cache_backends.local_disk")
    assert broken_rule(pipeline, "bergstream.plugins.isk_gateway")
    assert broken_rule(PACKAGES["bergstream.devstack"], "bergstream.pipeline.session")
    assert broken_rule(example, "bergstream.core.testing.filters")
    assert broken_rule(example, "bergstream_example_plugin.sqlite_cache.cache")
    assert broken_rule(example, "bergstream.plugins.ksi_fetch_filter")
    assert broken_rule(isk, PUBLIC) is None
    assert broken_rule(example, PUBLIC) is None
    assert broken_rule(isk, "bergstream.plugins.isk_gateway.http") is None
    assert broken_rule(example, "bergstream_example_plugin.add_header_filter.filter") is None
    assert broken_rule(core, "bergstream.core.proxy.codec") is None
    assert broken_rule(pipeline, "pyspark.sql") is None


def test_a_forbidden_import_is_reported_with_its_file_and_line(tmp_path: Path) -> None:
    folder = tmp_path / "rogue"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""A plugin."""\n')
    (folder / "plugin.py").write_text(
        "from bergstream.core.api import hookimpl\n\n\n"
        "def f():\n    from bergstream.core.records import Record\n"
    )
    assert violations(Package("rogue", "plugin", folder)) == [
        f"{folder / 'plugin.py'}:5: imports bergstream.core.records: "
        f"a plugin reaches core only through {PUBLIC}"
    ]
