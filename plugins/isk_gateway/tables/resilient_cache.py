"""A cache backend wrapper that keeps ISK serving while its cache is down.

The gateway never fails a request because of its cache: :class:`ResilientCache` turns a failing
``get`` into a miss (the file is synthesized again) and a failing ``put`` or ``delete`` into a
no-op. One outage is logged once, on the ``bergstream.isk.cache`` logger: a warning when the
backend starts failing and an info line when it answers again. While it is down the backend is
not called at all, except for one probe call at most every ``retry_seconds``, so a dead Redis or
S3 server does not add a connection timeout to every request; the first probe that succeeds
puts the backend back in use. A call that started before the backend went down (or came back)
and ends after it does not change that state: its answer is older than the state.

A ``ValueError`` from a backend (a key it refuses, an entry above its size limit, such as the
``redis`` backend's ``max_entry_bytes``) is not an outage: that entry is simply not cached. The
first refusal is logged as a warning with the backend's message (naming key, size and setting);
later ones at most once a minute, with how many entries were refused since.

``try_put_if_absent`` passes on a conditional backend's ``put_if_absent`` the same way (None when
it cannot answer), for the shared snapshot history (:mod:`.shared_history`).

Lookups are counted in ``bergstream_cache_requests{backend, result}``: ``hit``, ``miss``, or
``error`` (the backend failed, or was skipped because it is down).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from bergstream.core.api import CacheBackend, ConditionalCacheBackend
from bergstream.plugins.isk_gateway.metrics import CACHE_REQUESTS

__all__ = ["ResilientCache"]

log = logging.getLogger("bergstream.isk.cache")

T = TypeVar("T")
_REFUSAL_LOG_SECONDS = 60.0


class ResilientCache:
    """A :class:`~bergstream.core.api.CacheBackend` around another one whose failures
    become misses, logged once per outage, with calls skipped while it is down."""

    def __init__(
        self,
        backend: CacheBackend,
        name: str,
        retry_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Wrap ``backend`` (``name`` labels logs and metrics); while it fails, call it again
        at most every ``retry_seconds``."""
        if retry_seconds < 0:
            raise ValueError(f"retry_seconds must be >= 0, got {retry_seconds}")
        self.backend = backend
        self.name = name
        self.retry_seconds = retry_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        # Bumped when the backend goes down and when it comes back: a call that ends in
        # another state than the one it started in says nothing about the state now.
        self._generation = 0
        self._next_try = 0.0
        self._skipped = 0
        self._refused_since_log = 0
        self._next_refusal_log: float | None = None
        self.refused = 0  # entries the backend refused (ValueError), for tests and diagnostics
        self.failures = 0  # calls that raised (outages), for tests and diagnostics
        self._hits = CACHE_REQUESTS.labels(backend=name, result="hit")
        self._misses = CACHE_REQUESTS.labels(backend=name, result="miss")
        self._errors = CACHE_REQUESTS.labels(backend=name, result="error")

    @property
    def available(self) -> bool:
        """False while the backend is considered down."""
        with self._lock:
            return self._down_since is None

    def _may_call(self) -> int | None:
        """The generation a call of the backend starts in, or None not to call it now: always
        called while it is up; while down, one caller per ``retry_seconds`` gets to probe it."""
        with self._lock:
            if self._down_since is None:
                return self._generation
            now = self._clock()
            if now >= self._next_try:
                self._next_try = now + self.retry_seconds
                return self._generation
            self._skipped += 1
            return None

    def _succeeded(self, generation: int) -> None:
        """A call started in ``generation`` succeeded: the backend is back if the call was a
        probe of the current outage (one started before the outage proves nothing now)."""
        if self._down_since is None:  # unlocked fast path; the locked check below decides
            return
        with self._lock:
            if self._down_since is None or generation != self._generation:
                return
            outage = self._clock() - self._down_since
            skipped, self._skipped = self._skipped, 0
            self._down_since = None
            self._generation += 1
        log.info(
            "cache backend %r works again after %.1f s; using it again (%d calls skipped "
            "while it was down)",
            self.name,
            outage,
            skipped,
        )

    def _failed(self, operation: str, key: str, error: Exception, generation: int) -> None:
        """A call started in ``generation`` failed: an outage starts unless the backend is
        down already or came back after the call started (the failure is from before)."""
        with self._lock:
            self.failures += 1
            now = self._clock()
            if self._down_since is not None:
                self._next_try = now + self.retry_seconds
                return
            if generation != self._generation:
                return
            self._next_try = now + self.retry_seconds
            self._down_since = now
            self._generation += 1
        log.warning(
            "cache backend %r failed (%s %r: %s: %s); serving without it (misses, files "
            "synthesized again) and retrying it every %.0f s",
            self.name,
            operation,
            key,
            type(error).__name__,
            error,
            self.retry_seconds,
        )

    def _refused_entry(self, operation: str, key: str, error: ValueError) -> None:
        with self._lock:
            self.refused += 1
            self._refused_since_log += 1
            now = self._clock()
            if self._next_refusal_log is not None and now < self._next_refusal_log:
                return
            self._next_refusal_log = now + _REFUSAL_LOG_SECONDS
            count, self._refused_since_log = self._refused_since_log, 0
        if count > 1:
            log.warning(
                "cache backend %r refused %d more entries in the last minute, e.g. %s of %r: %s",
                self.name,
                count,
                operation,
                key,
                error,
            )
            return
        log.warning(
            "cache backend %r refused %s of %r; not cached: %s", self.name, operation, key, error
        )

    def _call(self, operation: str, key: str, call: Callable[[], T]) -> tuple[bool, T | None]:
        """``(True, result)`` if the backend answered, ``(False, None)`` if it was skipped,
        failed or refused the key."""
        generation = self._may_call()
        if generation is None:
            return False, None
        try:
            result = call()
        except ValueError as error:
            self._succeeded(generation)  # the backend answered; it refused this entry
            self._refused_entry(operation, key, error)
            return False, None
        except Exception as error:
            self._failed(operation, key, error, generation)
            return False, None
        self._succeeded(generation)
        return True, result

    def get(self, key: str) -> bytes | None:
        """The backend's verified bytes for ``key``; None on a miss or any failure."""
        answered, data = self._call("get", key, lambda: self.backend.get(key))
        if not answered:
            self._errors.inc()
            return None
        if data is None:
            self._misses.inc()
        else:
            self._hits.inc()
        return data

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key`` if the backend is up and accepts it; never raises."""
        self._call("put", key, lambda: self.backend.put(key, data))

    def try_put_if_absent(self, key: str, data: bytes) -> bool | None:
        """The backend's ``put_if_absent`` (True: stored, False: an entry was there); None if
        the backend has none, is down, failed or refused the entry. Never raises."""
        backend = self.backend
        if not isinstance(backend, ConditionalCacheBackend):
            return None
        answered, won = self._call("put_if_absent", key, lambda: backend.put_if_absent(key, data))
        return bool(won) if answered else None

    def delete(self, key: str) -> None:
        """Remove ``key`` if the backend is up; never raises."""
        self._call("delete", key, lambda: self.backend.delete(key))

    def close(self) -> None:
        """Close the backend; a failure is logged, not raised."""
        try:
            self.backend.close()
        except Exception:
            log.exception("closing cache backend %r failed", self.name)

    def __repr__(self) -> str:
        """``ResilientCache(<backend>, name=...)``."""
        return f"ResilientCache({self.backend!r}, name={self.name!r})"
