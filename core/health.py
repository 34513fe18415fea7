"""Readiness: whether what a process needs (Kafka, the catalog, the Schema Registry, the S3 store)
answers, each probed on its own with a deadline, so ``GET /readyz`` names the one that does not.

A service takes part by a ``readiness_checks()`` method returning :class:`ReadinessCheck`\\ s
(``docs/hooks.md``, *Services*); the probes here cover the usual needs. A probe is a blocking
function that returns when the dependency answered and raises :class:`ProbeFailed` (or
``OSError``) saying what went wrong; the endpoint runs every probe at once on threads, so one
slow dependency costs its own deadline, not the sum.
"""

from __future__ import annotations

import concurrent.futures
import socket
import sqlite3
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Probe",
    "ProbeFailed",
    "ReadinessCheck",
    "check_results",
    "http_probe",
    "kafka_probe",
    "sqlite_probe",
    "tcp_probe",
]

#: Seconds a probe may take before the dependency counts as not answering.
PROBE_TIMEOUT = 2.0

Probe = Callable[[float], None]


class ProbeFailed(Exception):
    """A dependency did not answer as needed; the message says how."""


@dataclass(frozen=True)
class ReadinessCheck:
    """One dependency of a process: what it is (``kafka``, ``catalog``, ``schema registry``,
    ``s3``), where (an address or URL, no secrets), and the probe that reaches it."""

    name: str
    target: str
    probe: Probe


def tcp_probe(host: str, port: int) -> Probe:
    """A probe that opens (and closes) a TCP connection to ``host:port``."""

    def probe(timeout: float) -> None:
        with socket.create_connection((host, port), timeout=timeout):
            pass

    return probe


def kafka_probe(bootstrap: str) -> Probe:
    """A probe that reaches any one broker of the ``host:port,...`` bootstrap list."""
    addresses = []
    for part in bootstrap.split(","):
        host, _, port = part.strip().rpartition(":")
        addresses.append((host.strip("[]"), int(port)))

    def probe(timeout: float) -> None:
        errors = []
        for host, port in addresses:
            try:
                tcp_probe(host, port)(timeout)
                return
            except OSError as error:
                errors.append(f"{host}:{port}: {error.strerror or error}")
        raise ProbeFailed("no broker answers (" + "; ".join(errors) + ")")

    return probe


def http_probe(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Probe:
    """A probe that GETs ``url`` and wants a status below 400 (a 401 or 403 means the
    credentials are refused, which the message says)."""

    def probe(timeout: float) -> None:
        request = urllib.request.Request(url, headers=dict(headers or {}))
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        try:
            with opener.open(request, timeout=timeout) as response:
                response.read(1024)
        except urllib.error.HTTPError as error:
            reason = "credentials refused" if error.code in (401, 403) else "error"
            raise ProbeFailed(f"{url} answered HTTP {error.code} ({reason})") from None
        except urllib.error.URLError as error:
            raise ProbeFailed(f"{url}: {error.reason}") from None

    return probe


def sqlite_probe(path: Path) -> Probe:
    """A probe that opens the SQLite file read-only and runs one query."""

    def probe(timeout: float) -> None:
        if not path.is_file():
            raise ProbeFailed(f"{path} does not exist")
        uri = f"file:{path}?mode=ro"
        with sqlite3.connect(uri, uri=True, timeout=timeout) as connection:
            connection.execute("select 1").fetchone()

    return probe


def _outcome(check: ReadinessCheck, timeout: float) -> dict[str, Any]:
    began = time.monotonic()
    error: str | None = None
    try:
        check.probe(timeout)
    except (ProbeFailed, OSError, sqlite3.Error, ValueError) as failure:
        error = str(failure) or type(failure).__name__
    seconds = round(time.monotonic() - began, 3)
    result: dict[str, Any] = {"name": check.name, "target": check.target, "ok": error is None}
    if error is not None:
        result["error"] = error
    result["seconds"] = seconds
    return result


def check_results(
    checks: Iterable[ReadinessCheck], timeout: float = PROBE_TIMEOUT
) -> list[dict[str, Any]]:
    """Run every check at once and return each outcome: ``name``, ``target``, ``ok``,
    ``error`` (when not ok) and ``seconds``; a probe past ``timeout`` fails as not answering."""
    checks = list(checks)
    if not checks:
        return []
    # Not a with-block: its exit would wait for a probe past its deadline.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(checks)))
    futures = [pool.submit(_outcome, check, timeout) for check in checks]
    pool.shutdown(wait=False)
    deadline = time.monotonic() + timeout + 0.5
    results = []
    for check, future in zip(checks, futures, strict=True):
        try:
            results.append(future.result(timeout=max(deadline - time.monotonic(), 0)))
        except concurrent.futures.TimeoutError:
            results.append(
                {
                    "name": check.name,
                    "target": check.target,
                    "ok": False,
                    "error": f"no answer in {timeout:g} s",
                    "seconds": timeout,
                }
            )
    return results
