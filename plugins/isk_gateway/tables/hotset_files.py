"""The hotset's file serving: every file by key, held, cached or built once, with read-ahead.

A file in memory (or waiting for its write-behind put) is answered at once; otherwise one lookup
in the cache backend runs for all concurrent readers of the key and, for a data key the cache
does not have, one build by the first file synthesizer that handles the key (by default
``hotset-parquet``, from Kafka). Metadata keys are never built here: they are kept from the load
that built them, and a missing one is ``NoSuchFile``.

Read-ahead: a cold read soon after the cold read of the file before it in scan order (the
table's files by partition, then offset) is a sequential scan, so the two files after it are
built in the background, and each use of a file built ahead keeps two ahead. A read-ahead build
starts only while fewer builds run than the machine has cores: the files clients wait for come
first, and the cores they leave free build the files they will ask for next.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Mapping, Sequence

from bergstream.core.api import FileSynthesizer
from bergstream.plugins.isk_gateway.metrics import ISK_SYNTHESIZED_BYTES
from bergstream.plugins.isk_gateway.tables.paths import DataKey, ParsedKey, parse_key
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile
from bergstream.plugins.isk_gateway.tables.store import FileStore

__all__ = ["HotsetFiles"]

log = logging.getLogger("bergstream.isk.index")

#: Files built ahead of a sequential scan: enough that an engine scanning one file while the
#: next is built does not wait for a build (2: a build takes about twice a scan of the file).
_READ_AHEAD_FILES = 2
#: Cold reads remembered per topic to tell a sequential scan (an engine reading files on
#: several threads asks for a file's successor before the file itself is done).
_RECENT_COLD_READS = 4


class HotsetFiles:
    """Serves one cluster's hotset files by key from ``store``, building missing data files
    with ``synthesizers`` (first match wins)."""

    def __init__(
        self, store: FileStore, cluster: str, synthesizers: Sequence[FileSynthesizer]
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.synthesizers: list[FileSynthesizer] = list(synthesizers)
        self._building: dict[str, asyncio.Future[bytes]] = {}
        # Read-ahead of sequential cold scans: the next data file in scan order, per topic.
        self._successors: dict[str, dict[str, str]] = {}
        self._recent_cold: dict[str, deque[str]] = {}
        self._read_ahead: set[str] = set()
        self._read_ahead_tasks: set[asyncio.Task[None]] = set()
        # A read-ahead starts only while the store counts fewer builds than ``_cores``, so a
        # client's builds never share a core with a guess, and read-aheads use the rest.
        self._build_ended = asyncio.Condition()
        self._cores = os.cpu_count() or 1

    def set_successors(self, topic: str, successors: Mapping[str, str]) -> None:
        """The data file after each data file of ``topic``'s partitions, by key, as the current
        snapshot lists them (what a sequential scan reads next)."""
        self._successors[topic] = dict(successors)

    async def file_size(self, key: str) -> int:
        """Size of the file at ``key``: listed by a loaded snapshot, or of the file itself."""
        size = self.store.size(key)
        return size if size is not None else len(await self.read_file(key))

    async def read_file(self, key: str) -> bytes:
        """The file at ``key`` (held, cached or built)."""
        return await self._read(key, ahead=False)

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the file at ``key`` (synthesized whole, then sliced without
        a copy: ranged GETs of large files are the hot path of a scan)."""
        return memoryview(await self.read_file(key))[start:end]

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys of the tables loaded so far (their current snapshot's files) under ``prefix``."""
        return self.store.list_keys(prefix, limit)

    async def _read(self, key: str, ahead: bool) -> bytes:
        """The file at ``key``: held, cached or built (once for concurrent readers). ``ahead``:
        a read-ahead build, which neither counts as a client's read nor reads further ahead."""
        parsed = parse_key(key)
        if parsed.cluster != self.cluster:
            raise NoSuchFile(f"no such key {key!r} (cluster {self.cluster!r} is served here)")
        while True:
            # No await from here until a lookup is registered in ``_building``: a reader finds
            # the file held, joins the one lookup (and build) in flight, or starts it. A build
            # keeps its file in the store before it leaves ``_building``, so a reader coming
            # after it finds the file instead of building it again.
            data = self.store.held(key)
            in_flight = self._building.get(key) if data is None else None
            if data is None and in_flight is None:
                return await self._look_up_or_build(key, parsed, ahead)
            if not ahead and key in self._read_ahead:  # a read-ahead was used: keep one ahead
                self._read_ahead.discard(key)
                self._read_ahead_after(parsed)
            if in_flight is None:
                return data
            try:  # concurrent GETs of one missing file: build it once
                return await asyncio.shield(in_flight)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not in_flight.cancelled() or (task is not None and task.cancelling()):
                    raise
                # The reader that started the lookup was cancelled, not this one: look again.

    async def _look_up_or_build(self, key: str, parsed: ParsedKey, ahead: bool) -> bytes:
        """The file at ``key`` from the cache backend, or built if it is a data key the cache
        does not have; registered in ``_building`` until done, so concurrent readers wait for
        this one instead of looking up or building it again."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._building[key] = future
        try:
            data = await self.store.get(key)
            if data is not None:
                if not ahead and key in self._read_ahead:
                    self._read_ahead.discard(key)
                    self._read_ahead_after(parsed)
            elif not isinstance(parsed, DataKey):
                raise NoSuchFile(f"no such key {key!r} (not built by this gateway, or expired)")
            else:
                if not ahead:
                    self._read_ahead.discard(key)  # built ahead but dropped before its use
                    self._note_cold_read(parsed)
                    self.store.begin_build()  # a read-ahead counted itself at its start
                try:
                    data = await self._synthesize(key)
                finally:
                    if not ahead:
                        await self._build_over()
                ISK_SYNTHESIZED_BYTES.labels(self.cluster, "data").inc(len(data))
                await self.store.keep(key, data, write_behind=True)
            future.set_result(data)
            return data
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved here, so a lookup nobody waited for logs nothing
            raise
        finally:
            del self._building[key]

    def _successor(self, key: DataKey) -> str | None:
        return self._successors.get(key.topic, {}).get(key.key)

    def _note_cold_read(self, key: DataKey) -> None:
        """A cold read of a file soon after a cold read of the file before it in scan order is
        a sequential scan (an engine's readers take the files in turn): start building the
        files after it in the background."""
        successors = self._successors.get(key.topic, {})
        recent = self._recent_cold.setdefault(key.topic, deque(maxlen=_RECENT_COLD_READS))
        # Concurrent reads of two neighbours are noted in either order: the later file of the
        # pair is where reading ahead starts.
        later: ParsedKey | None = None
        for previous in recent:
            if successors.get(previous) == key.key:
                later = key
            elif successors.get(key.key) == previous:
                later = parse_key(previous)
        recent.append(key.key)
        if isinstance(later, DataKey):
            self._read_ahead_after(later)

    def _read_ahead_after(self, key: DataKey) -> None:
        """Build the ``_READ_AHEAD_FILES`` files after ``key`` in scan order in the background,
        those not held or being built already, each once a core is free of builds."""
        following = self._successor(key)
        for _ in range(_READ_AHEAD_FILES):
            if following is None:
                return
            if not (
                following in self._building
                or following in self._read_ahead
                or self.store.holds(following)
            ):
                self._read_ahead.add(following)
                task = asyncio.create_task(self._build_ahead(following))
                self._read_ahead_tasks.add(task)
                task.add_done_callback(self._read_ahead_tasks.discard)
            following = self._successors.get(key.topic, {}).get(following)

    async def _build_ahead(self, key: str) -> None:
        async with self._build_ended:  # a free core: builds for clients come first
            await self._build_ended.wait_for(lambda: self.store.builds < self._cores)
            if key not in self._read_ahead or self.store.holds(key) or key in self._building:
                return
            self.store.begin_build()  # the core is this build's from now (no await before)
        try:
            await self._read(key, ahead=True)
        except Exception as error:  # a read-ahead is a guess: the real read reports errors
            self._read_ahead.discard(key)
            log.debug("isk: read-ahead of %s failed: %s", key, error)
        finally:
            await self._build_over()

    async def _build_over(self) -> None:
        """A build (or a read-ahead's lookup and build) ended: its core is free."""
        self.store.end_build()
        async with self._build_ended:
            self._build_ended.notify_all()

    async def _synthesize(self, key: str) -> bytes:
        """The file at ``key`` from the first synthesizer that handles it."""
        for synthesizer in self.synthesizers:
            if synthesizer.handles(key):
                return await synthesizer.synthesize(key)
        raise NoSuchFile(f"no such key {key!r} (no file synthesizer handles it)")
