"""Which topics the pipeline types, and the schemas a micro-batch's Spark workers decode with.

A topic matched by a rule of the ``codecs:`` section (with a codec other than ``raw``) gets typed
columns; any other topic is copied exactly as before typed tables existed.

Workers never ask the Schema Registry: the driver reads every schema a batch needs and ships
them (:class:`ShippedSchemas`). A worker that meets a schema id the driver did not ship (an id
that is no version of the topic's subject) fails its task with :class:`SchemasNeeded`; the
driver then looks those ids up and runs the batch again. Such ids are rare, so the common batch
costs no extra pass over its records, and a registry outage is met on the driver only, before
anything is written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from bergstream.core.api import (
    RegisteredSchema,
    SchemaNotFound,
    SchemaSource,
    ServiceContext,
    StoredSchemas,
    TopicCodecs,
    TopicCodecsResolver,
)
from bergstream.pipeline.session import PipelineSetupError

__all__ = [
    "SchemasNeeded",
    "ShippedSchemas",
    "TopicTyping",
    "needed_by",
    "shape_sides",
    "topic_typing",
]

_MARKER = "bergstream-pipeline-needs"
_NEEDS = re.compile(_MARKER + r"(\{[^}]*\})")


@dataclass(frozen=True)
class TopicTyping:
    """How the pipeline types one topic: its codecs and the registry its schemas come from."""

    codecs: TopicCodecs
    registry: SchemaSource


def topic_typing(context: ServiceContext, topic: str) -> TopicTyping | None:
    """The typing of ``topic`` per the ``codecs:`` section of ``context``'s config; None when
    no rule types it (the topic is copied as raw rows)."""
    resolver = TopicCodecsResolver(context)
    try:
        codecs = resolver.for_topic(topic)
    except ValueError as error:  # settings a codec refuses
        raise PipelineSetupError(f"the codecs of topic '{topic}': {error}") from None
    if codecs is None:
        return None
    client = resolver.registry_client
    if client is not None:
        return TopicTyping(codecs, client)
    sides = [side for side in (codecs.value, codecs.key) if side is not None]
    if all(side.shape_codec is not None for side in sides):
        return TopicTyping(codecs, StoredSchemas())  # plain values: no registry to ask
    raise PipelineSetupError(
        f"topic '{topic}' has a codec rule in codecs.topics but codecs.schema_registry is "
        "not set: set its url"
    )


def shape_sides(codecs: TopicCodecs) -> tuple[str, ...]:
    """The input columns (``kafka_value``, ``kafka_key``) whose values a shape codec reads."""
    return tuple(
        column
        for column, side in (("kafka_value", codecs.value), ("kafka_key", codecs.key))
        if side is not None and side.shape_codec is not None
    )


class SchemasNeeded(LookupError):
    """A worker met schema ids (or referenced subjects) the driver did not ship, or
    (``fold_shapes``) plain values whose shapes need columns the table lacks; the message
    carries them, so the driver can read them from the failed Spark job's error."""

    def __init__(
        self, ids: Iterable[int] = (), subjects: Iterable[str] = (), *, fold_shapes: bool = False
    ) -> None:
        self.ids = sorted(set(ids))
        self.subjects = sorted(set(subjects))
        self.fold_shapes = fold_shapes
        body: dict[str, object] = {"ids": self.ids, "subjects": self.subjects}
        if fold_shapes:
            body["fold"] = True
        payload = json.dumps(body, separators=(",", ":"))
        super().__init__(
            f"{_MARKER}{payload}: schemas the pipeline's driver has not read yet, or shapes "
            "it has not folded (it reads or folds them and runs the batch again)"
        )


def needed_by(error: BaseException) -> SchemasNeeded | None:
    """The :class:`SchemasNeeded` a failed Spark job reports in its message, if any."""
    if isinstance(error, SchemasNeeded):
        return error
    ids: set[int] = set()
    subjects: set[str] = set()
    fold = False
    for found in _NEEDS.finditer(str(error)):
        try:
            payload = json.loads(found.group(1))
        except json.JSONDecodeError:
            continue
        ids.update(int(i) for i in payload.get("ids", ()))
        subjects.update(str(s) for s in payload.get("subjects", ()))
        fold = fold or bool(payload.get("fold", False))
    return SchemasNeeded(ids, subjects, fold_shapes=fold) if ids or subjects or fold else None


@dataclass
class ShippedSchemas:
    """The :class:`~bergstream.core.api.SchemaSource` of a batch's workers: the schemas and
    subjects the driver read, the ids the registry said it does not have; anything else is
    :class:`SchemasNeeded`. Picklable, no network."""

    by_id: dict[int, RegisteredSchema] = field(default_factory=dict)
    subjects: dict[str, list[RegisteredSchema]] = field(default_factory=dict)
    absent: frozenset[int] = frozenset()

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The shipped schema; ``SchemaNotFound`` for an id the registry does not have."""
        found = self.by_id.get(schema_id)
        if found is not None:
            return found
        if schema_id in self.absent:
            raise SchemaNotFound(f"unknown schema id {schema_id}")
        raise SchemasNeeded(ids=[schema_id])

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        """The shipped versions of ``subject``."""
        if subject not in self.subjects:
            raise SchemasNeeded(subjects=[subject])
        return list(self.subjects[subject])

    def check(self, ids: Iterable[int]) -> None:
        """Raise :class:`SchemasNeeded` naming every id of ``ids`` not shipped."""
        missing = {i for i in ids if i not in self.by_id and i not in self.absent}
        if missing:
            raise SchemasNeeded(ids=missing)
