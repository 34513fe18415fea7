"""Decide, per fetched partition, whether the coldset serves it, and build what it serves.
Runs on a reader thread: every call here may block on the catalog or on data files."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial

from bergstream.core.api import record_batch
from bergstream.plugins.ksi_fetch_filter.ahead import AheadKey, Built
from bergstream.plugins.ksi_fetch_filter.batches import build_cold_batches
from bergstream.plugins.ksi_fetch_filter.coldset import ColdsetError, ColdTable
from bergstream.plugins.ksi_fetch_filter.store import ColdStore

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class FetchAsk:
    """One partition of a Fetch request on a topic KSI serves."""

    topic: str
    partition: int
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class ColdAnswer:
    """What the coldset says about one fetched partition.

    ``records`` is None when Kafka serves the partition (forward it); ``error`` is set when the
    coldset failed, so the partition cannot be trusted to Kafka alone; ``log_start`` is the
    first cold offset, if any; ``record_count`` is how many records ``records`` holds.
    """

    records: bytes | None = None
    next_offset: int | None = None
    log_start: int | None = None
    error: str | None = None
    record_count: int = 0


def plan_fetch(
    store: ColdStore, asks: list[FetchAsk], max_bytes: int, batch_max_bytes: int
) -> dict[Key, ColdAnswer]:
    """Answer each ask from the coldset where its offset lies in the cold range
    (first cold offset <= offset < boundary), within the fetch's byte limits. Each table is
    planned once and each row group read once for all the asks of the request it holds; the
    read-ahead of every served partition is queued at the end, once per table."""
    answers: dict[Key, ColdAnswer] = {}
    siblings = _offsets_by_topic(asks)
    if store.config.parallel_reads and len(asks) > 1:
        _start_reads(store, asks, max_bytes, siblings)
    ahead: list[tuple[AheadKey, Callable[[], Built]]] = []
    read_ahead: dict[str, dict[int, int]] = {}
    used = 0
    served_any = False
    for ask in asks:
        key = (ask.topic, ask.partition)
        cold = store.table(ask.topic)
        if cold is None:
            continue
        try:
            boundary = cold.boundary(ask.partition)
            first = cold.first_offset(ask.partition)
            if boundary is None or first is None or not first <= ask.offset < boundary:
                answers[key] = ColdAnswer(log_start=first)
                continue
            budget = max(min(ask.max_bytes, max_bytes - used), 0)
            if budget <= record_batch.HEADER_SIZE and served_any:
                # No batch fits (a batch is its header and at least one record, and only the
                # first in a response may exceed its budget): answer so without reading.
                answers[key] = ColdAnswer(records=b"", next_offset=ask.offset, log_start=first)
                continue
            version = cold.version()
            wanted = AheadKey(ask.topic, ask.partition, ask.offset, budget, not served_any, version)
            built = _take_ahead(store, wanted)
            if built is None:
                built = build_answer(cold, wanted, batch_max_bytes, siblings[ask.topic])
            read, batches = built.read, built.batches
            if read is None or batches is None:
                answers[key] = ColdAnswer(log_start=first)
                continue
        except ColdsetError as error:
            answers[key] = ColdAnswer(error=str(error))
            continue
        except Exception as error:  # a bug or a corrupt file: never silently hand to Kafka
            answers[key] = ColdAnswer(error=f"{type(error).__name__}: {error}")
            continue
        used += len(batches.data)
        served_any = served_any or bool(batches.data)
        answers[key] = ColdAnswer(
            records=batches.data,
            next_offset=batches.next_offset if batches.records else ask.offset,
            log_start=first,
            record_count=batches.records,
        )
        if batches.records:
            store.done_with(read, batches.next_offset)
            read_ahead.setdefault(ask.topic, {})[ask.partition] = batches.next_offset
            if batches.next_offset < boundary:
                after = replace(wanted, offset=batches.next_offset)
                ahead.append((after, partial(build_answer, cold, after, batch_max_bytes)))
    _read_ahead(store, read_ahead)
    store.ahead.schedule_many(ahead)
    return answers


def _start_reads(
    store: ColdStore,
    asks: list[FetchAsk],
    max_bytes: int,
    siblings: Mapping[str, Mapping[int, int]],
) -> None:
    """Start reading, on other reader threads, the data files that the asks after the first
    needing one will read and that no cache holds, as far as the fetch's ``max_bytes`` can
    take their answers: the loop of :func:`plan_fetch` then finds them read or being read
    instead of reading one file after the other, each a wait on an object store. The first
    such file is left to the loop itself."""
    started: set[str] = set()
    planned = 0
    for ask in asks:
        if planned >= max_bytes:
            break
        cold = store.table(ask.topic)
        if cold is None:
            continue
        try:
            path = cold.uncached_file(ask.partition, ask.offset)
        except Exception:  # the loop reads it and reports the failure
            continue
        if path is None:
            continue
        planned += ask.max_bytes
        if path in started:
            continue
        if started:
            store.start_read(cold, ask.partition, ask.offset, siblings[ask.topic])
        started.add(path)


def _read_ahead(store: ColdStore, offsets_by_topic: dict[str, dict[int, int]]) -> None:
    """Queue the read-ahead of each topic's partitions from their offsets, once per table."""
    for topic, offsets in offsets_by_topic.items():
        cold = store.table(topic)
        if cold is not None:
            store.prefetch_many(cold, offsets)


def _offsets_by_topic(asks: list[FetchAsk]) -> dict[str, dict[int, int]]:
    """Topic -> partition -> fetch offset of every ask."""
    out: dict[str, dict[int, int]] = {}
    for ask in asks:
        out.setdefault(ask.topic, {})[ask.partition] = ask.offset
    return out


def _take_ahead(store: ColdStore, ask: AheadKey) -> Built | None:
    """The answer built ahead for ``ask``, or for the same ask with the other first-in-response
    rule when that gives the same bytes: the rule only matters for a first batch larger than
    the budget (KIP-74 sends it only first in a response)."""
    built = store.ahead.take(ask)
    if built is not None:
        return built
    other = store.ahead.take(replace(ask, first_in_response=not ask.first_in_response))
    if other is None or other.batches is None:
        return other
    size = len(other.batches.data)
    same = size <= ask.budget if ask.first_in_response is False else size > 0
    return other if same else None


def build_answer(
    cold: ColdTable,
    ask: AheadKey,
    batch_max_bytes: int,
    siblings: Mapping[int, int] | None = None,
) -> Built:
    """The cold batches answering ``ask`` (read and batches None when no cold row is there).
    Built ahead, it reads whatever snapshot is current then: one other than ``ask.version``
    gives an answer never taken, as no later ask carries an older version. ``siblings``: the
    request's other partitions of the table (-> fetch offsets), read with ``ask``'s row
    group when it holds them (see :meth:`.ColdTable.read`)."""
    read = cold.read(ask.partition, ask.offset, ask.budget, siblings)
    if read is None:
        return Built(None, None)
    batches = build_cold_batches(
        read, ask.budget, batch_max_bytes, first_in_response=ask.first_in_response
    )
    return Built(read, batches)


@dataclass(frozen=True, slots=True)
class OffsetAsk:
    """One partition of a ListOffsets request on a topic KSI serves (EARLIEST or a time)."""

    topic: str
    partition: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    """The cold answer: (offset, timestamp) or None when the coldset has none; or an error."""

    found: tuple[int, int] | None = None
    error: str | None = None


def plan_offsets(store: ColdStore, asks: list[OffsetAsk]) -> dict[Key, OffsetAnswer]:
    """EARLIEST (-2): the first cold offset (timestamp -1); a timestamp: the first cold record
    at or after it. A consumer asks this right before it fetches from there: the row groups
    holding each found offset start loading in the background (read-ahead) now."""
    answers: dict[Key, OffsetAnswer] = {}
    read_ahead: dict[str, dict[int, int]] = {}
    for ask in asks:
        cold = store.table(ask.topic)
        if cold is None:
            continue
        key = (ask.topic, ask.partition)
        try:
            if ask.timestamp == -2:
                first = cold.first_offset(ask.partition)
                answers[key] = OffsetAnswer(None if first is None else (first, -1))
            else:
                answers[key] = OffsetAnswer(cold.offset_for_timestamp(ask.partition, ask.timestamp))
        except Exception as error:
            answers[key] = OffsetAnswer(error=f"{type(error).__name__}: {error}")
            continue
        found = answers[key].found
        if found is not None:
            read_ahead.setdefault(ask.topic, {})[ask.partition] = found[0]
    _read_ahead(store, read_ahead)
    return answers
