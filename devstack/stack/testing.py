"""Helpers for test suites: the same ``stack up`` / ``stack down`` code path as the CLI."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from .env import StackEnv
from .lifecycle import stack_down, stack_up

__all__ = ["running_stack", "session_stack", "stop_session_stack"]


def session_stack(
    tmp_home: Path,
    components: set[str] | None = None,
    *,
    brokers: int = 1,
    security: str = "plaintext",
) -> StackEnv:
    """Bring the local stack up in ``tmp_home`` (``stack_up``, Kafka with ``brokers`` nodes and
    ``security``) and return its environment; pair it with ``stop_session_stack(tmp_home)`` in
    the fixture's teardown."""
    return stack_up(home=tmp_home, components=components, brokers=brokers, security=security)


def stop_session_stack(tmp_home: Path) -> list[str]:
    """Stop the stack started by ``session_stack(tmp_home)`` (``stack_down``)."""
    return stack_down(home=tmp_home)


@contextlib.contextmanager
def running_stack(
    tmp_home: Path,
    components: set[str] | None = None,
    *,
    brokers: int = 1,
    security: str = "plaintext",
) -> Iterator[StackEnv]:
    """Context manager: the stack is up inside the block and always stopped after it, e.g.
    ``with running_stack(tmp_path_factory.mktemp("stack")) as env: yield env`` in a
    session-scoped fixture."""
    try:
        yield session_stack(tmp_home, components, brokers=brokers, security=security)
    finally:
        stop_session_stack(tmp_home)
