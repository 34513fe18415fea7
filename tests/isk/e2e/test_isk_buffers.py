"""``buffers:`` of the ``isk`` service: with ``pretouch`` the retained memory is resident before
``bergstream run`` says it is ready (its region mapped and every page present), the log says so,
and a bad value is refused by ``config check``. Kafka is unreachable here on purpose: ISK
serves anyway, so no broker is needed."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import BERGSTREAM

MIB = 1 << 20


def _config(tmp_path: Path, buffers: str) -> Path:
    config = tmp_path / "isk.yaml"
    config.write_text(
        "services:\n  - type: isk\n    config:\n      kafka_bootstrap: 127.0.0.1:1\n"
        "      http: {access_key: a, secret_key: b, catalog_port: 0, s3_port: 0}\n"
        f"      index: {{type: sqlite, config: {{path: {tmp_path / 'index.sqlite'}}}}}\n"
        f"      cache: {{type: local, config: {{directory: {tmp_path / 'cache'}}}}}\n"
        f"      buffers: {buffers}\n"
    )
    return config


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BERGSTREAM_")}


@contextlib.contextmanager
def _running(config: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``bergstream run -c config`` until it says it is ready: the process and its log so
    far; stopped with SIGTERM after, which it must exit 0 on."""
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [BERGSTREAM, "run", "-c", str(config)], stderr=stderr, env=_env()
        )
    try:
        deadline = time.monotonic() + 60
        while "bergstream: ready" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield process, log.read_text()
    finally:
        process.terminate()
        assert process.wait(30) == 0, log.read_text()


def _resident_kib_of_mapping(pid: int, size_kib: int) -> list[int]:
    """Rss of every mapping of exactly ``size_kib`` in ``pid``'s smaps."""
    found, current = [], None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line.startswith("Size:"):
            current = int(line.split()[1])
        elif line.startswith("Rss:") and current == size_kib:
            found.append(int(line.split()[1]))
    return found


def test_pretouched_buffer_memory_is_resident_when_ready(tmp_path: Path) -> None:
    config = _config(tmp_path, "{retained_bytes: 75497472, pretouch: true}")
    with _running(config, tmp_path / "isk.log") as (process, text):
        assert re.search(r"isk: 72 MiB of buffer memory touched in [\d.]+ s", text), text
        assert text.index("buffer memory touched") < text.index("bergstream: ready")
        assert 72 * 1024 in _resident_kib_of_mapping(process.pid, 72 * 1024)


def test_without_pretouch_the_region_is_not_resident(tmp_path: Path) -> None:
    config = _config(tmp_path, "{retained_bytes: 75497472}")
    with _running(config, tmp_path / "isk.log") as (process, text):
        assert "buffer memory touched" not in text
        resident = _resident_kib_of_mapping(process.pid, 72 * 1024)
        assert resident and max(resident) < 72 * 1024 // 2  # mapped, not touched yet


def test_a_negative_retained_size_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, "{retained_bytes: -1}")
    result = subprocess.run(
        [BERGSTREAM, "config", "check", str(config)],
        capture_output=True, text=True, env=_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "retained_bytes" in output and "greater than or equal to 0" in output


def test_a_region_the_system_refuses_leaves_buffers_to_the_allocator(tmp_path: Path) -> None:
    """1 PiB is more than a process can map: ISK warns, names the setting, and serves."""
    config = _config(tmp_path, "{retained_bytes: 1125899906842624, pretouch: true}")
    with _running(config, tmp_path / "isk.log") as (_, text):
        assert "isk: no buffer arena of 1073741824 MiB" in text, text
        assert "lower buffers.retained_bytes" in text and "buffer memory touched" not in text
