"""The pool of decoded-column buffers: reused between chunks, bounded, emptied when idle, and
files built with reused buffers are byte for byte those built without."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bergstream.plugins.isk_gateway.files.hotset_layout import parquet_layout
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from bergstream.plugins.isk_gateway.kafka import buffers
from bergstream.plugins.isk_gateway.kafka.buffers import BufferPool
from tests.isk.files.record_batches import batches

MB = 1 << 20


def test_a_given_buffer_is_taken_again_when_it_fits() -> None:
    pool = BufferPool(max_buffers=2, max_bytes=64 * MB, idle_seconds=60)
    first = pool.take(9 * MB)
    assert first.size == 12 * MB  # a quarter more, in whole huge pages
    pool.give(first)
    assert pool.take(11 * MB) is first and pool.reused == 1  # a larger chunk still fits
    pool.give(first)
    assert pool.take(13 * MB) is not first  # more than it holds: a new one
    small = pool.take(MB)
    assert small is first  # the smallest free buffer that holds it


def test_free_buffers_are_bounded_in_count_and_bytes() -> None:
    pool = BufferPool(max_buffers=2, max_bytes=24 * MB, idle_seconds=60)
    taken = [pool.take(size * MB) for size in (12, 8, 6, 2)]
    assert [base.size // MB for base in taken] == [16, 10, 8, 4]
    for base in taken:
        pool.give(base)
    assert pool.free_bytes <= 24 * MB
    assert sorted(base.size // MB for _, base in pool._free) == [8, 16]  # the largest that fit


def test_idle_buffers_go_back_to_the_system() -> None:
    pool = BufferPool(max_buffers=2, max_bytes=64 * MB, idle_seconds=0.2)
    pool.give(pool.take(9 * MB))
    assert pool.free_bytes == 12 * MB
    time.sleep(0.6)
    assert pool.free_bytes == 0


def test_files_built_with_reused_buffers_equal_files_built_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(buffers, "HUGE_PAGE_MIN_BYTES", MB)  # pool these small columns (1.2 MB)
    pool = BufferPool(max_buffers=2, max_bytes=64 * MB, idle_seconds=60)
    built = []
    for first, fill in ((0, 1), (400, 50), (800, 100)):
        blob = batches(first, 400, fill)
        lease = pool.lease()
        table = records_to_table(blob, 0, lease=lease)
        written = bytes(parquet_layout(table))
        lease.release()
        assert written == bytes(parquet_layout(records_to_table(blob, 0)))
        built.append(written)
    assert pool.reused >= 2  # the later chunks decoded into the first chunk's buffers
    assert len(set(built)) == 3
    assert np.frombuffer(built[0], np.uint8).size > 0
