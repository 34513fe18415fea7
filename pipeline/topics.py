"""Which topics one ``bergstream pipeline run`` copies: the names given (``--topic``, repeatable;
``lake.pipeline.topic``) and the topics whose whole name a regular expression matches
(``--topics REGEX``; ``lake.pipeline.topics``), as Kafka Connect's ``topics.regex`` does.
Kafka's internal topics (``__consumer_offsets``, ``__transaction_state``, any name starting
with ``__``) never match a pattern; name one to copy it. Nothing here imports pyspark."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["TopicSelection", "compile_topic_pattern"]


def compile_topic_pattern(text: str) -> re.Pattern[str]:
    """``text`` compiled, or ValueError naming the pattern and what is wrong with it."""
    if not text:
        raise ValueError("the topic pattern is empty: give a regular expression, e.g. 'orders.*'")
    try:
        return re.compile(text)
    except re.error as error:
        raise ValueError(
            f"topic pattern {text!r} is not a regular expression: {error} "
            "(it must match a topic's whole name, e.g. 'orders\\..*')"
        ) from None


@dataclass(frozen=True)
class TopicSelection:
    """Topic names given one by one, and an optional pattern for the rest."""

    names: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None

    @classmethod
    def of(cls, names: Iterable[str], pattern: str | None) -> TopicSelection:
        """The selection of ``names`` (order kept, repeats dropped) and ``pattern`` (a regular
        expression, or None); ValueError when both are empty or the pattern is bad."""
        unique = tuple(dict.fromkeys(name for name in names if name))
        compiled = compile_topic_pattern(pattern) if pattern is not None else None
        if not unique and compiled is None:
            raise ValueError(
                "no topic to copy: give --topic NAME (repeatable) or --topics REGEX, or "
                "lake.pipeline.topic / lake.pipeline.topics in the file"
            )
        return cls(unique, compiled)

    @property
    def single(self) -> str | None:
        """The one topic of a selection of exactly one name and no pattern, else None."""
        return self.names[0] if len(self.names) == 1 and self.pattern is None else None

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is selected: named, or (not internal) matched whole by the
        pattern."""
        if topic in self.names:
            return True
        return (
            self.pattern is not None
            and not topic.startswith("__")
            and self.pattern.fullmatch(topic) is not None
        )

    def select(self, existing: Iterable[str]) -> list[str]:
        """The topics to copy, given the cluster's ``existing`` topics: every name given (in
        its order, whether Kafka has it or not: a missing one fails on its own), then the
        pattern's matches, sorted."""
        named = list(self.names)
        matched = sorted({t for t in existing if t not in self.names and self.matches(t)})
        return named + matched

    def describe(self) -> str:
        """The selection in words, for logs and errors."""
        parts = [", ".join(repr(n) for n in self.names)] if self.names else []
        if self.pattern is not None:
            parts.append(f"topics matching {self.pattern.pattern!r}")
        return " and ".join(parts)
