"""``bergstream run`` puts Arrow on the system allocator unless the user chose one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "from bergstream.core.arrow_memory import use_system_allocator; "
    "import pyarrow as pa; "
    "name = use_system_allocator(); "
    "print(name, pa.default_memory_pool().backend_name, pa.array([1, 2]).nbytes > 0)"
)


def _allocator(env_pool: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env_pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = env_pool
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == out[1] and out[2] == "True", out
    return out[0]


def test_the_system_allocator_by_default() -> None:
    assert _allocator(None) == "system"


@pytest.mark.parametrize("pool", ["mimalloc", "jemalloc"])
def test_an_allocator_the_environment_names_is_kept(pool: str) -> None:
    import pyarrow as pa

    available = {"mimalloc": pa.mimalloc_memory_pool, "jemalloc": pa.jemalloc_memory_pool}[pool]
    try:
        available()
    except NotImplementedError:
        pytest.skip(f"this pyarrow build has no {pool}")
    assert _allocator(pool) == pool
