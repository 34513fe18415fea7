"""The repository's packages (core, the pipeline, the dev stack, each plugin and each capability
of the example plugin) and an ``ast`` reader of the modules a source imports, for the import
rules (test_import_rules.py) and the checks of docs/hooks.md's examples (test_docs.py)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = "bergstream.core.api"
EXAMPLE = ROOT / "examples" / "plugin-example"
EXAMPLE_PACKAGE = EXAMPLE / "bergstream_example_plugin"


@dataclass(frozen=True)
class Package:
    """A package the rules apply to: its import name, its kind and where its code lives."""

    name: str
    kind: Literal["core", "plugin"]
    folder: Path
    #: more code held to the package's rules (an example capability's own tests)
    extra: tuple[Path, ...] = ()


def _packages() -> dict[str, Package]:
    found = [
        Package("bergstream.core", "core", ROOT / "core"),
        Package("bergstream.core.typed", "core", ROOT / "core" / "typed"),
        Package("bergstream.pipeline", "plugin", ROOT / "pipeline"),
        Package("bergstream.devstack", "plugin", ROOT / "devstack"),
        *(
            Package(f"bergstream.plugins.{path.name}", "plugin", path)
            for path in sorted((ROOT / "plugins").iterdir())
            if (path / "__init__.py").exists()
        ),
        # The example distribution: its top package (a docstring) and one plugin per capability,
        # each with its tests under tests/<capability>/.
        Package("bergstream_example_plugin", "plugin", EXAMPLE_PACKAGE),
        *(
            Package(
                f"bergstream_example_plugin.{path.name}",
                "plugin",
                path,
                (EXAMPLE / "tests" / path.name,),
            )
            for path in sorted(EXAMPLE_PACKAGE.iterdir())
            if (path / "__init__.py").exists()
        ),
    ]
    return {package.name: package for package in found}


PACKAGES = _packages()


def module_name(path: Path, package: Package) -> str | None:
    """The import name of ``path`` (None for a file outside the package folder: a test)."""
    if not path.is_relative_to(package.folder):
        return None
    relative = path.relative_to(package.folder).with_suffix("")
    return ".".join([package.name, *(p for p in relative.parts if p != "__init__")])


def _known_modules() -> frozenset[str]:
    """Import names of every module and package of the repository's packages."""
    return frozenset(
        name
        for package in PACKAGES.values()
        for path in package.folder.rglob("*.py")
        if (name := module_name(path, package)) is not None
    )


KNOWN = _known_modules()


def _resolve(node: ast.ImportFrom, module: str | None, is_package: bool) -> str | None:
    """The absolute module a ``from ... import`` reads from (None: relative, in a test)."""
    if not node.level:
        return node.module or ""
    if module is None:
        return None
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def imports(source: str, module: str | None, *, is_package: bool = False) -> list[tuple[int, str]]:
    """Every module named by an import in ``source`` (of module ``module``), with its line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            if base is None:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((node.lineno, submodule if submodule in KNOWN else base))
        elif isinstance(node, ast.Call) and (name := _literal_import(node)) is not None:
            found.append((node.lineno, name))
    return found


def _literal_import(call: ast.Call) -> str | None:
    """The module of ``importlib.import_module("x")`` or ``__import__("x")``, else None."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def owner(module: str) -> Package | None:
    """The repository package ``module`` belongs to (the most specific one), if any."""
    matches = [
        package
        for name, package in PACKAGES.items()
        if module == name or module.startswith(name + ".")
    ]
    return max(matches, key=lambda package: len(package.name), default=None)
