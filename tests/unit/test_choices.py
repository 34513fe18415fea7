"""``{type, config}`` choices anywhere in a config, and plugin-defined sections: the loader
resolves and validates them all, naming the path and line of every problem."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.choices import (
    ChoiceError,
    FileSynthesizerChoice,
    PluginChoice,
    ValueCodecChoice,
    choice_settings,
)
from bergstream.core.config import ConfigError, parse_config
from bergstream.core.hookspecs import hookimpl
from bergstream.core.plugins import load_registry
from bergstream.core.proxy.api import FilterFactory, ProxyFilter
from bergstream.core.registrations import (
    ConfigSectionRegistration,
    FilterRegistration,
    ValueCodecRegistration,
)

ISK = """\
services:
  - type: isk
    config:
      kafka_bootstrap: 127.0.0.1:9092
      http: {access_key: a, secret_key: b}
      index:
        type: sqlite
        config: {busy_timeout_seconds: 5}
      cache:
        type: local
        config:
          max_bytes: 1048576
      synthesizers:
        - type: hotset-parquet
          config: {cluster: other, kafka_bootstrap: "127.0.0.1:9092", unit: hour}
"""


@pytest.fixture(scope="module")
def registry() -> Any:
    """Every installed plugin, as ``bergstream config check`` and ``bergstream run`` load them."""
    return load_registry()


def problems(text: str, registry: Any) -> dict[tuple[str, int | None], str]:
    """(path, line) -> message of every problem of ``text``."""
    with pytest.raises(ConfigError) as error:
        parse_config(text, source="c.yaml", registry=registry, env={})
    return {(p.path, p.line): p.message for p in error.value.problems}


def test_isk_choices_get_the_settings_core_validated(registry: Any) -> None:
    config = parse_config(ISK, registry=registry, env={})
    isk = config.services[0].settings
    assert isk.index.settings.busy_timeout_seconds == 5
    assert isk.cache.settings.max_bytes == 1048576
    assert isk.synthesizers[0].settings.unit == "hour"
    # A choice the file leaves to its default is resolved too.
    bare = ISK.split("      index:")[0]
    defaults = parse_config(bare, registry=registry, env={}).services[0].settings
    assert (defaults.index.type, defaults.cache.type) == ("sqlite", "local")
    assert defaults.index.settings is not None and defaults.cache.settings is not None


def test_an_unknown_index_type_names_it_the_path_and_the_installed_ones(registry: Any) -> None:
    found = problems(ISK.replace("type: sqlite", "type: nosuch"), registry)
    assert found == {
        ("services[0].config.index.type", 7): "no index backend plugin named 'nosuch' is "
        "installed; installed index backends: rocksdb, sqlite"
    }


def test_an_unknown_key_in_cache_config(registry: Any) -> None:
    found = problems(ISK.replace("max_bytes: 1048576", "max_byte: 1048576"), registry)
    assert found == {
        ("services[0].config.cache.config.max_byte", 12): "unknown key: remove it or check "
        "its spelling"
    }


def test_a_bad_value_in_a_synthesizer_config(registry: Any) -> None:
    found = problems(ISK.replace("unit: hour", "unit: week"), registry)
    assert found == {
        ("services[0].config.synthesizers[0].config.unit", 15): "Input should be 'day' or "
        "'hour' (got 'week')"
    }


def test_choice_problems_show_with_the_other_problems_of_the_file(registry: Any) -> None:
    text = (
        ISK.replace("type: sqlite", "type: nosuch")
        .replace("kafka_bootstrap: 127.0.0.1:9092\n", "kafka_bootstrap: nope\n", 1)
        .replace("type: local", "type: elsewhere")
    )
    text += "virtual_clusters: [{name: x, target: {bootstrap: 'a:1'}, gateway: {port: no}}]\n"
    found = problems(text, registry)
    assert set(found) == {
        ("virtual_clusters[0].gateway.port", 16),  # the file as a whole does not validate ...
        ("services[0].config.kafka_bootstrap", 4),  # ... nor does the service's config ...
        ("services[0].config.index.type", 7),  # ... and its choices are checked all the same
        ("services[0].config.cache.type", 10),
    }
    assert (
        "installed cache backends: local, redis, s3" in found[("services[0].config.cache.type", 10)]
    )


class CodecConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: int = Field(1, ge=1)


class TagConfig(BaseModel):
    """A filter whose settings pick a value codec, in a dict of lists of choices."""

    model_config = ConfigDict(extra="forbid")
    codecs: dict[str, list[ValueCodecChoice]] = Field(default_factory=dict)
    fallback: ValueCodecChoice | None = None


class TagFactory(FilterFactory[TagConfig]):
    def create_filter(self) -> ProxyFilter:
        return ProxyFilter()


class Plugin:
    @hookimpl
    def register_filters(self) -> list[FilterRegistration]:
        return [FilterRegistration(name="tag", factory=TagFactory, config_model=TagConfig)]

    @hookimpl
    def register_value_codecs(self) -> list[ValueCodecRegistration]:
        return [ValueCodecRegistration(name="zip", factory=object, config_model=CodecConfig)]


TAGGED = """\
virtual_clusters:
  - name: demo
    target: {bootstrap: "127.0.0.1:9092"}
    gateway: {port: 19092}
    filters:
      - type: tag
        config:
          codecs:
            orders: [{type: zip, config: {level: 3}}, {type: zip}]
          fallback: {type: zip}
"""


def test_choices_are_found_in_any_plugin_model_however_nested() -> None:
    registry = load_registry([Plugin()], entry_points=False)
    config = parse_config(TAGGED, registry=registry, env={})
    tag = config.virtual_clusters[0].filters[0].settings
    assert [c.settings.level for c in tag.codecs["orders"]] == [3, 1]
    assert tag.fallback.settings == CodecConfig()
    broken = TAGGED.replace("level: 3", "level: 0").replace(
        "fallback: {type: zip}", "fallback: {type: gz}"
    )
    assert problems(broken, registry) == {
        ("virtual_clusters[0].filters[0].config.codecs.orders[0].config.level", 9): "Input "
        "should be greater than or equal to 1 (got 0)",
        ("virtual_clusters[0].filters[0].config.fallback.type", 10): "no value codec plugin "
        "named 'gz' is installed; installed value codecs: zip",
    }


def test_a_choice_built_in_code_is_resolved_through_the_same_helper() -> None:
    registry = load_registry([Plugin()], entry_points=False)
    choice = ValueCodecChoice(type="zip", config={"level": 2})
    assert choice_settings(choice, registry) == CodecConfig(level=2)
    assert choice.settings == CodecConfig(level=2)  # attached: not validated twice
    with pytest.raises(ChoiceError, match=r"value codec 'zip': config\.level: Input should be"):
        choice_settings(ValueCodecChoice(type="zip", config={"level": 0}), registry)
    with pytest.raises(ChoiceError, match="no file synthesizer plugin named 'x'"):
        choice_settings(FileSynthesizerChoice(type="x"), registry)


def test_a_choice_declares_a_kind_that_can_be_chosen() -> None:
    with pytest.raises(TypeError, match="set it to a registration kind"):

        class Nothing(PluginChoice):  # no kind
            pass

    with pytest.raises(TypeError, match="'config section'"):

        class Section(PluginChoice):
            kind = "config section"


def test_a_section_no_installed_plugin_defines_says_what_to_do() -> None:
    text = "lake:\n  kafka_bootstrap: 127.0.0.1:9092\n  pipeline: {trigger_interval_seconds: 1}\n"
    found = problems(text, load_registry(entry_points=False))
    ((path, line), message), *more = found.items()
    assert (path, line, more) == ("lake.pipeline", 3, [])
    assert "no installed plugin defines a 'lake.pipeline' section" in message
    assert "install the plugin that defines it (`bergstream plugins`" in message
    # Left out, it is nobody's business: the lake alone is valid without the pipeline.
    parse_config(text.rsplit("  pipeline", 1)[0], registry=load_registry(entry_points=False))


def test_a_plugin_defining_a_section_core_has_no_place_for_is_reported() -> None:
    class Stray:
        @hookimpl
        def register_config_sections(self) -> list[ConfigSectionRegistration]:
            return [ConfigSectionRegistration(name="proxy.extras", config_model=CodecConfig)]

    found = problems("virtual_clusters: []\n", load_registry([Stray()], entry_points=False))
    ((path, _), message), *more = found.items()
    assert path == "" and not more
    assert "registers the config section 'proxy.extras'" in message
    assert "(lake.<name>)" in message


def test_a_plugin_adds_a_lake_section_core_never_names() -> None:
    class Extras:
        @hookimpl
        def register_config_sections(self) -> list[ConfigSectionRegistration]:
            return [ConfigSectionRegistration(name="lake.extras", config_model=CodecConfig)]

    registry = load_registry([Extras()], entry_points=False)
    text = "lake:\n  kafka_bootstrap: 127.0.0.1:9092\n  extras: {level: 3}\n"
    assert parse_config(text, registry=registry).sections["lake.extras"] == CodecConfig(level=3)
    found = problems(text.replace("level: 3", "level: 0"), registry)
    assert [path for path, _ in found] == ["lake.extras.level"]


def test_a_misspelled_lake_key_is_refused_with_the_nearest_name() -> None:
    text = "lake:\n  kafka_bootstrap: 127.0.0.1:9092\n  namespce: x\n"
    found = problems(text, load_registry())
    ((path, line), message), *more = found.items()
    assert (path, line, more) == ("lake.namespce", 3, [])
    assert "did you mean 'namespace'?" in message


def test_lake_settings_resolve_lake_refuses_are_refused_at_load() -> None:
    text = textwrap.dedent(
        """
        lake:
          kafka_bootstrap: 127.0.0.1:9092
          catalog:
            uri: postgresql://db/catalog
        """
    )
    with pytest.raises(ConfigError) as error:
        parse_config(text, source="c.yaml", env={})
    (problem,) = error.value.problems
    assert (problem.path, problem.line) == ("lake.catalog.uri", 5)
    assert "sqlite:///PATH" in problem.message
