"""Where a problem sits in a config file, and pydantic's errors in words a user can act on.

A location is the path of keys and list indexes from the top of the file, e.g.
``("services", 0, "config", "index", "type")``, written ``services[0].config.index.type``.
"""

from __future__ import annotations

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
        loc = (*prefix, *item["loc"])
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key: remove it or check its spelling"
        elif item["type"] == "missing":
            message = "required key is missing"
        elif "input" in item and item["type"] not in ("model_type", "dict_type"):
            message = f"{message} (got {item['input']!r})"
        out.append((loc, message))
    return out
