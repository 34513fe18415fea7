"""Which topics one ``pipeline run`` copies (names and a pattern), the settings that choose them,
and one topic's retries, without Spark."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from bergstream.pipeline.session import PipelineSetupError
from bergstream.pipeline.settings import LakePipelineConfig
from bergstream.pipeline.stream import RunResult
from bergstream.pipeline.topic_runs import TopicsResult, _TopicRun
from bergstream.pipeline.topics import TopicSelection


def test_a_pattern_matches_whole_names_and_never_internal_topics() -> None:
    selection = TopicSelection.of([], r"orders(\..*)?")
    existing = ["orders", "orders.eu", "xorders", "orders-old", "__consumer_offsets"]
    assert selection.select(existing) == ["orders", "orders.eu"]
    assert TopicSelection.of([], ".*").select(["__transaction_state", "a"]) == ["a"]


def test_names_come_first_in_their_order_and_count_once() -> None:
    selection = TopicSelection.of(["b", "a", "b"], "a|c")
    assert selection.names == ("b", "a")
    assert selection.select(["c", "a", "z"]) == ["b", "a", "c"]
    assert selection.single is None
    assert TopicSelection.of(["only"], None).single == "only"
    # A name given is copied whether Kafka lists it or not (it then fails on its own).
    assert TopicSelection.of(["missing"], None).select([]) == ["missing"]


def test_no_topic_or_a_bad_pattern_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="no topic to copy: give --topic"):
        TopicSelection.of([], None)
    with pytest.raises(ValueError, match=r"topic pattern '\(orders' is not a regular expression"):
        TopicSelection.of([], "(orders")
    with pytest.raises(ValueError, match="empty"):
        TopicSelection.of([], "")


def test_the_settings_check_the_pattern_and_names() -> None:
    config = LakePipelineConfig(topic=["a", "b"], topics="shop\\..*")
    assert config.topics_refresh_seconds == 30 and config.topic_attempts == 3
    with pytest.raises(ValidationError, match="not a regular expression"):
        LakePipelineConfig(topics="[")
    with pytest.raises(ValidationError, match="a topic name is empty"):
        LakePipelineConfig(topic=[""])


def _run(start: object, *, once: bool, attempts: int = 3) -> tuple[_TopicRun, list[str]]:
    lines: list[str] = []
    started: list[str] = []
    run = _TopicRun(
        "t1",
        start,  # type: ignore[arg-type]
        once=once,
        attempts=attempts,
        retry_seconds=0.01,
        retry_max_seconds=0.02,
        stop=threading.Event(),
        report=lines.append,
        started=started.append,
    )
    run.start()
    run.join(10)
    assert not run.is_alive()
    assert started, "the run never told it started"
    return run, lines


def test_a_failed_topic_is_started_again_until_it_succeeds() -> None:
    calls: list[int] = []

    def start(topic: str, stop: threading.Event, on_run: object) -> RunResult:
        calls.append(1)
        if len(calls) < 3:
            raise PipelineSetupError(f"table of {topic} cannot be committed\nJava trace line")
        return RunResult(table=f"coldset.{topic}", records=5)

    run, lines = _run(start, once=True, attempts=5)
    assert len(calls) == 3
    assert run.result is not None and run.result.records == 5 and run.failure is None
    assert lines[0].startswith("failed (attempt 1): table of t1 cannot be committed Java trace")
    assert "the other topics go on" in lines[0]


def test_a_once_run_gives_up_after_its_attempts() -> None:
    def start(topic: str, stop: threading.Event, on_run: object) -> RunResult:
        raise RuntimeError("refused")

    run, lines = _run(start, once=True, attempts=2)
    assert run.result is None
    assert run.failure is not None and run.failure.attempts == 2
    assert lines[-1] == "failed after 2 attempt(s): refused"
    summary = TopicsResult(failures={"t1": run.failure}).summary()
    assert summary["failed"] == [{"topic": "t1", "error": "refused", "attempts": 2}]


def test_a_continuous_run_retries_until_stopped() -> None:
    stop = threading.Event()
    calls: list[int] = []

    def start(topic: str, stop_event: threading.Event, on_run: object) -> RunResult:
        calls.append(1)
        if len(calls) == 4:
            stop.set()
        raise RuntimeError("still broken")

    run = _TopicRun(
        "t1",
        start,
        once=False,
        attempts=1,
        retry_seconds=0.01,
        retry_max_seconds=0.01,
        stop=stop,
        report=lambda line: None,
        started=lambda topic: None,
    )
    run.start()
    run.join(10)
    assert len(calls) == 4  # attempts bound only --once runs
    assert run.failure is not None and run.failure.attempts == 4


def test_the_command_refuses_a_bad_pattern_or_no_topic_before_starting_spark(
    tmp_path: Path,
) -> None:
    """``pipeline run`` names the bad pattern (exit 2, no JVM started) and asks for a topic."""
    from tests.support import BERGSTREAM

    example = Path(__file__).resolve().parents[2] / "examples" / "lake.yaml"
    env = {
        **os.environ,
        "BERGSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:9",
        "BERGSTREAM_HOME": str(tmp_path),
    }
    bad = subprocess.run(
        [BERGSTREAM, "pipeline", "run", "-c", str(example), "--topics", "(orders"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert "topic pattern '(orders' is not a regular expression" in bad.stderr
    none = subprocess.run(
        [BERGSTREAM, "pipeline", "run", "-c", str(example)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert none.returncode == 2 and "no topic to copy: give --topic" in none.stderr, none.stderr
