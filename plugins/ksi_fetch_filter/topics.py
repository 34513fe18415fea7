"""Which topics KSI serves: the topics its config lists by name (with their tables) and, by
default or through glob patterns, every topic that has a table named like it in
``lake.namespace``.

Tables appear while the proxy runs (the pipeline creates a topic's table with its first
commit), so the namespace is listed again when a fetched topic is not in the last listing and
that listing is older than ``namespace_refresh_seconds``. A topic found once stays served: a
served topic costs one dictionary lookup per request, a topic without a table one set lookup,
and the catalog sees at most one listing per interval, however many requests miss. While the
namespace cannot be listed, a topic not known yet is reported as failed, so its partitions get
a retriable error where Kafka cannot answer them rather than a silent jump to Kafka's log start.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bergstream.plugins.ksi_fetch_filter.config import KsiConfig

#: Lists the table names of ``lake.namespace`` (an empty set when the namespace is missing).
ListTables = Callable[[], Awaitable[set[str]]]
Log = logging.Logger | logging.LoggerAdapter[Any]
#: After a failed listing, fail fast for this long before asking the catalog again.
RETRY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Served:
    """What :meth:`ServedTopics.resolve` found for the topics of one request."""

    #: Topic -> its table in ``lake.namespace``: KSI serves these.
    tables: dict[str, str]
    #: Topic -> why it cannot be told whether the topic has a table (the catalog failed).
    failed: dict[str, str]

    def covers(self, topic: str) -> bool:
        """Whether KSI answers for ``topic`` (served, or failed and so guarded)."""
        return topic in self.tables or topic in self.failed

    def only(self, topics: set[str]) -> Served:
        """The same answer for ``topics`` only (the others left to Kafka)."""
        return Served(
            {t: table for t, table in self.tables.items() if t in topics},
            {t: why for t, why in self.failed.items() if t in topics},
        )


class ServedTopics:
    """The served topics of one virtual cluster, with the namespace listing they come from."""

    def __init__(
        self,
        config: KsiConfig,
        list_tables: ListTables,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._known = config.table_of()
        patterns = config.patterns()
        self._pattern = (
            re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
            if patterns
            else None
        )
        self._refresh = config.namespace_refresh_seconds
        self._list_tables = list_tables
        self._clock = clock
        self._listing: frozenset[str] = frozenset()
        self._listed_at: float | None = None
        self._failure: tuple[float, str] | None = None
        self._pending: asyncio.Future[None] | None = None

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is served by default or by a pattern once it has a table."""
        return self._pattern is not None and self._pattern.match(topic) is not None

    async def resolve(self, topics: Iterable[str], log: Log) -> Served:
        """Which of ``topics`` KSI serves, listing the namespace again when one may have got a
        table since the last listing (never raises: a failed listing is in ``failed``)."""
        tables: dict[str, str] = {}
        unknown: list[str] = []
        for topic in topics:
            table = self._known.get(topic)
            if table is not None:
                tables[topic] = table
            elif self.matches(topic):
                unknown.append(topic)
        if not unknown:
            return Served(tables, {})
        if any(topic not in self._listing for topic in unknown) and self._stale():
            await self._relist(log)
        failed: dict[str, str] = {}
        for topic in unknown:
            if topic in self._listing:
                tables[topic] = self._serve(topic, log)
            elif self._failure is not None:
                failed[topic] = self._failure[1]
        return Served(tables, failed)

    def _stale(self) -> bool:
        now = self._clock()
        if self._failure is not None and now - self._failure[0] < RETRY_SECONDS:
            return False  # no catalog storm while it is down
        return self._listed_at is None or now - self._listed_at >= self._refresh

    async def _relist(self, log: Log) -> None:
        if self._pending is None:  # one listing at a time, whoever else is waiting for it
            self._pending = asyncio.ensure_future(self._list(log))
        await asyncio.shield(self._pending)

    async def _list(self, log: Log) -> None:
        try:
            names = await self._list_tables()
        except Exception as error:
            message = f"cannot list the lake's tables: {error}"
            if self._failure is None:
                log.warning(
                    "ksi: %s; topics not served yet get retriable errors where Kafka cannot "
                    "answer them",
                    message,
                )
            self._failure = (self._clock(), message)
        else:
            if self._failure is not None:
                log.info("ksi: the lake's tables can be listed again")
            self._failure = None
            self._listing = frozenset(names)
            self._listed_at = self._clock()
        finally:
            self._pending = None

    def _serve(self, topic: str, log: Log) -> str:
        if topic in self._known:  # another request found it during the same listing
            return self._known[topic]
        self._known[topic] = topic
        log.info("ksi: serving topic %s from its coldset table", topic)
        return topic
