"""Hypothesis strategies of Kafka records as the pipeline tests produce them (the round trip's
generators): null, empty, small and large keys and values, headers with odd and repeated keys,
timestamps up to the last millisecond Python can show, ``PARTITIONS`` partitions."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.kits.lake import Produced

PARTITIONS = 3
#: 9999-12-31T23:59:59.999Z, the last millisecond Python's datetime (and Spark) can show.
FAR_FUTURE_MS = 253_402_300_799_999


def _repeated(size: int, pattern: bytes) -> bytes:
    return (pattern * (size // len(pattern) + 1))[:size]


def blobs(max_size: int) -> st.SearchStrategy[bytes]:
    """Small random bytes, or large ones (up to ``max_size``) made by repeating a pattern."""
    large = st.builds(_repeated, st.integers(0, max_size), st.binary(min_size=1, max_size=16))
    return st.one_of(st.binary(max_size=64), large)


headers = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "ключ", "鍵", "🔑", ""]) | st.text(max_size=12),
        st.none() | st.binary(max_size=48),
    ),
    max_size=20,
).map(tuple)

records = st.builds(
    Produced,
    partition=st.integers(0, PARTITIONS - 1),
    key=st.none() | st.just(b"") | blobs(10_000),
    value=st.none() | st.just(b"") | blobs(1_000_000),
    headers=headers,
    timestamp=st.sampled_from([0, 1, FAR_FUTURE_MS]) | st.integers(0, FAR_FUTURE_MS),
)
