"""docs/architecture.md names every module of core/, plugins/, pipeline/ and devstack/.

A module is a ``*.py`` file of those folders other than ``__init__.py``; its path is the file's
path from the repository root without ``.py`` (``plugins/ksi_fetch_filter/planner``). A
backticked name in the doc names it when, without a trailing ``.py`` (and with a dotted name such
as ``bergstream.core.api`` read as a path), it is that path or its tail at a ``/``:
``planner``, ``files/synthesis``, ``pipeline/stream.py``, ``core/kernel_cache.py``.

A bare file stem that several modules share (``plugin``, ``config``, ``codec``, ``typed``...)
names only the modules whose own folder the same place also names: the same paragraph or table
(a table together with the paragraph that introduces it) or the heading above it, by a
backticked folder (``avro/``, ``plugins/ksi_fetch_filter``, ``pipeline/``) or, in the heading, the
folder's name as a word ("The contract in core"). So ``plugin.py`` in the paragraph about
``plugins/isk_gateway`` documents ISK's registration, not every plugin's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SOURCES = ("core", "plugins", "pipeline", "devstack")

#: Where a module of each folder is documented (the longest matching prefix wins).
WHERE = {
    "core": 'a row of "The contract in core" or "The runtimes in core"',
    "core/proxy": 'the `proxy/` row of "The runtimes in core"',
    "core/typed": 'a row of "The typed engine in core"',
    "plugins": 'a table of its own, like the other plugins\' (package table under "Layers")',
    "plugins/isk_gateway": 'the `plugins/isk_gateway` table under "Kafka to Iceberg"',
    "plugins/ksi_fetch_filter": 'the `plugins/ksi_fetch_filter` table under "Iceberg to Kafka"',
    "plugins/value_codecs": 'the `plugins/value_codecs` table under "Layers"',
    "plugins/cache_backends": 'the backends table of "Backends and the dev stack"',
    "plugins/index_backends": 'the backends table of "Backends and the dev stack"',
    "pipeline": 'the `pipeline/` table under "Kafka to Iceberg"',
    "devstack": 'the `devstack/` table of "Backends and the dev stack"',
}

_TICKED = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"^[A-Za-z_][\w.]*$")


def _modules() -> list[str]:
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name != "__init__.py":
                found.append(path.relative_to(ROOT).with_suffix("").as_posix())
    return found


def _normalize(token: str) -> str:
    """A backticked name as a path: ``avro/`` is ``avro``, ``bergstream.core.api`` ``core/api``."""
    token = token.strip().rstrip("/")
    if token.endswith(".py"):
        token = token[: -len(".py")]
    elif "." in token and _DOTTED.match(token):
        token = token.replace(".", "/")
    token = token.removeprefix("bergstream/")
    return token


def _tail_of(path: str, name: str) -> bool:
    return bool(name) and (path == name or path.endswith("/" + name))


class _Place:
    """A paragraph or a table, with what its context names."""

    def __init__(self, names: set[str], context_names: set[str], heading_words: set[str]):
        self.names = names
        self.context_names = context_names
        self.heading_words = heading_words

    def names_folder(self, folder: str) -> bool:
        if any(_tail_of(folder, name) for name in self.context_names):
            return True
        return folder.split("/")[-1] in self.heading_words


def _places(text: str) -> list[_Place]:
    """Split the doc into paragraphs and tables (fenced blocks left out), each with its heading;
    a table's context also holds the paragraph just before it."""
    places: list[_Place] = []
    heading_names: set[str] = set()
    heading_words: set[str] = set()
    block: list[str] = []
    previous_paragraph: set[str] = set()
    fenced = False

    def names_in(lines: list[str]) -> set[str]:
        return {_normalize(t) for line in lines for t in _TICKED.findall(line)}

    def close() -> None:
        nonlocal previous_paragraph
        if not block:
            return
        names = names_in(block)
        is_table = block[0].lstrip().startswith("|")
        context = names | heading_names | (previous_paragraph if is_table else set())
        places.append(_Place(names, context, heading_words))
        previous_paragraph = set() if is_table else names
        block.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#"):
            close()
            previous_paragraph = set()
            heading_names = names_in([line])
            heading_words = set(re.findall(r"\w+", _TICKED.sub(" ", line).lower()))
            places.append(_Place(heading_names, heading_names, heading_words))
            continue
        if not line.strip():
            close()
            continue
        if block and block[0].lstrip().startswith("|") != line.lstrip().startswith("|"):
            close()
        block.append(line)
    close()
    return places


def _documented(module: str, places: list[_Place], shared_stems: set[str]) -> bool:
    folder, _, stem = module.rpartition("/")
    for place in places:
        for name in place.names:
            if not _tail_of(module, name):
                continue
            if "/" in name or stem not in shared_stems:
                return True
            if place.names_folder(folder):
                return True
    return False


def _where(module: str) -> str:
    prefixes = [prefix for prefix in WHERE if module == prefix or module.startswith(prefix + "/")]
    return WHERE[max(prefixes, key=len)]


def test_every_module_is_named_in_the_architecture_doc() -> None:
    modules = _modules()
    assert modules, "no modules found: the test looks in the wrong place"
    stems: dict[str, int] = defaultdict(int)
    for module in modules:
        stems[module.split("/")[-1]] += 1
    shared = {stem for stem, count in stems.items() if count > 1}
    places = _places(DOC.read_text(encoding="utf-8"))

    missing = [module for module in modules if not _documented(module, places, shared)]

    by_place: dict[str, list[str]] = defaultdict(list)
    for module in missing:
        by_place[_where(module)].append(module)
    report = "\n".join(
        f"- {', '.join(f'{m}.py' for m in names)}: add to {where}"
        for where, names in sorted(by_place.items())
    )
    assert not missing, (
        f"{len(missing)} module(s) not named in docs/architecture.md. Name each by its file stem "
        "in backticks with a few words from its docstring (a stem several modules share, such as "
        "`plugin` or `config`, next to its folder, e.g. in that folder's table):\n" + report
    )


def test_the_rule_tells_shared_stems_apart() -> None:
    doc = (
        "## Layers\n\n"
        "`plugins/isk_gateway` is grouped:\n\n"
        "| group | modules |\n|---|---|\n| `files/` | `synthesis` (Parquet) |\n\n"
        "In `plugins/isk_gateway` itself, `plugin.py` registers it.\n\n"
        "## The contract in core\n\n| module | holds |\n|---|---|\n| `config` | the file |\n"
    )
    places = _places(doc)
    shared = {"plugin", "config"}
    assert _documented("plugins/isk_gateway/files/synthesis", places, shared)
    assert _documented("plugins/isk_gateway/plugin", places, shared)
    assert not _documented("plugins/ksi_fetch_filter/plugin", places, shared)
    assert _documented("core/config", places, shared)
    assert not _documented("plugins/ksi_fetch_filter/config", places, shared)
    assert not _documented("pipeline/stream", places, shared)
