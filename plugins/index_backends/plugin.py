"""Registers the ``sqlite`` index backend through the ``bergstream`` entry-point group."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from bergstream.core.backends import ServiceContext
from bergstream.core.hookspecs import hookimpl
from bergstream.core.registrations import IndexBackendRegistration
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
    path = config.path or context.home / "isk" / "index.sqlite"
    return SqliteIndex(path, busy_timeout_seconds=config.busy_timeout_seconds)


@hookimpl
def register_index_backends() -> list[IndexBackendRegistration]:
    """Register the ``sqlite`` index backend."""
    return [
        IndexBackendRegistration(
            name="sqlite",
            factory=create_sqlite_index,
            config_model=SqliteIndexConfig,
            description="ISK chunk index in one SQLite file (WAL: one writer, many readers)",
        )
    ]
