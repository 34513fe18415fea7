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
    assert ksi.type == "ksi" and ksi.settings.table_of() == {"orders": "orders"}
    assert cluster.gateway.port == 19092 and config.lake is not None


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
