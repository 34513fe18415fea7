"""File serving of the namespaces whose tables ISK derives from a lake table and the log
(``current`` and ``rejected``): the lake table's files under ``files/<path>`` keys, the files
built for a snapshot (:class:`~.paths.ChangesKey`), and metadata files from the file store."""

from __future__ import annotations

import asyncio

from bergstream.plugins.isk_gateway.tables.lake_states import LakeStates
from bergstream.plugins.isk_gateway.tables.paths import ChangesKey, ColdFileKey, parse_key
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile
from bergstream.plugins.isk_gateway.tables.store import FileStore

__all__ = ["DerivedFiles"]


class DerivedFiles:
    """The file calls of a ``TableProvider`` of derived tables. A subclass sets ``store`` and
    ``states`` and says which lake namespace its ``files/`` keys are in and how a changes file
    is had (:meth:`_lake_namespace`, :meth:`_changes_file`)."""

    store: FileStore
    states: LakeStates | None

    def _lake_namespace(self) -> str:
        """The lake namespace of the tables whose files ``files/<path>`` keys name."""
        raise NotImplementedError

    async def _changes_file(self, key: ChangesKey) -> bytes | memoryview:
        """A file built for a snapshot: kept in the store, or built again."""
        raise NotImplementedError

    async def _lake_file(self, key: ColdFileKey, start: int | None, end: int | None) -> bytes:
        if self.states is None:
            raise NoSuchFile(f"no such key {key.key!r} (ISK has no lake)")
        states, namespace = self.states, self._lake_namespace()
        return await asyncio.to_thread(states.read, namespace, key.topic, key.path, start, end)

    async def _bytes(
        self, key: str, start: int | None = None, end: int | None = None
    ) -> bytes | memoryview:
        parsed = parse_key(key)
        if isinstance(parsed, ColdFileKey):
            return await self._lake_file(parsed, start, end)
        if isinstance(parsed, ChangesKey):
            data = await self._changes_file(parsed)
        else:  # metadata files
            found = await self.store.get(key)
            if found is None:
                raise NoSuchFile(f"no such key {key!r}")
            data = found
        return data if start is None else data[start:end]

    async def file_size(self, key: str) -> int:
        """Size of the file at ``key``."""
        size = self.store.size(key)
        if size is not None:
            return size
        return len(await self._bytes(key))

    async def read_file(self, key: str) -> bytes:
        """The file at ``key``."""
        return bytes(await self._bytes(key))

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the file at ``key``."""
        return await self._bytes(key, start, end)

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys of the loaded tables under ``prefix``."""
        return self.store.list_keys(prefix, limit)
