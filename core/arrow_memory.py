"""Which allocator Arrow uses in a long-running ``bergstream run`` process."""

from __future__ import annotations

import os

#: Arrow's own variable naming its allocator (``system``, ``jemalloc``, ``mimalloc``).
ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_allocator() -> str:
    """Send Arrow's allocations to the C library's allocator, unless ``ARROW_DEFAULT_MEMORY_POOL``
    names one; return the allocator in use.

    Arrow's bundled allocator (mimalloc in the PyPI wheels) keeps freed memory for reuse per
    thread: under concurrent queries ISK's resident memory grew by 655 MB where the system
    allocator's grew by 40 MB, at the same queries/s (``bench/isk_load.py --quick``, 16
    clients, 2 cores; docs/operations.md)."""
    import pyarrow as pa

    if not os.environ.get(ARROW_POOL_VARIABLE):
        pa.set_memory_pool(pa.system_memory_pool())
    return pa.default_memory_pool().backend_name
