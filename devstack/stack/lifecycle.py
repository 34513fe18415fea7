"""``stack up`` / ``stack down`` / ``stack status`` / ``stack env``: the local stack by PID.

The state file (:mod:`.state_file`) records each unit's process (:mod:`.units`); each
component's launcher (:mod:`.launchers`) knows how to start and probe it; :mod:`.startup`
starts units in stages and waits until they are ready.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from . import (
    kafka_logins,
    kafka_security,
    kdc_server,
    oidc_provider,
    postgres_server,
    rest_catalog,
    s3_server,
)
from .attached import stop_attached
from .env import StackEnv
from .launchers import LAUNCHERS, kafka_bootstrap, launcher
from .paths import COMPONENTS, StackError, StackPaths
from .ports import wait_closed
from .procs import find_strays, terminate
from .startup import raise_failures, select_components, start_stage, start_stages
from .state_file import UP_HINT, State, load_state, locked, save_state
from .units import (
    DEFAULT_MECHANISMS,
    is_running,
    kafka_mechanisms,
    kafka_shape,
    kafka_units,
    known_units,
    node_id,
    running_components,
    set_kafka_shape,
    units_of,
)

__all__ = ["stack_down", "stack_env", "stack_status", "stack_up"]


#: What ``stack up --sasl-mechanism`` accepts, and the component each one needs.
SASL_MECHANISM_COMPONENTS: dict[str, str | None] = {
    "scram-sha-512": None,
    "oauthbearer": "oidc",
    "gssapi": "kdc",
}


def _check_mechanisms(mechanisms: Sequence[str], security: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(m.lower() for m in mechanisms)) or DEFAULT_MECHANISMS
    unknown = [m for m in chosen if m not in SASL_MECHANISM_COMPONENTS]
    if unknown:
        raise StackError(
            f"unknown SASL mechanism {', '.join(unknown)}: choose from "
            f"{', '.join(SASL_MECHANISM_COMPONENTS)}"
        )
    if chosen != DEFAULT_MECHANISMS and security != "sasl_ssl":
        raise StackError(
            f"--sasl-mechanism {', '.join(chosen)} needs --security sasl_ssl (security "
            f"{security} does no SASL)"
        )
    return chosen


def stack_up(
    home: Path | None = None,
    components: set[str] | None = None,
    *,
    brokers: int = 1,
    security: str = "plaintext",
    sasl_mechanisms: Sequence[str] | None = None,
) -> StackEnv:
    """Start the local stack (``components``: any of ``kafka``, ``s3``, ``redis``,
    ``schema-registry``, ``postgres``, ``connect``, ``kdc``, ``oidc``, ``rest-catalog``; default
    all but ``postgres``, ``connect``, ``kdc``, ``oidc`` and ``rest-catalog``) as detached
    background processes on free 127.0.0.1 ports and wait until each is ready. ``connect`` (a
    Kafka Connect worker with Debezium's Postgres connector) brings ``kafka`` along and starts
    once Kafka is ready; ``postgres`` is PostgreSQL with ``wal_level=logical``; ``kdc`` is a
    Kerberos KDC (MIT ``krb5kdc``, realm ``BERGSTREAM.LOCAL``; keytabs and ``krb5.conf`` in
    ``home/security``, see :mod:`.kdc_server`); ``rest-catalog`` is Apache Iceberg's REST
    catalog server with its files on the stack's S3 (brings ``s3`` along, see
    :mod:`.rest_catalog`).

    Kafka runs ``brokers`` nodes (KRaft, each broker and controller, a static quorum of all;
    new topics get min(3, brokers) replicas). ``security``: ``plaintext`` (no authentication),
    ``sasl_ssl`` (TLS, SCRAM-SHA-512 and PLAIN users) or ``ssl`` (mutual TLS), both with the
    standard authorizer: the user ``admin`` may do anything, ``noaccess`` nothing; the CA,
    certificates, passwords and client config files are in ``home/security``.
    ``sasl_mechanisms`` (``sasl_ssl`` only): what the client files log in with, the first one
    for ``BERGSTREAM_KAFKA_CONFIG`` (None: the running cluster's, ``scram-sha-512`` for a new
    one; ``oauthbearer`` adds the
    ``oidc`` component, Keycloak, whose clients ``admin`` and ``noaccess`` are the principals;
    ``gssapi`` adds the ``kdc`` component, whose principals ``admin`` and ``noaccess`` log in
    with keytabs). The brokers enable SCRAM and PLAIN always, and each mechanism asked for.

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
    asked = None if sasl_mechanisms is None else _check_mechanisms(sasl_mechanisms, security)
    paths = StackPaths.resolve(home)
    wanted = select_components(components)
    paths.ensure()
    with locked(paths):
        state = load_state(paths, create=True)
        assert state is not None
        mechanisms = asked
        if mechanisms is None:
            # Not asked: the recorded cluster's, for the same shape (a node started again).
            same = kafka_shape(state) == (brokers, security)
            mechanisms = kafka_mechanisms(state) if same else DEFAULT_MECHANISMS
        logins = [SASL_MECHANISM_COMPONENTS[m] for m in mechanisms]
        login_components = [c for c in logins if c is not None]
        if "kafka" in wanted and login_components:
            wanted = select_components({*wanted, *login_components})
        # Fail before starting (or wiping) anything. A component to start again or to reshape
        # has a process that does not run.
        needs = [n for n in wanted if n not in running_components(paths, state)]
        prereqs = {name: LAUNCHERS[name].check() for name in needs}
        if "kafka" in wanted:
            set_kafka_shape(paths, state, brokers, security, mechanisms)
        units = units_of(state, wanted)
        to_start = [u for u in units if not is_running(paths, u, state.components.get(u))]
        # Kafka Connect starts once Kafka is ready (not waiting for the other components);
        # Kafka once its OIDC provider or KDC is (its brokers reach them when they start).
        extra_needs = {"kafka": login_components}
        stages = start_stages(units, extra_needs)
        spawned: dict[str, float] = {}
        unchecked: list[str] = []
        for index, stage in enumerate(stages):
            needed = {
                n
                for later in stages[index + 1 :]
                for u in later
                for n in (*launcher(u).needs, *extra_needs.get(launcher(u).name, ()))
            }
            unchecked += stage
            # Wait for what the next stages need; the rest is waited for at the end.
            check = [u for u in unchecked if not needed or launcher(u).name in needed]
            unchecked = [u for u in unchecked if u not in check]
            starting = [u for u in to_start if u in stage]
            failures = start_stage(paths, state, check, starting, prereqs, spawned)
            if failures:
                raise_failures(paths, failures)
        running = running_components(paths, state)
        security = kafka_shape(state)[1]
        if "kafka" in running and security != "plaintext":
            files = kafka_security.ensure_security_files(paths.home)
            logins = (
                kafka_logins.client_logins(paths.home, state) if security == "sasl_ssl" else None
            )
            kafka_security.write_client_files(files, security, kafka_bootstrap(state), logins)
        save_state(paths, state)
        return environment(paths, state, running)


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
    with locked(paths):
        state = load_state(paths, create=False)
        stopped: list[str] = stop_attached(paths.home)
        ports: list[int] = []
        # Dependents first (Kafka Connect before Kafka and before the database it reads).
        for stage in reversed(start_stages(known_units(paths, state))):
            targets: dict[int, float] = {}
            for name in stage:
                comp = launcher(name)
                entry = state.components.get(name) if state else None
                pids = set(find_strays(paths.component_dir(name), comp.comms))
                if entry and is_running(paths, name, entry):
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
            save_state(paths, state)
            if "s3" in stopped:
                s3_server.remove_sockets(paths, state.components.get("s3", {}).get("ports", {}))
        wait_closed(ports, timeout=10.0)
        return stopped


def stack_status(home: Path | None = None) -> dict[str, dict[str, Any]]:
    """Per component (``kafka``, ``s3``, ``redis``, ``schema-registry``, ``postgres``,
    ``connect``, ``kdc``): ``pid`` (or None), ``running``, ``address`` (or None; Postgres'
    without its password), ``ports``, ``version``, ``log`` and timings of the last start
    (``ready_seconds``: spawn to ready). Kafka's entry describes its first node and adds
    ``brokers``, ``security`` and ``nodes`` (the same fields per node, with ``node_id``); it is
    ``running`` when every node runs, and its ``address`` lists every node."""
    paths = StackPaths.resolve(home)
    state = load_state(paths, create=False) if paths.home.is_dir() else None
    status: dict[str, dict[str, Any]] = {}
    for name in COMPONENTS:
        entry = (state.components.get(name) if state else None) or {}
        running = is_running(paths, name, entry)
        status[name] = {
            "pid": entry.get("pid") if running else None,
            "running": running,
            "address": LAUNCHERS[name].address(entry) if running else None,
            "ports": dict(entry.get("ports", {})),
            "version": entry.get("version"),
            "ready_seconds": entry.get("ready_seconds"),
            "log": str(paths.log_file(name)),
        }
    kafka = status["kafka"]
    shape = kafka_shape(state) if state else (1, "plaintext")
    kafka["brokers"], kafka["security"] = shape
    kafka["nodes"] = []
    for unit in kafka_units(shape[0]):
        entry = (state.components.get(unit) if state else None) or {}
        running = is_running(paths, unit, entry)
        kafka["nodes"].append(
            {
                "node_id": node_id(unit),
                "pid": entry.get("pid") if running else None,
                "running": running,
                "ports": dict(entry.get("ports", {})),
                "ready_seconds": entry.get("ready_seconds"),
                "log": str(paths.log_file(unit)),
            }
        )
    kafka["running"] = all(node["running"] for node in kafka["nodes"])
    kafka["address"] = kafka_bootstrap(state) if state and kafka["running"] else None
    return status


def stack_env(home: Path | None = None) -> StackEnv:
    """The environment of the running local stack in ``home``, from ``stack.json``. Raises
    StackError (telling to run ``bergstream stack up``) if it is not up or a component that was
    started has since died."""
    paths = StackPaths.resolve(home)
    state = load_state(paths, create=False) if paths.home.is_dir() else None
    if state is None:
        raise StackError(f"the local stack is not up (no {paths.state_file}): {UP_HINT}")
    units = units_of(state, COMPONENTS)
    started = [u for u in units if state.components.get(u, {}).get("pid")]
    if not started:
        raise StackError(f"the local stack in {paths.home} is not up: {UP_HINT}")
    dead = [u for u in started if not is_running(paths, u, state.components[u])]
    if dead:
        raise StackError(
            f"{', '.join(dead)} of the local stack in {paths.home} is not running: "
            f"{UP_HINT} to restart it"
        )
    return environment(
        paths, state, [n for n in COMPONENTS if set(units_of(state, [n])) & set(started)]
    )


def environment(paths: StackPaths, state: State, names: Collection[str]) -> StackEnv:
    """The environment of the components ``names`` recorded in ``state``."""
    entries = state.components
    kafka = entries.get("kafka") if "kafka" in names else None
    security = kafka_shape(state)[1]
    client_security = None
    if kafka and security != "plaintext":
        files = kafka_security.load_security_files(paths.home)
        login = None
        if security == "sasl_ssl" and kafka_mechanisms(state)[0] != DEFAULT_MECHANISMS[0]:
            first = next(iter(kafka_logins.client_logins(paths.home, state).values()))
            login = first[kafka_security.ADMIN_USER]
        client_security = kafka_security.client_security(files, security, login)
    s3 = entries.get("s3") if "s3" in names else None
    redis = entries.get("redis") if "redis" in names else None
    registry = entries.get("schema-registry") if "schema-registry" in names else None
    postgres = entries.get("postgres") if "postgres" in names else None
    connect = entries.get("connect") if "connect" in names else None
    kerberos = kdc_server.kerberos_files(paths.home) if "kdc" in names else None
    admin, noaccess = kdc_server.ADMIN_USER, kdc_server.NOACCESS_USER
    oidc = entries.get("oidc") if "oidc" in names else None
    rest = entries.get("rest-catalog") if "rest-catalog" in names else None
    return StackEnv(
        home=paths.home,
        kafka_bootstrap=kafka_bootstrap(state) if kafka else None,
        s3_endpoint=LAUNCHERS["s3"].address(s3) if s3 else None,
        s3_access_key=state.s3_access_key if s3 else None,
        s3_secret_key=state.s3_secret_key if s3 else None,
        redis_url=LAUNCHERS["redis"].address(redis) if redis else None,
        schema_registry_url=LAUNCHERS["schema-registry"].address(registry) if registry else None,
        kafka_security=client_security,
        postgres_url=(
            postgres_server.postgres_url(postgres["ports"]["postgres"], postgres.get("password"))
            if postgres
            else None
        ),
        connect_url=LAUNCHERS["connect"].address(connect) if connect else None,
        krb5_config=kerberos.krb5_conf if kerberos else None,
        kerberos_realm=kerberos.realm if kerberos else None,
        kerberos_keytab=kerberos.user_keytab(admin) if kerberos else None,
        kerberos_principal=kerberos.principal(admin) if kerberos else None,
        kerberos_noaccess_keytab=kerberos.user_keytab(noaccess) if kerberos else None,
        kerberos_noaccess_principal=kerberos.principal(noaccess) if kerberos else None,
        oidc=(
            oidc_provider.oidc_environment(paths.home, LAUNCHERS["oidc"].address(oidc))
            if oidc
            else None
        ),
        rest_catalog_url=LAUNCHERS["rest-catalog"].address(rest) if rest else None,
        rest_catalog_warehouse=rest_catalog.warehouse() if rest else None,
    )
