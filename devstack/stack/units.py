"""Units: the processes of the local stack, one each. A component is one unit, except Kafka:
one per node (``kafka``, then ``kafka-2``, ``kafka-3``...), its shape (brokers, security) kept in
the first node's state entry. Which units a home has, and which of them run."""

from __future__ import annotations

import re
import shutil
from collections.abc import Collection
from typing import Any

from .paths import COMPONENTS, StackError, StackPaths
from .procs import owned
from .state_file import State

__all__ = [
    "DEFAULT_MECHANISMS",
    "DOWN_HINT",
    "EXTRA_BROKER",
    "is_kafka_unit",
    "is_running",
    "kafka_mechanisms",
    "kafka_shape",
    "kafka_units",
    "known_units",
    "node_id",
    "running_components",
    "set_kafka_shape",
    "units_of",
]

DOWN_HINT = "run `bergstream stack down` first"
# Kafka's nodes after the first: their state entries and working directories.
EXTRA_BROKER = re.compile(r"kafka-([2-9]|[1-9][0-9]+)")


def is_kafka_unit(unit: str) -> bool:
    """True for Kafka's nodes: ``kafka`` (the first) and ``kafka-2``, ``kafka-3``..."""
    return unit == "kafka" or EXTRA_BROKER.fullmatch(unit) is not None


def kafka_shape(state: State) -> tuple[int, str]:
    """(brokers, security) of the Kafka recorded in ``state`` (1, plaintext if none is)."""
    head = state.components.get("kafka", {})
    return int(head.get("brokers", 1)), str(head.get("security", "plaintext"))


def kafka_units(brokers: int) -> list[str]:
    """The units of a Kafka of ``brokers`` nodes: ``kafka``, ``kafka-2``..."""
    return ["kafka"] + [f"kafka-{node}" for node in range(2, brokers + 1)]


def node_id(unit: str) -> int:
    """The KRaft node id of a Kafka unit (``kafka`` is 1, ``kafka-N`` is N)."""
    return 1 if unit == "kafka" else int(unit.removeprefix("kafka-"))


def units_of(state: State, components: Collection[str]) -> list[str]:
    """The processes of ``components``, Kafka expanded to its nodes."""
    units: list[str] = []
    for name in components:
        units += kafka_units(kafka_shape(state)[0]) if name == "kafka" else [name]
    return units


def known_units(paths: StackPaths, state: State | None) -> list[str]:
    """Every unit this home may have processes of: the components, the Kafka nodes in
    ``stack.json`` and any ``kafka-N`` working directory (a cluster of an earlier shape)."""
    extra = set(state.components) if state else set()
    if paths.home.is_dir():
        extra |= {p.name for p in paths.home.iterdir() if p.is_dir()}
    brokers = sorted((u for u in extra if EXTRA_BROKER.fullmatch(u)), key=node_id)
    units: list[str] = []
    for name in COMPONENTS:
        units += [name, *brokers] if name == "kafka" else [name]
    return units


def is_running(paths: StackPaths, name: str, entry: dict[str, Any] | None) -> bool:
    """True if the PID of unit ``name``'s state ``entry`` runs in the unit's directory."""
    if not entry:
        return False
    return owned(entry.get("pid"), paths.component_dir(name))


def running_components(paths: StackPaths, state: State) -> list[str]:
    """The components every process of which runs."""
    return [
        name
        for name in COMPONENTS
        if all(is_running(paths, u, state.components.get(u)) for u in units_of(state, [name]))
    ]


#: The SASL mechanisms a ``sasl_ssl`` stack's clients log in with by default.
DEFAULT_MECHANISMS: tuple[str, ...] = ("scram-sha-512",)


def kafka_mechanisms(state: State) -> tuple[str, ...]:
    """The SASL mechanisms of a ``sasl_ssl`` Kafka recorded in ``state`` (beyond SCRAM and
    PLAIN, which it always enables): the first is what the stack's client files use."""
    head = state.components.get("kafka", {})
    return tuple(head.get("sasl_mechanisms", DEFAULT_MECHANISMS))


def set_kafka_shape(
    paths: StackPaths,
    state: State,
    brokers: int,
    security: str,
    mechanisms: tuple[str, ...] = DEFAULT_MECHANISMS,
) -> None:
    """Record the Kafka cluster ``stack up`` was asked for. A different shape than the running
    cluster's is an error; a different one than a stopped cluster's starts Kafka over, with
    empty storage (a KRaft quorum and its SCRAM users are fixed when the storage is formatted).
    A running cluster asked for other SASL ``mechanisms`` is an error too; a stopped one takes
    them on its next start (they are broker settings, not storage)."""
    old = kafka_shape(state)
    if old == (brokers, security):
        if kafka_mechanisms(state) != mechanisms:
            alive = [u for u in known_units(paths, state) if is_kafka_unit(u)]
            if any(is_running(paths, u, state.components.get(u)) for u in alive):
                raise StackError(
                    f"Kafka in {paths.home} runs with the SASL mechanisms "
                    f"{', '.join(kafka_mechanisms(state))}, not {', '.join(mechanisms)}: "
                    f"{DOWN_HINT}"
                )
            state.components.setdefault("kafka", {})["sasl_mechanisms"] = list(mechanisms)
        return
    alive = [u for u in known_units(paths, state) if is_kafka_unit(u)]
    alive = [u for u in alive if is_running(paths, u, state.components.get(u))]
    if alive:
        raise StackError(
            f"Kafka in {paths.home} runs {old[0]} broker(s) with security {old[1]}, not "
            f"{brokers} with {security}: {DOWN_HINT} (then `bergstream stack up` with the new "
            f"options starts Kafka over with empty topics)"
        )
    for unit in known_units(paths, state):
        if is_kafka_unit(unit):
            shutil.rmtree(paths.component_dir(unit) / "data", ignore_errors=True)
            if unit != "kafka":
                state.components.pop(unit, None)
    head = state.components.setdefault("kafka", {})
    head.pop("cluster_id", None)
    head["brokers"], head["security"] = brokers, security
    head["sasl_mechanisms"] = list(mechanisms)
