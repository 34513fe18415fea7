"""The xdist groups tests/conftest.py gives test files: files that share a heavy server run on
one worker."""

from __future__ import annotations

from tests.support import file_groups


def test_files_without_a_heavy_fixture_get_no_group() -> None:
    assert file_groups([]) == {}


def test_files_sharing_a_heavy_fixture_share_a_group() -> None:
    groups = file_groups(
        [
            ("a.py", "trino"),
            ("b.py", "secure-kafka"),
            ("c.py", "trino"),
            ("c.py", "cdc"),  # c uses Trino and the CDC stack: one group for both
            ("d.py", "cdc"),
            ("e.py", "secure-kafka"),
        ]
    )
    assert groups == {
        "a.py": "cdc+trino",
        "b.py": "secure-kafka",
        "c.py": "cdc+trino",
        "d.py": "cdc+trino",
        "e.py": "secure-kafka",
    }


def test_a_file_joining_two_groups_late_merges_them() -> None:
    groups = file_groups([("a.py", "x"), ("b.py", "y"), ("c.py", "x"), ("c.py", "y")])
    assert set(groups.values()) == {"x+y"}
