"""Starting units: which components to start and in which stages (a unit after the components
it needs), then per stage: ports chosen, every unit prepared first (configs written, jars
fetched), then all spawned together and waited for until their probes answer; a unit that lost
a port race is started again once; the failures are stopped and reported with their logs."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from pathlib import Path

from .launchers import LAUNCHERS, Prereqs, launcher
from .paths import COMPONENTS, DEFAULT_COMPONENTS, StackError, StackPaths
from .procs import START_MARK, pid_alive, spawn_detached, terminate
from .state_file import State, save_state
from .units import DOWN_HINT, is_running, units_of

__all__ = [
    "launch_units",
    "raise_failures",
    "select_components",
    "start_stage",
    "start_stages",
    "with_whole_quorum",
]


def select_components(components: Collection[str] | None) -> list[str]:
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
    while missing := {n for c in wanted for n in LAUNCHERS[c].needs} - wanted:
        wanted |= missing
    return [name for name in COMPONENTS if name in wanted]


def start_stages(
    units: list[str], extra_needs: Mapping[str, Collection[str]] | None = None
) -> list[list[str]]:
    """``units`` in start stages: a unit starts once the components it needs are ready (each
    stage after the previous one), keeping the order of ``units`` within a stage.
    ``extra_needs`` adds needs by component (Kafka needs its OIDC provider or KDC when its
    brokers log in with them)."""
    stages: list[list[str]] = []
    placed: dict[str, int] = {}
    extra = extra_needs or {}
    for unit in units:
        wanted = (*launcher(unit).needs, *extra.get(launcher(unit).name, ()))
        needs = [placed[n] for n in wanted if n in placed]
        stage = max(needs, default=-1) + 1
        placed[launcher(unit).name] = max(placed.get(launcher(unit).name, 0), stage)
        while len(stages) <= stage:
            stages.append([])
        stages[stage].append(unit)
    return stages


# How the servers' logs say that a port was taken ("seems to be in use": Quarkus, i.e. Apicurio).
_PORT_TAKEN = ("already in use", "seems to be in use")


def start_stage(
    paths: StackPaths,
    state: State,
    units: list[str],
    to_start: list[str],
    prereqs: dict[str, Prereqs],
    spawned: dict[str, float],
) -> dict[str, str]:
    """Start ``to_start`` and wait for all of ``units`` (``spawned``: see ``launch_units``); return
    the failures."""
    failures = launch_units(paths, state, units, to_start, prereqs, spawned)
    # A port chosen free can be taken before the server binds it: retry those once.
    raced = [u for u in failures if _lost_port_race(paths, u)]
    if raced:
        raced = with_whole_quorum(paths, state, raced, to_start)
        for unit in raced:
            state.components[unit].pop("ports", None)
        failures = {u: why for u, why in failures.items() if u not in raced}
        failures.update(launch_units(paths, state, raced, raced, prereqs, spawned))
    return failures


def with_whole_quorum(
    paths: StackPaths, state: State, raced: list[str], to_start: list[str]
) -> list[str]:
    """The units to start again after a port race. Kafka nodes know each other by their
    controller ports, so a raced node takes all the nodes started with it along (stopped first);
    if some node was running before, the quorum cannot move and nothing of Kafka is retried."""
    kafka = units_of(state, ["kafka"])
    if not any(u in kafka for u in raced):
        return raced
    others = [u for u in raced if u not in kafka]
    if not all(u in to_start for u in kafka):
        return others
    terminate(
        {
            state.components[u]["pid"]: LAUNCHERS["kafka"].stop_timeout
            for u in kafka
            if u not in raced and pid_alive(state.components[u].get("pid"))
        }
    )
    for unit in kafka:
        state.components[unit].pop("pid", None)
    return others + kafka


def launch_units(
    paths: StackPaths,
    state: State,
    wanted: list[str],
    to_start: list[str],
    prereqs: dict[str, Prereqs],
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
            launches[unit] = _prepare(paths, state, unit, prereqs[launcher(unit).name])
    finally:
        save_state(paths, state)
    spawned = {} if spawned is None else spawned
    try:
        for name, (argv, env) in launches.items():
            spawned[name] = _spawn(paths, state, name, argv, env)
    finally:
        save_state(paths, state)
    return _wait_ready(paths, state, wanted, spawned)


def _assign_ports(paths: StackPaths, state: State, unit: str, to_start: list[str]) -> None:
    """Choose the ports of one unit to start. A Kafka node rejoining running nodes must keep
    its ports: they are in the others' quorum configuration."""
    comp = launcher(unit)
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
        u not in to_start and is_running(paths, u, state.components.get(u))
        for u in units_of(state, ["kafka"])
    )
    if not rejoining:
        entry["ports"] = comp.choose_ports(state, previous, others)
        return
    kept = comp.choose_ports(state, previous, others)
    if kept != previous:
        raise StackError(
            f"{unit} must come back on its ports {previous} (the other Kafka nodes know it by "
            f"them) but some are taken now: {DOWN_HINT}, then `bergstream stack up`"
        )


def _prepare(
    paths: StackPaths, state: State, unit: str, pre: Prereqs
) -> tuple[list[str], dict[str, str] | None]:
    """Write the config of one unit (its ports chosen); return its command and environment."""
    entry = state.components[unit]
    entry["version"] = pre.version
    entry["ready_seconds"] = None
    paths.component_dir(unit).mkdir(parents=True, exist_ok=True)
    return launcher(unit).launch(paths, state, unit, entry, pre)


def _spawn(
    paths: StackPaths, state: State, name: str, argv: list[str], env: dict[str, str] | None
) -> float:
    """Start one prepared component; return the monotonic time it was spawned."""
    entry = state.components[name]
    log = paths.log_file(name)
    entry["pid"] = spawn_detached(argv, cwd=paths.component_dir(name), log_file=log, env=env)
    entry["started_at"] = time.time()
    return time.monotonic()


def _wait_ready(
    paths: StackPaths, state: State, names: list[str], spawned: dict[str, float]
) -> dict[str, str]:
    """Wait until every component in ``names`` answers its probe. Components that die or time
    out are stopped and returned as ``{name: why}``. ``spawned`` maps the units started and not
    yet seen ready to their spawn times: each is probed too (waited for later), so that its
    ``ready_seconds`` is right, and dropped once ready."""
    now = time.monotonic()
    deadlines = {n: spawned.get(n, now) + launcher(n).ready_timeout for n in names}
    pending = list(names)
    failures: dict[str, str] = {}

    def ready(name: str) -> None:
        if name in spawned:
            started = spawned.pop(name)
            state.components[name]["ready_seconds"] = round(time.monotonic() - started, 3)

    while pending:
        for name in [n for n in spawned if n not in pending]:
            if launcher(name).probe(state, state.components[name])[0]:
                ready(name)
        for name in list(pending):
            comp, entry = launcher(name), state.components[name]
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
            state.components[n]["pid"]: launcher(n).stop_timeout
            for n in failures
            if pid_alive(state.components[n].get("pid"))
        }
    )
    for name in failures:
        state.components[name].pop("pid", None)
    save_state(paths, state)
    return failures


def _lost_port_race(paths: StackPaths, name: str) -> bool:
    """True if the last start of ``name`` failed because a port was taken after it was chosen."""
    try:
        text = paths.log_file(name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    last_start = text[max(text.rfind(START_MARK), 0) :].lower()
    return any(phrase in last_start for phrase in _PORT_TAKEN)


def raise_failures(paths: StackPaths, failures: dict[str, str]) -> None:
    """Raise a StackError naming each failed unit, why, and the tail of its log."""
    report = "\n\n".join(
        f"{name}: {why}; last lines of {paths.log_file(name)}:\n{_log_tail(paths.log_file(name))}"
        for name, why in failures.items()
    )
    raise StackError(f"the local stack in {paths.home} did not come up:\n{report}")


def _log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])
