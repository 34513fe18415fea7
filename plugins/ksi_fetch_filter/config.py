"""Settings of the ``ksi`` filter (``virtual_clusters[].filters[].config``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class KsiTopic(BaseModel):
    """One topic served from its coldset table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str = Field(min_length=1, description="Kafka topic name")
    table: str | None = Field(
        None, description="table in lake.namespace holding the topic (default: named like it)"
    )

    @property
    def table_name(self) -> str:
        """The coldset table of the topic."""
        return self.table or self.topic


class KsiConfig(BaseModel):
    """Settings of the ``ksi`` filter; the lake itself is the config file's ``lake:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topics: list[KsiTopic] = Field(
        min_length=1,
        description="topics served from the coldset: names, or {topic, table} mappings",
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
    offsets_cache_seconds: float = Field(
        1.0, ge=0, description="how long Kafka's high watermarks asked out of band are reused"
    )
    reader_threads: int = Field(2, ge=1, le=32, description="threads reading the coldset")
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
    def _unique(cls, value: list[KsiTopic]) -> list[KsiTopic]:
        names = [item.topic for item in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"topics listed twice: {', '.join(duplicates)}")
        return value

    def table_of(self) -> dict[str, str]:
        """Topic name -> table name."""
        return {item.topic: item.table_name for item in self.topics}
