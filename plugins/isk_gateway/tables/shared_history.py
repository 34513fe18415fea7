"""One log of each table's snapshot history in a shared cache backend, so ISK instances behind
one load balancer serve the same history: the same metadata, byte for byte, for a log state.

Entry ``n`` of table ``T`` is the cache entry ``history/T/<n, 12 digits>`` (under the file
store's layout prefix). An instance records a snapshot by writing the next entry with
``put_if_absent`` (:class:`~bergstream.core.api.ConditionalCacheBackend`): one writer wins each
position; a loser adopts the entries it lacks (:meth:`..history.SnapshotHistories.sync`) and
plans again on top of them. An entry holds the snapshot as the index keeps it and the chunks its
new files cover, which the adopting instance puts in its own chunk index: its next plan cuts the
log where the writer cut it, so both list the same files.

``history/T/head`` holds the newest position written (a plain put, a hint only): an instance
that never saw the table starts reading there, ``max_count`` entries back, instead of at 1.
Entries are small (a few hundred bytes plus about 150 per new file) and never deleted by ISK;
a cache that expires or evicts them (``ttl_seconds``, ``max_bytes``) only costs instances their
common history until the next snapshot one of them records.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bergstream.core.api import CacheBackend, ChunkEntry, ConditionalCacheBackend, SnapshotRecord

__all__ = ["SharedEntry", "SharedLog"]

log = logging.getLogger("bergstream.isk.history")

_ENTRY_FORMAT = 1
_HEAD = "head"


@dataclass(frozen=True)
class SharedEntry:
    """One position of a table's shared log: a snapshot, and the chunks of the files it added
    (indexed under ``index_topic``)."""

    position: int
    record: SnapshotRecord
    index_topic: str
    chunks: Sequence[ChunkEntry]

    def encode(self) -> bytes:
        """The entry's bytes in the cache."""
        return json.dumps(
            {
                "format": _ENTRY_FORMAT,
                "position": self.position,
                "snapshot_id": self.record.snapshot_id,
                "sequence_number": self.record.sequence_number,
                "timestamp_ms": self.record.timestamp_ms,
                "state": self.record.state,
                "index_topic": self.index_topic,
                "chunks": [_chunk(c) for c in self.chunks],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> SharedEntry | None:
        """The entry in ``data``; None for another format or damaged bytes."""
        try:
            raw: dict[str, Any] = json.loads(data)
            if raw.get("format") != _ENTRY_FORMAT:
                return None
            topic = str(raw["index_topic"])
            return cls(
                position=int(raw["position"]),
                record=SnapshotRecord(
                    snapshot_id=int(raw["snapshot_id"]),
                    sequence_number=int(raw["sequence_number"]),
                    timestamp_ms=int(raw["timestamp_ms"]),
                    state=str(raw["state"]),
                ),
                index_topic=topic,
                chunks=[_unchunk(topic, c) for c in raw["chunks"]],
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None


def _bound(value: Any) -> Any:
    """A bound in JSON: ints and strings as they are, bytes and datetimes tagged, as an index
    may keep them (ISK's own are ints: offsets, partitions, timestamps in µs)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"b64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dt.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, int | str) and not isinstance(value, bool):
        return value
    raise TypeError(f"a chunk bound of type {type(value).__name__} cannot be shared: {value!r}")


def _unbound(value: Any) -> Any:
    if isinstance(value, dict):
        if "datetime" in value:
            return dt.datetime.fromisoformat(value["datetime"])
        return base64.b64decode(value["b64"])
    return value


def _chunk(chunk: ChunkEntry) -> list[Any]:
    bounds = {
        name: [_bound(low), _bound(high)] for name, (low, high) in sorted(chunk.bounds.items())
    }
    return [chunk.partition, chunk.start_offset, chunk.end_offset, chunk.row_count,
            chunk.size_bytes, bounds]  # fmt: skip


def _unchunk(topic: str, raw: list[Any]) -> ChunkEntry:
    partition, start, end, rows, size, bounds = raw
    return ChunkEntry(
        topic, int(partition), int(start), int(end), int(rows), int(size),
        {str(name): (_unbound(pair[0]), _unbound(pair[1])) for name, pair in bounds.items()},
    )  # fmt: skip


class SharedLog:
    """The snapshot logs of the tables, in a cache backend with ``put_if_absent``."""

    def __init__(self, cache: CacheBackend, prefix: str = "") -> None:
        """Entries under ``prefix`` + ``history/`` in ``cache`` (a conditional backend, or a
        wrapper with ``try_put_if_absent`` around one)."""
        self.cache = cache
        self.prefix = prefix

    @staticmethod
    def can_share(cache: CacheBackend) -> bool:
        """Whether ``cache`` (or the backend a resilient wrapper holds) has ``put_if_absent``."""
        inner = getattr(cache, "backend", cache)
        return isinstance(inner, ConditionalCacheBackend)

    def _key(self, name: str, position: int | str) -> str:
        suffix = f"{position:012d}" if isinstance(position, int) else position
        return f"{self.prefix}history/{name}/{suffix}"

    def _read(self, name: str, position: int) -> tuple[bool, SharedEntry | None]:
        """Whether table ``name``'s log has an entry at ``position``, and the entry if this
        version can read it (one it cannot, of another format, still holds its position)."""
        key = self._key(name, position)
        data = self.cache.get(key)
        if data is None:
            return False, None
        entry = SharedEntry.decode(data)
        if entry is None or entry.position != position:
            log.warning("isk: shared history entry %s is not readable; skipped", key)
            return True, None
        return True, entry

    def entries_after(
        self, name: str, position: int, up_to: int = 0
    ) -> tuple[list[SharedEntry], int]:
        """The readable entries after ``position``, in order, up to the first absent one past
        ``up_to`` (absent ones up to ``up_to`` are skipped: expired, or never written); and the
        last position taken, read or not (``position`` if none)."""
        found = []
        last = position
        at = position + 1
        while True:
            present, entry = self._read(name, at)
            if not present and at > up_to:
                return found, last
            if present:
                last = at
            if entry is not None:
                found.append(entry)
            at += 1

    def head(self, name: str) -> int:
        """The newest position written, as the hint says (0: none known)."""
        data = self.cache.get(self._key(name, _HEAD))
        try:
            return int(data) if data is not None else 0
        except ValueError:
            return 0

    def append(self, name: str, entry: SharedEntry) -> bool | None:
        """Write ``entry`` at its position if nobody has: True if this call did, False if
        another writer had, None if the cache could not tell (down, or refused the entry)."""
        key = self._key(name, entry.position)
        data = entry.encode()
        attempt = getattr(self.cache, "try_put_if_absent", None)
        if attempt is not None:
            won: bool | None = attempt(key, data)
        else:
            assert isinstance(self.cache, ConditionalCacheBackend)
            try:
                won = self.cache.put_if_absent(key, data)
            except Exception as error:
                log.warning("isk: writing shared history entry %s failed: %s", key, error)
                won = None
        if won:
            self.cache.put(self._key(name, _HEAD), str(entry.position).encode())
        return won
