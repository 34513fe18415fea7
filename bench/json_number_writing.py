"""Doubles written as JSON text: the json-schema encode kernel's own writer against the
libraries.

The encode kernel writes each double inside its compiled row loop, spelled as Python's ``repr``
spells it (what the codec's decoder proves canonical and reads back byte for byte). A library
can only do it outside the loop: ``repr`` per value (the stdlib), or ``orjson.dumps`` of the
values (faster, but another spelling: ``1e+16`` is ``1e16`` there, so its bytes would not be the
canonical ones; timed as the fastest library at all). This bench times the kernel's
``write_double`` over the same doubles as both and prints the ratios (library time / kernel
time); ``plugins/value_codecs/json_schema/number_writing.py`` quotes them.

Run: ``python bench/json_number_writing.py [count]``.
"""

from __future__ import annotations

import sys
import time

import numba
import numpy as np
import orjson

from bergstream.plugins.value_codecs.json_schema.number_writing import write_double


@numba.njit(nogil=True)
def _kernel(bits: np.ndarray, out: np.ndarray) -> int:
    pos = 0
    for i in range(bits.size):
        pos = write_double(out, pos, bits[i])
        out[pos] = 44  # ","
        pos += 1
    return pos


def _doubles(count: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate(
        [
            rng.normal(0, 1e3, count // 2).round(2),  # prices, 2 decimals
            rng.normal(0, 1, count - count // 2),  # 16 to 17 significant digits
        ]
    )


def main(count: int = 1_000_000) -> None:
    """Time the three ways over ``count`` doubles and print the ratios."""
    values = _doubles(count)
    bits = values.view(np.int64)
    out = np.empty(count * 26, dtype=np.uint8)
    _kernel(bits[:3], out)  # compile
    started = time.perf_counter()
    end = _kernel(bits, out)
    kernel = time.perf_counter() - started

    floats = values.tolist()
    started = time.perf_counter()
    with_repr = ",".join(repr(v) for v in floats).encode() + b","
    stdlib = time.perf_counter() - started

    started = time.perf_counter()
    orjson.dumps(floats)
    with_orjson = time.perf_counter() - started

    assert bytes(out[:end]) == with_repr, "the kernel must write what repr writes"
    print(f"{count} doubles: kernel {kernel * 1e3:.1f} ms (byte-identical to repr)")
    print(f"repr per value:      {stdlib * 1e3:.1f} ms, ratio {stdlib / kernel:.1f}")
    print(f"orjson.dumps (list): {with_orjson * 1e3:.1f} ms, ratio {with_orjson / kernel:.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
