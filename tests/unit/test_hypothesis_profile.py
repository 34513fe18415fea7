"""The tests' hypothesis profile (tests/conftest.py): ``ci`` unless ``HYPOTHESIS_PROFILE`` names
another, and a test's own example count wins over it."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.mark.skipif("HYPOTHESIS_PROFILE" in os.environ, reason="another profile was chosen")
def test_the_ci_profile_is_the_default() -> None:
    """50 examples where a test sets none, no deadline, replay blobs printed."""
    assert settings.default.max_examples == 50
    assert settings.default.deadline is None
    assert settings.default.print_blob is True


def test_a_test_keeps_its_own_example_count() -> None:
    """A property test held to a count keeps it in every profile."""
    seen: list[int] = []

    @settings(max_examples=120, database=None)
    @given(st.integers())
    def draws(value: int) -> None:
        seen.append(value)

    draws()
    assert len(seen) >= 100  # hypothesis stops early only when it runs out of distinct inputs
