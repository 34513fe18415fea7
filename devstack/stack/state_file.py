"""The local stack's state file, ``$BERGSTREAM_HOME/stack.json``: per unit (a component's
process, or one Kafka node's) its PID, ports, version and start timings, plus the S3 keys; read,
written atomically, and locked while ``stack up`` or ``stack down`` changes it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .paths import StackError, StackPaths

__all__ = ["UP_HINT", "State", "load_state", "locked", "save_state"]

_STATE_FORMAT = 1
_S3_ACCESS_KEY = "bergstream"
#: What a StackError tells to do when the stack is not (or no longer) up.
UP_HINT = "run `bergstream stack up`"


@dataclass
class State:
    """What ``stack.json`` holds: the home it belongs to, the S3 keys and, per unit, a dict of
    its ``pid``, ``ports``, ``version`` and timings (Kafka's first node also keeps the
    cluster's shape: ``brokers``, ``security``, ``cluster_id``)."""

    home: str
    s3_access_key: str
    s3_secret_key: str
    components: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        """The file's text."""
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


def load_state(paths: StackPaths, *, create: bool) -> State | None:
    """The state of ``paths.home``; if it has no state file, a new one (with fresh S3 keys) when
    ``create``, else None. An unreadable file is a StackError."""
    try:
        raw = json.loads(paths.state_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not create:
            return None
        return State(
            home=str(paths.home),
            s3_access_key=_S3_ACCESS_KEY,
            s3_secret_key=secrets.token_hex(20),
        )
    except (OSError, ValueError) as exc:
        raise StackError(
            f"cannot read {paths.state_file} ({exc}); stop any servers left running by hand, "
            f"remove the file, then {UP_HINT}"
        ) from exc
    return State(
        home=raw.get("home", str(paths.home)),
        s3_access_key=raw.get("s3_access_key") or _S3_ACCESS_KEY,
        s3_secret_key=raw.get("s3_secret_key") or secrets.token_hex(20),
        components={k: dict(v) for k, v in raw.get("components", {}).items()},
    )


def save_state(paths: StackPaths, state: State) -> None:
    """Write ``state`` (readable by its owner only: it holds the S3 secret), atomically."""
    tmp = paths.state_file.with_name(f".stack.json.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the S3 secret
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(state.to_json() + "\n")
    tmp.replace(paths.state_file)


@contextlib.contextmanager
def locked(paths: StackPaths) -> Iterator[None]:
    """Hold the home's lock file (one ``stack up`` or ``stack down`` at a time)."""
    paths.home.mkdir(parents=True, exist_ok=True)
    with open(paths.lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
