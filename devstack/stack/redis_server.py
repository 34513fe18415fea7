"""Redis from the Debian package ``redis-server``, no persistence, 127.0.0.1 only."""

from __future__ import annotations

import socket

from .paths import StackError, StackPaths
from .procs import binary_version, find_executable

__all__ = ["find_redis_server", "probe_redis", "redis_command", "redis_version"]

# Looked in after $PATH (sbin is not on every user's PATH).
_EXTRA_DIRS: tuple[str, ...] = ("/usr/sbin", "/usr/local/bin")

_INSTALL_REDIS = (
    "install Redis (Debian/Ubuntu: `apt-get install -y redis-server`; the package's service "
    "need not run, bergstream starts its own server)"
)


def find_redis_server() -> str:
    """The ``redis-server`` binary; raises StackError saying how to install it."""
    found = find_executable("redis-server", _EXTRA_DIRS)
    if found is None:
        raise StackError(
            f"the stack needs Redis, but `redis-server` was not found: {_INSTALL_REDIS}"
        )
    return found


def redis_version(binary: str) -> str:
    """The Redis version of ``binary`` (e.g. ``7.0.15``), or ``unknown``."""
    return binary_version([binary, "--version"], r"v=(\S+)")


def redis_command(paths: StackPaths, binary: str, port: int) -> list[str]:
    """``redis-server`` in the foreground on 127.0.0.1:``port``, nothing saved to disk, logging to
    stdout (``logs/redis.log``)."""
    workdir = paths.component_dir("redis")
    workdir.mkdir(parents=True, exist_ok=True)
    return [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        str(workdir),
        "--logfile",
        "",
    ]


def probe_redis(port: int, timeout: float = 1.0) -> bool:
    """True if Redis on 127.0.0.1:``port`` answers PING with PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False
