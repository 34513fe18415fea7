"""Where a problem sits in a config file, and pydantic's errors in words a user can act on.

A location is the path of keys and list indexes from the top of the file, e.g.
``("services", 0, "config", "index", "type")``, written ``services[0].config.index.type``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

__all__ = ["Loc", "Problem", "format_loc", "pydantic_problems"]

Loc = tuple[str | int, ...]

#: One problem: where it is and what is wrong.
Problem = tuple[Loc, str]


def format_loc(loc: Loc) -> str:
    """Render a location tuple as ``a.b[0].c``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def pydantic_problems(error: ValidationError, prefix: Loc = ()) -> list[Problem]:
    """The problems of a failed validation, each under ``prefix`` (where the data came from)."""
    out: list[Problem] = []
    for item in error.errors():
        out.append(((*prefix, *item["loc"]), _message(item)))
    return out


#: Errors whose message already says what the value is.
_SELF_TELLING = frozenset({"value_error", "assertion_error", "extra_forbidden", "missing"})


def _message(item: Any) -> str:
    kind, message = item["type"], item["msg"]
    if kind == "extra_forbidden":
        return "unknown key: remove it or check its spelling"
    if kind == "missing":
        return "required key is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        got = item.get("input")
        what = "nothing" if got is None else f"{type(got).__name__} {_short(got)}"
        return f"expected a mapping of keys here, got {what}"
    if kind in ("value_error", "assertion_error"):
        message = message.split(", ", 1)[1] if ", " in message else message
    if "input" in item and kind not in _SELF_TELLING:
        message = f"{message} (got {_short(item['input'])})"
    return message


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."
