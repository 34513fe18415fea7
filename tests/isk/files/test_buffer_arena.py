"""The buffer arena: pieces that never overlap, given back only once nothing refers to them,
free neighbours merged, a full arena leaving large buffers to the allocator, a pretouched
arena whose pages fault no more, and files built in it byte for byte those built without."""

from __future__ import annotations

import gc
import resource
import threading
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from bergstream.plugins.isk_gateway.files.hotset_layout import parquet_layout
from bergstream.plugins.isk_gateway.files.synthesis import records_to_table
from bergstream.plugins.isk_gateway.kafka import buffers
from bergstream.plugins.isk_gateway.kafka.arena import ARENA_ALIGNMENT, BufferArena
from tests.isk.files.record_batches import batches

MB = 1 << 20


@pytest.fixture
def arena(monkeypatch: pytest.MonkeyPatch) -> Iterator[BufferArena]:
    """A 64 MiB arena installed as the process's for the test only."""
    made = BufferArena(64 * MB)
    monkeypatch.setattr(buffers, "_arena", made)
    yield made


def test_pieces_are_mutable_aligned_and_do_not_overlap() -> None:
    arena = BufferArena(64 * MB)
    first, second = arena.take(3 * MB), arena.take(5 * MB + 1)
    assert first is not None and second is not None
    assert (first.size, second.size) == (3 * MB, 5 * MB + 1)
    assert first.is_mutable and second.is_mutable
    assert first.address % ARENA_ALIGNMENT == second.address % ARENA_ALIGNMENT
    np.frombuffer(first, dtype=np.uint8)[:] = 1
    np.frombuffer(second, dtype=np.uint8)[:] = 2
    assert set(np.frombuffer(first, dtype=np.uint8).tolist()) == {1}
    assert arena.taken_bytes == 4 * MB + 6 * MB  # whole 2 MiB pieces


def test_a_piece_comes_back_only_when_nothing_refers_to_it() -> None:
    arena = BufferArena(16 * MB)
    piece = arena.take(4 * MB)
    assert piece is not None
    view = np.frombuffer(piece, dtype=np.uint8)
    sliced = piece.slice(100, 200)
    memory = memoryview(piece)
    array = pa.Array.from_buffers(
        pa.binary(), 1, [None, pa.py_buffer(np.array([0, 7], dtype=np.int32)), piece]
    )
    del piece
    for holder in ("view", "sliced", "memory"):
        assert arena.taken_bytes == 4 * MB, f"given back while {holder} and others live"
        if holder == "view":
            del view
        elif holder == "sliced":
            del sliced
        else:
            memory.release()
            del memory
    assert arena.taken_bytes == 4 * MB  # the Arrow array still holds it
    del array
    assert arena.taken_bytes == 0 and arena.free_pieces == [(0, 16 * MB)]


def test_free_neighbours_merge() -> None:
    arena = BufferArena(32 * MB)
    pieces = [arena.take(size * MB) for size in (4, 8, 2, 8)]  # at 0, 4, 12, 14
    assert arena.free_pieces == [(22 * MB, 10 * MB)]
    pieces[1] = pieces[2] = None  # 8 MiB at 4 and 2 MiB at 12 come back as one hole
    assert arena.free_pieces == [(4 * MB, 10 * MB), (22 * MB, 10 * MB)]
    pieces.clear()
    assert arena.free_pieces == [(0, 32 * MB)] and arena.taken_bytes == 0
    assert arena.high_water_bytes == 22 * MB


def test_the_smallest_hole_that_holds_a_request_is_taken() -> None:
    arena = BufferArena(32 * MB)
    pieces = [arena.take(size * MB) for size in (2, 8, 2, 4, 2)]  # at 0, 2, 10, 12, 16
    pieces[1] = pieces[3] = None
    assert arena.free_pieces == [(2 * MB, 8 * MB), (12 * MB, 4 * MB), (18 * MB, 14 * MB)]
    fitted = arena.take(3 * MB)  # 4 MiB: the hole at 12 holds it exactly
    assert fitted is not None
    assert arena.free_pieces == [(2 * MB, 8 * MB), (18 * MB, 14 * MB)]
    assert arena.take(20 * MB) is None and arena.misses == 1  # 22 MiB free, in two holes


def test_a_full_arena_leaves_large_buffers_to_the_allocator(arena: BufferArena) -> None:
    held = [buffers.large_buffer(20 * MB) for _ in range(3)]  # 60 MiB of the arena's 64
    assert arena.taken_bytes == 60 * MB and arena.misses == 0
    beyond = buffers.large_buffer(20 * MB)
    assert beyond.is_mutable and beyond.size == 20 * MB
    assert arena.misses == 1 and arena.taken_bytes == 60 * MB
    small = buffers.large_buffer(MB)  # below HUGE_PAGE_MIN_BYTES: never from the arena
    assert small.size == MB and arena.taken_bytes == 60 * MB
    del held
    assert arena.taken_bytes == 0


def _faults_writing(buffer: pa.Buffer) -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    np.frombuffer(buffer, dtype=np.uint8)[:] = 5
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_a_pretouched_arena_takes_no_page_faults() -> None:
    fresh, touched = BufferArena(32 * MB), BufferArena(32 * MB)
    assert touched.pretouch() >= 0 and touched.touched
    fresh_piece, touched_piece = fresh.take(32 * MB), touched.take(32 * MB)
    assert fresh_piece is not None and touched_piece is not None
    assert _faults_writing(fresh_piece) > 0
    assert _faults_writing(touched_piece) == 0
    with pytest.raises(RuntimeError, match="before it hands out pieces"):
        touched.pretouch()


def test_files_built_in_the_arena_equal_files_built_without(arena: BufferArena) -> None:
    table = records_to_table(batches(0, 4000, 1), 0)  # 12 MB of values
    columns = arena.taken_bytes  # the value column is a piece too
    assert columns >= 12 * MB
    in_arena = parquet_layout(table, "snappy")
    assert arena.taken_bytes > columns  # the file's buffer is a piece while the file lives
    expected = bytes(in_arena)
    del in_arena
    assert arena.taken_bytes == columns
    buffers._arena = None  # the monkeypatch puts the fixture's back afterwards
    assert bytes(parquet_layout(table, "snappy")) == expected


def test_a_piece_that_becomes_garbage_while_the_arena_is_locked_does_not_deadlock() -> None:
    """A collection of cyclic garbage can finalize a piece inside ``take``, in the thread
    holding the arena's lock: giving it back must not wait for that lock."""
    arena = BufferArena(8 * MB)
    cycle: list[object] = [arena.take(2 * MB)]
    cycle.append(cycle)
    del cycle  # only the cyclic collector frees it now
    returned = threading.Event()

    def collect_while_locked() -> None:
        with arena._lock:
            gc.collect()
        returned.set()

    thread = threading.Thread(target=collect_while_locked, daemon=True)
    thread.start()
    thread.join(10)
    assert returned.is_set(), "giving a piece back waited for the arena's lock"
    assert arena.taken_bytes == 0 and arena.free_pieces == [(0, 8 * MB)]
