"""A config file's bytes to plain data: UTF-8 text, YAML with the line of every location, and
every problem of that stage (a byte that is not UTF-8, a YAML syntax error, a key given twice)
with its line and column.

pyyaml's own messages end in ``in "<unicode string>", line 3, column 1`` and keep the later of two
equal keys without a word; both are rewritten here into what the file's author acts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from bergstream.core.problems import Loc

__all__ = ["SourceProblem", "SourceText", "decode_source", "read_yaml"]


@dataclass(frozen=True)
class SourceProblem:
    """Something wrong with the file before its keys mean anything."""

    loc: Loc
    message: str
    line: int | None
    column: int | None = None


@dataclass
class SourceText:
    """The data of a file, where each location sits, and what was wrong on the way."""

    data: Any = None
    lines: dict[Loc, int] = field(default_factory=dict)
    problems: list[SourceProblem] = field(default_factory=list)


def decode_source(raw: bytes) -> tuple[str | None, SourceProblem | None]:
    """``raw`` as text (UTF-8, a byte-order mark dropped), or the problem naming the first byte
    that is not UTF-8 by line and column."""
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as error:
        start = error.start
        line = raw.count(b"\n", 0, start) + 1
        column = start - (raw.rfind(b"\n", 0, start) + 1) + 1
        return None, SourceProblem(
            (),
            f"the file is not UTF-8: byte 0x{raw[start]:02x} at line {line}, column {column} "
            "cannot be decoded; save the file as UTF-8",
            line,
            column,
        )


def read_yaml(text: str) -> SourceText:
    """Compose ``text`` into plain Python data, noting every location's line; a syntax error or a
    key given twice in one mapping becomes a :class:`SourceProblem` (the later value of a
    duplicate key is kept, so the rest of the file can still be checked)."""
    out = SourceText()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        out.problems.append(_syntax_problem(error))
        return out
    out.data = {} if node is None else _construct(node, (), out)
    return out


def _syntax_problem(error: yaml.YAMLError) -> SourceProblem:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    message = f"not valid YAML: {problem}"
    if context and context_mark is not None:
        message += f" ({context} at line {context_mark.line + 1}, column {context_mark.column + 1})"
    elif context:
        message += f" ({context})"
    if mark is None:
        return SourceProblem((), message, None)
    return SourceProblem((), message, mark.line + 1, mark.column + 1)


def _construct(node: yaml.Node, loc: Loc, out: SourceText) -> Any:
    out.lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        mapping: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(_scalar(key_node))
            line = key_node.start_mark.line + 1
            if key in first_line:
                out.problems.append(
                    SourceProblem(
                        (*loc, key),
                        f"key '{key}' is given twice in this mapping (lines {first_line[key]} "
                        f"and {line}); YAML keeps only one: remove or merge the other",
                        line,
                        key_node.start_mark.column + 1,
                    )
                )
            first_line.setdefault(key, line)
            mapping[key] = _construct(value_node, (*loc, key), out)
        return mapping
    if isinstance(node, yaml.SequenceNode):
        return [_construct(child, (*loc, index), out) for index, child in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    # The composer already resolved the node's tag; construct it directly (re-serializing a
    # bare null, as in ``metrics:``, yields a document YAML cannot parse back).
    return yaml.SafeLoader("").construct_object(node, deep=True)
