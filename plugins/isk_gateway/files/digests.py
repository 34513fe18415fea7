"""What makes rebuilt metadata byte-identical: digests of a state (which name manifests and
manifest lists and give hotset snapshot ids) and Avro sync markers derived from a file's key
instead of ``os.urandom``."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["state_digest", "sync_marker"]


def state_digest(value: Any) -> str:
    """The SHA-256 (hex) of ``value`` as compact JSON with sorted keys: the same state, the
    same digest."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def sync_marker(key: str) -> bytes:
    """The 16-byte Avro sync marker of the file at ``key`` (fixed, so rebuilds are identical)."""
    return hashlib.sha256(b"bergstream-avro-sync:" + key.encode()).digest()[:16]
