"""Config loading: interpolation, validation, and errors that name the file, path and fix."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import BaseModel, ConfigDict

from bergstream.core.config import ConfigError, interpolate, load_config, parse_config
from bergstream.core.hookspecs import hookimpl
from bergstream.core.plugins import load_registry
from bergstream.core.proxy.api import FilterFactory, ProxyFilter
from bergstream.core.registrations import FilterRegistration

GOOD = """
virtual_clusters:
  - name: demo
    target:
      bootstrap: ${KAFKA:-127.0.0.1:9092}
    gateway:
      port: ${PORT:-19092}
    filters:
      - type: tag
        config: {label: hello}
"""


class TagConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str
    weight: int = 1


class TagFactory(FilterFactory[TagConfig]):
    def create_filter(self) -> ProxyFilter:
        return ProxyFilter()


class TagPlugin:
    @hookimpl
    def register_filters(self):
        return [FilterRegistration(name="tag", factory=TagFactory, config_model=TagConfig)]


@pytest.fixture
def registry():
    return load_registry([TagPlugin()], entry_points=False)


def problems(text: str, registry=None, env=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text), source="c.yaml", registry=registry, env=env or {})
    return [str(p) for p in info.value.problems]


def test_good_config_validates_plugin_settings(registry):
    config = parse_config(GOOD, source="c.yaml", registry=registry, env={})
    cluster = config.virtual_clusters[0]
    assert cluster.target.addresses() == [("127.0.0.1", 9092)]
    assert cluster.gateway.port == 19092
    assert cluster.gateway.broker_port(0) == 19093
    assert cluster.gateway.broker_port(2) == 19095
    assert cluster.gateway.broker_port(3) is None
    assert isinstance(cluster.filters[0].settings, TagConfig)
    assert cluster.filters[0].settings.label == "hello"


def test_environment_interpolation_and_defaults(registry):
    config = parse_config(GOOD, registry=registry, env={"KAFKA": "10.0.0.1:9093", "PORT": "20000"})
    assert config.virtual_clusters[0].target.bootstrap == "10.0.0.1:9093"
    assert config.virtual_clusters[0].gateway.port == 20000


def test_interpolation_forms():
    found: list = []
    env = {"A": "1", "EMPTY": ""}
    assert interpolate("x${A}y", env, (), found) == "x1y"
    assert interpolate("${B:-dflt}", env, (), found) == "dflt"
    assert interpolate("${EMPTY:-dflt}", env, (), found) == "dflt"
    assert interpolate("${EMPTY}", env, (), found) == ""
    assert interpolate("$${A}", env, (), found) == "${A}"
    assert interpolate({"k": ["${A}", 3]}, env, (), found) == {"k": ["1", 3]}
    assert found == []
    interpolate({"k": ["${MISSING}"]}, env, (), found)
    assert found[0][0] == ("k", 0)
    assert "MISSING is not set" in found[0][1]


def test_missing_variable_names_the_path():
    out = problems(
        """
        virtual_clusters:
          - name: demo
            target: {bootstrap: "${NOPE}"}
            gateway: {port: 1}
        """
    )
    assert out == [
        "c.yaml:4: virtual_clusters[0].target.bootstrap: environment variable NOPE is not set: "
        "set it, or write ${NOPE:-default} to give a default"
    ]


def test_unknown_filter_lists_installed_names(registry):
    out = problems(GOOD.replace("type: tag", "type: tga"), registry)
    assert len(out) == 1
    assert "virtual_clusters[0].filters[0].type" in out[0]
    assert "no filter plugin named 'tga' is installed; installed filters: tag" in out[0]
    assert out[0].startswith("c.yaml:9:")


def test_bad_plugin_config_names_the_key(registry):
    out = problems(
        GOOD.replace("{label: hello}", "{label: hello, weight: heavy, colour: red}"), registry
    )
    assert any("virtual_clusters[0].filters[0].config.weight" in p and "heavy" in p for p in out)
    assert any("virtual_clusters[0].filters[0].config.colour: unknown key" in p for p in out)


def test_every_problem_is_reported_at_once():
    out = problems(
        """
        virtual_clustrs: []
        virtual_clusters:
          - name: "bad name"
            target: {bootstrap: "nohostport"}
            gateway: {port: 70000}
        """
    )
    joined = "\n".join(out)
    assert "virtual_clustrs: unknown key" in joined
    assert "virtual_clusters[0].name" in joined
    assert "virtual_clusters[0].target.bootstrap" in joined and "host:port" in joined
    assert "virtual_clusters[0].gateway.port" in joined
    assert len(out) == 4


def test_missing_required_key():
    out = problems("virtual_clusters:\n  - name: a\n    gateway: {port: 1000}\n")
    assert out == ["c.yaml:2: virtual_clusters[0].target: required key is missing"]


def test_overlapping_ports_are_refused():
    out = problems(
        "virtual_clusters:\n  - name: a\n    target: {bootstrap: 'h:1'}\n"
        "    gateway: {port: 1001, broker_start_port: 1000}\n"
    )
    assert len(out) == 1 and "overlaps the broker ports" in out[0]


def test_duplicate_cluster_names():
    cluster = "  - name: a\n    target: {bootstrap: 'h:1'}\n    gateway: {port: 1000}\n"
    out = problems("virtual_clusters:\n" + cluster + cluster.replace("1000", "2000"))
    assert out == [
        "c.yaml:5: virtual_clusters[1].name: virtual cluster name 'a' is also the name of "
        "virtual_clusters[0]: give each cluster its own name"
    ]


def test_invalid_yaml_and_non_mapping():
    assert "not valid YAML" in problems("a: [1, 2\n")[0]
    assert "mapping of keys at top level" in problems("- 1\n- 2\n")[0]


def test_empty_file_is_an_empty_config():
    config = parse_config("", env={})
    assert config.virtual_clusters == [] and config.services == []


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert "cannot read the file" in str(info.value)
    assert "missing.yaml" in str(info.value)
