"""The background indexer: every ``index_interval_seconds``, every topic's chunk index brought
up to date a few chunks at a time (:meth:`.hotset_index.HotsetIndexer.index_topic`), and the
pipeline lag of the lake's topics refreshed.

A topic that falls behind is reported on the ``bergstream.isk`` logger: how many offsets are not
indexed yet when its catch-up starts, progress at most every 5 s, and the end of the catch-up. A
failing pass is logged once, then again when passes work again; so is a topic that cannot be
indexed now while others can (a typed topic while the Schema Registry is down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from bergstream.plugins.isk_gateway.tables.hotset_index import HotsetIndexer, IndexStep
from bergstream.plugins.isk_gateway.tables.merged import MergedProvider
from bergstream.plugins.isk_gateway.tables.provider import ProviderUnavailable, TableNotServable

__all__ = ["BackgroundIndexer", "TopicSource"]

log = logging.getLogger("bergstream.isk")

#: Seconds between two progress lines of a topic's catch-up.
_PROGRESS_SECONDS = 5


class TopicSource(Protocol):
    """Where the topics to index come from (:class:`~..kafka.reader.KafkaReader` has it)."""

    async def topics(self) -> list[str]:
        """Topic names, internal topics left out."""
        ...


class BackgroundIndexer:
    """Keeps the chunk index of every topic of ``source`` up to date (and, with ``merged``,
    the pipeline lag of the lake's topics current), one pass every ``interval`` seconds."""

    def __init__(
        self,
        source: TopicSource,
        indexer: HotsetIndexer,
        merged: MergedProvider | None,
        interval: float,
    ) -> None:
        self.source = source
        self.indexer = indexer
        self.merged = merged
        self.interval = interval
        self._catching_up: dict[str, int] = {}  # topic -> offsets indexed since it fell behind
        self._last_progress: dict[str, float] = {}
        self._failing_topics: set[str] = set()

    def report(self, topic: str, step: IndexStep) -> None:
        """Log the start, the progress (at most every 5 s) and the end of a topic's catch-up."""
        catching_up, last_progress = self._catching_up, self._last_progress
        if topic not in catching_up:
            if not step.indexed and not step.behind:
                return
            log.info("isk: indexing %s: %d offsets not in the index yet", topic, step.missing)
            catching_up[topic] = 0
            last_progress[topic] = time.monotonic()
        catching_up[topic] += step.indexed
        if step.behind:
            if time.monotonic() - last_progress[topic] >= _PROGRESS_SECONDS:
                last_progress[topic] = time.monotonic()
                log.info(
                    "isk: indexing %s: %d offsets indexed, %d to go",
                    topic, catching_up[topic], step.behind,
                )  # fmt: skip
            return
        done = catching_up.pop(topic)
        last_progress.pop(topic, None)
        log.info("isk: index of %s brought up to date (%d new offsets)", topic, done)

    def _topic_failed(self, topic: str, error: Exception) -> None:
        """Log a topic that cannot be indexed now, once until it can again."""
        if topic not in self._failing_topics:
            log.warning("isk: indexing %s failed (retrying): %s", topic, error)
        self._failing_topics.add(topic)

    async def run(self) -> None:
        """Index forever (until cancelled): the lake's topics' pipeline lag first, then every
        topic, one topic and a few chunks at a time."""
        failing = False
        while True:
            try:
                if self.merged is not None:  # the lake's few topics first: cheap, and watched
                    for topic in await self.merged.coldset.topics():
                        with contextlib.suppress(LookupError):
                            await self.merged.update_pipeline_lag(topic)
                for topic in await self.source.topics():
                    if topic.startswith("__"):
                        continue
                    try:
                        self.report(topic, await self.indexer.index_topic(topic))
                    except LookupError:  # deleted since it was listed
                        self._catching_up.pop(topic, None)
                    except (ProviderUnavailable, TableNotServable) as error:
                        self._topic_failed(topic, error)
                    else:
                        if topic in self._failing_topics:
                            self._failing_topics.discard(topic)
                            log.info("isk: indexing %s works again", topic)
                if failing:
                    log.info("isk: background indexing works again")
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if not failing:
                    log.warning("isk: background indexing failed (retrying): %s", error)
                failing = True
            await asyncio.sleep(self.interval)
