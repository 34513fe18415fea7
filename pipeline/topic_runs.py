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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bergstream.core.api import TableModeRule
from bergstream.pipeline.kafka import list_topics
from bergstream.pipeline.metrics import FAILURES, failure_cause
from bergstream.pipeline.session import PipelineSetupError
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import RunResult, run_pipeline
from bergstream.pipeline.tables import open_catalog
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
                    # Streaming failures are counted where the query ends (stream._await).
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
            report=_prefixed(report, topic),
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
                report=_prefixed(report, topic),
                started=started,
            )
            runs[topic] = run
            run.start()

    launch(initial)
    if not initial and on_started is not None:
        on_started()
        started_called = True
    try:
        if once:
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
                    new = [t for t in selection.select(topic_lister()) if t not in runs]
                except PipelineSetupError as error:
                    report(f"cannot list Kafka's topics (the running copies go on): {error}")
                    continue
                if new:
                    report(f"new topic(s) matching the pattern: {', '.join(new)}")
                    launch(new)
    finally:
        stop.set()  # continuous runs end here too: each query stops between batches
        for run in runs.values():
            run.join()
    result = TopicsResult(seconds=time.monotonic() - began)
    for topic, run in runs.items():
        if run.result is not None:
            result.results[topic] = run.result
        elif run.failure is not None:
            result.failures[topic] = run.failure
    return result


def _prefixed(report: Report, topic: str) -> Report:
    def tell(line: str) -> None:
        report(f"[{topic}] {line}")

    return tell


def _one_line(error: BaseException, limit: int = 600) -> str:
    """``error`` on one line (Py4J's messages span many), at most ``limit`` characters."""
    text = " ".join(str(error).split()) or repr(error)
    return text if len(text) <= limit else text[: limit - 3] + "..."
