"""The ``codecs:`` config section: where the Schema Registry is and which topics use which codec.

One section in core, read alike by the pipeline, ISK and KSI, so a topic is typed the same way
everywhere::

    codecs:
      schema_registry: {url: "${BERGSTREAM_SCHEMA_REGISTRY_URL}"}
      topics:
        - match: "*"            # first rule whose match (a name or a glob) fits the topic wins
          value: registry       # by the registered schema's own type
          key: raw

A codec name is one registered through the ``register_value_codecs`` hook (``avro``, ...),
``raw`` (bytes as they are: no codec runs) or ``registry``: whichever registered codec reads the
type (``AVRO``, ``JSON``, ``PROTOBUF``) of the schema each record's id names. A topic no rule
matches stays raw. ``config`` holds settings per codec name (``{avro: {...}}``), so one rule can
configure every codec ``registry`` may pick.
:func:`check_codecs` finds what the models alone cannot: codec names and codec settings, checked
against the plugin registry, as ``bergstream config check`` reports them.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from bergstream.core.choices import ChoiceResolver
from bergstream.core.models import StrictModel
from bergstream.core.problems import Loc, Problem, format_loc, pydantic_problems
from bergstream.core.typed.schema_registry import SchemaRegistrySettings

if TYPE_CHECKING:
    from bergstream.core.plugins import PluginRegistry

__all__ = [
    "BY_SCHEMA_TYPE",
    "CODEC_KIND",
    "RAW",
    "CodecSettingsError",
    "CodecsSettings",
    "TopicCodecRule",
    "check_codecs",
    "check_codecs_data",
    "codec_settings",
    "rule_for",
]

#: The codec name that means "whichever codec reads the registered schema's type".
BY_SCHEMA_TYPE = "registry"
#: The codec that keeps bytes as they are (the behaviour of a topic no rule matches).
RAW = "raw"
#: The registration kind codecs are registered as.
CODEC_KIND = "value codec"


class CodecSettingsError(ValueError):
    """The settings a rule gives a codec do not validate (see :func:`codec_settings`)."""


class TopicCodecRule(StrictModel):
    """Which codecs decode the values and keys of the topics ``match`` names."""

    match: str = Field(min_length=1, description="a topic name or an fnmatch glob (*, ?, [seq])")
    value: str = Field(
        BY_SCHEMA_TYPE,
        min_length=1,
        description="codec of values: a registered codec name, or 'registry' for the codec of "
        "the registered schema's type",
    )
    key: str = Field(RAW, min_length=1, description="codec of keys; 'raw' leaves keys as bytes")
    value_subject: str = Field(
        "{topic}-value", description="subject whose versions make the value columns"
    )
    key_subject: str = Field(
        "{topic}-key", description="subject whose versions make the key columns"
    )
    config: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="settings per codec name, each validated by that codec's config model",
    )

    @field_validator("value_subject", "key_subject")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(topic="t")
        except (KeyError, IndexError, ValueError, AttributeError):
            raise ValueError(
                f"'{value}' is not a subject template: only {{topic}} may be used (write {{{{ "
                "and }} for literal braces)"
            ) from None
        if not value.format(topic="t"):
            raise ValueError("a subject template cannot be empty")
        return value

    def matches(self, topic: str) -> bool:
        """Whether this rule applies to ``topic`` (an exact name or a case-sensitive glob)."""
        return self.match == topic or fnmatch.fnmatchcase(topic, self.match)

    def value_subject_for(self, topic: str) -> str:
        """The subject of ``topic``'s values (``value_subject`` with ``{topic}`` filled in)."""
        return self.value_subject.format(topic=topic)

    def key_subject_for(self, topic: str) -> str:
        """The subject of ``topic``'s keys (``key_subject`` with ``{topic}`` filled in)."""
        return self.key_subject.format(topic=topic)

    def codec_config(self, codec: str) -> dict[str, Any]:
        """The settings given for ``codec`` (``{}`` when none): what its config model
        validates."""
        return dict(self.config.get(codec, {}))


class CodecsSettings(StrictModel):
    """The ``codecs:`` section."""

    schema_registry: SchemaRegistrySettings | None = Field(
        None, description="the Schema Registry every non-raw codec reads schemas from"
    )
    topics: list[TopicCodecRule] = Field(
        default_factory=list, description="rules in order; the first that matches a topic wins"
    )


def rule_for(settings: CodecsSettings, topic: str) -> TopicCodecRule | None:
    """The first rule of ``settings`` that matches ``topic``; None leaves the topic raw."""
    for rule in settings.topics:
        if rule.matches(topic):
            return rule
    return None


def _is_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def check_codecs(
    settings: CodecsSettings, registry: PluginRegistry, loc: Loc = ("codecs",)
) -> list[Problem]:
    """Every problem of ``settings`` (found at ``loc`` in the file) that needs the installed
    plugins to see: unknown codec names, codec settings their config model refuses, a codec
    that needs the registry with no ``schema_registry``, and a glob rule whose subject template
    lacks ``{topic}`` (every matching topic would share one subject)."""
    registered = registry.registrations(CODEC_KIND)
    installed = ", ".join(sorted(registered)) or "none"
    others = ", ".join(sorted(set(registered) - {RAW})) or "none"
    resolver = ChoiceResolver(registry)
    problems: list[Problem] = []
    for index, rule in enumerate(settings.topics):
        at = (*loc, "topics", index)
        for field, subject_field in (("value", "value_subject"), ("key", "key_subject")):
            name: str = getattr(rule, field)
            if name == RAW:  # bytes as they are: no codec runs, whatever is installed
                continue
            if name != BY_SCHEMA_TYPE and name not in registered:
                problems.append(
                    (
                        (*at, field),
                        f"no value codec named '{name}' is installed: use '{BY_SCHEMA_TYPE}' "
                        f"(the codec of the registered schema's type), '{RAW}' (bytes as they "
                        f"are) or an installed value codec: {others}",
                    )
                )
                continue
            plain = name != BY_SCHEMA_TYPE and not getattr(registered[name], "needs_registry", True)
            if settings.schema_registry is None and not plain:
                problems.append(
                    (
                        (*at, field),
                        f"codec '{name}' reads schemas from a Schema Registry: set "
                        f"{'.'.join(map(str, loc))}.schema_registry.url",
                    )
                )
            template: str = getattr(rule, subject_field)
            if _is_glob(rule.match) and "{topic}" not in template:
                problems.append(
                    (
                        (*at, subject_field),
                        f"'{template}' has no {{topic}} but match '{rule.match}' is a glob: every "
                        "matching topic would take its columns from one subject; add {topic}",
                    )
                )
            if name != BY_SCHEMA_TYPE and name not in rule.config:
                # no settings given: the codec's defaults must do
                _validate(resolver, registered[name].config_model, {}, (*at, "config", name))
        for name, config in rule.config.items():
            if name in registered:
                _validate(resolver, registered[name].config_model, config, (*at, "config", name))
            else:
                problems.append(
                    (
                        (*at, "config", name),
                        f"settings for '{name}', which is no installed value codec: installed "
                        f"value codecs: {installed}",
                    )
                )
    return [*problems, *resolver.problems]


def check_codecs_data(data: Any, registry: PluginRegistry, loc: Loc = ("codecs",)) -> list[Problem]:
    """:func:`check_codecs` on the raw ``codecs`` data of a file that did not validate as a
    whole, so its codec problems show with the others; ``[]`` when the section itself does not
    validate (the file's validation reports that)."""
    try:
        settings = CodecsSettings.model_validate({} if data is None else data)
    except ValidationError:
        return []
    return check_codecs(settings, registry, loc)


def _validate(
    resolver: ChoiceResolver, model: type[BaseModel], config: dict[str, Any], loc: Loc
) -> BaseModel | None:
    """``config`` validated by ``model`` with the plugin choices inside it resolved, or None
    with the problems (under ``loc``) added to ``resolver.problems``."""
    try:
        settings = model.model_validate(config)
    except ValidationError as error:
        resolver.problems.extend(pydantic_problems(error, loc))
        resolver.check_raw(model, config, loc)
        return None
    resolver.resolve_tree(settings, loc)
    return settings


def codec_settings(rule: TopicCodecRule, codec: str, registry: PluginRegistry) -> BaseModel:
    """The settings ``rule`` gives ``codec`` (a registered name), validated by its config model:
    what its factory takes. Raises :class:`CodecSettingsError` naming every problem."""
    registration = registry.get(CODEC_KIND, codec)
    resolver = ChoiceResolver(registry)
    settings = _validate(resolver, registration.config_model, rule.codec_config(codec), ())
    if settings is None or resolver.problems:
        details = "; ".join(
            f"{format_loc(loc) or '<root>'}: {msg}" for loc, msg in resolver.problems
        )
        raise CodecSettingsError(
            f"settings of value codec '{codec}' (rule '{rule.match}'): {details}"
        )
    return settings
