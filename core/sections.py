"""Config sections whose settings a plugin defines (``register_config_sections``).

Core says where plugins may add sections, never which: a config model that subclasses
:class:`OpenToPluginSections` (``lake:`` is one) accepts keys it does not declare, and each such
key is the section of the plugin that registers a
:class:`~bergstream.core.registrations.ConfigSectionRegistration` under its dotted path (the lake
pipeline registers ``lake.pipeline`` and ``lake.maintenance``). :func:`check_sections`
validates each against its registration, so ``bergstream config check`` refuses what the plugin
would, and reports a key that no installed plugin registers (a typo, or a plugin missing).
"""

from __future__ import annotations

import difflib
import typing
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from bergstream.core.problems import Loc, Problem, pydantic_problems

if TYPE_CHECKING:
    from bergstream.core.plugins import PluginRegistry

__all__ = ["OpenToPluginSections", "check_sections", "section_places"]


class OpenToPluginSections(BaseModel):
    """A config model whose undeclared keys are sections that plugins define. Subclass it
    beside the model's own base and allow extra keys (``model_config = ConfigDict(extra=
    "allow", ...)``); :func:`check_sections` then validates or refuses each extra key."""


def section_places(model: type[BaseModel], prefix: Loc = ()) -> list[Loc]:
    """Where plugins may define sections: the locations of ``model`` and of the models in its
    fields (not in lists) that are :class:`OpenToPluginSections`."""
    places: list[Loc] = [prefix] if issubclass(model, OpenToPluginSections) else []
    for name, field in model.model_fields.items():
        nested = _single_model(field.annotation)
        if nested is not None:
            places.extend(section_places(nested, (*prefix, field.alias or name)))
    return places


def _single_model(annotation: Any) -> type[BaseModel] | None:
    """The model of ``M`` or ``M | None``; None for anything else (lists, unions of models)."""
    members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is not None and len(members) == 1:
        annotation = members[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel]:
    for part in loc:
        field = next(f for n, f in model.model_fields.items() if (f.alias or n) == part)
        nested = _single_model(field.annotation)
        assert nested is not None
        model = nested
    return model


def check_sections(
    model: type[BaseModel], data: dict[str, Any], registry: PluginRegistry
) -> tuple[dict[str, Any], list[Problem]]:
    """Validate every plugin-defined section of the raw ``data`` (a file's, validated as
    ``model``) against its registration: the settings by dotted path, and the problems."""
    registered = registry.registrations("config section")
    settings: dict[str, Any] = {}
    problems: list[Problem] = []
    places = section_places(model)
    dotted = {".".join(str(part) for part in loc): loc for loc in places}
    for name in sorted(registered):
        parent_name, _, key = name.rpartition(".")
        if parent_name not in dotted or not key:
            where = ", ".join(f"{p}.<name>" if p else "<name>" for p in sorted(dotted))
            problems.append(
                (
                    (),
                    f"an installed plugin registers the config section '{name}', which is not "
                    f"where plugins can define sections ({where or 'nowhere'}); "
                    "`bergstream plugins` shows which plugin it is",
                )
            )
    for loc in places:
        parent = _lookup(data, loc)
        if not isinstance(parent, dict):
            continue  # the enclosing section is absent (or wrong, which the model reports)
        owner = _model_at(model, loc)
        declared = {field.alias or name for name, field in owner.model_fields.items()}
        prefix = ".".join(str(part) for part in loc)
        here = {
            name.rpartition(".")[2]: registration
            for name, registration in registered.items()
            if name.rpartition(".")[0] == prefix
        }
        for key in sorted(set(parent) - declared - set(here)):
            known = sorted(declared | set(here))
            nearest = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{nearest[0]}'? " if nearest else ""
            problems.append(
                (
                    (*loc, key),
                    f"'{key}' is no setting of '{prefix or 'the file'}' and no installed plugin "
                    f"defines a '{_join(prefix, key)}' section: {hint}remove it, or install the "
                    "plugin that defines it (`bergstream plugins` lists what is installed)",
                )
            )
        for key, registration in here.items():
            raw = parent.get(key, {})
            if not isinstance(raw, dict):
                problems.append(((*loc, key), "must be a mapping of the section's settings"))
                continue
            try:
                settings[_join(prefix, key)] = registration.config_model.model_validate(raw)
            except ValidationError as error:
                problems.extend(pydantic_problems(error, (*loc, key)))
    return settings, problems


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _lookup(data: Any, loc: Loc) -> Any:
    for part in loc:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data
