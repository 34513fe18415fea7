"""``examples/isk.yaml`` checks, and a wrong backend choice fails ``bergstream run`` early."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import BERGSTREAM

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "isk.yaml"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BERGSTREAM_")}
    return subprocess.run(
        [BERGSTREAM, *args], capture_output=True, text=True, env={**base, **env}, timeout=60
    )


def test_example_config_checks() -> None:
    result = run("config", "check", str(EXAMPLE), BERGSTREAM_KAFKA_BOOTSTRAP="127.0.0.1:9092")
    assert result.returncode == 0, result.stderr
    assert "1 service(s)" in result.stdout + result.stderr


def test_example_config_needs_the_kafka_bootstrap() -> None:
    result = run("config", "check", str(EXAMPLE))
    assert result.returncode != 0
    assert "BERGSTREAM_KAFKA_BOOTSTRAP" in result.stdout + result.stderr


def test_unknown_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      chunk_record: 5\n      http: {access_key: a, secret_key: b}\n"
    )
    result = run("config", "check", str(config))
    assert result.returncode != 0
    assert "chunk_record" in result.stdout + result.stderr


def test_an_unknown_parquet_codec_is_refused_with_the_choices(tmp_path: Path) -> None:
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      parquet_compression: brotli\n      http: {access_key: a, secret_key: b}\n"
    )
    result = run("config", "check", str(config))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "parquet_compression" in output and "brotli" in output
    assert "'snappy'" in output and "'zstd'" in output


def test_unknown_index_backend_fails_before_starting(tmp_path: Path) -> None:
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      index: {type: nosuch}\n      http: {access_key: a, secret_key: b}\n"
    )
    result = run("run", "-c", str(config), BERGSTREAM_HOME=str(tmp_path / "home"))
    assert result.returncode != 0
    assert "no index backend plugin named 'nosuch'" in result.stderr
    assert "bergstream: ready" not in result.stderr


def test_bad_backend_settings_fail_before_starting(tmp_path: Path) -> None:
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      cache: {type: local, config: {max_bytes: 5}}\n"
        "      http: {access_key: a, secret_key: b}\n"
    )
    result = run("run", "-c", str(config), BERGSTREAM_HOME=str(tmp_path / "home"))
    assert result.returncode != 0
    assert "max_bytes" in result.stderr


def test_unknown_file_synthesizer_fails_before_starting(tmp_path: Path) -> None:
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      synthesizers: [{type: nosuch}]\n      http: {access_key: a, secret_key: b}\n"
    )
    result = run("run", "-c", str(config), BERGSTREAM_HOME=str(tmp_path / "home"))
    assert result.returncode != 0
    assert "no file synthesizer plugin named 'nosuch'" in result.stderr
    assert "hotset-parquet" in result.stderr  # the installed ones are listed
    assert "bergstream: ready" not in result.stderr
