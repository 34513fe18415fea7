"""A Kafka Connect worker (distributed mode) of the stack's Kafka release, with Debezium's
Postgres connector and Apicurio Registry's converters on its plugin path.

The worker's jars (``connect-runtime``, ``connect-json``, ``connect-transforms`` at the brokers'
version) and each plugin's jars are resolved from Maven Central with the profiles of
``connect-pom.xml`` into ``<cache>/kafka-connect-<version>``: ``libs/`` is the worker's
classpath, ``plugins/<name>/`` one isolated plugin each. The worker keeps its connectors'
configs, offsets and statuses in three topics on the stack's Kafka (so connectors survive a
restart of the worker, not a Kafka started over) and serves its REST API on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from xml.sax.saxutils import quoteattr

from .kafka_broker import KAFKA_VERSION
from .maven import copy_dependencies, install_directory, pom_digest
from .paths import StackError, StackPaths
from .schema_registry import CCOMPAT_PATH

__all__ = [
    "APICURIO_AVRO_CONVERTER",
    "APICURIO_CONVERTER_VERSION",
    "CONNECT_PLUGINS",
    "CONNECT_VERSION",
    "DEBEZIUM_VERSION",
    "POSTGRES_CONNECTOR",
    "apicurio_avro_converter_config",
    "connect_command",
    "connect_dir",
    "connect_ready",
    "connect_url",
    "ensure_connect",
    "probe_connect",
    "worker_properties",
]

#: Connect runs from the brokers' release (``kafka.version`` in connect-pom.xml).
CONNECT_VERSION = KAFKA_VERSION

#: Debezium's release (every ``io.debezium`` artifact at this version).
DEBEZIUM_VERSION = "3.6.1.Final"

#: The Apicurio Registry serdes and converter release on the plugin path (the 2.6 line: the
#: 3.0.x artifacts do not resolve from Maven Central, see connect-pom.xml).
APICURIO_CONVERTER_VERSION = "2.6.13.Final"

#: The connector class of Debezium's Postgres connector.
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"

#: Apicurio's Avro converter (schemas registered in, and read from, the stack's registry).
APICURIO_AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"

#: The plugin directories under ``plugins/``: each a profile of connect-pom.xml.
CONNECT_PLUGINS: tuple[str, ...] = ("debezium-postgres", "apicurio-converter")

# The worker finds plugins through their ServiceLoader manifests (plugin.discovery=service_load:
# about 0.5 s, where scanning every class takes some 13 s on two cores). Apicurio's 2.x jars
# have none: the install adds a jar holding only the manifests, as Kafka's
# `connect-plugin-path sync-manifests` tool would.
_ADDED_MANIFESTS: dict[str, dict[str, tuple[str, ...]]] = {
    "apicurio-converter": {
        "org.apache.kafka.connect.storage.Converter": (
            APICURIO_AVRO_CONVERTER,
            "io.apicurio.registry.utils.converter.ExtJsonConverter",
        ),
    },
}
_MANIFEST_JAR = "bergstream-service-manifests.jar"

#: The worker group and its internal topics (one worker group per stack home).
GROUP_ID = "bergstream-connect"
CONFIG_TOPIC = "bergstream-connect-configs"
OFFSET_TOPIC = "bergstream-connect-offsets"
STATUS_TOPIC = "bergstream-connect-status"

_WORKER_PROFILE = "worker"
_WORKER_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"
_SENTINEL = ".complete"
# The registry's own (v2) API, which Apicurio's 2.x converters speak; Apicurio 3 serves it too.
_APICURIO_V2_PATH = "/apis/registry/v2"

# No proxies from the environment: the worker is on 127.0.0.1.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by `bergstream stack up`; rewritten on every start. -->
<Configuration status="warn" name="bergstream-kafka-connect">
  <Appenders>
    <RollingFile name="worker" fileName={worker} filePattern={worker_pattern}>
      <PatternLayout pattern="[%d] %p %X{{connector.context}}%m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="50 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %X{{connector.context}}%m (%c)%n"/>
      <ThresholdFilter level="WARN"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO">
      <AppenderRef ref="worker"/>
      <AppenderRef ref="stdout"/>
    </Root>
    <!-- Every client's full config at INFO would be most of the log. -->
    <Logger name="org.apache.kafka.clients.producer.ProducerConfig" level="WARN"/>
    <Logger name="org.apache.kafka.clients.consumer.ConsumerConfig" level="WARN"/>
    <Logger name="org.apache.kafka.clients.admin.AdminClientConfig" level="WARN"/>
    <Logger name="org.apache.kafka.common.config.AbstractConfig" level="WARN"/>
  </Loggers>
</Configuration>
"""


# --------------------------------------------------------------------------------------------
# Jars


def _pom_text() -> str:
    return (resources.files(__package__) / "connect-pom.xml").read_text(encoding="utf-8")


def connect_dir(paths: StackPaths) -> Path:
    """``<cache>/kafka-connect-<version>``: ``libs/`` (the worker) and ``plugins/<name>/``."""
    return paths.cache / f"kafka-connect-{CONNECT_VERSION}"


def connect_ready(paths: StackPaths) -> bool:
    """True if the worker's and every plugin's jars for the current pom are in the cache."""
    root = connect_dir(paths)
    sentinel = root / _SENTINEL
    return (
        sentinel.is_file()
        and sentinel.read_text().strip() == pom_digest(_pom_text())
        and (root / "libs").is_dir()
        and all((root / "plugins" / name).is_dir() for name in CONNECT_PLUGINS)
    )


def ensure_connect(paths: StackPaths | None = None) -> Path:
    """Make sure the worker's jars and the plugins are in ``connect_dir`` (resolving each
    profile of connect-pom.xml with ``mvn dependency:copy-dependencies`` the first time) and
    return that directory."""
    paths = paths or StackPaths.resolve()
    if not connect_ready(paths):
        with paths.cache_lock(f"kafka-connect-{CONNECT_VERSION}"):
            if not connect_ready(paths):
                _download(paths, connect_dir(paths))
    return connect_dir(paths)


def _download(paths: StackPaths, root: Path) -> None:
    pom = _pom_text()
    work = Path(tempfile.mkdtemp(prefix=f"kafka-connect-{CONNECT_VERSION}.", dir=paths.cache))
    try:
        staged = work / "staged"
        copy_dependencies(
            pom,
            work,
            staged / "libs",
            f"the Kafka Connect {CONNECT_VERSION} jars (cache {root})",
            profile=_WORKER_PROFILE,
            expect=f"connect-runtime-{CONNECT_VERSION}.jar",
        )
        for name in CONNECT_PLUGINS:
            plugin = staged / "plugins" / name
            copy_dependencies(
                pom, work, plugin, f"the Kafka Connect plugin {name} (cache {root})", profile=name
            )
            if name in _ADDED_MANIFESTS:
                write_manifest_jar(plugin / _MANIFEST_JAR, _ADDED_MANIFESTS[name])
        install_directory(staged, root, _SENTINEL, pom_digest(pom))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_manifest_jar(jar: Path, services: Mapping[str, tuple[str, ...]]) -> None:
    """Write ``jar`` holding only ServiceLoader manifests: ``META-INF/services/<interface>``
    listing the implementing classes, for each interface in ``services``."""
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
        for interface, classes in services.items():
            archive.writestr(f"META-INF/services/{interface}", "".join(c + "\n" for c in classes))


# --------------------------------------------------------------------------------------------
# Worker configuration and start


def worker_properties(
    bootstrap: str,
    port: int,
    plugin_path: Path,
    *,
    replication_factor: int = 1,
    client_settings: Mapping[str, str] | None = None,
) -> str:
    """The ``worker.properties`` of a distributed worker on 127.0.0.1:``port`` in the group
    ``bergstream-connect`` of the Kafka at ``bootstrap``, its internal topics with
    ``replication_factor``. ``client_settings`` (a secured Kafka's security protocol, stores and
    login) apply to the worker's own clients and to its connectors' producers, consumers and
    admin clients."""
    rf = str(replication_factor)
    props = {
        "bootstrap.servers": bootstrap,
        "group.id": GROUP_ID,
        "config.storage.topic": CONFIG_TOPIC,
        "offset.storage.topic": OFFSET_TOPIC,
        "status.storage.topic": STATUS_TOPIC,
        "config.storage.replication.factor": rf,
        "offset.storage.replication.factor": rf,
        "status.storage.replication.factor": rf,
        "offset.storage.partitions": "5",
        "status.storage.partitions": "1",
        # The default for connectors that name no converter: JSON with schemas, on the
        # worker's classpath.
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(port),
        "plugin.path": str(plugin_path),
        # Only plugins with ServiceLoader manifests (see _ADDED_MANIFESTS): no class scanning.
        "plugin.discovery": "service_load",
        # Source offsets committed every second (default 60 s), so a restarted worker repeats
        # little.
        "offset.flush.interval.ms": "1000",
        # A worker that comes back (new member id) gets its connectors at once, not after the
        # default 5 minutes.
        "scheduled.rebalance.max.delay.ms": "0",
    }
    for key, value in (client_settings or {}).items():
        for prefix in ("", "producer.", "consumer.", "admin."):
            props[prefix + key] = value
    lines = ["# Written by `bergstream stack up`; rewritten on every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def connect_log_config(logs: Path) -> str:
    """Log4j 2 config of the worker: ``logs/connect-worker.log`` (rolled by size), warnings
    also to stdout (``logs/connect.log``)."""
    return _LOG4J2.format(
        worker=quoteattr(str(logs / "connect-worker.log")),
        worker_pattern=quoteattr(str(logs / "connect-worker.log.%i")),
    )


def connect_command(
    paths: StackPaths,
    java: str,
    port: int,
    bootstrap: str,
    *,
    replication_factor: int = 1,
    client_settings: Mapping[str, str] | None = None,
) -> list[str]:
    """Write the worker's config files into ``home/connect`` and return its command line
    (``ConnectDistributed``); downloads the jars on first use. The arguments after ``bootstrap``
    are those of :func:`worker_properties`."""
    root = ensure_connect(paths)
    workdir = paths.component_dir("connect")
    workdir.mkdir(parents=True, exist_ok=True)
    props = workdir / "worker.properties"
    text = worker_properties(
        bootstrap,
        port,
        root / "plugins",
        replication_factor=replication_factor,
        client_settings=client_settings,
    )
    props.write_text(text, encoding="utf-8")
    props.chmod(0o600)  # a secured Kafka's password may be in it
    log_config = workdir / "log4j2.xml"
    log_config.write_text(connect_log_config(paths.logs), encoding="utf-8")
    return [
        java,
        "-Xmx512m",
        "-Xms128m",
        "-server",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log_config}",
        f"-Dkafka.logs.dir={paths.logs}",
        "-cp",
        f"{root / 'libs'}/*",
        _WORKER_MAIN,
        str(props),
    ]


# --------------------------------------------------------------------------------------------
# REST API


def connect_url(port: int) -> str:
    """The base URL of the worker's REST API (``GET <url>/connectors``)."""
    return f"http://127.0.0.1:{port}"


def _get_json(url: str, timeout: float) -> object:
    with _NO_PROXY.open(url, timeout=timeout) as response:
        return json.loads(response.read())


def probe_connect(port: int, timeout: float = 2.0) -> tuple[bool, str]:
    """(True, "") once the worker reports itself healthy (``GET /health``: started and in its
    group) and ``GET /connector-plugins`` lists Debezium's Postgres connector; else (False,
    what is missing)."""
    base = connect_url(port)
    try:
        _get_json(f"{base}/health", timeout)
    except urllib.error.HTTPError as exc:
        return False, f"GET /health answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError):
        return False, "REST API not answering"
    try:
        plugins = _get_json(f"{base}/connector-plugins", timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"GET /connector-plugins failed ({exc})"
    classes = (
        {p.get("class") for p in plugins if isinstance(p, dict)}
        if isinstance(plugins, list)
        else set()
    )
    if POSTGRES_CONNECTOR not in classes:
        return False, f"GET /connector-plugins does not list {POSTGRES_CONNECTOR}"
    return True, ""


def apicurio_avro_converter_config(
    registry_url: str, prefix: str = "value.converter"
) -> dict[str, str]:
    """Connector settings that make ``prefix`` (``value.converter`` or ``key.converter``)
    Apicurio's Avro converter on the stack's registry, writing Confluent's framing (magic byte
    and 4-byte schema id, the id the Confluent-compatible API ``registry_url`` serves), so any
    Confluent-compatible deserializer reads the records. ``registry_url`` is
    ``BERGSTREAM_SCHEMA_REGISTRY_URL`` (``http://127.0.0.1:PORT/apis/ccompat/v7``)."""
    base = registry_url.rstrip("/")
    if not base.endswith(CCOMPAT_PATH):
        raise StackError(f"{registry_url} is not an Apicurio ccompat URL (…{CCOMPAT_PATH})")
    v2 = base.removesuffix(CCOMPAT_PATH) + _APICURIO_V2_PATH
    return {
        prefix: APICURIO_AVRO_CONVERTER,
        f"{prefix}.apicurio.registry.url": v2,
        f"{prefix}.apicurio.registry.auto-register": "true",
        f"{prefix}.apicurio.registry.find-latest": "true",
        # The schema id in the value (Confluent's framing: magic byte 0, 4-byte id), not in
        # headers, and the id the Confluent-compatible API serves: the content id.
        f"{prefix}.apicurio.registry.headers.enabled": "false",
        f"{prefix}.apicurio.registry.id-handler": "io.apicurio.registry.serde.Legacy4ByteIdHandler",
        f"{prefix}.apicurio.registry.use-id": "contentId",
    }
