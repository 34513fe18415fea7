"""``CallGuard``: counts an index backend's calls in progress so that ``close`` waits for them.

Why: closing a SQLite connection or a RocksDB handle while another thread is inside a call on it
crashes the process (Python's ``sqlite3`` releases the GIL while a statement steps; a
``close`` from another thread then frees the database under it: a segmentation fault, reproduced
in ``tests/backends/test_index_close.py``). ISK closes its index on stop while a cancelled
background step may still be running on a worker thread (cancelling an ``asyncio.to_thread``
does not stop the thread).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["CallGuard"]


class CallGuard:
    """Admits calls until :meth:`close`; ``close`` waits until the admitted ones have returned.
    A call after ``close`` raises ``closed_error()``."""

    def __init__(self, closed_error: type[Exception], what: str) -> None:
        self._closed_error = closed_error
        self._what = what
        self._state = threading.Condition()
        self._running = 0
        self._closed = False

    @contextmanager
    def call(self) -> Iterator[None]:
        """The body of one backend call (raises the closed error once :meth:`close` began)."""
        with self._state:
            if self._closed:
                raise self._closed_error(f"the index {self._what} is closed")
            self._running += 1
        try:
            yield
        finally:
            with self._state:
                self._running -= 1
                if not self._running:
                    self._state.notify_all()

    def close(self) -> bool:
        """Refuse new calls and wait for the running ones; True the first time (the caller then
        releases the backend's resources), False when it was closed already."""
        with self._state:
            if self._closed:
                return False
            self._closed = True
            self._state.wait_for(lambda: not self._running)
        return True
