"""``copy_bytes``: the memcpy of compiled kernels copies exactly the ranges a slice would."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bergstream.core.api import copy_bytes


@numba.njit(cache=False)
def _gather(target: np.ndarray, source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> int:
    filled = 0
    for index in range(starts.shape[0]):
        copy_bytes(target, filled, source, starts[index], lengths[index])
        filled += lengths[index]
    return filled


@settings(max_examples=200, deadline=None)
@given(
    source=st.binary(min_size=1, max_size=4096),
    cuts=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 600)), max_size=20),
)
def test_copies_what_slices_copy(source: bytes, cuts: list[tuple[int, int]]) -> None:
    data = np.frombuffer(source, np.uint8)
    ranges = [(start % len(source), length) for start, length in cuts]
    ranges = [(start, min(length, len(source) - start)) for start, length in ranges]
    expected = b"".join(source[start : start + length] for start, length in ranges)
    target = np.zeros(len(expected) + 8, np.uint8)
    starts = np.array([r[0] for r in ranges], np.int64)
    lengths = np.array([r[1] for r in ranges], np.int64)
    assert _gather(target, data, starts, lengths) == len(expected)
    assert target[: len(expected)].tobytes() == expected
    assert not target[len(expected) :].any()  # nothing written past the copied ranges


def test_refuses_arrays_of_wider_items() -> None:
    with pytest.raises(numba.TypingError):
        _gather(np.zeros(4, np.int64), np.zeros(4, np.uint8), np.zeros(1, np.int64),
                np.zeros(1, np.int64))  # fmt: skip
