"""Column statistics of hot files: truncated binary bounds that still bound, the stats an index
entry gets from a chunk's rows, and the manifest entry (``DataFile``) made from them, round-tripped
through the sqlite index and used by PyIceberg to prune."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.expressions import EqualTo
from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator

from bergstream.core.api import (
    KEY_ID,
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    TIMESTAMP_TYPE_ID,
    VALUE_ID,
    ChunkEntry,
)
from bergstream.plugins.index_backends.sqlite_index import SqliteIndex
from bergstream.plugins.isk_gateway.files.data_files import (
    BINARY_BOUND_LENGTH,
    NULL_COUNTS,
    binary_lower_bound,
    binary_upper_bound,
    chunk_bounds,
    column_stats,
    data_file,
)


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20))
def test_truncated_bounds_still_bound(values: list[bytes]) -> None:
    low, high = binary_lower_bound(min(values)), binary_upper_bound(max(values))
    assert len(low) <= BINARY_BOUND_LENGTH
    assert all(low <= value for value in values)
    if high is not None:
        assert len(high) <= BINARY_BOUND_LENGTH
        assert all(value <= high for value in values)
    else:  # only a prefix of 0xFF bytes has no shorter upper bound
        assert max(values)[:BINARY_BOUND_LENGTH] == b"\xff" * BINARY_BOUND_LENGTH


def test_upper_bound_rounds_up() -> None:
    assert binary_upper_bound(b"short") == b"short"
    assert binary_upper_bound(b"a" * 15 + b"b" + b"zzz") == b"a" * 15 + b"c"
    assert binary_upper_bound(b"a" * 14 + b"\xff\xff" + b"z") == b"a" * 13 + b"b"
    assert binary_upper_bound(b"\xff" * 17) is None


def rows(keys: list[bytes | None], values: list[bytes | None], types: list[int]) -> pa.Table:
    count = len(keys)
    columns = {
        "kafka_partition": pa.array([0] * count, pa.int32()),
        "kafka_offset": pa.array(range(count), pa.int64()),
        "kafka_timestamp": pa.array([1_700_000_000_000_000] * count, pa.timestamp("us", "UTC")),
        "kafka_timestamp_type": pa.array(types, pa.int32()),
        "kafka_key": pa.array(keys, pa.large_binary()),
        "kafka_headers": pa.array([[]] * count, ROW_ARROW_SCHEMA.field("kafka_headers").type),
        "kafka_value": pa.array(values, pa.large_binary()),
    }
    return pa.table(columns, schema=ROW_ARROW_SCHEMA)


def test_column_stats_of_rows() -> None:
    long = b"x" * 20
    table = rows([None, b"", b"k2", None], [long, None, b"v", b"\xff" * 30], [0, 1, 1, 0])
    assert column_stats(table) == {
        "kafka_timestamp_type": (0, 1),
        "kafka_key": (b"", b"k2"),
        "kafka_value": (b"v", None),
        NULL_COUNTS: (2, 1),
    }
    all_null = rows([None, None], [None, None], [0, 0])
    assert column_stats(all_null) == {"kafka_timestamp_type": (0, 0), NULL_COUNTS: (2, 2)}
    # a layout without the row contract's key and value columns gets no stats of them
    typed = table.drop_columns(["kafka_key", "kafka_value"])
    assert column_stats(typed) == {"kafka_timestamp_type": (0, 1)}


def entry(table: pa.Table) -> ChunkEntry:
    bounds = chunk_bounds(0, (0, table.num_rows - 1), (1, 2)) | column_stats(table)
    return ChunkEntry("orders", 0, 0, table.num_rows, table.num_rows, 100, bounds)


def test_data_file_carries_the_stats_through_the_index(tmp_path: Path) -> None:
    table = rows([None, b"", b"k2", b"k9"], [b"a", None, b"b" * 40, b"c"], [1, 1, 1, 1])
    index = SqliteIndex(tmp_path / "index.db")
    try:
        index.put_chunks([entry(table)])
        (stored,) = index.chunks("orders", 0)
    finally:
        index.close()
    file = data_file("gw", "c1", stored)
    assert file.lower_bounds[KEY_ID] == b"" and file.upper_bounds[KEY_ID] == b"k9"
    assert file.lower_bounds[VALUE_ID] == b"a" and file.upper_bounds[VALUE_ID] == b"c"
    assert file.lower_bounds[TIMESTAMP_TYPE_ID] == (1).to_bytes(4, "little")
    assert file.null_value_counts[KEY_ID] == 1 and file.null_value_counts[VALUE_ID] == 1
    assert file.value_counts[KEY_ID] == file.value_counts[VALUE_ID] == 4

    def may_match(expression: object) -> bool:
        return _InclusiveMetricsEvaluator(ROW_SCHEMA, expression).eval(file)

    assert may_match(EqualTo("kafka_key", b"k2"))
    assert not may_match(EqualTo("kafka_key", b"zz"))
    assert not may_match(EqualTo("kafka_value", b"d"))
    assert not may_match(EqualTo("kafka_timestamp_type", 0))


def test_entry_without_the_new_stats_still_makes_a_file() -> None:
    """An entry with only the contract bounds (written before these stats existed) bounds only
    those columns; nothing is guessed for the others."""
    bounds = chunk_bounds(0, (0, 3), (1, 2))
    file = data_file("gw", "c1", ChunkEntry("orders", 0, 0, 4, 4, 100, bounds))
    assert KEY_ID not in file.lower_bounds and VALUE_ID not in file.null_value_counts
    assert TIMESTAMP_TYPE_ID not in file.lower_bounds
