"""Apache Kafka (KRaft nodes, each broker and controller) from Maven Central jars, on the JDK."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from xml.sax.saxutils import quoteattr

from bergstream.core.api import ApiKey

from . import kafka_security
from .kafka_security import SecurityFiles
from .maven import copy_dependencies, pom_digest
from .paths import StackError, StackPaths
from .procs import find_executable

__all__ = [
    "KAFKA_TOOL_ALIASES",
    "KAFKA_VERSION",
    "ensure_kafka_libs",
    "find_java",
    "kafka_tool_command",
]

#: The pinned Kafka release (must equal ``kafka.version`` in kafka-pom.xml).
KAFKA_VERSION = "4.3.1"

#: Kafka 4.x needs Java 17 for the broker and the tools.
MIN_JAVA = 17

#: Short names (as the ``kafka-<name>.sh`` scripts) for Kafka's own command-line tools.
KAFKA_TOOL_ALIASES: dict[str, str] = {
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "share-consumer-perf-test": "org.apache.kafka.tools.ShareConsumerPerformance",
    "e2e-latency": "org.apache.kafka.tools.EndToEndLatency",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "streams-groups": "org.apache.kafka.tools.streams.StreamsGroupCommand",
    "groups": "org.apache.kafka.tools.GroupsCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "configs": "kafka.admin.ConfigCommand",
    "acls": "org.apache.kafka.tools.AclCommand",
    "log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "dump-log": "org.apache.kafka.tools.DumpLogSegments",
    "metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "features": "org.apache.kafka.tools.FeatureCommand",
    "cluster": "org.apache.kafka.tools.ClusterTool",
    "broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
    "verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "storage": "kafka.tools.StorageTool",
}

_BROKER_MAIN = "kafka.Kafka"
_STORAGE_MAIN = "kafka.tools.StorageTool"
_SENTINEL = ".complete"
_INSTALL_JAVA = (
    "install a JDK >= 17 (Debian/Ubuntu: `apt-get install -y openjdk-17-jre-headless`) "
    "or set JAVA_HOME"
)

_TOOLS_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Kafka command-line tools run by bergstream: warnings and errors to stderr only. -->
<Configuration status="error" name="bergstream-kafka-tools">
  <Appenders>
    <Console name="stderr" target="SYSTEM_ERR">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="WARN">
      <AppenderRef ref="stderr"/>
    </Root>
  </Loggers>
</Configuration>
"""

_BROKER_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by `bergstream stack up`; rewritten on every start. -->
<Configuration status="warn" name="bergstream-kafka-broker">
  <Appenders>
    <RollingFile name="server" fileName={server} filePattern={server_pattern}>
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="50 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
    <RollingFile name="controller" fileName={controller} filePattern={controller_pattern}>
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="20 MB"/></Policies>
      <DefaultRolloverStrategy max="2"/>
    </RollingFile>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <ThresholdFilter level="WARN"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO">
      <AppenderRef ref="server"/>
      <AppenderRef ref="stdout"/>
    </Root>
    <Logger name="org.apache.kafka.controller" level="INFO" additivity="false">
      <AppenderRef ref="controller"/>
    </Logger>
    <Logger name="org.apache.kafka.raft" level="INFO" additivity="false">
      <AppenderRef ref="controller"/>
    </Logger>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.authorizer.logger" level="WARN"/>
  </Loggers>
</Configuration>
"""


# --------------------------------------------------------------------------------------------
# Prerequisites and jars


def find_java(needed_by: str = f"Kafka {KAFKA_VERSION}") -> str:
    """The ``java`` executable (``$JAVA_HOME/bin/java`` first, then ``$PATH``), checked to be
    Java >= 17; raises StackError saying how to install one (and that ``needed_by`` needs it)."""
    java = None
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            java = str(candidate)
    java = java or find_executable("java")
    if java is None:
        raise StackError(
            f"{needed_by} needs Java {MIN_JAVA}+, but `java` was not found: {_INSTALL_JAVA}"
        )
    major = _java_major(java)
    if major is not None and major < MIN_JAVA:
        raise StackError(
            f"{needed_by} needs Java {MIN_JAVA}+, but {java} is Java {major}: {_INSTALL_JAVA}"
        )
    return java


def _java_major(java: str) -> int | None:
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392"
        major = int(match.group(2))
    return major


def _pom_text() -> str:
    return (resources.files(__package__) / "kafka-pom.xml").read_text(encoding="utf-8")


def kafka_dir(paths: StackPaths) -> Path:
    """``<cache>/kafka-<version>``: the jars (``libs/``) and the tools' log config."""
    return paths.cache / f"kafka-{KAFKA_VERSION}"


def libs_ready(paths: StackPaths) -> bool:
    """True if the Kafka jars for the current pom are in the cache."""
    root = kafka_dir(paths)
    sentinel = root / _SENTINEL
    if not sentinel.is_file():
        return False
    return sentinel.read_text().strip() == pom_digest(_pom_text()) and (root / "libs").is_dir()


def ensure_kafka_libs(paths: StackPaths | None = None) -> Path:
    """Make sure Kafka's jars are in ``<cache>/kafka-<version>/libs`` (resolving the pinned pom
    with ``mvn dependency:copy-dependencies`` the first time) and return that directory."""
    paths = paths or StackPaths.resolve()
    root = kafka_dir(paths)
    if not libs_ready(paths):
        with paths.cache_lock(f"kafka-{KAFKA_VERSION}"):
            if not libs_ready(paths):
                _download_libs(paths, root)
    _write_if_changed(root / "config" / "tools-log4j2.xml", _TOOLS_LOG4J2)
    return root / "libs"


def _download_libs(paths: StackPaths, root: Path) -> None:
    pom = _pom_text()
    work = Path(tempfile.mkdtemp(prefix=f"kafka-{KAFKA_VERSION}.", dir=paths.cache))
    try:
        libs = work / "libs"
        copy_dependencies(
            pom,
            work,
            libs,
            f"the Kafka {KAFKA_VERSION} jars (cache {root})",
            expect=f"kafka_2.13-{KAFKA_VERSION}.jar",
        )
        (root / "libs").parent.mkdir(parents=True, exist_ok=True)
        old = root / "libs"
        if old.exists():
            shutil.rmtree(old)
        libs.rename(old)
        (root / _SENTINEL).write_text(pom_digest(pom) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def kafka_tool_command(
    main_class_or_alias: str, *args: str, cache_dir: Path | None = None
) -> list[str]:
    """Build ``java -cp <libs>/* <MainClass> args...`` for one of Kafka's own tools.

    ``main_class_or_alias`` is a fully qualified class name or an alias from
    ``KAFKA_TOOL_ALIASES`` (``console-consumer``, ``kafka-topics.sh``, ...). The tool logs only
    warnings, to stderr, so its stdout carries just its output. Downloads the jars on first use;
    ``cache_dir`` overrides ``$BERGSTREAM_CACHE``.
    """
    main = _tool_main(main_class_or_alias)
    paths = StackPaths.resolve(cache=cache_dir)
    java = find_java()
    libs = ensure_kafka_libs(paths)
    log_config = kafka_dir(paths) / "config" / "tools-log4j2.xml"
    return [
        java,
        "-Xmx512m",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def _tool_main(name: str) -> str:
    alias = name.removesuffix(".sh").removeprefix("kafka-")
    if alias in KAFKA_TOOL_ALIASES:
        return KAFKA_TOOL_ALIASES[alias]
    if "." in name and not name.endswith(".sh"):
        return name
    known = ", ".join(sorted(KAFKA_TOOL_ALIASES))
    raise StackError(f"unknown Kafka tool {name!r}: use a main class name or one of: {known}")


# --------------------------------------------------------------------------------------------
# Broker configuration and start


def new_cluster_id() -> str:
    """A random KRaft cluster id (URL-safe base64 of a UUID, never starting with '-')."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def replication_factor(brokers: int) -> int:
    """The replication factor of new and internal topics on a cluster of ``brokers``."""
    return min(3, brokers)


def server_properties(
    data_dir: Path,
    port: int,
    controller_port: int,
    *,
    node_id: int = 1,
    controllers: Mapping[int, int] | None = None,
    internal_port: int | None = None,
    security: str = "plaintext",
    files: SecurityFiles | None = None,
    oauth: kafka_security.OAuthValidation | None = None,
    kerberos: kafka_security.KerberosService | None = None,
) -> str:
    """The ``server.properties`` of one node (KRaft combined broker+controller, 127.0.0.1 only).

    ``controllers`` maps every node id of the cluster to its controller port (the static quorum;
    default: this node alone). Plaintext: a ``PLAINTEXT`` listener on ``port`` for clients and
    brokers. Secured (``sasl_ssl`` or ``ssl``, with ``files`` and ``internal_port``): the client
    listener ``SASL_SSL`` or ``SSL`` on ``port``, brokers talk over ``INTERNAL`` on
    ``internal_port``, and ``INTERNAL`` and ``CONTROLLER`` take only mutual TLS.
    """
    controllers = dict(controllers or {node_id: controller_port})
    if controllers.get(node_id) != controller_port:
        raise ValueError(f"node {node_id} must be a voter on port {controller_port}")
    rf = str(replication_factor(len(controllers)))
    voters = ",".join(f"{node}@127.0.0.1:{cport}" for node, cport in sorted(controllers.items()))
    client = kafka_security.client_listener(security)
    if client == "PLAINTEXT":
        listeners = {"PLAINTEXT": port, "CONTROLLER": controller_port}
        advertised = {"PLAINTEXT": port}
        inter_broker = "PLAINTEXT"
        protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    else:
        if files is None or internal_port is None:
            raise ValueError(f"a {security} broker needs its TLS files and an internal port")
        listeners = {client: port, "INTERNAL": internal_port, "CONTROLLER": controller_port}
        advertised = {client: port, "INTERNAL": internal_port}
        inter_broker = "INTERNAL"
        protocols = f"CONTROLLER:SSL,INTERNAL:SSL,{client}:{client}"
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": ",".join(f"{name}://127.0.0.1:{p}" for name, p in listeners.items()),
        "advertised.listeners": ",".join(
            f"{name}://127.0.0.1:{p}" for name, p in advertised.items()
        ),
        "inter.broker.listener.name": inter_broker,
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": protocols,
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": rf,
        # 1, so that producing with acks=all goes on while one broker of three is down.
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        # Time-based retention is checked every 5 s (default 5 min), so tests can age data out.
        "log.retention.check.interval.ms": "5000",
    }
    if files is not None and client != "PLAINTEXT":
        props.update(
            kafka_security.server_security_properties(
                files, security, oauth=oauth, kerberos=kerberos
            )
        )
    lines = ["# Written by `bergstream stack up`; rewritten on every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def broker_log_config(logs: Path, name: str = "kafka") -> str:
    """Log4j 2 config for the broker ``name`` (``kafka``, ``kafka-2``...):
    ``logs/<name>-server.log`` and ``logs/<name>-controller.log`` (rolled by size), warnings also
    to stdout (``logs/<name>.log``)."""
    return _BROKER_LOG4J2.format(
        server=quoteattr(str(logs / f"{name}-server.log")),
        server_pattern=quoteattr(str(logs / f"{name}-server.log.%i")),
        controller=quoteattr(str(logs / f"{name}-controller.log")),
        controller_pattern=quoteattr(str(logs / f"{name}-controller.log.%i")),
    )


def prepare_broker(
    paths: StackPaths,
    java: str,
    port: int,
    controller_port: int,
    cluster_id: str,
    *,
    name: str = "kafka",
    node_id: int = 1,
    controllers: Mapping[int, int] | None = None,
    internal_port: int | None = None,
    security: str = "plaintext",
    files: SecurityFiles | None = None,
    oauth: kafka_security.OAuthValidation | None = None,
    kerberos: kafka_security.KerberosService | None = None,
) -> list[str]:
    """Write the config files of the broker ``name`` (node ``node_id``; its working directory
    is ``paths.component_dir(name)``), format its storage on first start (with the SCRAM users
    when ``security`` is ``sasl_ssl``) and return its command line. The arguments after
    ``cluster_id`` are those of ``server_properties``."""
    libs = ensure_kafka_libs(paths)
    controllers = dict(controllers or {node_id: controller_port})
    workdir = paths.component_dir(name)
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    props = workdir / "server.properties"
    text = server_properties(
        data,
        port,
        controller_port,
        node_id=node_id,
        controllers=controllers,
        internal_port=internal_port,
        security=security,
        files=files,
        oauth=oauth,
        kerberos=kerberos,
    )
    # Owner-only: a secured broker's file holds the PLAIN users' passwords.
    fd = os.open(props, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(props, 0o600)
    log_config = workdir / "log4j2.xml"
    log_config.write_text(broker_log_config(paths.logs, name), encoding="utf-8")
    classpath = f"{libs}/*"
    if not (data / "meta.properties").is_file():
        tools_log = kafka_dir(paths) / "config" / "tools-log4j2.xml"
        cmd = [
            java,
            "-Xmx256m",
            f"-Dlog4j2.configurationFile={tools_log}",
            "-cp",
            classpath,
            _STORAGE_MAIN,
            "format",
            "--config",
            str(props),
            "--cluster-id",
            cluster_id,
            "--ignore-formatted",
        ]
        if security == "sasl_ssl" and files is not None:
            cmd += kafka_security.scram_format_args(files)
        try:
            out = subprocess.run(
                cmd, cwd=workdir, capture_output=True, text=True, timeout=300, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"formatting the storage of {name} timed out after 300 s") from exc
        if out.returncode != 0:
            raise StackError(
                f"formatting the storage of {name} failed (exit {out.returncode}):\n"
                f"{(out.stdout + out.stderr).strip()}"
            )
    return [
        java,
        # Several brokers share a small machine: 512 MiB each is plenty for a dev cluster.
        "-Xmx512m" if len(controllers) > 1 else "-Xmx1g",
        "-Xms256m",
        "-server",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log_config}",
        f"-Dkafka.logs.dir={paths.logs}",
        *kafka_security.broker_java_options(oauth, kerberos),
        "-cp",
        classpath,
        _BROKER_MAIN,
        str(props),
    ]


# --------------------------------------------------------------------------------------------
# Readiness: ApiVersions, then Metadata listing this broker, over a raw socket.


def _request(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    client_id = b"bergstream-stack"
    header = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    frame = header + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    size = struct.unpack(">i", _read_exact(sock, 4))[0]
    payload = _read_exact(sock, size)
    if struct.unpack(">i", payload[:4])[0] != corr:
        raise OSError("correlation id mismatch")
    return payload[4:]


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return bytes(buf)


def _read_string(data: bytes, pos: int) -> tuple[str | None, int]:
    (length,) = struct.unpack_from(">h", data, pos)
    pos += 2
    if length < 0:
        return None, pos
    return data[pos : pos + length].decode(), pos + length


def broker_ssl_context(files: SecurityFiles) -> ssl.SSLContext:
    """A TLS client context that trusts the stack's CA and presents the brokers' own
    certificate (for ``probe_broker`` on a secured broker's ``INTERNAL`` listener)."""
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.load_cert_chain(str(files.broker_keystore))
    return context


def probe_broker(
    port: int,
    host: str = "127.0.0.1",
    timeout: float = 2.0,
    ssl_context: ssl.SSLContext | None = None,
) -> bool:
    """True once the broker answers ApiVersions and its Metadata lists itself (registered and
    unfenced, i.e. ready to serve produce and fetch). With ``ssl_context`` the connection is
    TLS (a secured broker's mutual-TLS ``INTERNAL`` listener)."""
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
            if ssl_context is not None:
                sock = stack.enter_context(ssl_context.wrap_socket(sock, server_hostname=host))
            sock.settimeout(timeout)
            body = _request(sock, ApiKey.API_VERSIONS, 0, 1, b"")
            (error,) = struct.unpack_from(">h", body, 0)
            if error != 0:
                return False
            (count,) = struct.unpack_from(">i", body, 2)
            ranges = {}
            for i in range(count):
                key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * i)
                ranges[key] = (low, high)
            low, high = ranges.get(ApiKey.METADATA, (0, -1))
            version = min(high, 8)
            if version < max(low, 4):
                return False
            request = struct.pack(">ib", 0, 0)  # no topics, allow_auto_topic_creation=false
            if version >= 8:
                request += struct.pack(">bb", 0, 0)
            meta = _request(sock, ApiKey.METADATA, version, 2, request)
            pos = 4  # throttle_time_ms
            (brokers,) = struct.unpack_from(">i", meta, pos)
            pos += 4
            ports = []
            for _ in range(brokers):
                pos += 4  # node_id
                _host, pos = _read_string(meta, pos)
                (broker_port,) = struct.unpack_from(">i", meta, pos)
                pos += 4
                _rack, pos = _read_string(meta, pos)
                ports.append(broker_port)
            return port in ports
    except (OSError, struct.error, UnicodeDecodeError):
        return False
