"""Canonical JSON doubles: the json-schema kernel's own reader against the libraries.

The kernel must both read a double and prove its text canonical (``repr`` of the float it reads
as), per value, inside the compiled row loop. The libraries can only do that outside it: parse
the text (orjson, or the stdlib's ``float``) and compare ``repr`` of the result with the text.
This bench times both over the same number texts and prints the ratio
(library time / kernel time); ``plugins/value_codecs/json_schema/number_reading.py`` quotes it.

Run: ``python bench/json_numbers.py [count]``.
"""

from __future__ import annotations

import sys
import time

import numba
import numpy as np
import orjson

from bergstream.plugins.value_codecs.json_schema.number_reading import read_double


@numba.njit(nogil=True)
def _kernel(buf: np.ndarray, bounds: np.ndarray) -> tuple[int, float]:
    scratch = np.empty(64, dtype=np.uint8)
    cell = np.empty(1, dtype=np.float64)
    cell_bits = cell.view(np.int64)
    proven = 0
    total = 0.0
    for i in range(bounds.size - 1):
        ok, value = read_double(buf, bounds[i], bounds[i + 1], scratch, cell, cell_bits)
        proven += ok
        total += value
    return proven, total


def _texts(count: int) -> list[bytes]:
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            rng.normal(0, 1e3, count // 2).round(2),  # prices, 2 decimals
            rng.normal(0, 1, count - count // 2),  # 16 to 17 significant digits
        ]
    )
    return [repr(float(v)).encode() for v in values]


def main(count: int = 1_000_000) -> None:
    """Time both ways over ``count`` texts and print the ratios."""
    texts = _texts(count)
    buf = np.frombuffer(b"".join(texts), dtype=np.uint8)
    bounds = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
    _kernel(buf, bounds[:3])  # compile
    started = time.perf_counter()
    proven, _ = _kernel(buf, bounds)
    kernel = time.perf_counter() - started

    started = time.perf_counter()
    library_proven = sum(repr(orjson.loads(t)).encode() == t for t in texts)
    with_orjson = time.perf_counter() - started

    started = time.perf_counter()
    stdlib_proven = sum(repr(float(t)).encode() == t for t in texts)
    with_stdlib = time.perf_counter() - started

    assert proven <= library_proven == stdlib_proven == count
    print(f"{count} doubles: kernel {kernel * 1e3:.1f} ms ({proven} proven canonical)")
    print(f"orjson.loads + repr: {with_orjson * 1e3:.1f} ms, ratio {with_orjson / kernel:.1f}")
    print(f"float + repr:        {with_stdlib * 1e3:.1f} ms, ratio {with_stdlib / kernel:.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
