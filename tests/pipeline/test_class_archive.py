"""The Spark driver's class archive: named by JVM and jars, written under a name of its own and
renamed only after its JVM exited cleanly, then mapped by the next start (a real Spark start in
a fresh cache for the last test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bergstream.pipeline.class_archive import ClassArchive, class_archive_for, with_java_options

CONF = {"spark.jars.packages": "a:b:1", "spark.driver.memory": "1g"}


def test_one_archive_per_jvm_and_jars(tmp_path: Path) -> None:
    archive = class_archive_for(CONF, tmp_path)
    assert archive is not None
    assert archive.path.parent == tmp_path / "class-archives"
    assert archive == class_archive_for({**CONF, "spark.driver.memory": "2g"}, tmp_path)
    assert archive != class_archive_for({**CONF, "spark.jars.packages": "a:b:2"}, tmp_path)
    assert archive != class_archive_for({**CONF, "spark.jars": "/x.jar"}, tmp_path)


def test_without_a_java_there_is_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert class_archive_for(CONF, tmp_path) is None


def test_write_at_exit_until_the_archive_is_in_place(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "class-archives" / "spark-x.jsa")
    options = archive.java_options()
    assert f"-XX:ArchiveClassesAtExit={archive.pending}" in options
    assert str(os.getpid()) in archive.pending.name and "-Xlog:cds=off" in options
    archive.path.write_bytes(b"archive")
    assert archive.java_options().startswith(f"-XX:SharedArchiveFile={archive.path} ")


def test_pending_archives_of_dead_processes_are_removed(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "spark-x.jsa")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f".spark-x.jsa.{dead.pid}.tmp"
    alive = tmp_path / f".spark-x.jsa.{os.getppid()}.tmp"
    abandoned.write_bytes(b"half")
    alive.write_bytes(b"half")
    archive.java_options()
    assert not abandoned.exists() and alive.exists()


def _jvm_like(script: str) -> subprocess.Popen[bytes]:
    """A child that waits for its stdin to close, as PySpark's gateway does, then runs
    ``script``."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdin.read()\n{script}"], stdin=subprocess.PIPE
    )


def test_renamed_into_place_once_the_jvm_exited_cleanly(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "spark-x.jsa")
    jvm = _jvm_like(f"open({str(archive.pending)!r}, 'wb').write(b'classes')")
    archive._publish(jvm)
    assert archive.path.read_bytes() == b"classes" and not archive.pending.exists()


def test_a_failed_jvm_leaves_no_archive(tmp_path: Path) -> None:
    archive = ClassArchive(tmp_path / "spark-x.jsa")
    jvm = _jvm_like(f"open({str(archive.pending)!r}, 'wb').write(b'cla')\nsys.exit(1)")
    archive._publish(jvm)
    assert not archive.path.exists() and not archive.pending.exists()


def test_the_drivers_own_options_come_first() -> None:
    merged = with_java_options({"spark.driver.extraJavaOptions": "-Dx=1"}, "-XX:A")
    assert merged["spark.driver.extraJavaOptions"] == "-Dx=1 -XX:A"
    assert with_java_options({}, "-XX:A")["spark.driver.extraJavaOptions"] == "-XX:A"


START = textwrap.dedent(
    """
    import json, sys
    from bergstream.pipeline.session import build_session
    spark = build_session({"spark.driver.memory": "1g"}, "local[1]")
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    flags = [str(flag) for flag in runtime.getInputArguments()]
    print(json.dumps({"flags": flags, "rows": spark.sql("select 1 as x").collect()[0].x}))
    spark.stop()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_first_start_writes_the_archive_the_next_maps_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ivy = Path(os.environ.get("BERGSTREAM_CACHE") or Path.home() / ".cache" / "bergstream")
    (cache / "ivy").parent.mkdir(parents=True)
    (cache / "ivy").symlink_to((ivy / "ivy").resolve())  # the jars, not the archives
    env = {**os.environ, "BERGSTREAM_CACHE": str(cache), "SPARK_LOCAL_IP": "127.0.0.1"}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(done.stdout.strip().splitlines()[-1])
    archives = list((cache / "class-archives").iterdir())
    assert [path.suffix for path in archives] == [".jsa"], archives  # no pending file left
    first, second = (json.loads(run) for run in runs)
    assert any(f.startswith("-XX:ArchiveClassesAtExit=") for f in first["flags"])
    assert f"-XX:SharedArchiveFile={archives[0]}" in second["flags"]
    assert first["rows"] == second["rows"] == 1
