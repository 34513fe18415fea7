"""The tests' own layout (docs/architecture.md, "Tests"): test folders are grouped by what they
test, and none reaches into another.

Every module under tests/ (tests, conftest files, helpers, kits) imports of tests/ only

- ``tests.support`` (helpers every folder uses, beside tests/conftest.py),
- ``tests.kits`` and its modules (helpers more than one folder uses),
- modules of its own folder (the same directory: a helper only that folder uses);

and no module imports a ``test_*.py`` module (what tests share lives in a helper or a kit) or a
``conftest.py`` (pytest hands its fixtures to the tests below it; what else it holds, a test
gets from ``tests.support`` or a kit). Every import counts, as in test_import_rules.py: at
module level or inside functions, relative ones, ``from package import module`` and
``importlib.import_module("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("tests.support", "tests.kits")


def _dotted(path: Path, root: Path) -> str:
    """The import name of a module or folder under ``root`` (``tests/isk/e2e`` is
    ``tests.isk.e2e``, ``tests/kits/__init__.py`` is ``tests.kits``)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(part for part in parts if part != "__init__")


def _is_module(name: str, root: Path) -> bool:
    """Whether ``name`` is a module or a folder under ``root``."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def _literal_import(call: ast.Call) -> str | None:
    """The module of ``importlib.import_module("x")`` or ``__import__("x")``, else None."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__") or not call.args:
        return None
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def imported(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """Every module of tests/ that ``path`` imports, with its line; ``from package import name``
    names the module ``package.name`` when there is one."""
    package = _dotted(path.parent, root)
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            if not _of_tests(base):
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((node.lineno, submodule if _is_module(submodule, root) else base))
        elif isinstance(node, ast.Call) and (name := _literal_import(node)) is not None:
            found.append((node.lineno, name))
    return sorted((line, name) for line, name in found if _of_tests(name))


def _of_tests(module: str) -> bool:
    return module == "tests" or module.startswith("tests.")


def broken_rule(path: Path, module: str, root: Path = ROOT) -> str | None:
    """Why the module at ``path`` may not import ``module`` (of tests/), or None when it may."""
    last = module.rsplit(".", 1)[-1]
    if last.startswith("test_"):
        return "a test module: move what it shares into a helper of its folder or a kit"
    if last == "conftest":
        return "a conftest: take what it holds from tests.support or a kit"
    if any(module == shared or module.startswith(shared + ".") for shared in SHARED):
        return None
    if module.rpartition(".")[0] == _dotted(path.parent, root):
        return None
    return "another folder's module: a helper more than one folder uses belongs in tests/kits"


def violations(root: Path = ROOT) -> list[str]:
    """Every forbidden import under ``root``/tests, as ``path:line: imports module: reason``."""
    out = []
    for path in sorted((root / "tests").rglob("*.py")):
        for line, module in imported(path, root):
            reason = broken_rule(path, module, root)
            if reason:
                out.append(f"{path.relative_to(root)}:{line}: imports {module}: {reason}")
    return out


def test_test_folders_import_only_their_own_modules_the_kits_and_support() -> None:
    found = violations()
    assert not found, "forbidden imports of tests/ modules:\n" + "\n".join(found)


def test_a_forbidden_import_is_reported_with_its_file_and_line(tmp_path: Path) -> None:
    files = {
        "tests/support.py": "",
        "tests/conftest.py": "from tests.support import x\n",
        "tests/kits/__init__.py": "",
        "tests/kits/stage.py": "from tests.kits import other\nfrom tests.a.helper import h\n",
        "tests/kits/other.py": "",
        "tests/a/helper.py": "from tests.kits.stage import s\n",
        "tests/a/test_one.py": (
            "from tests.a.helper import h\n"  # its own folder
            "from . import helper\n"  # the same, relative
            "from tests.support import x\n"
            "from tests.kits import stage\n"
            "from tests.b.helper import g\n"  # another folder's helper
        ),
        "tests/b/helper.py": "",
        "tests/b/test_two.py": (
            "import tests.a.helper\n"
            "from tests.a import test_one\n"
            "from tests.a.test_one import f\n"
            "from tests.conftest import X\n"
            "from tests.b.conftest import Y\n"
            "from ..a import helper\n"
            "\n"
            "def later():\n"
            "    import importlib\n"
            "    return importlib.import_module('tests.a.helper')\n"
        ),
        "tests/b/conftest.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    other = "another folder's module: a helper more than one folder uses belongs in tests/kits"
    test = "a test module: move what it shares into a helper of its folder or a kit"
    conftest = "a conftest: take what it holds from tests.support or a kit"
    assert violations(tmp_path) == [
        f"tests/a/test_one.py:5: imports tests.b.helper: {other}",
        f"tests/b/test_two.py:1: imports tests.a.helper: {other}",
        f"tests/b/test_two.py:2: imports tests.a.test_one: {test}",
        f"tests/b/test_two.py:3: imports tests.a.test_one: {test}",
        f"tests/b/test_two.py:4: imports tests.conftest: {conftest}",
        f"tests/b/test_two.py:5: imports tests.b.conftest: {conftest}",
        f"tests/b/test_two.py:6: imports tests.a.helper: {other}",
        f"tests/b/test_two.py:10: imports tests.a.helper: {other}",
        f"tests/kits/stage.py:2: imports tests.a.helper: {other}",
    ]


def test_a_test_module_is_not_imported_even_from_its_own_folder(tmp_path: Path) -> None:
    folder = tmp_path / "tests" / "a"
    folder.mkdir(parents=True)
    (folder / "test_one.py").write_text("ROWS = 1\n")
    (folder / "test_two.py").write_text("from tests.a.test_one import ROWS\n")
    assert [line for line in violations(tmp_path) if "test_two.py:1:" in line]


def _slow_files_first() -> tuple[str, ...]:
    """``SLOW_FILES_FIRST`` of tests/conftest.py, read without importing it."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "SLOW_FILES_FIRST"
            for target in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("tests/conftest.py has no SLOW_FILES_FIRST")


def test_the_slow_files_run_first_by_their_current_paths() -> None:
    """A moved test file keeps its place at the head of the run."""
    listed = _slow_files_first()
    assert listed, "SLOW_FILES_FIRST is empty"
    missing = [path for path in listed if not (ROOT / path).is_file()]
    assert missing == [], f"tests/conftest.py's SLOW_FILES_FIRST names missing files: {missing}"
    assert all(Path(path).name.startswith("test_") for path in listed)


def test_only_the_kits_are_a_package() -> None:
    """Test folders have no ``__init__.py`` (tests/ is a namespace package and pytest imports
    each test file by its path, ``--import-mode=importlib``); tests/kits is a package, its
    docstring the list of kits."""
    packages = sorted(
        init.parent.relative_to(ROOT).as_posix() for init in (ROOT / "tests").rglob("__init__.py")
    )
    assert packages == ["tests/kits"]
