"""The ``tables:`` config section: which topics are logs and which hold a current state.

One section in core, read alike by the pipeline and ISK, so a topic's state is the same
everywhere::

    tables:
      topics:
        - match: "state.*"      # first rule whose match (a name or a glob) fits the topic wins
          mode: upsert          # the record key names the row; a null value deletes it
        - match: "orders"
          mode: upsert
          key_fields: [order_id, region]   # the row's identity from these value fields
        - match: "cdc.*"
          mode: debezium        # values are Debezium change events

A topic no rule matches is an ``append`` topic (a log: one row per record), as every topic was
before this section existed. ``upsert`` and ``debezium`` topics keep their log tables and gain a
table of their current state (ISK's ``current`` namespace, and the pipeline's state table in the
lake namespace ``lake.current_namespace``); see :mod:`bergstream.core.current_state` for the
rules that turn a log into a state.
"""

from __future__ import annotations

import fnmatch
from enum import StrEnum

from pydantic import Field, model_validator

from bergstream.core.models import StrictModel

__all__ = ["TableMode", "TableModeRule", "TablesSettings", "mode_rule_for"]


class TableMode(StrEnum):
    """What a topic's table holds."""

    #: One row per record (the log); every topic no rule matches.
    APPEND = "append"
    #: The last record of each key; a null value (tombstone) deletes the key.
    UPSERT = "upsert"
    #: The source table of Debezium change events (``before``, ``after``, ``op``, ``source``).
    DEBEZIUM = "debezium"


class TableModeRule(StrictModel):
    """The mode of the topics ``match`` names."""

    match: str = Field(min_length=1, description="a topic name or an fnmatch glob (*, ?, [seq])")
    mode: TableMode = Field(
        TableMode.APPEND,
        description="append (a log: one row per record), upsert (the last record per key) or "
        "debezium (the source table of Debezium change events)",
    )
    key_fields: list[str] | None = Field(
        None,
        min_length=1,
        description="upsert only: value fields (typed columns) that name a row instead of the "
        "record key; a record must then have a value that decoded",
    )

    @model_validator(mode="after")
    def _key_fields_for_upsert(self) -> TableModeRule:
        if self.key_fields is not None and self.mode is not TableMode.UPSERT:
            raise ValueError(
                f"key_fields names a row's identity in upsert mode; mode {self.mode.value!r} "
                "takes the record key (remove key_fields or set mode: upsert)"
            )
        if self.key_fields is not None and len(set(self.key_fields)) != len(self.key_fields):
            raise ValueError(f"key_fields lists a field twice: {self.key_fields}")
        return self

    def matches(self, topic: str) -> bool:
        """Whether this rule applies to ``topic`` (an exact name or a case-sensitive glob)."""
        return self.match == topic or fnmatch.fnmatchcase(topic, self.match)


class TablesSettings(StrictModel):
    """The ``tables:`` section."""

    topics: list[TableModeRule] = Field(
        default_factory=list, description="rules in order; the first that matches a topic wins"
    )


def mode_rule_for(settings: TablesSettings, topic: str) -> TableModeRule | None:
    """The first rule of ``settings`` that matches ``topic``; None: an append topic."""
    for rule in settings.topics:
        if rule.matches(topic):
            return rule
    return None
