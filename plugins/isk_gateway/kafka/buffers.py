"""Large byte and number buffers from Arrow's memory pool, for Kafka responses received straight
into memory and for the columns the batch decoder fills.

Freed pool memory (mimalloc or jemalloc) is reused already mapped; a fresh numpy array of 100 MB
costs page faults on its first write, more CPU than the decoding that fills it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["pooled_array"]


def pooled_array(count: int, dtype: type[np.generic] = np.uint8) -> np.ndarray:
    """An uninitialised array of ``count`` items of ``dtype`` in Arrow's memory pool."""
    item = np.dtype(dtype).itemsize
    return np.frombuffer(pa.allocate_buffer(max(count, 1) * item), dtype=dtype)[:count]
