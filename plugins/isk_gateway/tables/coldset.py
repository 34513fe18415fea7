"""The ``coldset`` namespace: the lake's physical table of each topic, proxied.

LoadTable reads the physical table's current snapshot with PyIceberg and re-publishes it as one
snapshot whose manifests list the same data files (same stats, partition values and sizes) under
gateway keys ``<cluster>/coldset/<topic>/files/<path under the table's location>``; the S3
gateway serves those keys from the lake's storage. The snapshot keeps the physical snapshot's id,
timestamp and boundary (``bergstream.kafka-offsets``), so the same physical state gives the same
metadata. Rewriting a snapshot's manifests is done once per physical snapshot. A typed table
keeps its schema (typed columns included), last column id and ``bergstream.schema.<id>``
properties.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortOrder

from bergstream.core.api import BOUNDARY_PROPERTY, Boundary, ResolvedLake, format_boundary
from bergstream.core.api import table_boundary as physical_boundary
from bergstream.plugins.isk_gateway.files.manifests import ManifestGroup
from bergstream.plugins.isk_gateway.files.table_metadata import SnapshotPlan, build_metadata
from bergstream.plugins.isk_gateway.metrics import ISK_LOAD_TABLES
from bergstream.plugins.isk_gateway.tables.hotset import record_built
from bergstream.plugins.isk_gateway.tables.lake_schemas import (
    BaseSchema,
    base_of,
    open_lake_catalog,
)
from bergstream.plugins.isk_gateway.tables.paths import (
    COLDSET,
    MERGED,
    ColdFileKey,
    parse_key,
    uri,
)
from bergstream.plugins.isk_gateway.tables.provider import (
    LoadedTable,
    NoSuchFile,
    NoSuchNamespace,
    NoSuchTable,
    ProviderUnavailable,
    TableNotServable,
)
from bergstream.plugins.isk_gateway.tables.store import FileStore

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table

__all__ = ["ColdSnapshot", "ColdsetProvider", "relative_path", "with_path"]

_Rewritten = tuple[dict[str, list[ManifestGroup]], dict[str, dict[str, int]]]

#: How long a table's location and FileIO are reused for serving files before a reload.
_TABLE_TTL_SECONDS = 10.0


def _normalized(location: str) -> str:
    """A location with ``file:``/``s3a:`` spellings unified (Java writes ``file:/x``)."""
    for prefix in ("file:///", "file://", "file:/"):
        if location.startswith(prefix):
            return "file:///" + location[len(prefix) :].lstrip("/")
    if location.startswith("s3a://"):
        return "s3://" + location[len("s3a://") :]
    return location


def relative_path(table_location: str, file_path: str) -> str:
    """``file_path`` relative to ``table_location``; :class:`TableNotServable` if it lies
    outside (the gateway only serves files under the table's location)."""
    base = _normalized(table_location).rstrip("/") + "/"
    path = _normalized(file_path)
    if not path.startswith(base) or len(path) == len(base):
        raise TableNotServable(
            f"data file {file_path!r} is outside the table location {table_location!r}; the "
            "gateway serves only files under the table location"
        )
    return path[len(base) :]


@dataclass(frozen=True)
class ColdSnapshot:
    """The current snapshot of a topic's physical table, rewritten to gateway keys."""

    topic: str
    snapshot_id: int | None
    timestamp_ms: int
    groups: dict[str, list[ManifestGroup]]  # by namespace: coldset keys, and merged aliases
    sizes: dict[str, dict[str, int]]
    boundary: Boundary
    schema: Schema
    base: BaseSchema  # the schema, last column id and bergstream.schema.<id> properties
    specs: list[PartitionSpec]
    default_spec_id: int
    sort_order: SortOrder
    location: str
    io: FileIO = field(repr=False)
    #: Every snapshot the lake table still has (a merged snapshot of an expired one is not
    #: served: its files may be gone).
    snapshot_ids: frozenset[int] = frozenset()


def with_path(file: DataFile, path: str) -> DataFile:
    """``file`` with every field kept but its path."""
    copy = DataFile.from_args(
        content=file.content,
        file_path=path,
        file_format=file.file_format,
        partition=file.partition,
        record_count=file.record_count,
        file_size_in_bytes=file.file_size_in_bytes,
        column_sizes=file.column_sizes,
        value_counts=file.value_counts,
        null_value_counts=file.null_value_counts,
        nan_value_counts=file.nan_value_counts,
        lower_bounds=file.lower_bounds,
        upper_bounds=file.upper_bounds,
        key_metadata=file.key_metadata,
        split_offsets=file.split_offsets,
        equality_ids=file.equality_ids,
        sort_order_id=file.sort_order_id,
    )
    copy.spec_id = file.spec_id
    return copy


@contextlib.contextmanager
def _lake_errors(key: str, path: str) -> Iterator[None]:
    """A missing lake file is :class:`NoSuchFile`; any other I/O failure is retriable."""
    try:
        yield
    except FileNotFoundError:
        raise NoSuchFile(f"no such key {key!r} (no file {path!r} in the lake)") from None
    except OSError as error:
        if "not found" in str(error).lower() or "no such" in str(error).lower():
            raise NoSuchFile(f"no such key {key!r} ({error})") from None
        raise ProviderUnavailable(f"reading {path!r} from the lake: {error}") from error


class ColdsetProvider:
    """Serves the ``coldset`` namespace from the lake's catalog (a ``TableProvider`` for it)."""

    def __init__(
        self,
        lake: ResolvedLake,
        store: FileStore,
        bucket: str,
        cluster: str,
        rewritten_snapshots: int = 64,
    ) -> None:
        self.lake = lake
        self.store = store
        self.bucket = bucket
        self.cluster = cluster
        self._catalog: Catalog | None = None
        self._catalog_lock = threading.Lock()
        self._rewritten: OrderedDict[tuple[str, int], _Rewritten] = OrderedDict()
        self._rewriting: dict[tuple[str, int], Future[_Rewritten]] = {}
        self._rewrite_lock = threading.Lock()
        self._rewritten_max = rewritten_snapshots
        self._tables: dict[str, tuple[float, str, FileIO]] = {}

    # ------------------------------------------------------------------ the lake

    def _open_catalog(self) -> Catalog:
        with self._catalog_lock:
            if self._catalog is None:
                self._catalog = open_lake_catalog(self.lake)
            return self._catalog

    def _topics(self) -> list[str]:
        catalog = self._open_catalog()
        try:
            identifiers = catalog.list_tables(self.lake.namespace)
        except NoSuchNamespaceError:
            return []
        except Exception as error:
            raise ProviderUnavailable(f"the lake catalog cannot list tables: {error}") from error
        return sorted(identifier[-1] for identifier in identifiers)

    def _table(self, topic: str) -> Table | None:
        catalog = self._open_catalog()
        try:
            return catalog.load_table(self.lake.table_identifier(topic))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except Exception as error:
            raise ProviderUnavailable(f"the coldset table of {topic!r}: {error}") from error

    def lake_table(self, topic: str) -> Table | None:
        """The topic's log table in the lake (PyIceberg, loaded now); None if there is none."""
        return self._table(topic)

    def _snapshot(self, topic: str) -> ColdSnapshot | None:
        table = self._table(topic)
        if table is None:
            return None
        metadata = table.metadata
        self._tables[topic] = (time.monotonic(), metadata.location, table.io)
        current = metadata.current_snapshot()
        groups: dict[str, list[ManifestGroup]] = {COLDSET: [], MERGED: []}
        sizes: dict[str, dict[str, int]] = {COLDSET: {}, MERGED: {}}
        if current is not None:
            groups, sizes = self._rewritten_once(topic, table, current.snapshot_id)
        return ColdSnapshot(
            topic=topic,
            snapshot_id=current.snapshot_id if current else None,
            timestamp_ms=current.timestamp_ms if current else metadata.last_updated_ms,
            groups=groups,
            sizes=sizes,
            boundary=physical_boundary(table),
            schema=metadata.schema(),
            base=base_of(metadata),
            specs=list(metadata.partition_specs),
            default_spec_id=metadata.default_spec_id,
            sort_order=metadata.sort_order_by_id(metadata.default_sort_order_id)
            or metadata.sort_orders[0],
            location=metadata.location,
            io=table.io,
            snapshot_ids=frozenset(s.snapshot_id for s in metadata.snapshots),
        )

    def _rewritten_once(self, topic: str, table: Table, snapshot_id: int) -> _Rewritten:
        """The rewrite of ``topic``'s current snapshot: remembered, or done now by one thread
        however many ask for it at the same time (the others wait for its result)."""
        memo_key = (topic, snapshot_id)
        # Memo and in-flight rewrites change together under the lock: a thread finds a
        # rewrite done, joins the one in flight, or starts it.
        with self._rewrite_lock:
            memo = self._rewritten.get(memo_key)
            if memo is not None:
                return memo
            running = self._rewriting.get(memo_key)
            if running is None:
                owner: Future[_Rewritten] = Future()
                self._rewriting[memo_key] = owner
        if running is not None:
            return running.result()
        try:
            memo = self._rewrite(topic, table)
        except BaseException as error:
            with self._rewrite_lock:
                del self._rewriting[memo_key]
            owner.set_exception(error)
            raise
        with self._rewrite_lock:
            self._rewritten[memo_key] = memo
            while len(self._rewritten) > self._rewritten_max:
                self._rewritten.popitem(last=False)
            del self._rewriting[memo_key]
        owner.set_result(memo)
        return memo

    def _rewrite(self, topic: str, table: Table) -> _Rewritten:
        """The live data files of the current snapshot under gateway keys (of the coldset and
        of the merged namespace), grouped by partition spec."""
        metadata = table.metadata
        current = metadata.current_snapshot()
        assert current is not None
        by_spec: dict[str, dict[int, list[DataFile]]] = {COLDSET: {}, MERGED: {}}
        sizes: dict[str, dict[str, int]] = {COLDSET: {}, MERGED: {}}
        for manifest in current.manifests(table.io):
            if manifest.content != ManifestContent.DATA:
                raise TableNotServable(
                    f"the coldset table of {topic!r} has delete files (row-level deletes); ISK "
                    "serves tables without them: compact it first (`bergstream pipeline maintain`)"
                )
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                file = entry.data_file
                if file.content != DataFileContent.DATA:
                    raise TableNotServable(f"the coldset table of {topic!r} has delete files")
                path = relative_path(metadata.location, file.file_path)
                for namespace in (COLDSET, MERGED):
                    key = ColdFileKey(self.cluster, topic, path, namespace).key
                    files = by_spec[namespace].setdefault(manifest.partition_spec_id, [])
                    files.append(with_path(file, uri(self.bucket, key)))
                    sizes[namespace][key] = file.file_size_in_bytes
        specs = {spec.spec_id: spec for spec in metadata.partition_specs}
        groups = {
            namespace: [ManifestGroup(specs[spec], files) for spec, files in sorted(found.items())]
            for namespace, found in by_spec.items()
        }
        return groups, sizes

    async def snapshot(self, topic: str) -> ColdSnapshot | None:
        """The current coldset snapshot of ``topic``; None if the lake has no such table."""
        return await asyncio.to_thread(self._snapshot, topic)

    # ------------------------------------------------------------------ catalog

    async def list_tables(self, namespace: str) -> list[str]:
        """Topics with a coldset table."""
        self._check_namespace(namespace)
        return await asyncio.to_thread(self._topics)

    async def topics(self) -> list[str]:
        """Topics with a coldset table."""
        return await asyncio.to_thread(self._topics)

    async def load_table(self, namespace: str, table: str) -> LoadedTable:
        """The coldset table of topic ``table``, re-published under gateway keys."""
        self._check_namespace(namespace)
        cold = await self.snapshot(table)
        if cold is None:
            raise NoSuchTable(f"no coldset table for topic {table!r}")
        summary = {BOUNDARY_PROPERTY: format_boundary(cold.boundary)} if cold.boundary else {}
        plan = SnapshotPlan(
            namespace=COLDSET,
            topic=table,
            snapshot_id=cold.snapshot_id,
            timestamp_ms=cold.timestamp_ms,
            groups=cold.groups[COLDSET],
            summary=summary,
            schema=cold.schema,
            specs=cold.specs,
            default_spec_id=cold.default_spec_id,
            sort_order=cold.sort_order,
            properties=cold.base.properties,
            last_column_id=cold.base.last_column_id,
        )
        built = await asyncio.to_thread(build_metadata, self.bucket, self.cluster, plan)
        record_built(self.cluster, built)
        for key, data in built.files.items():
            await self.store.keep(key, data)
        listing = {key: len(data) for key, data in built.files.items()}
        listing.update(cold.sizes[COLDSET])
        self.store.set_listing(COLDSET, table, listing)
        ISK_LOAD_TABLES.labels(self.cluster, COLDSET).inc()
        return LoadedTable(built.metadata_location, built.metadata)

    @staticmethod
    def _check_namespace(namespace: str) -> None:
        if namespace != COLDSET:
            raise NoSuchNamespace(f"no namespace {namespace!r} (this provider serves {COLDSET!r})")

    # ------------------------------------------------------------------ files

    def _location(self, topic: str) -> tuple[str, FileIO]:
        known = self._tables.get(topic)
        if known is not None and time.monotonic() - known[0] < _TABLE_TTL_SECONDS:
            return known[1], known[2]
        table = self._table(topic)
        if table is None:
            raise NoSuchFile(f"no coldset table for topic {topic!r}")
        self._tables[topic] = (time.monotonic(), table.metadata.location, table.io)
        return table.metadata.location, table.io

    def _lake_path(self, key: str) -> tuple[str, FileIO] | None:
        parsed = parse_key(key)
        if parsed.cluster != self.cluster:
            raise NoSuchFile(f"no such key {key!r} (cluster {self.cluster!r} is served here)")
        if not isinstance(parsed, ColdFileKey) or parsed.namespace != COLDSET:
            return None
        location, io = self._location(parsed.topic)
        return f"{location.rstrip('/')}/{parsed.path}", io

    def _lake_file(self, key: str) -> tuple[str, FileIO]:
        found = self._lake_path(key)
        if found is None:
            raise NoSuchFile(f"no such key {key!r} (not built by this gateway, or expired)")
        return found

    def _read(self, key: str, start: int | None, end: int | None) -> bytes:
        path, io = self._lake_file(key)
        with _lake_errors(key, path), io.new_input(path).open(seekable=True) as stream:
            if start is None:
                return stream.read()
            stream.seek(start)
            return stream.read((end or start) - start)

    def _size(self, key: str) -> int:
        path, io = self._lake_file(key)
        with _lake_errors(key, path):
            return len(io.new_input(path))

    async def file_size(self, key: str) -> int:
        """Size of a coldset key: listed, built metadata, or the lake file's size."""
        size = self.store.size(key)
        if size is not None:
            return size
        data = await self.store.get(key)
        if data is not None:
            return len(data)
        return await asyncio.to_thread(self._size, key)

    async def read_file(self, key: str) -> bytes:
        """A coldset key's bytes: built metadata from the store, data files from the lake."""
        data = await self.store.get(key)
        if data is not None:
            return data
        return await asyncio.to_thread(self._read, key, None, None)

    async def read_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of a coldset key, read from the lake without the rest."""
        data = await self.store.get(key)
        if data is not None:
            return data[start:end]
        return await asyncio.to_thread(self._read, key, start, end)

    async def list_keys(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Keys of the coldset tables loaded so far under ``prefix``."""
        return self.store.list_keys(prefix, limit)
