"""One :class:`~.provider.TableProvider` over the served namespaces.

Catalog calls go to the provider of their namespace; file calls to the provider of the key's
namespace (every key names it, see :mod:`.paths`). A metadata file that is neither in memory nor
in the cache (a restart with a fresh cache, an evicted entry) is rebuilt by loading its table
again: the same state gives the same files, so a key from before the restart is found again as
long as the table has not changed since.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bergstream.plugins.isk_gateway.tables.load_coalescer import LoadCoalescer
from bergstream.plugins.isk_gateway.tables.paths import (
    COLDSET,
    HOTSET,
    MERGED,
    ChangesKey,
    ColdFileKey,
    DataKey,
    key_namespace,
    parse_key,
)
from bergstream.plugins.isk_gateway.tables.provider import (
    LoadedTable,
    NoSuchFile,
    NoSuchNamespace,
    TableProvider,
)
from bergstream.plugins.isk_gateway.tables.store import FileStore

__all__ = ["NamespaceRouter"]

#: A table is reloaded to rebuild a missing metadata file at most this often.
_RELOAD_SECONDS = 1.0

T = TypeVar("T")


class NamespaceRouter:
    """Serves ``providers`` (namespace -> provider) as one gateway."""

    def __init__(self, providers: dict[str, TableProvider], store: FileStore) -> None:
        self.providers = providers
        self.store = store
        # (namespace, topic) -> when its last reload started and when it finished.
        self._reloaded: dict[tuple[str, str], tuple[float, float]] = {}
        self._reloading: dict[tuple[str, str], asyncio.Task[bool]] = {}
        self._loads: LoadCoalescer[tuple[str, str], LoadedTable] = LoadCoalescer(
            lambda key: self._provider(key[0]).load_table(*key)
        )

    def _provider(self, namespace: str) -> TableProvider:
        provider = self.providers.get(namespace)
        if provider is None:
            raise NoSuchNamespace(
                f"no namespace {namespace!r} (served: {', '.join(self.providers)})"
            )
        return provider

    async def list_namespaces(self) -> list[str]:
        """The served namespaces."""
        return list(self.providers)

    async def list_tables(self, namespace: str) -> list[str]:
        """Tables of ``namespace``."""
        return await self._provider(namespace).list_tables(namespace)

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        """Fresh metadata of ``namespace.table`` (concurrent calls share loads: see
        :mod:`.load_coalescer`)."""
        self._provider(namespace)  # an unknown namespace fails here, not in a shared load
        return await self._loads((namespace, table))

    def _file_provider(self, key: str) -> tuple[TableProvider, str, bool]:
        """The provider serving ``key``, the key it knows the file by, and whether it is a
        metadata file. A merged table's data keys are aliases of hotset and coldset keys."""
        parsed = parse_key(key)
        if isinstance(parsed, DataKey):
            namespace, target = HOTSET, dataclasses.replace(parsed, namespace=HOTSET).key
        elif isinstance(parsed, ColdFileKey) and parsed.namespace in (COLDSET, MERGED):
            namespace, target = COLDSET, dataclasses.replace(parsed, namespace=COLDSET).key
        else:
            namespace, target = key_namespace(parsed), key
        provider = self.providers.get(namespace)
        if provider is None:
            raise NoSuchFile(f"no such key {key!r} (namespace {namespace!r} is not served)")
        return provider, target, not isinstance(parsed, DataKey | ColdFileKey | ChangesKey)

    async def _reload_for(self, key: str, since: float) -> bool:
        """After a lookup of metadata key ``key`` started at ``since`` found nothing: whether
        to look again. Yes if its table was reloaded since (the lookup may have missed the
        files the reload kept) or a reload is in flight (waited for); else the table is loaded
        again, at most once per ``_RELOAD_SECONDS``."""
        parsed = parse_key(key)
        table = (key_namespace(parsed), parsed.topic)
        # No await until a reload is registered: concurrent misses share one reload.
        running = self._reloading.get(table)
        if running is None:
            started, finished = self._reloaded.get(table, (0.0, 0.0))
            if finished >= since:
                return True
            if time.monotonic() - started < _RELOAD_SECONDS:
                return False
            self._reloaded[table] = (time.monotonic(), finished)
            running = asyncio.create_task(self._reload(table))
            self._reloading[table] = running
        return await asyncio.shield(running)

    async def _reload(self, table: tuple[str, str]) -> bool:
        """Load ``table`` (namespace, topic) again; whether it exists."""
        try:
            await self.load_table(*table)
        except LookupError:
            return False
        finally:
            self._reloaded[table] = (self._reloaded[table][0], time.monotonic())
            del self._reloading[table]
        return True

    async def _from_provider(
        self, key: str, call: Callable[[TableProvider, str], Awaitable[T]]
    ) -> T:
        """``call(provider, target)`` for the provider serving ``key``; a metadata file it does
        not have is looked for once more after its table was reloaded (:meth:`_reload_for`)."""
        provider, target, is_metadata = self._file_provider(key)
        since = time.monotonic()
        try:
            return await call(provider, target)
        except NoSuchFile:
            if is_metadata and await self._reload_for(key, since):
                return await call(provider, target)
            raise

    async def file_size(self, key: str) -> int:
        """Size of the file at ``key``: listed by the table that named it (a merged alias is
        listed under its own key, so its size needs no build), or from its provider."""
        size = self.store.size(key)
        if size is not None:
            return size
        return await self._from_provider(key, lambda provider, target: provider.file_size(target))

    async def read_file(self, key: str) -> bytes:
        """The file at ``key``."""
        return await self._from_provider(key, lambda provider, target: provider.read_file(target))

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the file at ``key``."""
        return await self._from_provider(
            key, lambda provider, target: provider.read_range(target, start, end)
        )

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys of every loaded table's current snapshot under ``prefix``."""
        return self.store.list_keys(prefix, limit)
