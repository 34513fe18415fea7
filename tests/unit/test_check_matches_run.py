"""``bergstream config check FILE`` and ``bergstream run -c FILE`` accept exactly the same files.

Both commands run in-process on every ``examples/*.yaml`` (with dummy values for the variables
they need) and on broken variants of each: a wrong choice deep in a plugin's settings, an
unknown key in a plugin's or a plugin-defined section's settings, an unknown plugin. ``run`` goes
through its own code (its plugin registry, its loading, its error handling) up to the moment it
would start listening: building every service and filter factory, which is where a service
refuses settings it cannot use.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from bergstream.core import runner
from bergstream.core.cli import cli
from tests.unit.pki_files import make_pki

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))

#: A dummy value for every variable an example needs (one without a ``:-default``).
DUMMY_ENV = {
    "BERGSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
    "BERGSTREAM_S3_ENDPOINT": "http://127.0.0.1:8333",
    "BERGSTREAM_S3_ACCESS_KEY": "access",
    "BERGSTREAM_S3_SECRET_KEY": "secret",
    "BERGSTREAM_S3_REGION": "us-east-1",
    "BERGSTREAM_SCHEMA_REGISTRY_URL": "http://127.0.0.1:8081/apis/ccompat/v7",
    # examples/production.yaml's (an existing setup's names)
    "KAFKA_BOOTSTRAP_SERVERS": "broker1:9093,broker2:9093",
    "ICEBERG_REST_URI": "https://catalog.example.com",
    "ICEBERG_WAREHOUSE": "s3://lake/warehouse",
    "ICEBERG_REST_TOKEN": "token",
    "SCHEMA_REGISTRY_URL": "https://registry.example.com",
    "ISK_ACCESS_KEY": "isk",
    "ISK_SECRET_KEY": "isk-secret",
    "BERGSTREAM_CHECKPOINT_DIR": "/tmp/bergstream-checkpoints",
    # examples/glue.yaml's (what a user on AWS has)
    "AWS_REGION": "eu-west-1",
    "GLUE_WAREHOUSE": "s3://lake/warehouse",
}
#: Variables naming files, made by the ``env`` fixture: a client properties file, and a TLS key
#: with its certificate in one PEM file.
FILE_VARIABLES = ("KAFKA_CLIENT_PROPERTIES", "ISK_TLS_CERT_FILE", "ISK_TLS_KEY_FILE")

_REQUIRED_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Variant:
    """One way to break a config: ``applies`` says whether it can break this file, ``breaks``
    breaks it in place and returns the bad name both commands must report."""

    name: str
    applies: Callable[[dict[str, Any]], bool]
    breaks: Callable[[dict[str, Any]], str]


def _isk_configs(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [s.setdefault("config", {}) for s in data.get("services") or [] if s["type"] == "isk"]


def _ksi_configs(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block.setdefault("config", {})
        for cluster in data.get("virtual_clusters") or []
        for block in cluster.get("filters") or []
        if block["type"] == "ksi"
    ]


def _set_all(items: list[dict[str, Any]], key: str, value: Any, name: str) -> str:
    for item in items:
        item[key] = value
    return name


def _unknown_index(data: dict[str, Any]) -> str:
    return _set_all(_isk_configs(data), "index", {"type": "nosuch-index"}, "nosuch-index")


def _unknown_cache_key(data: dict[str, Any]) -> str:
    for isk in _isk_configs(data):
        cache = isk.setdefault("cache", {"type": "local"})
        cache.setdefault("config", {})["nosuch_cache_key"] = 1
    return "nosuch_cache_key"


def _bad_synthesizer_value(data: dict[str, Any]) -> str:
    synthesizer = {
        "type": "hotset-parquet",
        "config": {"cluster": "c", "kafka_bootstrap": "127.0.0.1:9092", "unit": "fortnight"},
    }
    return _set_all(_isk_configs(data), "synthesizers", [synthesizer], "fortnight")


def _unknown_synthesizer(data: dict[str, Any]) -> str:
    choice = [{"type": "nosuch-synthesizer"}]
    return _set_all(_isk_configs(data), "synthesizers", choice, "nosuch-synthesizer")


def _unknown_isk_key(data: dict[str, Any]) -> str:
    return _set_all(_isk_configs(data), "nosuch_isk_key", 1, "nosuch_isk_key")


def _unknown_filter(data: dict[str, Any]) -> str:
    for cluster in data["virtual_clusters"]:
        cluster.setdefault("filters", []).append({"type": "nosuch-filter"})
    return "nosuch-filter"


def _unknown_ksi_key(data: dict[str, Any]) -> str:
    return _set_all(_ksi_configs(data), "nosuch_ksi_key", 1, "nosuch_ksi_key")


def _unknown_service(data: dict[str, Any]) -> str:
    data["services"].append({"type": "nosuch-service"})
    return "nosuch-service"


def _unknown_pipeline_key(data: dict[str, Any]) -> str:
    data["lake"].setdefault("pipeline", {})["nosuch_pipeline_key"] = 1
    return "nosuch_pipeline_key"


def _bad_maintenance_value(data: dict[str, Any]) -> str:
    data["lake"].setdefault("maintenance", {})["retain_last"] = 0
    return "lake.maintenance.retain_last"


def _unusable_catalog(data: dict[str, Any]) -> str:
    data["lake"].setdefault("catalog", {}).update(type="sql", uri="postgresql://db/catalog")
    return "postgresql://db/catalog"


def _ksi_without_lake(data: dict[str, Any]) -> str:
    del data["lake"]
    return "lake: section"


VARIANTS = [
    Variant("unknown-index-type", lambda d: bool(_isk_configs(d)), _unknown_index),
    Variant("unknown-cache-key", lambda d: bool(_isk_configs(d)), _unknown_cache_key),
    Variant("bad-synthesizer-value", lambda d: bool(_isk_configs(d)), _bad_synthesizer_value),
    Variant("unknown-synthesizer", lambda d: bool(_isk_configs(d)), _unknown_synthesizer),
    Variant("unknown-isk-key", lambda d: bool(_isk_configs(d)), _unknown_isk_key),
    Variant("unknown-filter-type", lambda d: bool(d.get("virtual_clusters")), _unknown_filter),
    Variant("unknown-ksi-key", lambda d: bool(_ksi_configs(d)), _unknown_ksi_key),
    Variant("unknown-service-type", lambda d: bool(d.get("services")), _unknown_service),
    Variant("unknown-pipeline-key", lambda d: "lake" in d, _unknown_pipeline_key),
    Variant("bad-maintenance-value", lambda d: "lake" in d, _bad_maintenance_value),
    Variant("unusable-catalog", lambda d: "lake" in d, _unusable_catalog),
    Variant("ksi-without-lake", lambda d: bool(_ksi_configs(d)) and "lake" in d, _ksi_without_lake),
]


def _load(example: Path) -> dict[str, Any]:
    data = yaml.safe_load(example.read_text())
    assert isinstance(data, dict), example
    return data


BROKEN = [
    pytest.param(example, variant, id=f"{example.stem}-{variant.name}")
    for example in EXAMPLES
    for variant in VARIANTS
    if variant.applies(_load(example))
]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The examples' variables, with a home and files of this test's own."""
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=PLAINTEXT\nclient.id=bergstream\n")
    files = {
        "KAFKA_CLIENT_PROPERTIES": str(properties),
        "ISK_TLS_CERT_FILE": str(pki["client.pem"]),
        "ISK_TLS_KEY_FILE": str(pki["client.pem"]),
    }
    return {**DUMMY_ENV, **files, "BERGSTREAM_HOME": str(tmp_path / "home")}


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """Both commands set up logging for the process; put it back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def config_check(path: Path, env: dict[str, str]) -> tuple[bool, str]:
    """Whether ``bergstream config check PATH`` accepts the file, and what it printed."""
    result = CliRunner(env=env).invoke(cli, ["config", "check", str(path)])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code == 0, result.output


def run_until_start(
    path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[bool, str]:
    """Whether ``bergstream run -c PATH`` gets as far as starting, and what it printed: the
    command's own code, with the start (listening until a signal) replaced by building every
    service and filter factory, which is all that precedes it."""
    built: list[list[Any]] = []

    def build_only(config: Any, registry: Any) -> None:
        built.append(runner.build_services(config, registry))

    monkeypatch.setattr(runner, "run_until_signalled", build_only)
    result = CliRunner(env=env).invoke(cli, ["run", "-c", str(path)])
    assert result.exit_code in (0, 1), result.output
    assert (result.exit_code == 0) == bool(built), result.output
    return result.exit_code == 0, result.output


def test_every_example_serves_metrics_at_the_variables_port() -> None:
    for example in EXAMPLES:
        metrics = _load(example).get("metrics")
        assert isinstance(metrics, dict), f"{example.name} has no metrics: section"
        assert str(metrics.get("port", "")).startswith("${BERGSTREAM_METRICS_PORT:-"), example.name


def test_every_example_variable_has_a_dummy_value() -> None:
    assert len(EXAMPLES) >= 5
    for example in EXAMPLES:
        needed = set(_REQUIRED_VARIABLE.findall(example.read_text())) - {"BERGSTREAM_HOME"}
        known = {*DUMMY_ENV, *FILE_VARIABLES}
        assert needed <= known, f"{example.name} needs {needed - known}"


def test_every_variant_breaks_some_example() -> None:
    used = {param.values[1].name for param in BROKEN}
    assert used == {variant.name for variant in VARIANTS}


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_both_accept_every_example(
    example: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    checked, check_output = config_check(example, env)
    assert checked, check_output
    ran, run_output = run_until_start(example, env, monkeypatch)
    data = _load(example)
    if data.get("virtual_clusters") or data.get("services"):
        assert ran, run_output
    else:  # a lake alone: `pipeline run` runs it, `run` says so
        assert not ran and "`bergstream pipeline run -c FILE --topic T`" in run_output


@pytest.mark.parametrize(("example", "variant"), BROKEN)
def test_both_refuse_every_broken_variant(
    example: Path,
    variant: Variant,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    data = _load(example)
    bad_name = variant.breaks(data)
    broken = tmp_path / example.name
    broken.write_text(yaml.safe_dump(data, sort_keys=False))
    checked, check_output = config_check(broken, env)
    assert not checked, f"config check accepted it:\n{check_output}"
    assert bad_name in check_output
    ran, run_output = run_until_start(broken, env, monkeypatch)
    assert not ran, f"run accepted it:\n{run_output}"
    assert bad_name in run_output
