"""core.codecs_config: the ``codecs:`` section's models, which rule a topic gets, and the checks
against the installed codecs (names, settings, the registry, subject templates)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bergstream.core.choices import IndexBackendChoice
from bergstream.core.hookspecs import hookimpl
from bergstream.core.plugins import PluginRegistry, load_registry
from bergstream.core.problems import format_loc
from bergstream.core.registrations import (
    EmptyConfig,
    IndexBackendRegistration,
    ValueCodecRegistration,
)
from bergstream.core.typed.codecs_config import (
    CodecSettingsError,
    CodecsSettings,
    TopicCodecRule,
    check_codecs,
    check_codecs_data,
    codec_settings,
    rule_for,
)

REGISTRY = {"url": "http://127.0.0.1:8081"}


class ZapConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: int = Field(1, ge=1)
    index: IndexBackendChoice | None = None  # a choice inside a codec's settings


class NeedyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dictionary: str  # no default: the codec cannot run without settings


class Codecs:
    """A test plugin: codecs ``raw``, ``zap`` and ``needy``, and an index backend ``mem``."""

    @hookimpl
    def register_value_codecs(self) -> list[ValueCodecRegistration]:
        return [
            ValueCodecRegistration(name="raw", factory=object, config_model=EmptyConfig),
            ValueCodecRegistration(name="zap", factory=object, config_model=ZapConfig),
            ValueCodecRegistration(name="needy", factory=object, config_model=NeedyConfig),
        ]

    @hookimpl
    def register_index_backends(self) -> list[IndexBackendRegistration]:
        return [IndexBackendRegistration(name="mem", factory=object, config_model=EmptyConfig)]


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    return load_registry([Codecs()], entry_points=False)


def settings(*rules: dict[str, Any], schema_registry: Any = REGISTRY) -> CodecsSettings:
    return CodecsSettings.model_validate({"schema_registry": schema_registry, "topics": rules})


def found(codecs: CodecsSettings, registry: PluginRegistry) -> dict[str, str]:
    return {format_loc(loc): message for loc, message in check_codecs(codecs, registry)}


def test_defaults() -> None:
    empty = CodecsSettings()
    assert (empty.schema_registry, empty.topics) == (None, [])
    rule = TopicCodecRule(match="*")
    assert (rule.value, rule.key, rule.config) == ("registry", "raw", {})
    assert rule.value_subject_for("payments") == "payments-value"
    assert rule.key_subject_for("payments") == "payments-key"
    assert rule.codec_config("zap") == {}


def test_the_first_matching_rule_wins_and_no_rule_means_raw() -> None:
    codecs = settings(
        {"match": "payments", "value": "zap"},
        {"match": "pay*", "value": "needy"},
        {"match": "log-?", "value": "raw"},
        {"match": "[ab]-*"},
    )
    assert rule_for(codecs, "payments").value == "zap"
    assert rule_for(codecs, "payments-eu").value == "needy"
    assert rule_for(codecs, "log-1").value == "raw"
    assert rule_for(codecs, "b-x").value == "registry"
    assert rule_for(codecs, "log-12") is None
    assert rule_for(codecs, "Payments") is None  # topic names are case-sensitive
    assert rule_for(CodecsSettings(), "payments") is None


def test_subject_templates() -> None:
    rule = TopicCodecRule(match="*", value_subject="{topic}.v", key_subject="fixed-{{x}}")
    assert (rule.value_subject_for("t"), rule.key_subject_for("t")) == ("t.v", "fixed-{x}")
    for bad in ("{name}-value", "{topic", "{0}", "{topic.x}", ""):
        with pytest.raises(ValidationError, match=r"not a subject template|cannot be empty"):
            TopicCodecRule(match="*", value_subject=bad)


def test_models_refuse_unknown_keys_and_empty_names() -> None:
    with pytest.raises(ValidationError) as raised:
        CodecsSettings.model_validate(
            {"topics": [{"match": "", "values": "zap"}], "registry": REGISTRY}
        )
    locs = {tuple(e["loc"]) for e in raised.value.errors()}
    assert locs == {("topics", 0, "match"), ("topics", 0, "values"), ("registry",)}


def test_a_good_section_has_no_problems(registry: PluginRegistry) -> None:
    codecs = settings(
        {"match": "payments", "value": "zap", "key": "zap", "config": {"zap": {"level": 3}}},
        {"match": "orders", "value_subject": "orders-v2"},  # a fixed subject for one topic
        {"match": "*", "value": "needy", "config": {"needy": {"dictionary": "d"}}},
    )
    assert check_codecs(codecs, registry) == []
    assert (
        check_codecs(settings({"match": "*", "value": "raw"}, schema_registry=None), registry) == []
    )


def test_unknown_codec_names_list_the_installed_ones_and_registry(
    registry: PluginRegistry,
) -> None:
    problems = found(settings({"match": "*", "value": "avro", "key": "gz"}), registry)
    use = (
        "is installed: use 'registry' (the codec of the registered schema's type), 'raw' (bytes "
        "as they are) or an installed value codec: needy, zap"
    )
    assert problems == {
        "codecs.topics[0].value": f"no value codec named 'avro' {use}",
        "codecs.topics[0].key": f"no value codec named 'gz' {use}",
    }


def test_raw_needs_no_installed_codec() -> None:
    bare = load_registry(entry_points=False)
    codecs = settings({"match": "*", "value": "raw"}, {"match": "b", "value": "zap"})
    assert found(codecs, bare) == {
        "codecs.topics[1].value": "no value codec named 'zap' is installed: use 'registry' (the "
        "codec of the registered schema's type), 'raw' (bytes as they are) or an installed value "
        "codec: none"
    }


def test_codec_settings_are_validated_by_the_codec_model(registry: PluginRegistry) -> None:
    problems = found(
        settings(
            {"match": "a", "value": "zap", "config": {"zap": {"level": 0, "speed": 1}}},
            {"match": "b", "value": "needy"},  # needs a setting it is not given
            {"match": "c", "config": {"gzip": {}, "needy": {}}},
            {"match": "d", "value": "zap", "config": {"zap": {"index": {"type": "nosuch"}}}},
        ),
        registry,
    )
    assert problems == {
        "codecs.topics[0].config.zap.level": "Input should be greater than or equal to 1 (got 0)",
        "codecs.topics[0].config.zap.speed": "unknown key: remove it or check its spelling",
        "codecs.topics[1].config.needy.dictionary": "required key is missing",
        "codecs.topics[2].config.gzip": "settings for 'gzip', which is no installed value codec: "
        "installed value codecs: needy, raw, zap",
        "codecs.topics[2].config.needy.dictionary": "required key is missing",
        "codecs.topics[3].config.zap.index.type": "no index backend plugin named 'nosuch' is "
        "installed; installed index backends: mem",
    }


def test_a_codec_other_than_raw_needs_the_registry(registry: PluginRegistry) -> None:
    problems = found(
        settings(
            {"match": "a", "key": "zap"}, {"match": "b", "value": "raw"}, schema_registry=None
        ),
        registry,
    )
    need = "reads schemas from a Schema Registry: set codecs.schema_registry.url"
    assert problems == {
        "codecs.topics[0].value": f"codec 'registry' {need}",
        "codecs.topics[0].key": f"codec 'zap' {need}",
    }


def test_a_glob_rule_needs_topic_in_its_subjects(registry: PluginRegistry) -> None:
    problems = found(
        settings(
            {"match": "pay*", "value_subject": "payments-value", "key_subject": "k"},
            {"match": "orders", "value_subject": "orders-value"},
            {"match": "x?", "key": "zap", "key_subject": "shared-key"},
        ),
        registry,
    )
    # The key subject of rule 0 does not matter: its keys stay raw.
    assert set(problems) == {"codecs.topics[0].value_subject", "codecs.topics[2].key_subject"}
    assert problems["codecs.topics[0].value_subject"] == (
        "'payments-value' has no {topic} but match 'pay*' is a glob: every matching topic "
        "would take its columns from one subject; add {topic}"
    )


def test_problems_sit_under_the_given_location(registry: PluginRegistry) -> None:
    ((loc, _),) = check_codecs(settings({"match": "*", "value": "x"}), registry, ("a", 1))
    assert loc == ("a", 1, "topics", 0, "value")


def test_codec_settings_gives_what_the_factory_takes(registry: PluginRegistry) -> None:
    rule = TopicCodecRule(
        match="*", config={"zap": {"level": 4, "index": {"type": "mem"}}, "needy": {}}
    )
    zap = codec_settings(rule, "zap", registry)
    assert isinstance(zap, ZapConfig) and zap.level == 4
    assert zap.index is not None and zap.index.settings == EmptyConfig()  # choices resolved
    assert codec_settings(rule, "raw", registry) == EmptyConfig()
    with pytest.raises(CodecSettingsError, match=r"'needy' \(rule '\*'\): dictionary: required"):
        codec_settings(rule, "needy", registry)


def test_raw_section_data_is_checked_when_it_validates(registry: PluginRegistry) -> None:
    data = {"schema_registry": REGISTRY, "topics": [{"match": "*", "value": "nosuch"}]}
    ((loc, message),) = check_codecs_data(data, registry)
    assert loc == ("codecs", "topics", 0, "value") and "'nosuch'" in message
    assert check_codecs_data({"topics": [{"value": "nosuch"}]}, registry) == []  # no match
    assert check_codecs_data(None, registry) == []  # a bare `codecs:` line


def test_a_codec_of_plain_values_needs_no_registry() -> None:
    installed = load_registry()  # the built-in codecs: json reads no registered schema
    codecs = settings(
        {"match": "plain", "value": "json"},
        {"match": "avro", "value": "avro"},
        schema_registry=None,
    )
    assert found(codecs, installed) == {
        "codecs.topics[1].value": "codec 'avro' reads schemas from a Schema Registry: set "
        "codecs.schema_registry.url"
    }
