"""Record batches of the ISK file tests: runs of records with large values, built in batches
of 50 as a producer would send them."""

from __future__ import annotations

from bergstream.core.records import BatchInfo, Record, build_batch


def batches(first: int, count: int, fill: int) -> bytes:
    """``count`` records from offset ``first``, each of a 3,000-byte value of ``fill + i % 7``
    repeated (so different ``fill`` give different files), key ``k``."""
    values = [bytes([fill + i % 7]) * 3000 for i in range(count)]
    records = [Record(first + i, 1_700_000_000_000 + i, b"k", values[i]) for i in range(count)]
    return b"".join(
        build_batch(records[i : i + 50], BatchInfo(base_offset=first + i))
        for i in range(0, count, 50)
    )
