"""Settings of the ``ksi`` filter (``virtual_clusters[].filters[].config``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Characters that make a ``topics`` entry a glob pattern; none is legal in a Kafka topic name.
GLOB_CHARACTERS = frozenset("*?[")


def is_pattern(name: str) -> bool:
    """Whether a ``topics`` entry is a glob pattern (``orders-*``) rather than a topic name."""
    return not GLOB_CHARACTERS.isdisjoint(name)


class KsiTopic(BaseModel):
    """One topic served from its coldset table, or a glob pattern of such topics."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str = Field(
        min_length=1, description="Kafka topic name, or a glob pattern (*, ?, [...]) of names"
    )
    table: str | None = Field(
        None, description="table in lake.namespace holding the topic (default: named like it)"
    )

    @model_validator(mode="after")
    def _no_table_for_a_pattern(self) -> KsiTopic:
        if self.table is not None and self.is_pattern:
            raise ValueError(
                f"{self.topic!r} is a pattern: the topics it matches use tables named like them,"
                " so it takes no table"
            )
        return self

    @property
    def is_pattern(self) -> bool:
        """Whether this entry is a glob pattern of topic names."""
        return is_pattern(self.topic)

    @property
    def table_name(self) -> str:
        """The coldset table of the topic."""
        return self.table or self.topic


class KsiConfig(BaseModel):
    """Settings of the ``ksi`` filter; the lake itself is the config file's ``lake:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topics: list[KsiTopic] | None = Field(
        None,
        min_length=1,
        description=(
            "topics served from the coldset: names, glob patterns or {topic, table} mappings"
            " (default: every topic with a table in lake.namespace)"
        ),
    )
    read_ahead_segments: int = Field(
        2, ge=0, le=64, description="row groups loaded ahead of a sequential consumer"
    )
    cache_max_bytes: int = Field(
        268_435_456, ge=1_048_576, description="memory bound of decoded coldset row groups"
    )
    batch_max_bytes: int = Field(
        1_048_576, ge=1024, description="target size of one rebuilt record batch"
    )
    table_refresh_seconds: float = Field(
        5.0, gt=0, description="how often a table's snapshot (and boundary) is reloaded"
    )
    namespace_refresh_seconds: float = Field(
        5.0,
        gt=0,
        description=(
            "how long a listing of lake.namespace is reused before a topic not in it is looked"
            " up again (topics served by default or by a pattern)"
        ),
    )
    offsets_cache_seconds: float = Field(
        1.0, ge=0, description="how long Kafka's high watermarks asked out of band are reused"
    )
    authorization_cache_seconds: float = Field(
        10.0,
        ge=0,
        description="how long the broker's answer to whether a client connection may READ a "
        "topic (asked on that connection before serving its cold offsets) is reused",
    )
    reader_threads: int = Field(2, ge=1, le=32, description="threads reading the coldset")
    parallel_reads: bool = Field(
        True,
        description=(
            "a Fetch needing several data files no cache holds starts reading them all at once"
            " on the reader threads, rather than one after the other"
        ),
    )
    read_timeout_seconds: float = Field(
        30.0, gt=0, description="a coldset read taking longer fails that partition (retriable)"
    )

    @field_validator("topics", mode="before")
    @classmethod
    def _names_or_mappings(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"topic": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("topics")
    @classmethod
    def _unique(cls, value: list[KsiTopic] | None) -> list[KsiTopic] | None:
        names = [item.topic for item in value or ()]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"topics listed twice: {', '.join(duplicates)}")
        return value

    def table_of(self) -> dict[str, str]:
        """Topic name -> table name of the topics listed by name (patterns left out)."""
        return {item.topic: item.table_name for item in self.topics or () if not item.is_pattern}

    def patterns(self) -> list[str]:
        """The glob patterns of ``topics``; ``["*"]`` when ``topics`` is not set."""
        if self.topics is None:
            return ["*"]
        return [item.topic for item in self.topics if item.is_pattern]
