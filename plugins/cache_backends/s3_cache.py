"""The ``s3`` cache backend: entries as objects in a bucket of any S3-compatible server.

Gateway replicas pointing at one bucket and prefix share the cache: a file one synthesized is
served by all. Each object is ``<prefix><key>``, holding the data behind a verified header
(:mod:`.entries`); ``get`` checks it, and deletes and misses a corrupt or expired entry. A PUT
replaces an object whole, so concurrent writers of one key are harmless and a reader sees one
writer's complete entry. ``put_if_absent`` is a PUT with ``If-None-Match: *``.

Bounds: ``ttl_seconds`` (an entry older than that is a miss and is deleted), and optionally
``max_bytes``: once this process has written past it (counting what was there when it first
looked), the oldest objects under the prefix (by LastModified) are deleted down to 90 %. With
several writers the bound is best effort. The client is the ``minio`` package with short
timeouts and no retries, so a dead server costs one quick error (which ISK's resilient wrapper
turns into a miss), not minutes of retrying.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from bergstream.plugins.cache_backends.entries import check_key, seal, unseal

__all__ = ["S3Cache", "minio_client"]

log = logging.getLogger(__name__)

_MAX_KEY = 1024
_LOW_WATERMARK = 0.9
_MISSING = ("NoSuchKey", "NoSuchObject", "NoSuchBucket")
#: What a server answers a conditional PUT of an existing object (or of one being written).
_EXISTS = ("PreconditionFailed", "ConditionalRequestConflict")


def minio_client(
    endpoint: str,
    access_key: str,
    secret_key: str,
    region: str,
    connect_timeout: float = 2.0,
    read_timeout: float = 10.0,
    pool_size: int = 16,
) -> Minio:
    """A Minio client for ``endpoint`` (``http[s]://host:port``) with the given timeouts and
    no retries."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"S3 endpoint {endpoint!r} must look like http://host:port")
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
        retries=urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0),
        maxsize=pool_size,
    )
    return Minio(
        parts.netloc,
        access_key=access_key,
        secret_key=secret_key,
        secure=parts.scheme == "https",
        region=region,
        http_client=http,
    )


class S3Cache:
    """A :class:`~bergstream.core.api.CacheBackend` on an S3 bucket."""

    def __init__(
        self,
        client: Minio,
        bucket: str,
        prefix: str = "bergstream-cache/",
        ttl_seconds: float | None = None,
        max_bytes: int | None = None,
        create_bucket: bool = True,
    ) -> None:
        """Use ``bucket`` (created on first write if missing and ``create_bucket``), objects
        under ``prefix``. Nothing is sent to the server until the first call."""
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be > 0, got {ttl_seconds}")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if prefix.startswith("/"):
            raise ValueError(f"prefix {prefix!r} must not start with '/'")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds
        self.max_bytes = max_bytes
        self.create_bucket = create_bucket
        self.corrupt_entries = 0
        self._lock = threading.Lock()
        self._estimate: int | None = None  # bytes under the prefix, counted on first need

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key, _MAX_KEY - len(self.prefix.encode()))

    def get(self, key: str) -> bytes | None:
        """The verified bytes under ``key``; None if absent, expired or corrupt (then the object
        is deleted). Server errors other than "no such key/bucket" are raised."""
        name = self._name(key)
        try:
            response = self.client.get_object(self.bucket, name)
        except S3Error as error:
            if error.code in _MISSING:
                return None
            raise
        try:
            blob = response.read()
        finally:
            response.close()
            response.release_conn()
        entry = unseal(blob)
        if entry is None:
            self.corrupt_entries += 1
            log.warning("s3 cache: %s/%s failed verification; deleted", self.bucket, name)
            self._remove(name)
            return None
        if self.ttl_seconds is not None and time.time() * 1000 - entry.stored_ms > (
            self.ttl_seconds * 1000
        ):
            self._remove(name)
            return None
        return entry.data

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key`` in one PUT (atomic on the server)."""
        name = self._name(key)
        blob = seal(data)
        self._in_bucket(lambda: self._put(name, blob))
        if self.max_bytes is not None:
            self._account(len(blob))

    def _in_bucket(self, write: Callable[[], None]) -> None:
        """Run ``write``; if the bucket is missing and ``create_bucket`` is set, create it and
        run ``write`` again."""
        try:
            write()
        except S3Error as error:
            if error.code != "NoSuchBucket" or not self.create_bucket:
                raise
            self._ensure_bucket()
            write()

    def _put(self, name: str, blob: bytes) -> None:
        self.client.put_object(
            self.bucket,
            name,
            io.BytesIO(blob),
            len(blob),
            content_type="application/octet-stream",
        )

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` unless an object is there: one PUT with
        ``If-None-Match: *``, which the server refuses (412) if the object exists; True if
        stored. A server that ignores the header would let a later writer win: SeaweedFS and
        MinIO honour it (SeaweedFS since 3.97, concurrent writers too in 4.x)."""
        name = self._name(key)
        blob = seal(data)
        try:
            self._in_bucket(lambda: self._put_new(name, blob))
        except S3Error as error:
            if error.code in _EXISTS:
                return False
            raise
        if self.max_bytes is not None:
            self._account(len(blob))
        return True

    def _put_new(self, name: str, blob: bytes) -> None:
        # minio's put_object would turn If-None-Match into user metadata: send the PUT itself.
        response = self.client._execute(
            "PUT",
            self.bucket,
            name,
            body=blob,
            headers={"If-None-Match": "*", "Content-Type": "application/octet-stream"},
        )
        response.close()
        response.release_conn()

    def _ensure_bucket(self) -> None:
        try:
            self.client.make_bucket(self.bucket)
            log.info("s3 cache: created bucket %s", self.bucket)
        except S3Error as error:
            if error.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        self._remove(self._name(key))

    def _remove(self, name: str) -> None:
        try:
            self.client.remove_object(self.bucket, name)
        except S3Error as error:
            if error.code not in _MISSING:
                raise

    def close(self) -> None:
        """Drop the client's pooled connections."""
        self.client._http.clear()

    # ------------------------------------------------------------------ size bound

    def _objects(self) -> list[tuple[float, int, str]]:
        """``(last_modified, size, name)`` of every object under the prefix."""
        found = []
        for item in self.client.list_objects(self.bucket, prefix=self.prefix, recursive=True):
            if item.is_dir or item.object_name is None:
                continue
            stamp = item.last_modified.timestamp() if item.last_modified else 0.0
            found.append((stamp, item.size or 0, item.object_name))
        return found

    def _account(self, size: int) -> None:
        assert self.max_bytes is not None
        with self._lock:
            if self._estimate is None:
                try:
                    self._estimate = sum(size for _t, size, _n in self._objects())
                except S3Error as error:
                    if error.code != "NoSuchBucket":
                        raise
                    self._estimate = 0
            else:
                self._estimate += size
            over = self._estimate > self.max_bytes
        if over:
            self.evict()

    def evict(self) -> int:
        """Delete expired objects, then the oldest (by LastModified) until the total is below
        90 % of ``max_bytes``; return how many objects were deleted."""
        with self._lock:
            objects = sorted(self._objects())
            total = sum(size for _t, size, _n in objects)
            now = time.time()
            target = int(self.max_bytes * _LOW_WATERMARK) if self.max_bytes else None
            doomed = []
            for stamp, size, name in objects:
                expired = self.ttl_seconds is not None and now - stamp > self.ttl_seconds
                if expired or (target is not None and total > target):
                    doomed.append(name)
                    total -= size
            if doomed:
                errors = list(
                    self.client.remove_objects(self.bucket, (DeleteObject(name) for name in doomed))
                )
                for error in errors:
                    log.warning("s3 cache: evicting %s failed: %s", error.name, error.message)
            self._estimate = total
            return len(doomed)
