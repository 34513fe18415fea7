"""Processes attached to the local stack: started by another command (the quickstart's
``bergstream run``), stopped by ``stack down`` before the servers they depend on.

Each one is recorded in ``$BERGSTREAM_HOME/attached.json`` with its PID and working directory;
like the stack's own servers it is recognised by both, so a recycled PID is never signalled.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .paths import StackError, StackPaths
from .procs import find_strays, owned, terminate

__all__ = [
    "AttachedProcess",
    "attach_process",
    "attached_processes",
    "detach_process",
    "stop_attached",
]

_FILE = "attached.json"


@dataclass(frozen=True)
class AttachedProcess:
    """One attached process: ``pid`` running in ``cwd``, writing to ``log``."""

    name: str
    pid: int
    cwd: str
    log: str
    argv: list[str]
    comm: str
    stop_timeout: float = 30.0
    started_at: float = 0.0

    def running(self) -> bool:
        """True if the recorded PID is alive and still runs in the recorded directory."""
        return owned(self.pid, Path(self.cwd))


def _path(paths: StackPaths) -> Path:
    return paths.home / _FILE


def _read(paths: StackPaths) -> dict[str, AttachedProcess]:
    try:
        raw = json.loads(_path(paths).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StackError(f"cannot read {_path(paths)} ({exc}); remove it and retry") from exc
    return {name: AttachedProcess(**entry) for name, entry in raw.items()}


def _write(paths: StackPaths, entries: dict[str, AttachedProcess]) -> None:
    paths.home.mkdir(parents=True, exist_ok=True)
    tmp = _path(paths).with_name(f".{_FILE}.{os.getpid()}.tmp")
    body: dict[str, Any] = {name: asdict(entry) for name, entry in sorted(entries.items())}
    tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    tmp.replace(_path(paths))


def attach_process(
    name: str,
    pid: int,
    cwd: Path,
    log: Path,
    argv: list[str],
    comm: str,
    *,
    stop_timeout: float = 30.0,
    home: Path | None = None,
) -> AttachedProcess:
    """Record process ``pid`` (started in ``cwd``, executable name ``comm``) under ``name`` so
    that ``stack down`` stops it; replaces an earlier record of the same name."""
    paths = StackPaths.resolve(home)
    entry = AttachedProcess(
        name=name,
        pid=pid,
        cwd=str(cwd),
        log=str(log),
        argv=list(argv),
        comm=comm,
        stop_timeout=stop_timeout,
        started_at=time.time(),
    )
    entries = _read(paths)
    entries[name] = entry
    _write(paths, entries)
    return entry


def detach_process(name: str, home: Path | None = None) -> None:
    """Forget the record of ``name`` (the process itself is left alone)."""
    paths = StackPaths.resolve(home)
    entries = _read(paths)
    if entries.pop(name, None) is not None:
        _write(paths, entries)


def attached_processes(home: Path | None = None) -> dict[str, AttachedProcess]:
    """Every recorded attached process of the stack in ``home``, running or not."""
    paths = StackPaths.resolve(home)
    return _read(paths) if paths.home.is_dir() else {}


def stop_attached(home: Path | None = None, names: set[str] | None = None) -> list[str]:
    """Stop the attached processes (all, or those in ``names``): SIGTERM to the process group,
    SIGKILL after the entry's timeout. Processes the record lost (same directory and executable
    name) are stopped too. Returns the names of those that were running; their records are
    removed."""
    paths = StackPaths.resolve(home)
    entries = attached_processes(paths.home)
    chosen = {n: e for n, e in entries.items() if names is None or n in names}
    targets: dict[int, float] = {}
    stopped: list[str] = []
    for name, entry in sorted(chosen.items()):
        pids = set(find_strays(Path(entry.cwd), (entry.comm,)))
        if entry.running():
            pids.add(entry.pid)
        if pids:
            stopped.append(name)
            targets.update(dict.fromkeys(pids, entry.stop_timeout))
    terminate(targets)
    if chosen:
        _write(paths, {n: e for n, e in entries.items() if n not in chosen})
    return stopped
