"""Every hook and every config key is documented under docs/."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

from pydantic import BaseModel

from bergstream.core import hookspecs
from bergstream.core.config import BergstreamConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_of(argument)
        if found is not None:
            return found
    return None


def config_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted key paths of a config model, below list items too."""
    keys = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        path = f"{prefix}{name}"
        keys.append(path)
        nested = _model_of(field.annotation)
        if nested is not None:
            list_item = typing.get_origin(field.annotation) is list
            keys.extend(config_keys(nested, "" if list_item else f"{path}."))
    return keys


def test_every_config_key_is_documented():
    text = (DOCS / "configuration.md").read_text()
    keys = config_keys(BergstreamConfig)
    assert "gateway.tls.cert_file" in keys and "target.bootstrap" in keys
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"undocumented config keys in docs/configuration.md: {missing}"


def test_every_hook_is_documented_with_an_example():
    text = (DOCS / "hooks.md").read_text()
    names = [
        n
        for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(f, "bergstream_spec")
    ]
    for name in names:
        assert f"## `{name}`" in text, f"hook {name} has no section in docs/hooks.md"
        section = text.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        assert "@hookimpl" in section, f"hook {name} has no example in docs/hooks.md"
