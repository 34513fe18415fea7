"""Many topics in one Spark application: one streaming query per topic, each with its own table,
checkpoint and boundary (:func:`~bergstream.pipeline.stream.run_pipeline`, run in a thread of
its own), so exactly once holds per topic as it does for a single one.

- A topic that fails (its table cannot be committed, Kafka refuses it, a batch cannot be
  written) is reported and started again after ``lake.pipeline.topic_retry_seconds`` (doubled
  after each failure in a row, at most ``topic_retry_max_seconds``) while the other topics go
  on; a failed attempt commits nothing (each batch's append is atomic), so no table loses or
  repeats a record.
- With a pattern, Kafka's topics are matched again every ``topics_refresh_seconds``: a new topic
  gets its query without a restart.
- ``once``: every topic selected at the start is copied up to what Kafka holds then; a topic that
  failed ``topic_attempts`` times is reported failed, the others still finish.
- With ``lake.pipeline.group_topics`` (the default), the raw append topics selected at the start
  share one streaming query (:mod:`~bergstream.pipeline.topic_group`): a topic whose table
  refuses a commit leaves it for a query of its own (with the retries above) and the group goes
  on without it; a group that fails as a whole hands every topic to a query of its own. Topics
  found later by the pattern run on queries of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bergstream.core.api import TableMode, TableModeRule
from bergstream.pipeline.kafka import list_topics
from bergstream.pipeline.metrics import FAILURES, failure_cause
from bergstream.pipeline.session import PipelineSetupError
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import RunResult, prefixed_report, run_pipeline
from bergstream.pipeline.tables import LakeTable, open_catalog, open_table
from bergstream.pipeline.topic_group import GroupMembersFailed, group_target, run_group
from bergstream.pipeline.topics import TopicSelection
from bergstream.pipeline.typed import TopicTyping

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["TopicFailure", "TopicsResult", "run_topics"]

Report = Callable[[str], None]


@dataclass
class TopicFailure:
    """A topic whose copy failed, with the last error."""

    topic: str
    error: str
    attempts: int


@dataclass
class TopicsResult:
    """What :func:`run_topics` did: each topic's result, and the topics that failed (``once``:
    gave up after ``topic_attempts``; continuous: still failing when the run stopped)."""

    results: dict[str, RunResult] = field(default_factory=dict)
    failures: dict[str, TopicFailure] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON summary ``pipeline run`` prints for several topics: ``topics`` (each
        topic's summary, by name), ``failed`` (topic, error, attempts) and ``seconds``."""
        return {
            "topics": {topic: r.summary() for topic, r in sorted(self.results.items())},
            "failed": [
                {"topic": f.topic, "error": f.error, "attempts": f.attempts}
                for f in sorted(self.failures.values(), key=lambda f: f.topic)
            ],
            "seconds": round(self.seconds, 3),
        }


class _TopicRun(threading.Thread):
    """One topic's copy, started again after a failure until it succeeds or the run ends."""

    def __init__(
        self,
        topic: str,
        start: Callable[[str, threading.Event, Callable[[], None]], RunResult],
        *,
        once: bool,
        attempts: int,
        retry_seconds: float,
        retry_max_seconds: float,
        stop: threading.Event,
        report: Report,
        started: Callable[[str], None],
    ) -> None:
        super().__init__(name=f"bergstream-pipeline-{topic}", daemon=True)
        self.topic = topic
        self._start_copy = start
        self._once = once
        self._attempts = attempts
        self._retry_seconds = retry_seconds
        self._retry_max_seconds = retry_max_seconds
        self._stop_event = stop
        self._report = report
        self._on_started = started
        self.result: RunResult | None = None
        self.failure: TopicFailure | None = None

    def run(self) -> None:
        failed_in_a_row = 0
        while not self._stop_event.is_set():
            try:
                self.result = self._start_copy(
                    self.topic, self._stop_event, lambda: self._on_started(self.topic)
                )
                self.failure = None
                return
            except Exception as error:  # one topic's failure must never end the others
                failed_in_a_row += 1
                if isinstance(error, PipelineSetupError):
                    # Streaming failures are counted where the query ends (stream.await_query).
                    FAILURES.labels(self.topic, failure_cause(error)).inc()
                message = _one_line(error)
                self.failure = TopicFailure(self.topic, message, failed_in_a_row)
                self._on_started(self.topic)  # a failed start must not hold /readyz back
                if self._once and failed_in_a_row >= self._attempts:
                    self._report(f"failed after {failed_in_a_row} attempt(s): {message}")
                    return
                delay = min(
                    self._retry_seconds * 2 ** (failed_in_a_row - 1), self._retry_max_seconds
                )
                self._report(
                    f"failed (attempt {failed_in_a_row}): {message}; starting again in "
                    f"{delay:.0f} s, the other topics go on"
                )
                self._stop_event.wait(delay)


class _GroupRun(threading.Thread):
    """The group's copy: started again without the topics whose tables refused a commit (each
    handed to ``eject``); a failure of the whole group hands every topic to ``eject``."""

    def __init__(
        self,
        members: dict[str, LakeTable],
        start: Callable[[dict[str, LakeTable], Callable[[], None]], dict[str, RunResult]],
        *,
        stop: threading.Event,
        report: Report,
        started: Callable[[str], None],
        eject: Callable[[str, str], None],
    ) -> None:
        super().__init__(name="bergstream-pipeline-group", daemon=True)
        self.members = dict(members)
        self._start_copy = start
        self._stop_event = stop
        self._report = report
        self._on_started = started
        self._eject = eject
        self.results: dict[str, RunResult] = {}

    def _members_started(self) -> None:
        for topic in self.members:
            self._on_started(topic)

    def run(self) -> None:
        while self.members and not self._stop_event.is_set():
            try:
                self.results.update(self._start_copy(dict(self.members), self._members_started))
                return
            except GroupMembersFailed as error:
                for topic, message in sorted(error.failures.items()):
                    self.members.pop(topic, None)
                    self._report(f"[{topic}] leaves the group: {message}")
                    self._eject(topic, message)
            except Exception as error:  # the others must go on: each alone
                message = _one_line(error)
                self._report(f"the group of {len(self.members)} topic(s) failed: {message}; "
                             "each of its topics goes on in a query of its own")  # fmt: skip
                for topic in sorted(self.members):
                    self._eject(topic, message)
                self.members.clear()
                return


def _group_members(
    spark: SparkSession,
    lake: PipelineLake,
    topics: list[str],
    typing_for: Callable[[str], TopicTyping | None],
    mode_for: Callable[[str], TableModeRule | None],
    report: Report,
) -> dict[str, LakeTable]:
    """The topics of ``topics`` that can share a query, with their tables (created if new):
    no codecs, append mode, a table the group's workers can write (:func:`group_target`)."""

    def joinable(topic: str) -> bool:
        mode = mode_for(topic)
        return typing_for(topic) is None and (mode is None or mode.mode is TableMode.APPEND)

    def member(topic: str) -> LakeTable | None:
        try:
            table = open_table(spark, lake, topic, create=True)
        except Exception as error:  # its own query reports it, with retries
            report(f"[{topic}] runs alone: {_one_line(error)}")
            return None
        return table if group_target(table) is not None else None

    candidates = [t for t in topics if joinable(t)]
    # Tables load (or are created) through the catalog one round trip after another: a few at
    # once, as the topics' own queries would. The first alone: it may create the namespace,
    # which two at once would both try (the JDBC catalog's insert fails for the second).
    tables = [member(t) for t in candidates[:1]]
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="bergstream-open") as pool:
        tables += list(pool.map(member, candidates[1:]))
    return {t: table for t, table in zip(candidates, tables, strict=True) if table is not None}


def run_topics(
    spark: SparkSession,
    lake: PipelineLake,
    selection: TopicSelection,
    *,
    once: bool,
    typing_for: Callable[[str], TopicTyping | None],
    mode_for: Callable[[str], TableModeRule | None],
    report: Report = print,
    stop: threading.Event | None = None,
    on_started: Callable[[], None] | None = None,
    topic_lister: Callable[[], set[str]] | None = None,
) -> TopicsResult:
    """Copy every topic of ``selection`` into its own table, exactly once each, in ``spark``'s
    one application, until Kafka has nothing more (``once``) or until ``stop``.

    ``typing_for`` and ``mode_for`` give a topic's codecs and table mode (its rules of the
    ``codecs:`` and ``tables:`` sections); ``topic_lister`` lists Kafka's topics for the
    pattern (default: the pipeline's admin client, :func:`~bergstream.pipeline.kafka.list_topics`).
    ``on_started`` is called once every topic selected at the start has its query running (or
    has failed once)."""
    began = time.monotonic()
    stop = stop or threading.Event()
    settings = lake.pipeline
    if topic_lister is None:

        def topic_lister() -> set[str]:
            return list_topics(spark, lake.config, settings.kafka_options)

    open_catalog(spark, lake)
    existing = topic_lister() if selection.pattern is not None else set()
    initial = selection.select(existing)
    if not initial:
        report(f"no topic matches {selection.describe()} yet; waiting for one")
    else:
        report(f"copying {len(initial)} topic(s): {', '.join(initial)}")
    waiting = set(initial)
    lock = threading.Lock()
    started_called = False

    def started(topic: str) -> None:
        nonlocal started_called
        with lock:
            waiting.discard(topic)
            fire = not waiting and not started_called
            started_called = started_called or fire
        if fire and on_started is not None:
            on_started()

    def start_copy(
        topic: str, topic_stop: threading.Event, on_run: Callable[[], None]
    ) -> RunResult:
        return run_pipeline(
            spark,
            lake,
            topic,
            once=once,
            report=prefixed_report(report, topic),
            stop=topic_stop,
            codecs=typing_for(topic),
            mode=mode_for(topic),
            on_started=on_run,
        )

    runs: dict[str, _TopicRun] = {}

    def launch(topics: list[str]) -> None:
        for topic in topics:
            if topic in runs:
                continue
            run = _TopicRun(
                topic,
                start_copy,
                once=once,
                attempts=settings.topic_attempts,
                retry_seconds=settings.topic_retry_seconds,
                retry_max_seconds=settings.topic_retry_max_seconds,
                stop=stop,
                report=prefixed_report(report, topic),
                started=started,
            )
            runs[topic] = run
            run.start()

    group: _GroupRun | None = None
    members: dict[str, LakeTable] = {}
    if settings.group_topics and len(initial) > 1:
        members = _group_members(spark, lake, initial, typing_for, mode_for, report)
    if len(members) > 1:

        def start_group(
            tables: dict[str, LakeTable], on_run: Callable[[], None]
        ) -> dict[str, RunResult]:
            return run_group(
                spark, lake, tables, once=once, stop=stop, report=report, on_started=on_run
            )

        group = _GroupRun(
            members,
            start_group,
            stop=stop,
            report=report,
            started=started,
            eject=lambda topic, _error: launch([topic]),
        )
        group.start()
    launch([t for t in initial if group is None or t not in group.members])
    if not initial and on_started is not None:
        on_started()
        started_called = True
    try:
        if once:
            while group is not None and group.is_alive():
                group.join(1)
            for run in list(runs.values()):
                while run.is_alive():
                    run.join(1)
        else:
            next_listing = time.monotonic() + settings.topics_refresh_seconds
            while not stop.wait(1):
                if selection.pattern is None or time.monotonic() < next_listing:
                    continue
                next_listing = time.monotonic() + settings.topics_refresh_seconds
                try:
                    grouped = group.members if group is not None else {}
                    new = [
                        t
                        for t in selection.select(topic_lister())
                        if t not in runs and t not in grouped
                    ]
                except PipelineSetupError as error:
                    report(f"cannot list Kafka's topics (the running copies go on): {error}")
                    continue
                if new:
                    report(f"new topic(s) matching the pattern: {', '.join(new)}")
                    launch(new)
    finally:
        stop.set()  # continuous runs end here too: each query stops between batches
        if group is not None:
            group.join()
        for run in list(runs.values()):
            run.join()
    result = TopicsResult(seconds=time.monotonic() - began)
    if group is not None:
        result.results.update(group.results)
    for topic, run in runs.items():
        if run.result is not None:
            result.results[topic] = run.result
        elif run.failure is not None:
            result.failures[topic] = run.failure
    return result


def _one_line(error: BaseException, limit: int = 600) -> str:
    """``error`` on one line (Py4J's messages span many), at most ``limit`` characters."""
    text = " ".join(str(error).split()) or repr(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."
