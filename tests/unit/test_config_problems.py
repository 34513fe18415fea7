"""Every mistake of a config file in one run, each with file, line, path and the fix, through the
commands users run: ``config check`` (text and ``--json``), ``run`` and ``config show``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from bergstream.core.cli import build_cli
from bergstream.core.config import ConfigError, load_config, parse_config
from bergstream.core.config_show import MASK, mask_secrets

CLUSTER = """\
virtual_clusters:
  - name: demo
    target: {bootstrap: "127.0.0.1:9092"}
    gateway: {port: 19092}
"""


def check(tmp_path: Path, text: str | bytes, *options: str) -> tuple[int, str]:
    file = tmp_path / "c.yaml"
    if isinstance(text, str):
        file.write_text(text, encoding="utf-8")
    else:
        file.write_bytes(text)
    result = CliRunner().invoke(build_cli(), ["config", "check", *options, str(file)])
    return result.exit_code, result.output.replace(str(file), "c.yaml")


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="c.yaml")
    return [str(p) for p in caught.value.problems]


def test_a_file_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    code, out = check(tmp_path, b'lake:\n  kafka_bootstrap: "caf\xe9:9092"\n')
    assert code == 1 and "Traceback" not in out
    assert (
        "c.yaml:2:24: <root>: the file is not UTF-8: byte 0xe9 at line 2, column 24 cannot be "
        "decoded; save the file as UTF-8"
    ) in out


def test_a_byte_order_mark_is_fine(tmp_path: Path) -> None:
    code, out = check(tmp_path, "\ufeff" + CLUSTER)
    assert code == 0, out


def test_invalid_yaml_says_its_own_line_and_column() -> None:
    (problem,) = problems("lake:\n  kafka_bootstrap: a:1\n  x: [1, 2\n")
    assert problem.startswith("c.yaml:4:1: <root>: not valid YAML: expected ',' or ']'"), problem
    assert "(while parsing a flow sequence at line 3, column 6)" in problem
    assert "unicode string" not in problem


def test_duplicate_keys_are_problems_among_the_others() -> None:
    text = CLUSTER + "metrics: {port: 1}\nmetrics: {port: 70000}\nlogging: {format: xml}\n"
    assert problems(text) == [
        "c.yaml:6:1: metrics: key 'metrics' is given twice in this mapping (lines 5 and 6); "
        "YAML keeps only one: remove or merge the other",
        "c.yaml:6: metrics.port: Input should be less than or equal to 65535 (got 70000)",
        "c.yaml:7: logging.format: Input should be 'text' or 'json' (got 'xml')",
    ]


@pytest.mark.parametrize("text", ["", "# nothing\n", "virtual_clusters: []\n", "metrics: {}\n"])
def test_nothing_to_run_is_refused(tmp_path: Path, text: str) -> None:
    code, out = check(tmp_path, text)
    assert code == 1 and "the file configures nothing to run: add virtual_clusters" in out


def test_a_lake_alone_is_for_the_pipeline_not_for_run(tmp_path: Path) -> None:
    text = "lake: {kafka_bootstrap: '127.0.0.1:9092'}\n"
    assert check(tmp_path, text)[0] == 0
    file = tmp_path / "c.yaml"
    result = CliRunner().invoke(build_cli(), ["run", "-c", str(file)])
    assert result.exit_code == 1
    assert "has a lake but no virtual_clusters and no services" in result.output
    assert "`bergstream pipeline run -c FILE --topic T`" in result.output


def test_bare_sections() -> None:
    assert problems("lake:\n") == ["c.yaml:1: lake.kafka_bootstrap: required key is missing"]
    config = parse_config(CLUSTER + "logging:\nmetrics:\n")
    assert config.logging.format == "text" and config.metrics is not None
    (problem,) = problems(CLUSTER + "logging: 3\n")
    assert problem == "c.yaml:5: logging: expected a mapping of keys here, got int 3"


def test_hosts_and_ports_of_kafka_and_listeners() -> None:
    text = textwrap.dedent(
        """\
        virtual_clusters:
          - name: a
            target: {bootstrap: "kafka1:99999,ok:9092"}
            gateway: {host: "not a host!!", port: 19092, advertised_host: "x y"}
          - name: b
            target: {bootstrap: "[::1]:9092,kafka_2.internal:9093"}
            gateway: {host: "::1", port: 29092}
        lake: {kafka_bootstrap: "k:0"}
        """
    )
    assert problems(text) == [
        "c.yaml:3: virtual_clusters[0].target.bootstrap: 'kafka1:99999': port 99999 is outside "
        "1-65535",
        "c.yaml:4: virtual_clusters[0].gateway.host: 'not a host!!' is not an IP address or host "
        "name: use e.g. 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or ::1",
        "c.yaml:4: virtual_clusters[0].gateway.advertised_host: 'x y' is not an IP address or "
        "host name: use e.g. 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or ::1",
        "c.yaml:8: lake.kafka_bootstrap: 'k:0': port 0 is outside 1-65535",
    ]


def test_listeners_of_one_process_on_one_port() -> None:
    text = textwrap.dedent(
        """\
        virtual_clusters:
          - name: a
            target: {bootstrap: "k:9092"}
            gateway: {port: 19092, broker_count: 3}
          - name: b
            target: {bootstrap: "k:9092"}
            gateway: {port: 19094, host: 0.0.0.0}
          - name: c
            target: {bootstrap: "k:9092"}
            gateway: {port: 19092, host: 127.0.0.2, broker_start_port: 39000}
        metrics: {port: 19093}
        """
    )
    assert problems(text) == [
        "c.yaml:7: virtual_clusters[1].gateway.port: virtual cluster 'b' bootstrap (port 19094) "
        "would listen where virtual cluster 'a' broker ports already does: give one of them "
        "other ports",
        "c.yaml:7: virtual_clusters[1].gateway.broker_count: virtual cluster 'b' broker ports "
        "(ports 19095-19097) would listen where virtual cluster 'a' broker ports already does: "
        "give one of them other ports",
        "c.yaml:11: metrics.port: the metrics endpoint (port 19093) would listen where virtual "
        "cluster 'a' broker ports already does: give one of them other ports",
    ]


def test_a_service_port_against_a_proxy_port() -> None:
    text = CLUSTER + textwrap.dedent(
        """\
        services:
          - type: isk
            config:
              kafka_bootstrap: "127.0.0.1:9092"
              http: {catalog_port: 19093, s3_port: 0, access_key: a, secret_key: b}
        """
    )
    from bergstream.core.plugins import load_registry

    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="c.yaml", registry=load_registry())
    assert [str(p) for p in caught.value.problems] == [
        "c.yaml:6: services[0]: services[0] ISK catalog (port 19093) would listen where virtual "
        "cluster 'demo' broker ports already does: give one of them other ports"
    ]


def test_field_errors_do_not_hide_the_cross_key_checks() -> None:
    cluster = "  - name: a\n    target: {bootstrap: 'h:1'}\n    gateway: {port: 1000}\n"
    broken = cluster.replace("{port: 1000}", "{port: 2000, broker_count: 0}")
    assert problems("virtual_clusters:\n" + cluster + broken) == [
        "c.yaml:7: virtual_clusters[1].gateway.broker_count: Input should be greater than or "
        "equal to 1 (got 0)",
        "c.yaml:5: virtual_clusters[1].name: virtual cluster name 'a' is also the name of "
        "virtual_clusters[0]: give each cluster its own name",
    ]


def test_an_unset_variable_is_one_problem_not_two() -> None:
    text = "lake:\n  kafka_bootstrap: ${NO_SUCH_BOOTSTRAP}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="c.yaml", env={})
    assert [p.path for p in caught.value.problems] == ["lake.kafka_bootstrap"]
    assert "NO_SUCH_BOOTSTRAP is not set" in caught.value.problems[0].message


def test_a_filter_that_refuses_its_settings_is_a_located_problem(tmp_path: Path) -> None:
    text = CLUSTER + "    filters:\n      - type: ksi\n"
    text += (
        CLUSTER.replace("virtual_clusters:\n", "")
        .replace("demo", "other")
        .replace("19092", "29092")
        + "    filters:\n      - type: ksi\n"
    )
    code, out = check(tmp_path, text)
    assert code == 1 and "Traceback" not in out
    lines = out.splitlines()
    assert lines[0] == (
        "c.yaml:6: virtual_clusters[0].filters[0]: virtual cluster 'demo' uses the ksi filter, "
        "which reads the coldset of the lake: section; add one (see examples/ksi.yaml)"
    )
    assert lines[1].startswith("c.yaml:11: virtual_clusters[1].filters[0]: virtual cluster 'other'")
    assert lines[2] == "c.yaml: 2 problem(s)"


def test_check_json(tmp_path: Path) -> None:
    code, out = check(tmp_path, CLUSTER + "metrics: {port: 70000}\n", "--json")
    assert code == 1
    assert json.loads(out) == {
        "file": "c.yaml",
        "ok": False,
        "problems": [
            {
                "file": "c.yaml",
                "line": 5,
                "column": None,
                "path": "metrics.port",
                "message": "Input should be less than or equal to 65535 (got 70000)",
            }
        ],
    }
    code, out = check(tmp_path, CLUSTER, "--json")
    assert code == 0
    assert json.loads(out) == {
        "file": "c.yaml",
        "ok": True,
        "problems": [],
        "virtual_clusters": 1,
        "filters": 0,
        "services": 0,
        "lake": False,
    }


def test_no_internal_class_names_in_any_problem(tmp_path: Path) -> None:
    text = "logging: []\nmetrics: 5\nlake: 3\nvirtual_clusters: {a: 1}\ncodecs: x\ntables: 1\n"
    code, out = check(tmp_path, text)
    assert code == 1
    for internal in ("Config", "Settings", "instance of", "model_type"):
        assert internal not in out, out


def test_show_fills_defaults_substitutes_and_masks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOW_PORT", "18999")
    file = tmp_path / "show.yaml"
    file.write_text(
        textwrap.dedent(
            """\
            services:
              - type: isk
                config:
                  kafka_bootstrap: "127.0.0.1:9092"
                  kafka_client: {security.protocol: SASL_PLAINTEXT, sasl.mechanism: PLAIN,
                                 sasl.username: u, sasl.password: hunter2}
                  http: {catalog_port: "${SHOW_PORT}", access_key: a, secret_key: s3cret}
            lake:
              kafka_bootstrap: "127.0.0.1:9092"
              catalog: {type: rest, uri: "https://user:pa55@catalog.example/api"}
              s3: {endpoint: "http://127.0.0.1:8333", access_key: k, secret_key: plain-secret}
            """
        )
    )
    result = CliRunner().invoke(build_cli(), ["config", "show", "--json", str(file)])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    isk = shown["services"][0]["config"]
    assert isk["http"]["catalog_port"] == 18999 and isk["http"]["s3_port"] == 19000
    assert isk["http"]["secret_key"] == MASK and isk["kafka_client"]["sasl.password"] == MASK
    assert isk["index"] == {
        "type": "sqlite",
        "config": {"path": None, "busy_timeout_seconds": 30.0},
    }
    assert shown["lake"]["s3"]["secret_key"] == MASK
    assert shown["lake"]["catalog"]["uri"] == f"https://user:{MASK}@catalog.example/api"
    assert shown["lake"]["pipeline"]["trigger_interval_seconds"] == 10.0  # a plugin's section
    assert shown["logging"] == {"format": "text", "level": "info"}
    for secret in ("hunter2", "s3cret", "plain-secret", "pa55"):
        assert secret not in result.output
    yaml_out = CliRunner().invoke(build_cli(), ["config", "show", str(file)]).output
    assert "catalog_port: 18999" in yaml_out and "hunter2" not in yaml_out
    assert load_config(file).services[0].type == "isk"


def test_show_refuses_a_broken_file_with_its_problems(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(CLUSTER + "metrics: {port: 70000}\n")
    result = CliRunner().invoke(build_cli(), ["config", "show", str(file)])
    assert result.exit_code == 1 and "metrics.port" in result.output


def test_masking_rules() -> None:
    masked = mask_secrets(
        {
            "token_ttl_seconds": 3600,
            "ssl_key_password": "x",
            "ca_file": "/etc/secret/ca.pem",
            "kafka_options": {"kafka.sasl.jaas.config": "Login required;"},
            "client_secret_file": "/run/secret",
            "note": "see http://a:b@h/",
            "empty_password": "",
        }
    )
    assert masked == {
        "token_ttl_seconds": 3600,
        "ssl_key_password": MASK,
        "ca_file": "/etc/secret/ca.pem",
        "kafka_options": {"kafka.sasl.jaas.config": MASK},
        "client_secret_file": "/run/secret",
        "note": f"see http://a:{MASK}@h/",
        "empty_password": "",
    }
