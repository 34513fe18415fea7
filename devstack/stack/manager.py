"""``stack up`` / ``stack down`` / ``stack status`` / ``stack env``: the local stack by PID."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import (
    kafka_broker,
    kafka_connect,
    kafka_security,
    postgres_server,
    redis_server,
    s3_server,
    schema_registry,
)
from .attached import stop_attached
from .env import StackEnv
from .paths import COMPONENTS, DEFAULT_COMPONENTS, StackError, StackPaths
from .ports import free_ports, port_is_free, wait_closed
from .procs import START_MARK, find_strays, owned, pid_alive, spawn_detached, terminate

__all__ = ["stack_down", "stack_env", "stack_status", "stack_up"]

_STATE_FORMAT = 1
_S3_ACCESS_KEY = "bergstream"
_UP_HINT = "run `bergstream stack up`"
# How the servers' logs say that a port was taken ("seems to be in use": Quarkus, i.e. Apicurio).
_PORT_TAKEN = ("already in use", "seems to be in use")
_DOWN_HINT = "run `bergstream stack down` first"
# Kafka's nodes after the first: their state entries and working directories.
_EXTRA_BROKER = re.compile(r"kafka-([2-9]|[1-9][0-9]+)")


# --------------------------------------------------------------------------------------------
# State: home/stack.json


@dataclass
class _State:
    home: str
    s3_access_key: str
    s3_secret_key: str
    components: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _STATE_FORMAT,
                "home": self.home,
                "s3_access_key": self.s3_access_key,
                "s3_secret_key": self.s3_secret_key,
                "components": self.components,
            },
            indent=2,
            sort_keys=True,
        )


def _load(paths: StackPaths, *, create: bool) -> _State | None:
    try:
        raw = json.loads(paths.state_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not create:
            return None
        return _State(
            home=str(paths.home),
            s3_access_key=_S3_ACCESS_KEY,
            s3_secret_key=secrets.token_hex(20),
        )
    except (OSError, ValueError) as exc:
        raise StackError(
            f"cannot read {paths.state_file} ({exc}); stop any servers left running by hand, "
            f"remove the file, then {_UP_HINT}"
        ) from exc
    return _State(
        home=raw.get("home", str(paths.home)),
        s3_access_key=raw.get("s3_access_key") or _S3_ACCESS_KEY,
        s3_secret_key=raw.get("s3_secret_key") or secrets.token_hex(20),
        components={k: dict(v) for k, v in raw.get("components", {}).items()},
    )


def _save(paths: StackPaths, state: _State) -> None:
    tmp = paths.state_file.with_name(f".stack.json.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the S3 secret
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(state.to_json() + "\n")
    tmp.replace(paths.state_file)


@contextlib.contextmanager
def _locked(paths: StackPaths) -> Iterator[None]:
    paths.home.mkdir(parents=True, exist_ok=True)
    with open(paths.lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Components


@dataclass(frozen=True)
class _Prereqs:
    binary: str
    version: str


class _Component:
    name: str
    port_names: tuple[str, ...]
    comms: tuple[str, ...]  # executable names, to find processes stack.json lost
    ready_timeout: float
    stop_timeout: float
    #: Components this one needs: started with it (and ready before it starts), stopped after it.
    needs: tuple[str, ...] = ()

    def check(self) -> _Prereqs:
        raise NotImplementedError

    def choose_ports(
        self, state: _State, previous: dict[str, int] | None, exclude: set[int]
    ) -> dict[str, int]:
        return _choose_ports(self.port_names, previous, exclude)

    def launch(
        self, paths: StackPaths, state: _State, unit: str, entry: dict[str, Any], pre: _Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        raise NotImplementedError

    def probe(self, state: _State, entry: dict[str, Any]) -> tuple[bool, str]:
        raise NotImplementedError

    def address(self, entry: dict[str, Any]) -> str:
        raise NotImplementedError


class _Kafka(_Component):
    """Kafka: one process per node. The first node's state entry and working directory are
    ``kafka`` (it also keeps the cluster's shape: ``brokers``, ``security``, ``cluster_id``), the
    others' ``kafka-2``, ``kafka-3``..."""

    name = "kafka"
    port_names = ("broker", "controller")
    comms = ("java",)
    ready_timeout = 180.0
    stop_timeout = 60.0

    def check(self) -> _Prereqs:
        java = kafka_broker.find_java()
        return _Prereqs(java, kafka_broker.KAFKA_VERSION)

    def choose_ports(
        self, state: _State, previous: dict[str, int] | None, exclude: set[int]
    ) -> dict[str, int]:
        names = self.port_names
        if _kafka_shape(state)[1] != "plaintext":
            names = ("broker", "internal", "controller")
        return _choose_ports(names, previous, exclude)

    def launch(
        self, paths: StackPaths, state: _State, unit: str, entry: dict[str, Any], pre: _Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        brokers, security = _kafka_shape(state)
        cluster_id = state.components["kafka"].setdefault(
            "cluster_id", kafka_broker.new_cluster_id()
        )
        controllers = {
            _node_id(u): state.components[u]["ports"]["controller"] for u in _kafka_units(brokers)
        }
        files = None
        if security != "plaintext":
            files = kafka_security.ensure_security_files(paths.home)
        ports = entry["ports"]
        t0 = time.monotonic()
        argv = kafka_broker.prepare_broker(
            paths,
            pre.binary,
            ports["broker"],
            ports["controller"],
            cluster_id,
            name=unit,
            node_id=_node_id(unit),
            controllers=controllers,
            internal_port=ports.get("internal"),
            security=security,
            files=files,
        )
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: _State, entry: dict[str, Any]) -> tuple[bool, str]:
        if _kafka_shape(state)[1] == "plaintext":
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


class _S3(_Component):
    name = "s3"
    port_names = s3_server.S3_PORT_NAMES
    comms = ("weed",)
    ready_timeout = 90.0
    stop_timeout = 20.0

    def check(self) -> _Prereqs:
        weed = s3_server.find_weed()
        return _Prereqs(weed, s3_server.weed_version(weed))

    def choose_ports(
        self, state: _State, previous: dict[str, int] | None, exclude: set[int]
    ) -> dict[str, int]:
        return s3_server.choose_s3_ports(previous, exclude)

    def launch(
        self, paths: StackPaths, state: _State, unit: str, entry: dict[str, Any], pre: _Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        return s3_server.weed_command(
            paths, pre.binary, entry["ports"], state.s3_access_key, state.s3_secret_key
        )

    def probe(self, state: _State, entry: dict[str, Any]) -> tuple[bool, str]:
        status = s3_server.probe_s3(entry["ports"]["s3"], state.s3_access_key, state.s3_secret_key)
        if status == 200:
            return True, ""
        if status is None:
            return False, "S3 port not answering"
        return False, f"signed ListBuckets answered HTTP {status}"

    def address(self, entry: dict[str, Any]) -> str:
        return f"http://127.0.0.1:{entry['ports']['s3']}"


class _Redis(_Component):
    name = "redis"
    port_names = ("redis",)
    comms = ("redis-server", "redis-check-rdb")
    ready_timeout = 30.0
    stop_timeout = 10.0

    def check(self) -> _Prereqs:
        binary = redis_server.find_redis_server()
        return _Prereqs(binary, redis_server.redis_version(binary))

    def launch(
        self, paths: StackPaths, state: _State, unit: str, entry: dict[str, Any], pre: _Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        return redis_server.redis_command(paths, pre.binary, entry["ports"]["redis"]), None

    def probe(self, state: _State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = redis_server.probe_redis(entry["ports"]["redis"])
        return ok, "" if ok else "no PONG"

    def address(self, entry: dict[str, Any]) -> str:
        return f"redis://127.0.0.1:{entry['ports']['redis']}/0"


class _SchemaRegistry(_Component):
    name = "schema-registry"
    port_names = ("http",)
    comms = ("java",)
    ready_timeout = 120.0
    stop_timeout = 20.0

    def check(self) -> _Prereqs:
        java = kafka_broker.find_java(f"Apicurio Registry {schema_registry.APICURIO_VERSION}")
        return _Prereqs(java, schema_registry.APICURIO_VERSION)

    def launch(
        self, paths: StackPaths, state: _State, unit: str, entry: dict[str, Any], pre: _Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        t0 = time.monotonic()
        argv = schema_registry.registry_command(paths, pre.binary, entry["ports"]["http"])
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: _State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = schema_registry.probe_registry(entry["ports"]["http"])
        return ok, "" if ok else "GET /subjects did not answer 200"

    def address(self, entry: dict[str, Any]) -> str:
        return schema_registry.registry_url(entry["ports"]["http"])


class _Postgres(_Component):
    """PostgreSQL for change data capture: its data directory is the component directory."""

    name = "postgres"
    port_names = ("postgres",)
    comms = ("postgres",)
    ready_timeout = 60.0
    stop_timeout = 30.0

    def check(self) -> _Prereqs:
        bindir = postgres_server.find_postgres()
        postgres_server.run_as_prefix()  # as root: the postgres user and setpriv are there
        return _Prereqs(str(bindir), postgres_server.postgres_version(bindir))

    def launch(
        self, paths: StackPaths, state: _State, unit: str, entry: dict[str, Any], pre: _Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        password = entry.setdefault("password", secrets.token_hex(16))
        t0 = time.monotonic()
        argv = postgres_server.postgres_command(
            paths, Path(pre.binary), entry["ports"]["postgres"], password
        )
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: _State, entry: dict[str, Any]) -> tuple[bool, str]:
        ok = postgres_server.probe_postgres(entry["ports"]["postgres"])
        return ok, "" if ok else "no connection accepted"

    def address(self, entry: dict[str, Any]) -> str:
        # No password: ``stack status`` prints it; ``stack env`` has the full URL.
        return postgres_server.postgres_url(entry["ports"]["postgres"])


class _Connect(_Component):
    """A Kafka Connect worker (distributed) on the stack's Kafka, with Debezium's connector."""

    name = "connect"
    port_names = ("http",)
    comms = ("java",)
    ready_timeout = 180.0
    stop_timeout = 30.0
    needs = ("kafka",)

    def check(self) -> _Prereqs:
        java = kafka_broker.find_java(f"Kafka Connect {kafka_connect.CONNECT_VERSION}")
        return _Prereqs(java, kafka_connect.CONNECT_VERSION)

    def launch(
        self, paths: StackPaths, state: _State, unit: str, entry: dict[str, Any], pre: _Prereqs
    ) -> tuple[list[str], dict[str, str] | None]:
        brokers, security = _kafka_shape(state)
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
            _kafka_bootstrap(state),
            replication_factor=kafka_broker.replication_factor(brokers),
            client_settings=settings,
        )
        entry["prepare_seconds"] = round(time.monotonic() - t0, 3)
        return argv, None

    def probe(self, state: _State, entry: dict[str, Any]) -> tuple[bool, str]:
        return kafka_connect.probe_connect(entry["ports"]["http"])

    def address(self, entry: dict[str, Any]) -> str:
        return kafka_connect.connect_url(entry["ports"]["http"])


_REGISTRY: dict[str, _Component] = {
    c.name: c for c in (_Kafka(), _S3(), _Redis(), _SchemaRegistry(), _Postgres(), _Connect())
}
assert set(_REGISTRY) == set(COMPONENTS)


# --------------------------------------------------------------------------------------------
# Units: one process each. A component is one unit, except Kafka: one per node.


def _kafka_shape(state: _State) -> tuple[int, str]:
    """(brokers, security) of the Kafka recorded in ``state`` (1, plaintext if none is)."""
    head = state.components.get("kafka", {})
    return int(head.get("brokers", 1)), str(head.get("security", "plaintext"))


def _kafka_units(brokers: int) -> list[str]:
    return ["kafka"] + [f"kafka-{node}" for node in range(2, brokers + 1)]


def _node_id(unit: str) -> int:
    return 1 if unit == "kafka" else int(unit.removeprefix("kafka-"))


def _comp(unit: str) -> _Component:
    return _REGISTRY["kafka"] if _EXTRA_BROKER.fullmatch(unit) else _REGISTRY[unit]


def _units(state: _State, components: Collection[str]) -> list[str]:
    """The processes of ``components``, Kafka expanded to its nodes."""
    units: list[str] = []
    for name in components:
        units += _kafka_units(_kafka_shape(state)[0]) if name == "kafka" else [name]
    return units


def _known_units(paths: StackPaths, state: _State | None) -> list[str]:
    """Every unit this home may have processes of: the components, the Kafka nodes in
    ``stack.json`` and any ``kafka-N`` working directory (a cluster of an earlier shape)."""
    extra = set(state.components) if state else set()
    if paths.home.is_dir():
        extra |= {p.name for p in paths.home.iterdir() if p.is_dir()}
    brokers = sorted((u for u in extra if _EXTRA_BROKER.fullmatch(u)), key=_node_id)
    units: list[str] = []
    for name in COMPONENTS:
        units += [name, *brokers] if name == "kafka" else [name]
    return units


def _kafka_bootstrap(state: _State) -> str:
    """The client addresses of every Kafka node, comma-separated."""
    return ",".join(
        _REGISTRY["kafka"].address(state.components[u])
        for u in _kafka_units(_kafka_shape(state)[0])
    )


def _set_kafka_shape(paths: StackPaths, state: _State, brokers: int, security: str) -> None:
    """Record the Kafka cluster ``stack up`` was asked for. A different shape than the running
    cluster's is an error; a different one than a stopped cluster's starts Kafka over, with
    empty storage (a KRaft quorum and its SCRAM users are fixed when the storage is formatted)."""
    old = _kafka_shape(state)
    if old == (brokers, security):
        return
    alive = [u for u in _known_units(paths, state) if _comp(u).name == "kafka"]
    alive = [u for u in alive if _running(paths, u, state.components.get(u))]
    if alive:
        raise StackError(
            f"Kafka in {paths.home} runs {old[0]} broker(s) with security {old[1]}, not "
            f"{brokers} with {security}: {_DOWN_HINT} (then `bergstream stack up` with the new "
            f"options starts Kafka over with empty topics)"
        )
    for unit in _known_units(paths, state):
        if _comp(unit).name == "kafka":
            shutil.rmtree(paths.component_dir(unit) / "data", ignore_errors=True)
            if unit != "kafka":
                state.components.pop(unit, None)
    head = state.components.setdefault("kafka", {})
    head.pop("cluster_id", None)
    head["brokers"], head["security"] = brokers, security


def _select(components: Collection[str] | None) -> list[str]:
    """The components to start, in start order: ``components`` (default: DEFAULT_COMPONENTS)
    and the components they need (``connect`` needs ``kafka``)."""
    if components is None:
        components = DEFAULT_COMPONENTS
    if isinstance(components, str):
        components = {components}
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise StackError(
            f"unknown stack component(s) {', '.join(sorted(unknown))}: "
            f"choose from {', '.join(COMPONENTS)}"
        )
    wanted = set(components)
    while missing := {n for c in wanted for n in _REGISTRY[c].needs} - wanted:
        wanted |= missing
    return [name for name in COMPONENTS if name in wanted]


def _stages(units: list[str]) -> list[list[str]]:
    """``units`` in start stages: a unit starts once the components it needs are ready (each
    stage after the previous one), keeping the order of ``units`` within a stage."""
    stages: list[list[str]] = []
    placed: dict[str, int] = {}
    for unit in units:
        needs = [placed[n] for n in _comp(unit).needs if n in placed]
        stage = max(needs, default=-1) + 1
        placed[_comp(unit).name] = max(placed.get(_comp(unit).name, 0), stage)
        while len(stages) <= stage:
            stages.append([])
        stages[stage].append(unit)
    return stages


def _running(paths: StackPaths, name: str, entry: dict[str, Any] | None) -> bool:
    if not entry:
        return False
    return owned(entry.get("pid"), paths.component_dir(name))


def _choose_ports(
    names: tuple[str, ...], previous: dict[str, int] | None, exclude: set[int]
) -> dict[str, int]:
    """Keep the previous ports where they are still free, pick new free ones for the rest."""
    previous = previous or {}
    chosen: dict[str, int] = {}
    used = set(exclude)
    for name in names:
        port = previous.get(name)
        if port and port not in used and port_is_free(port):
            chosen[name] = port
            used.add(port)
    missing = [name for name in names if name not in chosen]
    for name, port in zip(missing, free_ports(len(missing), used), strict=True):
        chosen[name] = port
    return chosen


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _env(paths: StackPaths, state: _State, names: Collection[str]) -> StackEnv:
    entries = state.components
    kafka = entries.get("kafka") if "kafka" in names else None
    security = _kafka_shape(state)[1]
    client_security = None
    if kafka and security != "plaintext":
        files = kafka_security.load_security_files(paths.home)
        client_security = kafka_security.client_security(files, security)
    s3 = entries.get("s3") if "s3" in names else None
    redis = entries.get("redis") if "redis" in names else None
    registry = entries.get("schema-registry") if "schema-registry" in names else None
    postgres = entries.get("postgres") if "postgres" in names else None
    connect = entries.get("connect") if "connect" in names else None
    return StackEnv(
        home=paths.home,
        kafka_bootstrap=_kafka_bootstrap(state) if kafka else None,
        s3_endpoint=_REGISTRY["s3"].address(s3) if s3 else None,
        s3_access_key=state.s3_access_key if s3 else None,
        s3_secret_key=state.s3_secret_key if s3 else None,
        redis_url=_REGISTRY["redis"].address(redis) if redis else None,
        schema_registry_url=_REGISTRY["schema-registry"].address(registry) if registry else None,
        kafka_security=client_security,
        postgres_url=(
            postgres_server.postgres_url(postgres["ports"]["postgres"], postgres.get("password"))
            if postgres
            else None
        ),
        connect_url=_REGISTRY["connect"].address(connect) if connect else None,
    )


def _running_components(paths: StackPaths, state: _State) -> list[str]:
    """The components every process of which runs."""
    return [
        name
        for name in COMPONENTS
        if all(_running(paths, u, state.components.get(u)) for u in _units(state, [name]))
    ]


# --------------------------------------------------------------------------------------------
# Public API


def stack_up(
    home: Path | None = None,
    components: set[str] | None = None,
    *,
    brokers: int = 1,
    security: str = "plaintext",
) -> StackEnv:
    """Start the local stack (``components``: any of ``kafka``, ``s3``, ``redis``,
    ``schema-registry``, ``postgres``, ``connect``; default all but ``postgres`` and
    ``connect``) as detached background processes on free 127.0.0.1 ports and wait until each
    is ready. ``connect`` (a Kafka Connect worker with Debezium's Postgres connector) brings
    ``kafka`` along and starts once Kafka is ready; ``postgres`` is PostgreSQL with
    ``wal_level=logical``.

    Kafka runs ``brokers`` nodes (KRaft, each broker and controller, a static quorum of all;
    new topics get min(3, brokers) replicas). ``security``: ``plaintext`` (no authentication),
    ``sasl_ssl`` (TLS, SCRAM-SHA-512 and PLAIN users) or ``ssl`` (mutual TLS), both with the
    standard authorizer: the user ``admin`` may do anything, ``noaccess`` nothing; the CA,
    certificates, passwords and client config files are in ``home/security``.

    Idempotent: components already running and healthy are left alone (same PIDs and ports); a
    component (or Kafka node) whose process died is started again, on its previous ports if they
    are free. Asking for another Kafka shape (brokers, security) than the running one is a
    StackError; after ``stack down`` a new shape starts Kafka over with empty storage.
    State is kept in ``home/stack.json``, logs in ``home/logs``. Returns the environment of every
    component running in this home. Raises StackError if a prerequisite is missing (nothing is
    started then) or a component does not become ready (its log tail is in the message).
    """
    if brokers < 1:
        raise StackError(f"Kafka needs at least one broker, not {brokers}")
    try:
        kafka_security.check_mode(security)
    except ValueError as exc:
        raise StackError(str(exc)) from None
    paths = StackPaths.resolve(home)
    wanted = _select(components)
    paths.ensure()
    with _locked(paths):
        state = _load(paths, create=True)
        assert state is not None
        # Fail before starting (or wiping) anything. A component to start again or to reshape
        # has a process that does not run.
        needs = [n for n in wanted if n not in _running_components(paths, state)]
        prereqs = {name: _REGISTRY[name].check() for name in needs}
        if "kafka" in wanted:
            _set_kafka_shape(paths, state, brokers, security)
        units = _units(state, wanted)
        to_start = [u for u in units if not _running(paths, u, state.components.get(u))]
        # Kafka Connect starts once Kafka is ready (not waiting for the other components).
        stages = _stages(units)
        spawned: dict[str, float] = {}
        unchecked: list[str] = []
        for index, stage in enumerate(stages):
            needed = {n for later in stages[index + 1 :] for u in later for n in _comp(u).needs}
            unchecked += stage
            # Wait for what the next stages need; the rest is waited for at the end.
            check = [u for u in unchecked if not needed or _comp(u).name in needed]
            unchecked = [u for u in unchecked if u not in check]
            starting = [u for u in to_start if u in stage]
            failures = _start_stage(paths, state, check, starting, prereqs, spawned)
            if failures:
                _raise_failures(paths, failures)
        running = _running_components(paths, state)
        security = _kafka_shape(state)[1]
        if "kafka" in running and security != "plaintext":
            files = kafka_security.ensure_security_files(paths.home)
            kafka_security.write_client_files(files, security, _kafka_bootstrap(state))
        _save(paths, state)
        return _env(paths, state, running)


def _start_stage(
    paths: StackPaths,
    state: _State,
    units: list[str],
    to_start: list[str],
    prereqs: dict[str, _Prereqs],
    spawned: dict[str, float],
) -> dict[str, str]:
    """Start ``to_start`` and wait for all of ``units`` (``spawned``: see ``_launch``); return
    the failures."""
    failures = _launch(paths, state, units, to_start, prereqs, spawned)
    # A port chosen free can be taken before the server binds it: retry those once.
    raced = [u for u in failures if _lost_port_race(paths, u)]
    if raced:
        raced = _with_whole_quorum(paths, state, raced, to_start)
        for unit in raced:
            state.components[unit].pop("ports", None)
        failures = {u: why for u, why in failures.items() if u not in raced}
        failures.update(_launch(paths, state, raced, raced, prereqs, spawned))
    return failures


def _with_whole_quorum(
    paths: StackPaths, state: _State, raced: list[str], to_start: list[str]
) -> list[str]:
    """The units to start again after a port race. Kafka nodes know each other by their
    controller ports, so a raced node takes all the nodes started with it along (stopped first);
    if some node was running before, the quorum cannot move and nothing of Kafka is retried."""
    kafka = _units(state, ["kafka"])
    if not any(u in kafka for u in raced):
        return raced
    others = [u for u in raced if u not in kafka]
    if not all(u in to_start for u in kafka):
        return others
    terminate(
        {
            state.components[u]["pid"]: _REGISTRY["kafka"].stop_timeout
            for u in kafka
            if u not in raced and pid_alive(state.components[u].get("pid"))
        }
    )
    for unit in kafka:
        state.components[unit].pop("pid", None)
    return others + kafka


def _launch(
    paths: StackPaths,
    state: _State,
    wanted: list[str],
    to_start: list[str],
    prereqs: dict[str, _Prereqs],
    spawned: dict[str, float] | None = None,
) -> dict[str, str]:
    """Start ``to_start`` and wait for all of ``wanted``; return the failures. ``spawned``
    (updated) has the spawn times of units started earlier and waited for now."""
    # Prepare everything first (Kafka: download jars, format storage), then spawn together,
    # so the slow preparation does not count against anyone's readiness timeout.
    launches = {}
    try:
        for unit in to_start:
            _assign_ports(paths, state, unit, to_start)
        # Only now: a Kafka node's config lists the controller ports of all nodes.
        for unit in to_start:
            launches[unit] = _prepare(paths, state, unit, prereqs[_comp(unit).name])
    finally:
        _save(paths, state)
    spawned = {} if spawned is None else spawned
    try:
        for name, (argv, env) in launches.items():
            spawned[name] = _spawn(paths, state, name, argv, env)
    finally:
        _save(paths, state)
    return _wait_ready(paths, state, wanted, spawned)


def _assign_ports(paths: StackPaths, state: _State, unit: str, to_start: list[str]) -> None:
    """Choose the ports of one unit to start. A Kafka node rejoining running nodes must keep
    its ports: they are in the others' quorum configuration."""
    comp = _comp(unit)
    entry = state.components.setdefault(unit, {})
    entry.pop("pid", None)
    others = {
        port
        for other, e in state.components.items()
        if other != unit
        for port in e.get("ports", {}).values()
    }
    previous = entry.get("ports")
    rejoining = comp.name == "kafka" and any(
        u not in to_start and _running(paths, u, state.components.get(u))
        for u in _units(state, ["kafka"])
    )
    if not rejoining:
        entry["ports"] = comp.choose_ports(state, previous, others)
        return
    kept = comp.choose_ports(state, previous, others)
    if kept != previous:
        raise StackError(
            f"{unit} must come back on its ports {previous} (the other Kafka nodes know it by "
            f"them) but some are taken now: {_DOWN_HINT}, then `bergstream stack up`"
        )


def _prepare(
    paths: StackPaths, state: _State, unit: str, pre: _Prereqs
) -> tuple[list[str], dict[str, str] | None]:
    """Write the config of one unit (its ports chosen); return its command and environment."""
    entry = state.components[unit]
    entry["version"] = pre.version
    entry["ready_seconds"] = None
    paths.component_dir(unit).mkdir(parents=True, exist_ok=True)
    return _comp(unit).launch(paths, state, unit, entry, pre)


def _spawn(
    paths: StackPaths, state: _State, name: str, argv: list[str], env: dict[str, str] | None
) -> float:
    """Start one prepared component; return the monotonic time it was spawned."""
    entry = state.components[name]
    log = paths.log_file(name)
    entry["pid"] = spawn_detached(argv, cwd=paths.component_dir(name), log_file=log, env=env)
    entry["started_at"] = time.time()
    return time.monotonic()


def _wait_ready(
    paths: StackPaths, state: _State, names: list[str], spawned: dict[str, float]
) -> dict[str, str]:
    """Wait until every component in ``names`` answers its probe. Components that die or time
    out are stopped and returned as ``{name: why}``. ``spawned`` maps the units started and not
    yet seen ready to their spawn times: each is probed too (waited for later), so that its
    ``ready_seconds`` is right, and dropped once ready."""
    now = time.monotonic()
    deadlines = {n: spawned.get(n, now) + _comp(n).ready_timeout for n in names}
    pending = list(names)
    failures: dict[str, str] = {}

    def ready(name: str) -> None:
        if name in spawned:
            started = spawned.pop(name)
            state.components[name]["ready_seconds"] = round(time.monotonic() - started, 3)

    while pending:
        for name in [n for n in spawned if n not in pending]:
            if _comp(name).probe(state, state.components[name])[0]:
                ready(name)
        for name in list(pending):
            comp, entry = _comp(name), state.components[name]
            ok, detail = comp.probe(state, entry)
            if ok:
                ready(name)
                pending.remove(name)
            elif not pid_alive(entry.get("pid")):
                failures[name] = "its process exited during start-up"
                pending.remove(name)
            elif time.monotonic() > deadlines[name]:
                failures[name] = f"not ready after {comp.ready_timeout:.0f} s ({detail})"
                pending.remove(name)
        if pending:
            time.sleep(0.1)
    if not failures:
        return failures
    terminate(
        {
            state.components[n]["pid"]: _comp(n).stop_timeout
            for n in failures
            if pid_alive(state.components[n].get("pid"))
        }
    )
    for name in failures:
        state.components[name].pop("pid", None)
    _save(paths, state)
    return failures


def _lost_port_race(paths: StackPaths, name: str) -> bool:
    """True if the last start of ``name`` failed because a port was taken after it was chosen."""
    try:
        text = paths.log_file(name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    last_start = text[max(text.rfind(START_MARK), 0) :].lower()
    return any(phrase in last_start for phrase in _PORT_TAKEN)


def _raise_failures(paths: StackPaths, failures: dict[str, str]) -> None:
    report = "\n\n".join(
        f"{name}: {why}; last lines of {paths.log_file(name)}:\n{_log_tail(paths.log_file(name))}"
        for name, why in failures.items()
    )
    raise StackError(f"the local stack in {paths.home} did not come up:\n{report}")


def stack_down(home: Path | None = None) -> list[str]:
    """Stop every server of the local stack in ``home``: SIGTERM to its process group, SIGKILL
    after a timeout; servers that ``stack.json`` lost track of (same working directory and
    executable) are stopped too, after the processes attached to the stack (the quickstart's
    ``bergstream run``, see :mod:`.attached`), which depend on them. Removes the PIDs from
    ``stack.json`` (ports, versions, S3 keys and Kafka's shape stay for the next ``stack up``)
    and returns the names of the components and attached processes stopped (Kafka's nodes after
    the first as ``kafka-2``, ``kafka-3``...)."""
    paths = StackPaths.resolve(home)
    if not paths.home.is_dir():
        return []
    with _locked(paths):
        state = _load(paths, create=False)
        stopped: list[str] = stop_attached(paths.home)
        ports: list[int] = []
        # Dependents first (Kafka Connect before Kafka and before the database it reads).
        for stage in reversed(_stages(_known_units(paths, state))):
            targets: dict[int, float] = {}
            for name in stage:
                comp = _comp(name)
                entry = state.components.get(name) if state else None
                pids = set(find_strays(paths.component_dir(name), comp.comms))
                if entry and _running(paths, name, entry):
                    pids.add(entry["pid"])
                if pids:
                    stopped.append(name)
                    targets.update(dict.fromkeys(pids, comp.stop_timeout))
                    if entry:
                        ports.extend(entry.get("ports", {}).values())
            terminate(targets)
        if state is not None:
            for entry in state.components.values():
                entry.pop("pid", None)
            _save(paths, state)
            if "s3" in stopped:
                s3_server.remove_sockets(paths, state.components.get("s3", {}).get("ports", {}))
        wait_closed(ports, timeout=10.0)
        return stopped


def stack_status(home: Path | None = None) -> dict[str, dict[str, Any]]:
    """Per component (``kafka``, ``s3``, ``redis``, ``schema-registry``, ``postgres``,
    ``connect``): ``pid`` (or None), ``running``, ``address`` (or None; Postgres' without its
    password), ``ports``, ``version``, ``log`` and timings of the last start
    (``ready_seconds``: spawn to ready). Kafka's entry describes its first node and adds
    ``brokers``, ``security`` and ``nodes`` (the same fields per node, with ``node_id``); it is
    ``running`` when every node runs, and its ``address`` lists every node."""
    paths = StackPaths.resolve(home)
    state = _load(paths, create=False) if paths.home.is_dir() else None
    status: dict[str, dict[str, Any]] = {}
    for name in COMPONENTS:
        entry = (state.components.get(name) if state else None) or {}
        running = _running(paths, name, entry)
        status[name] = {
            "pid": entry.get("pid") if running else None,
            "running": running,
            "address": _REGISTRY[name].address(entry) if running else None,
            "ports": dict(entry.get("ports", {})),
            "version": entry.get("version"),
            "ready_seconds": entry.get("ready_seconds"),
            "log": str(paths.log_file(name)),
        }
    kafka = status["kafka"]
    shape = _kafka_shape(state) if state else (1, "plaintext")
    kafka["brokers"], kafka["security"] = shape
    kafka["nodes"] = []
    for unit in _kafka_units(shape[0]):
        entry = (state.components.get(unit) if state else None) or {}
        running = _running(paths, unit, entry)
        kafka["nodes"].append(
            {
                "node_id": _node_id(unit),
                "pid": entry.get("pid") if running else None,
                "running": running,
                "ports": dict(entry.get("ports", {})),
                "ready_seconds": entry.get("ready_seconds"),
                "log": str(paths.log_file(unit)),
            }
        )
    kafka["running"] = all(node["running"] for node in kafka["nodes"])
    kafka["address"] = _kafka_bootstrap(state) if state and kafka["running"] else None
    return status


def stack_env(home: Path | None = None) -> StackEnv:
    """The environment of the running local stack in ``home``, from ``stack.json``. Raises
    StackError (telling to run ``bergstream stack up``) if it is not up or a component that was
    started has since died."""
    paths = StackPaths.resolve(home)
    state = _load(paths, create=False) if paths.home.is_dir() else None
    if state is None:
        raise StackError(f"the local stack is not up (no {paths.state_file}): {_UP_HINT}")
    units = _units(state, COMPONENTS)
    started = [u for u in units if state.components.get(u, {}).get("pid")]
    if not started:
        raise StackError(f"the local stack in {paths.home} is not up: {_UP_HINT}")
    dead = [u for u in started if not _running(paths, u, state.components[u])]
    if dead:
        raise StackError(
            f"{', '.join(dead)} of the local stack in {paths.home} is not running: "
            f"{_UP_HINT} to restart it"
        )
    return _env(paths, state, [n for n in COMPONENTS if set(_units(state, [n])) & set(started)])
