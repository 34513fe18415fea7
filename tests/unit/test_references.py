"""Code cites only documents the repository has: every ``*.md`` file a module or example names
exists in the repository (a file of another checkout, such as a design note, does not count)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("core", "plugins", "pipeline", "devstack", "bench", "scripts", "examples")
_CITED = re.compile(r"(?<![\w/.-])((?:\.\./|[\w.-]+/)*[\w.-]+\.md)\b")


def _cited(path: Path) -> set[str]:
    return set(_CITED.findall(path.read_text(encoding="utf-8", errors="replace")))


def _exists(cited: str, source: Path) -> bool:
    return (ROOT / cited).resolve().is_file() or (source.parent / cited).resolve().is_file()


def test_every_cited_document_is_in_the_repository() -> None:
    missing = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".toml", ".yaml", ".xml", ".properties", ""):
                continue
            if not path.is_file() or ".venv" in path.parts:
                continue
            for cited in _cited(path):
                if not _exists(cited, path):
                    missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert missing == []


def test_the_check_sees_a_missing_document(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text('"""See ARCHITECTURE.md and docs/architecture.md."""\n')
    assert _cited(source) == {"ARCHITECTURE.md", "docs/architecture.md"}
    assert not _exists("ARCHITECTURE.md", source)
