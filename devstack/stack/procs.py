"""Detached server processes: start, recognise, stop by PID (process group)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .paths import StackError

__all__ = [
    "find_executable",
    "pid_alive",
    "pid_cwd",
    "process_comm",
    "spawn_detached",
    "terminate",
]

# Popen objects of the servers this Python process started: kept so they are never garbage
# collected while running (no ResourceWarning) and so a dead one is reaped (no zombie that
# os.kill(pid, 0) would still report as alive).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}

_PROC = Path("/proc")

#: Written to a server's log file before each start.
START_MARK = "bergstream stack: starting"


def _script_dirs() -> list[str]:
    """Directories where pip puts console scripts for this interpreter (venv not activated)."""
    dirs = [str(Path(sys.executable).parent)]
    with contextlib.suppress(KeyError):
        dirs.append(sysconfig.get_path("scripts"))
    with contextlib.suppress(KeyError):
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    return dirs


def find_executable(name: str, extra_dirs: Iterable[str] = ()) -> str | None:
    """The full path of executable ``name`` on ``$PATH`` or in ``extra_dirs``, else None."""
    found = shutil.which(name)
    if found:
        return found
    for directory in extra_dirs:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def spawn_detached(
    argv: Sequence[str],
    *,
    cwd: Path,
    log_file: Path,
    env: Mapping[str, str] | None = None,
) -> int:
    """Start ``argv`` in its own session (so it is its own process-group leader and survives the
    calling process), with stdin from /dev/null and stdout+stderr appended to ``log_file``.
    Returns the PID."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"\n==== {stamp} {START_MARK} {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise StackError(f"cannot start {argv[0]}: {exc}") from exc
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is a dead child of this process."""
    proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del _CHILDREN[pid]
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _is_zombie(pid: int) -> bool:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ..." where comm may contain spaces and parentheses.
    return stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))


def pid_alive(pid: int | None) -> bool:
    """True if ``pid`` is a running process (a zombie counts as dead; our own are reaped)."""
    if not pid or pid <= 0:
        return False
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, but belongs to another user
    if _is_zombie(pid):
        _reap(pid)  # it died since the first look: collect it if it is ours
        return False
    return True


def pid_cwd(pid: int) -> Path | None:
    """The working directory of ``pid`` (Linux /proc), None if unknown."""
    try:
        target = os.readlink(_PROC / str(pid) / "cwd")
    except OSError:
        return None
    return Path(target.removesuffix(" (deleted)"))


def process_comm(pid: int) -> str | None:
    """The executable name of ``pid`` (Linux /proc/PID/comm), None if unknown."""
    try:
        return (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return None


def owned(pid: int | None, cwd: Path) -> bool:
    """True if ``pid`` is alive and is the server we started in ``cwd``.

    Every server is started with its component directory as working directory, which tells it
    apart from an unrelated process that got the same PID later. Where /proc is not available
    a live PID is trusted.
    """
    if not pid_alive(pid):
        return False
    assert pid is not None
    if not _PROC.is_dir():
        return True
    actual = pid_cwd(pid)
    if actual is None:
        return False
    return actual == cwd


def find_strays(cwd: Path, comms: Iterable[str]) -> list[int]:
    """PIDs (Linux) running in directory ``cwd`` whose executable name is one of ``comms``:
    servers of this stack that ``stack.json`` lost track of."""
    if not _PROC.is_dir():
        return []
    names = set(comms)
    found = []
    me = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        if process_comm(pid) in names and pid_cwd(pid) == cwd and pid_alive(pid):
            found.append(pid)
    return found


def _signal(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid`` (and to ``pid`` itself)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
            return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def terminate(pids: Mapping[int, float]) -> dict[int, bool]:
    """Stop processes: SIGTERM to each PID's process group, wait up to its timeout (seconds, the
    mapping's value), then SIGKILL the group. Returns ``{pid: True if it had to be killed}``."""
    deadlines: dict[int, float] = {}
    now = time.monotonic()
    for pid, timeout in pids.items():
        if pid_alive(pid):
            _signal(pid, signal.SIGTERM)
            deadlines[pid] = now + timeout
    killed = dict.fromkeys(pids, False)
    while deadlines:
        for pid, deadline in list(deadlines.items()):
            if not pid_alive(pid):
                # The leader is gone; take down anything left in its group.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                del deadlines[pid]
            elif time.monotonic() > deadline:
                if killed[pid]:
                    raise StackError(f"process {pid} survived SIGKILL; stop it by hand")
                _signal(pid, signal.SIGKILL)
                killed[pid] = True
                deadlines[pid] = time.monotonic() + 10.0
        if deadlines:
            time.sleep(0.05)
    return killed


def binary_version(command: Sequence[str], pattern: str) -> str:
    """The version a server binary prints for ``command`` (first group of ``pattern`` in its
    stdout and stderr), or ``unknown`` if it cannot be run or prints none."""
    try:
        out = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    match = re.search(pattern, out.stdout + out.stderr)
    return match.group(1) if match else "unknown"
