"""ISK's :class:`ResilientCache` around real backends whose server this test kills: requests keep
being answered (misses), the outage is logged once, calls are skipped while the server is down,
and the cache is used again once it is back. Each test starts its own Redis or SeaweedFS (own
stack home, ports and PID) so the session's servers are never touched."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from bergstream.plugins.cache_backends.redis_cache import RedisCache
from bergstream.plugins.cache_backends.s3_cache import S3Cache
from bergstream.plugins.isk_gateway.metrics import CACHE_REQUESTS
from bergstream.plugins.isk_gateway.tables.resilient_cache import ResilientCache
from tests.backends.servers import OwnServer, S3Settings
from tests.support import wait_until

pytestmark = pytest.mark.slow

LOGGER = "bergstream.isk.cache"


def _count(name: str, result: str) -> float:
    return CACHE_REQUESTS.labels(backend=name, result=result)._value.get()


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnServer]:
    """A Redis of this test's own, stopped at the end."""
    server = OwnServer(tmp_path / "redis-home", "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_s3(tmp_path: Path) -> Iterator[OwnServer]:
    """A SeaweedFS of this test's own, stopped at the end."""
    server = OwnServer(tmp_path / "s3-home", "s3")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _outage_and_recovery(
    cache: ResilientCache,
    server: OwnServer,
    caplog: pytest.LogCaptureFixture,
    survives_restart: bool,
    writable: Callable[[], bool],
) -> None:
    """Use ``cache``, kill its server, keep using it, restart the server and wait until
    ``writable()`` (a direct write to the server succeeds), then check the cache is used
    again."""
    name = cache.name
    cache.put("meta/v1.metadata.json", b"{}")
    hits = _count(name, "hit")
    assert cache.get("meta/v1.metadata.json") == b"{}"
    assert _count(name, "hit") == hits + 1
    misses = _count(name, "miss")
    assert cache.get("never/put") is None
    assert _count(name, "miss") == misses + 1
    once = f"history/t/{uuid.uuid4().hex}"
    assert cache.try_put_if_absent(once, b"first") is True
    assert cache.try_put_if_absent(once, b"second") is False
    assert cache.get(once) == b"first"

    server.stop()
    errors = _count(name, "error")
    started = time.monotonic()
    for i in range(50):  # a busy gateway: every call answers at once, nothing raises
        assert cache.get("meta/v1.metadata.json") is None
        cache.put(f"data/{i}.parquet", b"x" * 100)
        cache.delete("meta/v1.metadata.json")
        assert cache.try_put_if_absent(f"history/t/{i}", b"x") is None  # cannot tell
    assert time.monotonic() - started < 5, "calls were not skipped while the server was down"
    assert not cache.available
    assert _count(name, "error") == errors + 50  # lookups only
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert f"cache backend {name!r} failed" in warnings[0].getMessage()
    failures = cache.failures
    assert failures <= 3  # the first call, and at most a probe or two

    time.sleep(cache.retry_seconds + 0.1)
    assert cache.get("meta/v1.metadata.json") is None  # a probe, still failing: no new log
    assert len(_records(caplog, logging.WARNING)) == 1

    server.start()
    wait_until(writable, 60)
    wait_until(lambda: cache.get("meta/v1.metadata.json") is not None or cache.available, 30)
    assert cache.available
    infos = _records(caplog, logging.INFO)
    assert len(infos) == 1 and "works again" in infos[0].getMessage()
    expected = b"{}" if survives_restart else None
    assert cache.get("meta/v1.metadata.json") == expected
    assert cache.try_put_if_absent(f"history/t/{uuid.uuid4().hex}", b"back") is True
    cache.put("after", b"back")
    hits = _count(name, "hit")
    assert cache.get("after") == b"back"
    assert _count(name, "hit") == hits + 1
    assert len(_records(caplog, logging.WARNING)) == 1


def test_a_killed_redis_becomes_misses_logged_once(
    own_redis: OwnServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert own_redis.env is not None and own_redis.env.redis_url is not None
    url = own_redis.env.redis_url
    backend = RedisCache.from_url(url, prefix="t:")
    cache = ResilientCache(backend, name=f"redis-{uuid.uuid4().hex[:6]}", retry_seconds=1.0)

    def writable() -> bool:
        probe = RedisCache.from_url(url, prefix="probe:")
        try:
            probe.put("k", b"v")
            return True
        except redis.RedisError:
            return False
        finally:
            probe.close()

    _outage_and_recovery(cache, own_redis, caplog, False, writable)
    cache.close()


def test_a_killed_s3_server_becomes_misses_logged_once(
    own_s3: OwnServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert own_s3.env is not None
    settings = S3Settings.from_env(own_s3.env.as_dict())
    backend = S3Cache(settings.client(read_timeout=5.0), "resilience")
    cache = ResilientCache(backend, name=f"s3-{uuid.uuid4().hex[:6]}", retry_seconds=1.0)

    def writable() -> bool:
        probe = S3Cache(settings.client(read_timeout=5.0), "resilience", prefix="probe/")
        try:
            probe.put("k", b"v")
            return probe.get("k") == b"v"
        except Exception:
            return False

    _outage_and_recovery(cache, own_s3, caplog, True, writable)
    cache.close()


def test_a_refused_entry_is_not_an_outage(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    backend = RedisCache.from_url(
        redis_url, prefix=f"bergstream-test:{uuid.uuid4().hex}:", max_entry_bytes=2000
    )
    cache = ResilientCache(backend, name="redis-small")
    for _ in range(3):
        cache.put("hotset/big.parquet", bytes(5000))  # refused: logged once, never raised
    cache.put("small", b"s")
    assert cache.available and cache.failures == 0 and cache.refused == 3
    assert cache.get("hotset/big.parquet") is None and cache.get("small") == b"s"
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "'hotset/big.parquet'" in message and "max_entry_bytes=2000" in message
    assert "not cached" in message


def test_refusals_are_logged_at_most_once_a_minute(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    now = [1000.0]
    backend = RedisCache.from_url(
        redis_url, prefix=f"bergstream-test:{uuid.uuid4().hex}:", max_entry_bytes=2000
    )
    cache = ResilientCache(backend, name="redis-rate", clock=lambda: now[0])
    for i in range(5):
        cache.put(f"big/{i}", bytes(5000))
    assert len(_records(caplog, logging.WARNING)) == 1
    now[0] += 61
    cache.put("big/last", bytes(5000))
    warnings = [r.getMessage() for r in _records(caplog, logging.WARNING)]
    assert len(warnings) == 2 and "refused 5 more entries" in warnings[1]
    assert "'big/last'" in warnings[1] and cache.refused == 6 and cache.available


class HeldBackend:
    """A backend answering from ``answers`` (a value, or an exception to raise); a call of a
    key in ``held`` waits, once it has started, until that key's event is set."""

    def __init__(self, answers: dict[str, bytes | Exception], held: tuple[str, ...]) -> None:
        self.answers = answers
        self.started = {key: threading.Event() for key in held}
        self.release = {key: threading.Event() for key in held}

    def get(self, key: str) -> bytes | None:
        if key in self.started:
            self.started[key].set()
            assert self.release[key].wait(10)
        answer = self.answers.get(key)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.answers[key] = bytes(data)

    def delete(self, key: str) -> None:
        self.answers.pop(key, None)

    def close(self) -> None:
        pass


def _call_held(cache: ResilientCache, backend: HeldBackend, key: str) -> threading.Thread:
    """``cache.get(key)`` on a thread, returned once the backend has started answering it."""
    thread = threading.Thread(target=cache.get, args=(key,))
    thread.start()
    assert backend.started[key].wait(10)
    return thread


def test_a_call_started_before_an_outage_does_not_end_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    down = ConnectionError("refused")
    backend = HeldBackend({"slow": b"old answer", "bad": down}, held=("slow",))
    now = [100.0]
    cache = ResilientCache(backend, name="held-success", retry_seconds=5, clock=lambda: now[0])
    slow = _call_held(cache, backend, "slow")  # started while the backend was up
    assert cache.get("bad") is None  # the outage starts
    assert not cache.available
    backend.release["slow"].set()
    slow.join(10)
    assert not cache.available  # its success is older than the outage: still down
    assert _records(caplog, logging.INFO) == []
    now[0] += 6
    backend.answers["bad"] = b"fine"
    assert cache.get("bad") == b"fine"  # a probe of the outage: the backend is back
    assert cache.available
    assert len(_records(caplog, logging.INFO)) == 1
    assert len(_records(caplog, logging.WARNING)) == 1


def test_a_call_failing_from_before_a_recovery_does_not_start_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    down = ConnectionError("refused")
    backend = HeldBackend({"slow": down, "probe": down}, held=("slow",))
    now = [100.0]
    cache = ResilientCache(backend, name="held-failure", retry_seconds=5, clock=lambda: now[0])
    slow = _call_held(cache, backend, "slow")  # started while the backend was up
    assert cache.get("probe") is None  # the outage starts
    now[0] += 6
    backend.answers["probe"] = b"back"
    assert cache.get("probe") == b"back"  # a probe: the backend is back
    assert cache.available
    backend.release["slow"].set()
    slow.join(10)
    assert cache.available  # its failure is older than the recovery: no new outage
    assert len(_records(caplog, logging.WARNING)) == 1
    assert len(_records(caplog, logging.INFO)) == 1
    assert cache.failures == 2


def test_a_backend_without_put_if_absent_cannot_tell(tmp_path: Path) -> None:
    class Plain:
        def get(self, key: str) -> bytes | None:
            return None

        def put(self, key: str, data: bytes) -> None:
            pass

        def delete(self, key: str) -> None:
            pass

        def close(self) -> None:
            pass

    cache = ResilientCache(Plain(), name="plain")
    assert cache.try_put_if_absent("history/t/1", b"x") is None
    assert cache.available
