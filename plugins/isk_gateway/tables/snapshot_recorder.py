"""The snapshot recorder: every ``snapshot_interval_seconds``, each table served since ISK
started whose newest snapshot is older than that is loaded again, so its history gains a
snapshot when Kafka has new records even if no client asked (``TIMESTAMP AS OF`` then finds a
snapshot at most one interval before the time it names)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from bergstream.plugins.isk_gateway.tables.history import SnapshotHistories
from bergstream.plugins.isk_gateway.tables.provider import TableProvider

__all__ = ["SnapshotRecorder"]

log = logging.getLogger("bergstream.isk")


class SnapshotRecorder:
    """Loads the tables of ``histories`` that are due, through their namespace's provider."""

    def __init__(
        self,
        histories: SnapshotHistories,
        providers: Mapping[str, TableProvider],
        interval: float,
    ) -> None:
        self.histories = histories
        self.providers = providers
        self.interval = interval

    async def record_due(self) -> int:
        """Load every table whose newest snapshot was recorded more than ``interval`` seconds
        ago; the number loaded. A table that cannot be loaded now is skipped (its next
        LoadTable reports why)."""
        loaded = 0
        for namespace, table in self.histories.due(self.interval):
            provider = self.providers.get(namespace)
            if provider is None:
                continue
            try:
                await provider.load_table(namespace, table)
                loaded += 1
            except Exception as error:  # a client's LoadTable gets the error; this one retries
                log.debug("isk: recording a snapshot of %s.%s failed: %s", namespace, table, error)
        return loaded

    async def run(self) -> None:
        """Record due snapshots forever (until cancelled)."""
        while True:
            await asyncio.sleep(self.interval)
            await self.record_due()
