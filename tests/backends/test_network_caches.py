"""The ``s3`` and ``redis`` cache backends against the stack's real SeaweedFS and Redis (the
``s3`` conformance suite also against moto's S3, the reference): the conformance suite, then
what is specific to each (TTL, size bounds, errors, registration)."""

from __future__ import annotations

import io
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from bergstream.core.backends import ServiceContext
from bergstream.core.plugins import load_registry
from bergstream.core.testing.backends import CACHE_CHECKS, CacheCheck, check_id
from bergstream.plugins.cache_backends import plugin
from bergstream.plugins.cache_backends.entries import (
    CacheEntryTooLargeError,
    CacheKeyError,
    seal,
    unseal,
)
from bergstream.plugins.cache_backends.redis_cache import RedisCache
from bergstream.plugins.cache_backends.s3_cache import S3Cache
from tests.backends.servers import TEST_BUCKET, S3Settings, redis_case, s3_case

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("check", CACHE_CHECKS, ids=check_id)
def test_s3_conformance(check: CacheCheck, s3_settings: S3Settings, tmp_path: Path) -> None:
    check(s3_case(s3_settings), tmp_path / "cache")


#: moto keeps each object's bytes in one buffer that concurrent requests share: two threads
#: reading or writing one key at once get a 500 from moto itself (measured with moto 5.2.5), so
#: the checks that do that run against SeaweedFS only.
MOTO_UNSAFE = {"cache_concurrent_writers", "cache_shared_between_instances"}

#: moto checks ``If-None-Match: *`` and then stores, with no lock between (moto 5.2.5,
#: ``s3/responses.py`` ``put_object``): two racing conditional PUTs can both succeed there, as
#: one CI run saw ("2 of 8 racing writers won"). On moto the check runs its sequential part
#: only; the race runs against SeaweedFS and Redis, whose conditional writes are atomic.
MOTO_ROUNDS = {"cache_put_if_absent": 0}


@pytest.mark.parametrize(
    "check", [c for c in CACHE_CHECKS if check_id(c) not in MOTO_UNSAFE], ids=check_id
)
def test_s3_conformance_on_moto(check: CacheCheck, moto: Any, tmp_path: Path) -> None:
    from tests.kits.moto_server import ACCESS_KEY, REGION, SECRET_KEY

    case = s3_case(S3Settings(moto.url, ACCESS_KEY, SECRET_KEY, REGION))
    if check_id(check) in MOTO_ROUNDS:
        check(case, tmp_path / "cache", rounds=MOTO_ROUNDS[check_id(check)])  # type: ignore[call-arg]
    else:
        check(case, tmp_path / "cache")


@pytest.mark.parametrize("check", CACHE_CHECKS, ids=check_id)
def test_redis_conformance(check: CacheCheck, redis_url: str, tmp_path: Path) -> None:
    check(redis_case(redis_url), tmp_path / "cache")


# --------------------------------------------------------------------------- entry format


def test_a_sealed_entry_detects_any_flipped_bit() -> None:
    blob = seal(b"some data", now_ms=1234)
    entry = unseal(blob)
    assert entry is not None and entry.data == b"some data" and entry.stored_ms == 1234
    for position in range(4, len(blob)):  # every byte after the magic
        damaged = bytearray(blob)
        damaged[position] ^= 0x10
        assert unseal(bytes(damaged)) is None, position
    assert unseal(blob[:-1]) is None and unseal(b"") is None and unseal(b"x" * 100) is None


# --------------------------------------------------------------------------- s3 specifics


def _s3(settings: S3Settings, **options: Any) -> S3Cache:
    return S3Cache(settings.client(), TEST_BUCKET, prefix=f"{uuid.uuid4().hex}/", **options)


def test_s3_creates_its_bucket_on_first_write(s3_settings: S3Settings) -> None:
    bucket = f"bergstream-new-{uuid.uuid4().hex[:12]}"
    cache = S3Cache(s3_settings.client(), bucket)
    assert cache.get("k") is None  # a missing bucket is a miss, not an error
    cache.put("k", b"v")
    assert s3_settings.client().bucket_exists(bucket)
    assert cache.get("k") == b"v"


def test_s3_entries_expire_after_the_ttl(s3_settings: S3Settings) -> None:
    cache = _s3(s3_settings, ttl_seconds=1.0)
    cache.put("k", b"v")
    assert cache.get("k") == b"v"
    time.sleep(1.3)
    assert cache.get("k") is None
    names = [
        o.object_name
        for o in cache.client.list_objects(TEST_BUCKET, prefix=cache.prefix, recursive=True)
    ]
    assert names == []  # the expired object was deleted


def test_s3_max_bytes_evicts_the_oldest_objects(s3_settings: S3Settings) -> None:
    cache = _s3(s3_settings, max_bytes=1024**2)
    for i in range(5):
        cache.put(f"k{i}", bytes(300_000))
        time.sleep(1.1)  # LastModified has a resolution of one second
    sizes = [
        o.size for o in cache.client.list_objects(TEST_BUCKET, prefix=cache.prefix, recursive=True)
    ]
    assert sum(sizes) <= 1024**2
    assert cache.get("k0") is None and cache.get("k4") == bytes(300_000)


def test_s3_truncated_and_foreign_objects_are_misses_and_deleted(s3_settings: S3Settings) -> None:
    cache = _s3(s3_settings)
    cache.client.put_object(TEST_BUCKET, cache.prefix + "foreign", io.BytesIO(b"abc"), 3)
    assert cache.get("foreign") is None and cache.corrupt_entries == 1
    assert list(cache.client.list_objects(TEST_BUCKET, prefix=cache.prefix, recursive=True)) == []


def test_s3_refuses_bad_keys(s3_settings: S3Settings) -> None:
    cache = _s3(s3_settings)
    for key in ["", "/abs", "a\x00b", "x" * 1100]:
        with pytest.raises(CacheKeyError, match="cache key"):
            cache.put(key, b"v")


def test_s3_unreachable_server_fails_fast(tmp_path: Path) -> None:
    from bergstream.devstack.stack.ports import free_port

    settings = S3Settings(f"http://127.0.0.1:{free_port()}", "a", "b", "us-east-1")
    cache = S3Cache(settings.client(), TEST_BUCKET)
    started = time.monotonic()
    with pytest.raises(Exception, match=r"onnect|refused"):
        cache.get("k")
    assert time.monotonic() - started < 2


# --------------------------------------------------------------------------- redis specifics


def test_redis_sets_the_ttl_as_expiry(redis_url: str) -> None:
    prefix = f"bergstream-test:{uuid.uuid4().hex}:"
    cache = RedisCache.from_url(redis_url, prefix=prefix, ttl_seconds=1)
    cache.put("k", b"v")
    assert 0 < cache.client.pttl(cache.prefix + "k") <= 1000
    time.sleep(1.2)
    assert cache.get("k") is None


def test_redis_refuses_entries_above_the_limit_with_a_clear_error(redis_url: str) -> None:
    prefix = f"bergstream-test:{uuid.uuid4().hex}:"
    cache = RedisCache.from_url(redis_url, prefix=prefix, max_entry_bytes=10_000)
    cache.put("small", bytes(9000))
    with pytest.raises(CacheEntryTooLargeError) as caught:
        cache.put("hotset/big.parquet", bytes(20_000))
    message = str(caught.value)
    assert "'hotset/big.parquet'" in message and "20000 bytes" in message
    assert "max_entry_bytes=10000" in message
    assert isinstance(caught.value, ValueError)
    assert cache.get("hotset/big.parquet") is None and cache.get("small") == bytes(9000)


def test_redis_corrupt_entry_is_deleted(redis_url: str) -> None:
    cache = RedisCache.from_url(redis_url, prefix=f"bergstream-test:{uuid.uuid4().hex}:")
    cache.client.set(cache.prefix + "k", b"not an entry")
    assert cache.get("k") is None and cache.corrupt_entries == 1
    assert cache.client.exists(cache.prefix + "k") == 0


def test_redis_unreachable_server_fails_fast() -> None:
    from bergstream.devstack.stack.ports import free_port

    cache = RedisCache.from_url(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        cache.get("k")
    assert time.monotonic() - started < 2


# --------------------------------------------------------------------------- registration


def _context(home: Path) -> ServiceContext:
    fake: Any = SimpleNamespace()
    return ServiceContext(config=fake, plugins=fake, home=home)


def test_the_plugin_registers_s3_and_redis(
    s3_settings: S3Settings, redis_url: str, tmp_path: Path
) -> None:
    registry = load_registry([plugin], entry_points=False)
    s3 = registry.get("cache backend", "s3")
    config = s3.config_model.model_validate(
        {
            "endpoint": s3_settings.endpoint,
            "access_key": s3_settings.access_key,
            "secret_key": s3_settings.secret_key,
            "bucket": TEST_BUCKET,
            "prefix": f"{uuid.uuid4().hex}/",
        }
    )
    assert s3_settings.secret_key not in repr(config)
    cache = s3.factory(config, _context(tmp_path))
    cache.put("k", b"v")
    assert cache.get("k") == b"v"
    cache.close()
    with pytest.raises(ValidationError, match="secret_key"):
        s3.config_model.model_validate({"endpoint": "http://x:1", "access_key": "a"})
    with pytest.raises(ValidationError, match="bucket"):
        s3.config_model.model_validate(
            {"endpoint": "http://x:1", "access_key": "a", "secret_key": "b", "bucket": "A_B"}
        )

    red = registry.get("cache backend", "redis")
    config = red.config_model.model_validate(
        {"url": redis_url, "prefix": f"bergstream-test:{uuid.uuid4().hex}:", "ttl_seconds": 60}
    )
    cache = red.factory(config, _context(tmp_path))
    cache.put("k", b"v")
    assert cache.get("k") == b"v"
    cache.close()
    with pytest.raises(ValidationError, match="max_entry_bytes"):
        red.config_model.model_validate({"max_entry_bytes": 5})
    with pytest.raises(ValidationError, match="url"):
        red.config_model.model_validate({"url": "http://nope"})
