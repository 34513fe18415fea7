"""``{type, config}`` choices: a setting that picks a registered plugin by name.

A config model declares a choice with a :class:`PluginChoice` subclass naming the registration
kind it picks from (:class:`IndexBackendChoice`, :class:`CacheBackendChoice`, ...), wherever it
sits: a top-level list (``services[]``, ``filters[]``) or deep inside a plugin's own settings
(ISK's ``index``, ``cache`` and ``synthesizers[]``). The config loader finds every choice of the
file (:class:`ChoiceResolver`), resolves its ``type`` against the registry, validates its
``config`` against that registration's model, and attaches the result as ``settings``, so
``bergstream config check`` refuses exactly what ``bergstream run`` would.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, ValidationError

from bergstream.core.models import StrictModel
from bergstream.core.plugins import REGISTRATION_HOOKS
from bergstream.core.problems import Loc, Problem, format_loc, pydantic_problems

if TYPE_CHECKING:
    from bergstream.core.plugins import PluginRegistry

__all__ = [
    "CacheBackendChoice",
    "ChoiceError",
    "ChoiceResolver",
    "FileSynthesizerChoice",
    "FilterChoice",
    "IndexBackendChoice",
    "PluginChoice",
    "ServiceChoice",
    "ValueCodecChoice",
    "choice_settings",
]


class PluginChoice(StrictModel):
    """A registered plugin of kind :attr:`kind`, chosen by ``type``, with its own ``config``.

    Subclass it with ``kind`` set to a registration kind to declare a choice in a config model;
    ``settings`` holds the ``config`` validated by the chosen plugin's model once the loader (or
    :func:`choice_settings`) resolved it.
    """

    kind: ClassVar[str] = ""

    type: str = Field(min_length=1, description="registered name of the plugin")
    config: dict[str, Any] = Field(default_factory=dict, description="the plugin's own settings")
    settings: Any = Field(None, exclude=True, description="(internal) the validated config model")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.kind not in REGISTRATION_HOOKS or cls.kind == "config section":
            raise TypeError(
                f"{cls.__name__}.kind is {cls.kind!r}: set it to a registration kind a "
                f"{{type, config}} block can pick ({', '.join(_choice_kinds())})"
            )


def _choice_kinds() -> list[str]:
    return [kind for kind in REGISTRATION_HOOKS if kind != "config section"]


class FilterChoice(PluginChoice):
    """A proxy filter: ``virtual_clusters[].filters[]``."""

    kind: ClassVar[str] = "filter"


class ServiceChoice(PluginChoice):
    """A long-running service: ``services[]``."""

    kind: ClassVar[str] = "service"


class CacheBackendChoice(PluginChoice):
    """A cache backend of synthesized files (ISK's ``cache``)."""

    kind: ClassVar[str] = "cache backend"


class IndexBackendChoice(PluginChoice):
    """A chunk index backend (ISK's ``index``)."""

    kind: ClassVar[str] = "index backend"


class FileSynthesizerChoice(PluginChoice):
    """A synthesizer of Iceberg files (ISK's ``synthesizers[]``)."""

    kind: ClassVar[str] = "file synthesizer"


class ValueCodecChoice(PluginChoice):
    """A codec turning record values into columns and back."""

    kind: ClassVar[str] = "value codec"


class ChoiceError(ValueError):
    """A choice made in code (or in a config loaded without a registry) cannot be resolved."""

    def __init__(self, choice: PluginChoice, problems: list[Problem]) -> None:
        self.problems = problems
        details = "; ".join(f"{format_loc(loc)}: {message}" for loc, message in problems)
        super().__init__(f"{choice.kind} {choice.type!r}: {details}")


class ChoiceResolver:
    """Finds every :class:`PluginChoice` of a config, resolves it against ``registry`` and
    collects the problems (each with its location) in :attr:`problems`."""

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry
        self.problems: list[Problem] = []

    def resolve_tree(self, value: Any, loc: Loc) -> None:
        """Resolve every choice in the validated ``value`` (models, lists, tuples, dicts) found
        at ``loc``, attaching each one's ``settings``, then the choices inside those."""
        if isinstance(value, PluginChoice):
            settings = self.validate(value.kind, value.type, value.config, loc)
            if settings is not None:
                object.__setattr__(value, "settings", settings)
        elif isinstance(value, BaseModel):
            for name, field in type(value).model_fields.items():
                if not field.exclude:
                    self.resolve_tree(getattr(value, name), (*loc, field.alias or name))
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                self.resolve_tree(item, (*loc, index))
        elif isinstance(value, dict):
            for key, item in value.items():
                self.resolve_tree(item, (*loc, str(key)))

    def check_raw(self, annotation: Any, data: Any, loc: Loc) -> None:
        """Report the problems of every choice in raw ``data`` that ``annotation`` (a model or a
        type built of models) declares: used where the data as a whole did not validate, so
        one check still shows every problem of the file."""
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, PluginChoice):
            if isinstance(data, dict) and isinstance(data.get("type"), str):
                config = data.get("config", {})
                if isinstance(config, dict):  # else the model's own validation reports it
                    self.validate(annotation.kind, data["type"], config, loc)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if isinstance(data, dict):
                for name, field in annotation.model_fields.items():
                    key = field.alias or name
                    if key in data:
                        self.check_raw(field.annotation, data[key], (*loc, key))
        else:
            origin, args = typing.get_origin(annotation), typing.get_args(annotation)
            if _is_a(origin, Sequence) and isinstance(data, list) and args:
                for index, item in enumerate(data):
                    self.check_raw(args[0], item, (*loc, index))
            elif _is_a(origin, Mapping) and isinstance(data, dict) and len(args) == 2:
                for key, item in data.items():
                    self.check_raw(args[1], item, (*loc, str(key)))

    def validate(self, kind: str, name: str, config: dict[str, Any], loc: Loc) -> Any:
        """The ``config`` of the choice of plugin ``name`` at ``loc`` validated by that plugin's
        model, with the choices inside it resolved; None (and problems) if that fails."""
        registered = self.registry.registrations(kind)
        registration = registered.get(name)
        if registration is None:
            names = ", ".join(sorted(registered)) or "none"
            self.problems.append(
                (
                    (*loc, "type"),
                    f"no {kind} plugin named '{name}' is installed; installed {kind}s: {names}",
                )
            )
            return None
        model = registration.config_model
        try:
            settings = model.model_validate(config)
        except ValidationError as error:
            self.problems.extend(pydantic_problems(error, (*loc, "config")))
            self.check_raw(model, config, (*loc, "config"))
            return None
        self.resolve_tree(settings, (*loc, "config"))
        return settings


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None``; unions of several types stay."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _unwrap(members[0]) if len(members) == 1 else annotation
    return annotation


def _is_a(origin: Any, abstract: type) -> bool:
    return isinstance(origin, type) and issubclass(origin, abstract) and origin is not str


def choice_settings(choice: PluginChoice, registry: PluginRegistry) -> Any:
    """The validated settings of ``choice``: those the config loader attached, else (a choice
    built in code, or a config loaded without a registry) resolved now the same way and
    attached. Raises :class:`ChoiceError` naming every problem."""
    if choice.settings is None:
        resolver = ChoiceResolver(registry)
        resolver.resolve_tree(choice, ())
        if resolver.problems:
            raise ChoiceError(choice, resolver.problems)
    return choice.settings
