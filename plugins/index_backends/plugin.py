"""Registers the ``sqlite`` and ``rocksdb`` index backends through the ``bergstream``
entry-point group."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.api import IndexBackendRegistration, LogComponent, hookimpl

if TYPE_CHECKING:
    from bergstream.core.api import ServiceContext
    from bergstream.plugins.index_backends.rocksdb_index import RocksIndex
    from bergstream.plugins.index_backends.sqlite_index import SqliteIndex


class SqliteIndexConfig(BaseModel):
    """Settings of the ``sqlite`` index backend (``indexes[].config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path | None = Field(
        None, description="the SQLite file (default $BERGSTREAM_HOME/isk/index.sqlite)"
    )
    busy_timeout_seconds: float = Field(
        30.0, gt=0, description="how long a writer waits for another process's write lock"
    )


def create_sqlite_index(config: SqliteIndexConfig, context: ServiceContext) -> SqliteIndex:
    """Open the index at ``config.path``, or under the home directory by default."""
    from bergstream.plugins.index_backends.sqlite_index import SqliteIndex

    path = config.path or context.home / "isk" / "index.sqlite"
    return SqliteIndex(path, busy_timeout_seconds=config.busy_timeout_seconds)


class RocksIndexConfig(BaseModel):
    """Settings of the ``rocksdb`` index backend (``indexes[].config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path | None = Field(
        None, description="the RocksDB directory (default $BERGSTREAM_HOME/isk/index.rocksdb)"
    )
    sync_writes: bool = Field(
        False, description="fsync the write-ahead log on every write (survives power loss)"
    )


def create_rocksdb_index(config: RocksIndexConfig, context: ServiceContext) -> RocksIndex:
    """Open the index at ``config.path``, or under the home directory by default."""
    from bergstream.plugins.index_backends.rocksdb_index import RocksIndex

    path = config.path or context.home / "isk" / "index.rocksdb"
    return RocksIndex(path, sync_writes=config.sync_writes)


@hookimpl
def register_index_backends() -> list[IndexBackendRegistration]:
    """Register the ``sqlite`` and ``rocksdb`` index backends."""
    return [
        IndexBackendRegistration(
            name="sqlite",
            factory=create_sqlite_index,
            config_model=SqliteIndexConfig,
            description="ISK chunk index in one SQLite file (WAL: one writer, many readers)",
        ),
        IndexBackendRegistration(
            name="rocksdb",
            factory=create_rocksdb_index,
            config_model=RocksIndexConfig,
            description="ISK chunk index in a RocksDB directory (ordered keys, one process)",
        ),
    ]


@hookimpl
def register_log_components() -> list[LogComponent]:
    """The index backends log as ``index``."""
    return [
        LogComponent(logger="bergstream.index", component="index"),
        LogComponent(logger="bergstream.plugins.index_backends", component="index"),
    ]
