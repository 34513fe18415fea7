"""Spark checkpoints of the pipeline: one directory per table, a lock per topic, and the offset
log that says where each micro-batch ends.

The checkpoint only saves work: the table's boundary is the truth. A checkpoint lives under the
table's UUID, so a recreated table never reuses an old one, and deleting it is always safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from bergstream.pipeline.session import PipelineSetupError

__all__ = [
    "batch_end_offsets",
    "batch_end_offsets_by_topic",
    "checkpoint_path",
    "group_checkpoint_path",
    "topic_lock",
]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def checkpoint_path(root: Path, namespace: str, topic: str, table_uuid: str) -> Path:
    """``root/<namespace>.<topic>/<table uuid>``."""
    return root / _safe(f"{namespace}.{topic}") / table_uuid


@contextlib.contextmanager
def topic_lock(root: Path, namespace: str, topic: str) -> Iterator[Path]:
    """Hold an exclusive lock on ``root/<namespace>.<topic>.lock`` while one pipeline copies the
    topic; a second pipeline for the same topic fails at once, naming the lock file. The OS drops
    the lock when the process dies, however it dies."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / (_safe(f"{namespace}.{topic}") + ".lock")
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise PipelineSetupError(
                f"another pipeline ({holder}) is copying topic '{topic}' into "
                f"{namespace}.{topic} (lock {path}): stop it first; one pipeline per topic"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield path
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def batch_end_offsets(checkpoint: Path, batch_id: int, topic: str) -> dict[int, int]:
    """The end offsets (next offset per partition) of micro-batch ``batch_id``, from Spark's
    offset log ``<checkpoint>/offsets/<batch_id>`` (written before the batch runs: a version
    line, a metadata line, then one JSON line per source)."""
    offsets = batch_end_offsets_by_topic(checkpoint, batch_id)
    if topic not in offsets:
        path = checkpoint / "offsets" / str(batch_id)
        raise PipelineSetupError(f"Spark's offset log {path} has no offsets for topic '{topic}'")
    return offsets[topic]


def batch_end_offsets_by_topic(checkpoint: Path, batch_id: int) -> dict[str, dict[int, int]]:
    """The end offsets of micro-batch ``batch_id`` of every topic its source reads."""
    path = checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise PipelineSetupError(f"cannot read Spark's offset log {path}: {error}") from None
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise PipelineSetupError(f"Spark's offset log {path} has an unknown format: {lines[:3]}")
    offsets = json.loads(lines[2])
    return {
        topic: {int(partition): int(offset) for partition, offset in partitions.items()}
        for topic, partitions in offsets.items()
    }


def group_checkpoint_path(root: Path, namespace: str, tables: dict[str, str]) -> Path:
    """``root/<namespace>._groups/<digest>``: the checkpoint of one streaming query copying
    the topics of ``tables`` (topic: table UUID); another set of topics or tables gets another
    directory (a query's checkpoint is bound to the topics it subscribed to)."""
    digest = hashlib.sha256(json.dumps(sorted(tables.items())).encode()).hexdigest()[:24]
    return root / _safe(f"{namespace}._groups") / digest
