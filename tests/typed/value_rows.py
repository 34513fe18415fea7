"""Batches in the row contract made of given values, for the typed-rows tests of this folder."""

from __future__ import annotations

import pyarrow as pa

from bergstream.core.api import ROW_ARROW_SCHEMA


def rows(values: list[bytes | None]) -> pa.Table:
    """A batch in the row contract holding ``values`` (partition 0, offsets from 0)."""
    count = len(values)
    return pa.Table.from_pydict(
        {
            "kafka_partition": [0] * count,
            "kafka_offset": list(range(count)),
            "kafka_timestamp": [0] * count,
            "kafka_timestamp_type": [0] * count,
            "kafka_key": [None] * count,
            "kafka_headers": [[]] * count,
            "kafka_value": values,
        },
        schema=ROW_ARROW_SCHEMA,
    )
