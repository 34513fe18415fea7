"""One launcher per component of the local stack (Kafka, S3, Redis, the Schema Registry,
PostgreSQL, Kafka Connect, a Kerberos KDC, Keycloak, Iceberg's REST catalog): the component's
prerequisites, ports, command, readiness probe and address, on top of its server module
(:mod:`.kafka_broker`, :mod:`.s3_server`...)."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import (
    kafka_broker,
    kafka_connect,
    kafka_logins,
    kafka_security,
    kdc_server,
    oidc_provider,
    postgres_server,
    redis_server,
    rest_catalog,
    s3_server,
    schema_registry,
)
from .env import S3_REGION
from .paths import COMPONENTS, StackPaths
from .ports import choose_ports
from .state_file import State
from .units import EXTRA_BROKER, kafka_shape, kafka_units, node_id

__all__ = ["LAUNCHERS", "Launcher", "Prereqs", "kafka_bootstrap", "launcher"]


@dataclass(frozen=True)
class Prereqs:
    """What a component's check found: the binary (or directory) to run, its version."""

    binary: str
    version: str


class Launcher:
    """How to start one component: check its prerequisites, choose its ports, write its
    config and command, probe its readiness, and tell its address."""

    name: str
    port_names: tuple[str, ...]
    comms: tuple[str, ...]  # executable names, to find processes stack.json lost
    ready_timeout: float
    stop_timeout: float
    #: Components this one needs: started with it (and ready before it starts), stopped after it.
    needs: tuple[str, ...] = ()

    def check(self) -> Prereqs:
        """Find what the component needs to run; a StackError says what is missing."""
        raise NotImplementedError

    def choose_ports(
        self, state: State, previous: dict[str, int] | None, exclude: set[int]
    ) -> dict[str, int]:
        """The unit's ports: its ``previous`` ones where still free, none of ``exclude``."""
        return choose_ports(self.port_names, previous, exclude)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        """Write the config of ``unit`` (its ports in ``entry``); return its command and
        environment (None: this process's)."""
        raise NotImplementedError

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        """(ready, why not) of the unit of ``entry``."""
        raise NotImplementedError

    def address(self, entry: dict[str, Any]) -> str:
        """The address clients use to reach the unit of ``entry``."""
        raise NotImplementedError


class _Kafka(Launcher):
    """Kafka: one process per node. The first node's state entry and working directory are
    ``kafka`` (it also keeps the cluster's shape: ``brokers``, ``security``, ``cluster_id``), the
    others' ``kafka-2``, ``kafka-3``..."""

    name = "kafka"
    port_names = ("broker", "controller")
    comms = ("java",)
    ready_timeout = 180.0
    stop_timeout = 60.0

    def check(self) -> Prereqs:
        java = kafka_broker.find_java()
        return Prereqs(java, kafka_broker.KAFKA_VERSION)

    def choose_ports(
        self, state: State, previous: dict[str, int] | None, exclude: set[int]
    ) -> dict[str, int]:
        names = self.port_names
        if kafka_shape(state)[1] != "plaintext":
            names = ("broker", "internal", "controller")
        return choose_ports(names, previous, exclude)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        brokers, security = kafka_shape(state)
        cluster_id = state.components["kafka"].setdefault(
            "cluster_id", kafka_broker.new_cluster_id()
        )
        controllers = {
            node_id(u): state.components[u]["ports"]["controller"] for u in kafka_units(brokers)
        }
        files = None
        if security != "plaintext":
            files = kafka_security.ensure_security_files(paths.home)
        oauth, kerberos = kafka_logins.broker_logins(paths.home, state)
        ports = entry["ports"]
        t0 = time.monotonic()
        argv = kafka_broker.prepare_broker(
            paths,
            pre.binary,
            ports["broker"],
            ports["controller"],
            cluster_id,
            name=unit,
            node_id=node_id(unit),
            controllers=controllers,
            internal_port=ports.get("internal"),
            security=security,
            files=files,
            oauth=oauth,
            kerberos=kerberos,
        )
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        if kafka_shape(state)[1] == "plaintext":
            ok = kafka_broker.probe_broker(entry["ports"]["broker"])
        else:
            # The client listener wants credentials: ask over the mutual-TLS INTERNAL listener,
            # as the brokers do, with their certificate.
            files = kafka_security.load_security_files(Path(state.home))
            context = kafka_broker.broker_ssl_context(files)
            ok = kafka_broker.probe_broker(entry["ports"]["internal"], ssl_context=context)
        return ok, "" if ok else "broker not registered yet"

    def address(self, entry: dict[str, Any]) -> str:
        return f"127.0.0.1:{entry['ports']['broker']}"


class _S3(Launcher):
    name = "s3"
    port_names = s3_server.S3_PORT_NAMES
    comms = ("weed",)
    ready_timeout = 90.0
    stop_timeout = 20.0

    def check(self) -> Prereqs:
        weed = s3_server.find_weed()
        return Prereqs(weed, s3_server.weed_version(weed))

    def choose_ports(
        self, state: State, previous: dict[str, int] | None, exclude: set[int]
    ) -> dict[str, int]:
        return s3_server.choose_s3_ports(previous, exclude)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        return s3_server.weed_command(
            paths, pre.binary, entry["ports"], state.s3_access_key, state.s3_secret_key
        )

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        status = s3_server.probe_s3(entry["ports"]["s3"], state.s3_access_key, state.s3_secret_key)
        if status == 200:
            return True, ""
        if status is None:
            return False, "S3 port not answering"
        return False, f"signed ListBuckets answered HTTP {status}"

    def address(self, entry: dict[str, Any]) -> str:
        return f"http://127.0.0.1:{entry['ports']['s3']}"


class _Redis(Launcher):
    name = "redis"
    port_names = ("redis",)
    comms = ("redis-server", "redis-check-rdb")
    ready_timeout = 30.0
    stop_timeout = 10.0

    def check(self) -> Prereqs:
        binary = redis_server.find_redis_server()
        return Prereqs(binary, redis_server.redis_version(binary))

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        return redis_server.redis_command(paths, pre.binary, entry["ports"]["redis"]), None

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = redis_server.probe_redis(entry["ports"]["redis"])
        return ok, "" if ok else "no PONG"

    def address(self, entry: dict[str, Any]) -> str:
        return f"redis://127.0.0.1:{entry['ports']['redis']}/0"


class _SchemaRegistry(Launcher):
    name = "schema-registry"
    port_names = ("http",)
    comms = ("java",)
    ready_timeout = 120.0
    stop_timeout = 20.0

    def check(self) -> Prereqs:
        java = kafka_broker.find_java(f"Apicurio Registry {schema_registry.APICURIO_VERSION}")
        return Prereqs(java, schema_registry.APICURIO_VERSION)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        t0 = time.monotonic()
        argv = schema_registry.registry_command(paths, pre.binary, entry["ports"]["http"])
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = schema_registry.probe_registry(entry["ports"]["http"])
        return ok, "" if ok else "GET /subjects did not answer 200"

    def address(self, entry: dict[str, Any]) -> str:
        return schema_registry.registry_url(entry["ports"]["http"])


class _Postgres(Launcher):
    """PostgreSQL for change data capture: its data directory is the component directory."""

    name = "postgres"
    port_names = ("postgres",)
    comms = ("postgres",)
    ready_timeout = 60.0
    stop_timeout = 30.0

    def check(self) -> Prereqs:
        bindir = postgres_server.find_postgres()
        postgres_server.run_as_prefix()  # as root: the postgres user and setpriv are there
        return Prereqs(str(bindir), postgres_server.postgres_version(bindir))

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        password = entry.setdefault("password", secrets.token_hex(16))
        t0 = time.monotonic()
        argv = postgres_server.postgres_command(
            paths, Path(pre.binary), entry["ports"]["postgres"], password
        )
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = postgres_server.probe_postgres(entry["ports"]["postgres"])
        return ok, "" if ok else "no connection accepted"

    def address(self, entry: dict[str, Any]) -> str:
        # No password: ``stack status`` prints it; ``stack env`` has the full URL.
        return postgres_server.postgres_url(entry["ports"]["postgres"])


class _Kdc(Launcher):
    """A Kerberos KDC (MIT ``krb5kdc``, realm ``BERGSTREAM.LOCAL``) for Kafka's SASL GSSAPI: its
    database in the component directory, keytabs and ``krb5.conf`` in ``home/security``."""

    name = "kdc"
    port_names = ("kdc",)
    comms = ("krb5kdc",)
    ready_timeout = 30.0
    stop_timeout = 10.0

    def check(self) -> Prereqs:
        tools = kdc_server.find_kdc_tools()
        kdc_server.ticket_lifetime()  # a bad $BERGSTREAM_KDC_TICKET_LIFETIME fails up front
        return Prereqs(tools.krb5kdc, kdc_server.kdc_version(tools))

    def choose_ports(
        self, state: State, previous: dict[str, int] | None, exclude: set[int]
    ) -> dict[str, int]:
        return kdc_server.choose_kdc_ports(previous, exclude)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        lifetime = kdc_server.ticket_lifetime()
        entry["ticket_lifetime"] = lifetime
        t0 = time.monotonic()
        argv, env = kdc_server.kdc_command(
            paths, kdc_server.find_kdc_tools(), entry["ports"]["kdc"], lifetime=lifetime
        )
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, env

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = kdc_server.probe_kdc(Path(state.home), entry["ports"]["kdc"])
        return ok, "" if ok else "kinit with admin's keytab got no ticket"

    def address(self, entry: dict[str, Any]) -> str:
        return f"127.0.0.1:{entry['ports']['kdc']}"


class _Oidc(Launcher):
    """Keycloak, the OIDC provider of Kafka's SASL OAUTHBEARER (realm ``bergstream``, clients
    ``admin`` and ``noaccess``; see :mod:`.oidc_provider`). Its address is the issuer URL."""

    name = "oidc"
    port_names = oidc_provider.PORT_NAMES
    comms = ("kc.sh", "java")
    ready_timeout = 120.0
    stop_timeout = 20.0

    def check(self) -> Prereqs:
        java, _ = oidc_provider.keycloak_java()
        oidc_provider.token_lifespan()  # a bad $BERGSTREAM_OIDC_TOKEN_LIFESPAN fails up front
        return Prereqs(java, oidc_provider.KEYCLOAK_VERSION)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        java, major = oidc_provider.keycloak_java()
        entry["token_lifespan"] = lifespan = oidc_provider.token_lifespan()
        t0 = time.monotonic()
        argv, env = oidc_provider.keycloak_command(paths, java, major, entry["ports"], lifespan)
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, env

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = oidc_provider.probe_oidc(entry["ports"]["http"])
        return ok, "" if ok else "GET <issuer>/.well-known/openid-configuration did not answer 200"

    def address(self, entry: dict[str, Any]) -> str:
        return oidc_provider.issuer_url(entry["ports"]["http"])


class _Connect(Launcher):
    """A Kafka Connect worker (distributed) on the stack's Kafka, with Debezium's connector."""

    name = "connect"
    port_names = ("http",)
    comms = ("java",)
    ready_timeout = 180.0
    stop_timeout = 30.0
    needs = ("kafka",)

    def check(self) -> Prereqs:
        java = kafka_broker.find_java(f"Kafka Connect {kafka_connect.CONNECT_VERSION}")
        return Prereqs(java, kafka_connect.CONNECT_VERSION)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        brokers, security = kafka_shape(state)
        settings = None
        if security != "plaintext":
            files = kafka_security.ensure_security_files(paths.home)
            user = kafka_security.ADMIN_USER
            settings = kafka_security.java_client_settings(files, security, user)
        t0 = time.monotonic()
        argv = kafka_connect.connect_command(
            paths,
            pre.binary,
            entry["ports"]["http"],
            kafka_bootstrap(state),
            replication_factor=kafka_broker.replication_factor(brokers),
            client_settings=settings,
        )
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        return kafka_connect.probe_connect(entry["ports"]["http"])

    def address(self, entry: dict[str, Any]) -> str:
        return kafka_connect.connect_url(entry["ports"]["http"])


class _RestCatalog(Launcher):
    """Apache Iceberg's REST catalog server (``iceberg-open-api``): tables in SQLite in the
    component directory, files in the bucket ``rest-catalog`` of the stack's S3."""

    name = "rest-catalog"
    port_names = ("http",)
    comms = ("java",)
    ready_timeout = 90.0
    stop_timeout = 20.0
    needs = ("s3",)

    def check(self) -> Prereqs:
        java = kafka_broker.find_java(
            f"Iceberg's REST catalog server {rest_catalog.ICEBERG_REST_VERSION}"
        )
        return Prereqs(java, rest_catalog.ICEBERG_REST_VERSION)

    def launch(
        self, paths: StackPaths, state: State, unit: str, entry: dict[str, Any], pre: Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        t0 = time.monotonic()
        classpath = rest_catalog.ensure_rest_catalog(paths, pre.binary)
        endpoint = LAUNCHERS["s3"].address(state.components["s3"])
        access_key, secret_key = state.s3_access_key, state.s3_secret_key
        s3_server.ensure_bucket(endpoint, access_key, secret_key, rest_catalog.WAREHOUSE_BUCKET)
        env = dict(os.environ)
        env.update(
            rest_catalog.catalog_environment(paths, endpoint, access_key, secret_key, S3_REGION)
        )
        argv = rest_catalog.rest_catalog_command(classpath, pre.binary, entry["ports"]["http"])
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, env

    def probe(self, state: State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = rest_catalog.probe_rest_catalog(entry["ports"]["http"])
        return ok, "" if ok else "GET /v1/config did not answer 200"

    def address(self, entry: dict[str, Any]) -> str:
        return rest_catalog.rest_catalog_url(entry["ports"]["http"])


#: The launcher of each component, by name.
LAUNCHERS: dict[str, Launcher] = {
    c.name: c
    for c in (
        _Kafka(),
        _S3(),
        _Redis(),
        _Kdc(),
        _Oidc(),
        _SchemaRegistry(),
        _Postgres(),
        _Connect(),
        _RestCatalog(),
    )
}
assert set(LAUNCHERS) == set(COMPONENTS)


def launcher(unit: str) -> Launcher:
    """The launcher of a unit (every Kafka node's is Kafka's)."""
    return LAUNCHERS["kafka"] if EXTRA_BROKER.fullmatch(unit) else LAUNCHERS[unit]


def kafka_bootstrap(state: State) -> str:
    """The client addresses of every Kafka node, comma-separated."""
    return ",".join(
        LAUNCHERS["kafka"].address(state.components[u]) for u in kafka_units(kafka_shape(state)[0])
    )
