"""The stored form of an entry in the network caches (``s3``, ``redis``): a header, then the data.

Header (big-endian): magic ``BSE1``, SHA-256, data length, time stored (ms since the epoch).
The digest covers the length, the time and the data, so a flipped bit anywhere but in the magic
is caught, and a changed time cannot revive an expired entry. :func:`unseal` returns None for
anything that does not verify; callers delete such entries and report a miss.
"""

from __future__ import annotations

import hashlib
import struct
import time
from dataclasses import dataclass

__all__ = [
    "HEADER_BYTES",
    "CacheEntryTooLargeError",
    "CacheKeyError",
    "Unsealed",
    "check_key",
    "seal",
    "unseal",
]

_MAGIC = b"BSE1"
_HEADER = struct.Struct(">4s32sQQ")
_SIGNED = struct.Struct(">QQ")
#: Bytes an entry takes on top of its data.
HEADER_BYTES = _HEADER.size


class CacheKeyError(ValueError):
    """A key a network cache refuses (empty, absolute, with NUL bytes or too long)."""


class CacheEntryTooLargeError(ValueError):
    """An entry above the backend's per-entry size limit; it is not cached."""


def check_key(key: str, max_length: int) -> str:
    """``key`` if it is a usable cache key (a non-empty relative path of at most
    ``max_length`` UTF-8 bytes without NUL bytes), else raise :class:`CacheKeyError`."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
        raise CacheKeyError(f"cache key {key!r} must be a non-empty relative path without NUL")
    if len(key.encode()) > max_length:
        raise CacheKeyError(f"cache key {key[:60]!r}... is longer than {max_length} bytes")
    return key


def seal(data: bytes | memoryview, now_ms: int | None = None) -> bytes:
    """``data`` with its header (stored now, or at ``now_ms``)."""
    stored = int(time.time() * 1000) if now_ms is None else now_ms
    signed = _SIGNED.pack(len(data), stored)
    digest = hashlib.sha256(signed + data).digest()
    return _HEADER.pack(_MAGIC, digest, len(data), stored) + data


@dataclass(frozen=True)
class Unsealed:
    """A verified entry: its data and when it was stored (ms since the epoch)."""

    data: bytes
    stored_ms: int


def unseal(blob: bytes) -> Unsealed | None:
    """The verified data of a stored entry, or None if it is truncated, foreign or corrupt."""
    if len(blob) < _HEADER.size:
        return None
    magic, digest, length, stored = _HEADER.unpack_from(blob)
    data = blob[_HEADER.size :]
    if magic != _MAGIC or length != len(data):
        return None
    if hashlib.sha256(_SIGNED.pack(length, stored) + data).digest() != digest:
        return None
    return Unsealed(data, stored)
