"""Free TCP ports on 127.0.0.1 for the local stack's servers."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterable

__all__ = [
    "choose_ports",
    "free_port",
    "free_port_block",
    "free_port_pairs",
    "free_ports",
    "port_is_free",
    "port_is_open",
]

HOST = "127.0.0.1"

# Ports are drawn below Linux's default ephemeral range (32768-60999), so an outgoing connection
# cannot take a port between the moment it is picked and the moment the server binds it.
_LOW, _HIGH = 20000, 32000
_ATTEMPTS = 200


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if a server could bind ``host:port`` now (checked with ``SO_REUSEADDR`` set, as servers
    do, so a port in TIME_WAIT counts as free but one with a listener does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_is_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_ports(count: int, exclude: Iterable[int] = (), host: str = HOST) -> list[int]:
    """``count`` distinct ports that are free on ``host`` now and not in ``exclude``.

    Ports are drawn at random from 20000-31999 (outside the ephemeral range); if that range is
    crowded the kernel is asked for ephemeral ports instead.
    """
    taken = set(exclude)
    chosen: list[int] = []
    rng = random.SystemRandom()
    for _ in range(_ATTEMPTS):
        if len(chosen) == count:
            return chosen
        port = rng.randrange(_LOW, _HIGH)
        if port in taken:
            continue
        taken.add(port)
        if port_is_free(port, host):
            chosen.append(port)
    while len(chosen) < count:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in taken:
            taken.add(port)
            chosen.append(port)
    return chosen


def free_port_block(count: int, host: str = HOST) -> int:
    """First port of ``count`` consecutive ports that are all free on ``host`` now (a proxy's
    bootstrap port followed by its broker ports), drawn below the ephemeral range."""
    rng = random.SystemRandom()
    for _ in range(_ATTEMPTS):
        base = rng.randrange(_LOW, _HIGH - count)
        if all(port_is_free(port, host) for port in range(base, base + count)):
            return base
    raise OSError(f"no {count} consecutive free ports on {host} in {_LOW}-{_HIGH}")


def free_port_pairs(
    count: int, offset: int, exclude: Iterable[int] = (), host: str = HOST
) -> list[int]:
    """``count`` distinct ports ``p`` such that both ``p`` and ``p + offset`` are free now and
    not in ``exclude`` (for servers that derive a second port, e.g. gRPC = HTTP + 10000).
    Both ports stay below the ephemeral range."""
    taken = set(exclude)
    chosen: list[int] = []
    rng = random.SystemRandom()
    high = min(_HIGH, 32768 - offset)
    if high <= _LOW:
        raise ValueError(f"offset {offset} too large")
    for _ in range(_ATTEMPTS * 5):
        if len(chosen) == count:
            break
        port = rng.randrange(_LOW, high)
        pair = {port, port + offset}
        if pair & taken:
            continue
        if port_is_free(port, host) and port_is_free(port + offset, host):
            chosen.append(port)
            taken |= pair
    if len(chosen) < count:
        raise OSError(f"no {count} free port pairs {offset} apart on {host}")
    return chosen


def free_port(exclude: Iterable[int] = (), host: str = HOST) -> int:
    """One port that is free on ``host`` now and not in ``exclude``."""
    return free_ports(1, exclude, host)[0]


def wait_closed(ports: Iterable[int], timeout: float = 10.0, host: str = HOST) -> list[int]:
    """Wait until nothing listens on ``ports``; return those still open after ``timeout``."""
    pending = list(ports)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [port for port in pending if port_is_open(port, host, timeout=0.2)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return pending


def choose_ports(
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
