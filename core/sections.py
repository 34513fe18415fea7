"""Config sections whose settings a plugin defines (``register_config_sections``).

Core declares where such a section sits with a field annotated :class:`SectionSlot` (for example
``lake.pipeline``: core keeps it as a raw mapping and never reads it); the plugin that owns it
registers a :class:`~bergstream.core.registrations.ConfigSectionRegistration` under the same
dotted path. :func:`check_sections` validates each slot of a file against its registration, so
``bergstream config check`` refuses what the plugin would, and names what to install when a
section of the file has no owner.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from bergstream.core.problems import Loc, Problem, pydantic_problems

if TYPE_CHECKING:
    from bergstream.core.plugins import PluginRegistry

__all__ = ["SectionSlot", "check_sections", "section_slots"]


@dataclass(frozen=True)
class SectionSlot:
    """Marks a config field as a section a plugin defines; ``provider`` says what to install
    when no installed plugin registers it. Use it as
    ``section: Annotated[dict[str, Any], SectionSlot("...")] = Field(default_factory=dict)``."""

    provider: str


def section_slots(model: type[BaseModel], prefix: Loc = ()) -> dict[Loc, SectionSlot]:
    """Every field of ``model`` (and of the models in its fields, not in lists) marked as a
    plugin-defined section, by location."""
    slots: dict[Loc, SectionSlot] = {}
    for name, field in model.model_fields.items():
        loc = (*prefix, field.alias or name)
        marks = [item for item in field.metadata if isinstance(item, SectionSlot)]
        if marks:
            slots[loc] = marks[0]
            continue
        nested = _single_model(field.annotation)
        if nested is not None:
            slots.update(section_slots(nested, loc))
    return slots


def _single_model(annotation: Any) -> type[BaseModel] | None:
    """The model of ``M`` or ``M | None``; None for anything else (lists, unions of models)."""
    members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is not None and len(members) == 1:
        annotation = members[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def check_sections(
    model: type[BaseModel], data: dict[str, Any], registry: PluginRegistry
) -> tuple[dict[str, Any], list[Problem]]:
    """Validate every plugin-defined section of the raw ``data`` (a file's, validated as
    ``model``) against its registration: the settings by dotted path, and the problems."""
    slots = section_slots(model)
    registered = registry.registrations("config section")
    settings: dict[str, Any] = {}
    problems: list[Problem] = []
    places = {".".join(str(part) for part in loc): loc for loc in slots}
    for name in sorted(set(registered) - set(places)):
        problems.append(
            (
                (),
                f"an installed plugin registers the config section '{name}', which is not a "
                f"section plugins can define ({', '.join(sorted(places)) or 'none'}); "
                "`bergstream plugins` shows which plugin it is",
            )
        )
    for name, loc in places.items():
        parent = _lookup(data, loc[:-1])
        if not isinstance(parent, dict):
            continue  # its enclosing section is absent (or wrong, which the model reports)
        key = loc[-1]
        registration = registered.get(name)
        if registration is None:
            if key in parent:
                problems.append(
                    (
                        loc,
                        f"no installed plugin defines the '{name}' section: install "
                        f"{slots[loc].provider}, or remove the section",
                    )
                )
            continue
        raw = parent.get(key, {})
        if not isinstance(raw, dict):
            continue  # the model reports a section that is not a mapping
        try:
            settings[name] = registration.config_model.model_validate(raw)
        except ValidationError as error:
            problems.extend(pydantic_problems(error, loc))
    return settings, problems


def _lookup(data: Any, loc: Loc) -> Any:
    for part in loc:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data
