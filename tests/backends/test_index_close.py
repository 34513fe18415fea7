"""Closing an index backend while other threads are inside calls on it: the calls in progress
finish, later ones raise :class:`IndexClosedError`, and the process does not crash.

Before the guard (``plugins/index_backends/call_guard.py``) the ``sqlite`` backend closed
connections under a statement another thread was stepping: a segmentation fault of ISK's
``bergstream run`` on stop, while its background indexer was writing. The race runs in a
child process so a crash fails this test instead of killing the test worker."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from bergstream.core.backends import ChunkEntry, IndexBackend
from bergstream.plugins.index_backends.call_guard import CallGuard
from bergstream.plugins.index_backends.rocksdb_index import RocksIndex
from bergstream.plugins.index_backends.sqlite_index import IndexClosedError, SqliteIndex

ROUNDS = 60
THREADS = 3


def _work(index: IndexBackend, partition: int, started: threading.Barrier) -> BaseException | None:
    """Write and read ``partition`` until the index is closed: None when that ends it, else
    what went wrong."""
    started.wait()
    position = 0
    try:
        while True:
            index.put_chunks(
                [
                    ChunkEntry("t", partition, position + i, position + i + 1, 1, 10, {})
                    for i in range(100)
                ]
            )
            assert index.chunks("t", partition, 0)[-1].end_offset == position + 100
            position += 100
    except IndexClosedError:
        return None
    except BaseException as error:
        return error


def _race(backend: str, rounds: int) -> None:
    """``rounds`` times: open an index, start ``THREADS`` threads writing and reading it in a
    loop, close it from this thread while they run; every thread must end on
    IndexClosedError and nothing else."""
    folder = Path(tempfile.mkdtemp())
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        for attempt in range(rounds):
            path = folder / f"index-{attempt}"
            index: IndexBackend = SqliteIndex(path) if backend == "sqlite" else RocksIndex(path)
            started = threading.Barrier(THREADS + 1)
            running = [pool.submit(_work, index, p, started) for p in range(THREADS)]
            started.wait()
            time.sleep(0.002 * (attempt % 10))
            index.close()
            for outcome in running:
                if (error := outcome.result()) is not None:
                    raise error
    print("ok")


@pytest.mark.parametrize("backend", ["sqlite", "rocksdb"])
def test_close_while_other_threads_call_does_not_crash(backend: str) -> None:
    """The race, in a child process: it exits 0 and says ok (a crash gives -11)."""
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", __file__, backend, str(ROUNDS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-4000:]}"
    assert done.stdout.strip() == "ok"


def test_the_guard_waits_for_calls_in_progress_and_refuses_later_ones() -> None:
    """``close`` returns only after the running call has; a call after it raises; a second
    close says it was closed already."""
    guard = CallGuard(IndexClosedError, "demo")
    inside, leave = threading.Event(), threading.Event()
    order: list[str] = []

    def call() -> None:
        with guard.call():
            inside.set()
            leave.wait()
            order.append("call returned")

    caller = threading.Thread(target=call)
    caller.start()
    inside.wait()
    closer = threading.Thread(target=lambda: order.append(f"closed {guard.close()}"))
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and order == []  # waiting for the call
    leave.set()
    caller.join()
    closer.join()
    assert order == ["call returned", "closed True"]
    with pytest.raises(IndexClosedError, match="the index demo is closed"), guard.call():
        pass
    assert guard.close() is False


if __name__ == "__main__":
    _race(sys.argv[1], int(sys.argv[2]))
