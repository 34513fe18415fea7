"""``hotset-parquet``: the built-in file synthesizer of hotset data files, registered through the
``register_file_synthesizers`` hook like any third-party synthesizer.

A data key (:mod:`..tables.paths`) names a cluster, topic, partition, offset range and time
bucket; the synthesizer reads exactly that range from Kafka (read_committed), checks that the
range still exists and that every row lies in the key's bucket (a made-up key is refused, never
answered with an empty file), and writes the rows in the Parquet layout the indexer wrote when it
listed the file (:mod:`.hotset_layout`), so the bytes match the size in the manifest. A key of a
typed topic names its layout's digest: the rows are decoded into that layout (found again by
:class:`~..tables.layouts.TopicLayouts`), or the key is refused when the layout is gone.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

import pyarrow.compute as pc

from bergstream.core.api import ServiceContext
from bergstream.plugins.isk_gateway.files.hotset_layout import (
    RowDecoder,
    parquet_layout,
    time_buckets,
)
from bergstream.plugins.isk_gateway.files.synthesis import (
    SynthesisError,
    records_to_table,
)
from bergstream.plugins.isk_gateway.kafka.buffers import DECODED_COLUMNS
from bergstream.plugins.isk_gateway.kafka.reader import (
    FetchedRange,
    KafkaReader,
    PartitionOffsets,
)
from bergstream.plugins.isk_gateway.metrics import ISK_KAFKA_READ_BYTES
from bergstream.plugins.isk_gateway.settings import HotsetDataSynthesizerConfig
from bergstream.plugins.isk_gateway.tables.paths import DAY, DataKey, parse_key
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile, NoSuchTable

if TYPE_CHECKING:
    from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts

__all__ = [
    "HotsetDataSynthesizer",
    "HotsetDataSynthesizerConfig",
    "KafkaRanges",
    "create_hotset_data_synthesizer",
]


class KafkaRanges(Protocol):
    """What the synthesizer reads from Kafka (:class:`~..kafka.reader.KafkaReader` has it)."""

    async def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        """End offsets per partition; :class:`NoSuchTable` if the topic does not exist."""
        ...

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> FetchedRange:
        """Record batches covering ``[start, end)``, read_committed, with aborted transactions."""
        ...


class HotsetDataSynthesizer:
    """Builds hotset data files of one cluster from their keys (a ``FileSynthesizer``)."""

    def __init__(
        self,
        source: KafkaRanges,
        cluster: str,
        unit: str = DAY,
        compression: str = "snappy",
        layouts: TopicLayouts | None = None,
    ) -> None:
        self.source = source
        self.cluster = cluster
        self.unit = unit
        self.compression = compression
        #: Typed layouts by digest (None: every key of a typed layout is refused).
        self.layouts = layouts
        if layouts is not None and layouts.source is None:  # topics of plain values read it
            layouts.source = source

    def handles(self, path: str) -> bool:
        """Whether ``path`` is a hotset data key of this cluster cut by this unit."""
        try:
            key = parse_key(path)
        except NoSuchFile:
            return False
        return isinstance(key, DataKey) and key.cluster == self.cluster and key.unit == self.unit

    async def synthesize(self, path: str) -> bytes | memoryview:
        """The Parquet file at ``path``, from Kafka; :class:`NoSuchFile` if the key does not
        name a readable range whose rows all lie in its time bucket."""
        key = parse_key(path)
        if not isinstance(key, DataKey) or not self.handles(path):
            raise NoSuchFile(f"no such key {path!r} (not a {self.unit} data key of {self.cluster})")
        typed: RowDecoder | None = None
        if key.layout is not None:
            if self.layouts is None:
                raise NoSuchFile(f"no such key {path!r} (no codecs: no typed layout is built)")
            typed = await self.layouts.by_digest(key.topic, key.layout)
        try:
            offsets = await self.source.offsets(key.topic)
        except NoSuchTable:
            raise NoSuchFile(f"no such key {path!r} (no topic {key.topic!r})") from None
        part = offsets.get(key.partition)
        if part is None or key.start < part.log_start or key.end > part.last_stable:
            raise NoSuchFile(f"no such key {path!r} (offsets not readable in Kafka)")
        fetched = await self.source.fetch(key.topic, key.partition, key.start, key.end)
        ISK_KAFKA_READ_BYTES.labels(self.cluster, "serve").inc(len(fetched.records))
        return await asyncio.to_thread(self._build, key, fetched, typed)

    async def close(self) -> None:
        """Close the Kafka connection if this synthesizer opened it."""
        if isinstance(self.source, KafkaReader):
            await self.source.close()

    def _build(self, key: DataKey, fetched: FetchedRange, typed: RowDecoder | None) -> memoryview:
        # Plain rows go straight into the Parquet file, so their columns are garbage once it
        # is written and reuse pooled buffers; a typed layout's decoder may keep parts of them.
        lease = DECODED_COLUMNS.lease() if typed is None else None
        try:
            try:
                table = records_to_table(
                    fetched.records, key.partition, key.start, key.end, fetched.aborted, lease
                )
            except SynthesisError as error:
                raise NoSuchFile(f"no such key {key.key!r} ({error})") from None
            if key.bucket is None or not table.num_rows:
                raise NoSuchFile(f"no such key {key.key!r} (no rows in that range)")
            if pc.any(pc.not_equal(time_buckets(table, key.unit), key.bucket)).as_py():
                raise NoSuchFile(f"no such key {key.key!r} (rows of other {key.unit}s in it)")
            return parquet_layout(
                typed.decode(table) if typed is not None else table, self.compression
            )
        finally:
            if lease is not None:
                lease.release()
            fetched.release()  # decoded rows are copies: the received batches are garbage


def create_hotset_data_synthesizer(
    config: HotsetDataSynthesizerConfig, context: ServiceContext
) -> HotsetDataSynthesizer:
    """The ``hotset-parquet`` factory: a synthesizer with its own Kafka connection (started on
    first use) and the typed layouts of ``context``'s ``codecs:`` section (the ``isk`` service
    gives the built-in one its own, shared with the tables it serves)."""
    from bergstream.core.api import LakeConfigError, resolve_lake
    from bergstream.plugins.isk_gateway.tables.layouts import TopicLayouts

    reader = KafkaReader(
        config.kafka_bootstrap,
        client_id=f"bergstream-isk-{config.cluster}-files",
        settings=config.kafka_client,
    )
    lake = None
    if context.config.lake is not None:
        try:
            lake = resolve_lake(context.config.lake, context.home)
        except LakeConfigError as error:
            raise ValueError(f"hotset-parquet: {error}") from None
    layouts = TopicLayouts.from_context(context, lake, source=reader)
    return HotsetDataSynthesizer(reader, config.cluster, config.unit, config.compression, layouts)
