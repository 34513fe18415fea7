"""The ksi filter is an ordinary plugin: found through the entry point, configured from YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from bergstream.core.config import ConfigError, load_config, parse_config
from bergstream.core.plugins import load_registry
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ksi.yaml"


def test_the_entry_point_registers_the_ksi_filter() -> None:
    registration = load_registry().get("filter", "ksi")
    assert registration.config_model is KsiConfig


def test_the_example_config_is_valid(tmp_path: Path) -> None:
    env = {"BERGSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "BERGSTREAM_HOME": str(tmp_path)}
    config = load_config(EXAMPLE, registry=load_registry(), env=env)
    (cluster,) = config.virtual_clusters
    (ksi,) = cluster.filters
    assert ksi.type == "ksi" and ksi.settings.topics is None  # every topic with a table
    assert cluster.gateway.port == 19092 and config.lake is not None


_WITHOUT_TOPICS = """
virtual_clusters:
  - name: c
    target: {bootstrap: "127.0.0.1:9092"}
    gateway: {port: 19092}
    filters: [{type: ksi, config: {read_ahead_segments: 1}}]
lake: {kafka_bootstrap: "127.0.0.1:9092"}
"""


def test_a_config_without_topics_is_valid_and_serves_every_table() -> None:
    config = parse_config(_WITHOUT_TOPICS, registry=load_registry(), env={})
    settings = config.virtual_clusters[0].filters[0].settings
    assert settings.topics is None and settings.patterns() == ["*"]


def test_a_pattern_with_a_table_is_reported_with_its_path() -> None:
    text = _WITHOUT_TOPICS.replace(
        "{read_ahead_segments: 1}", "{topics: [{topic: 'orders-*', table: orders}]}"
    )
    with pytest.raises(ConfigError, match=r"filters\[0\]\.config\.topics\[0\].*takes no table"):
        parse_config(text, registry=load_registry(), env={})


def test_a_bad_setting_is_reported_with_its_path() -> None:
    text = """
virtual_clusters:
  - name: c
    target: {bootstrap: "127.0.0.1:9092"}
    gateway: {port: 19092}
    filters: [{type: ksi, config: {topics: [a], cache_max_bytes: 5}}]
"""
    with pytest.raises(ConfigError, match=r"filters\[0\]\.config\.cache_max_bytes"):
        parse_config(text, registry=load_registry(), env={})
