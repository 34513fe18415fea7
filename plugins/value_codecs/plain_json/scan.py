"""The compiled skeleton scanner (numba) behind :func:`.shapes.observe`'s fast path.

A row's *skeleton* is its structure with the values left out: every key's raw bytes (as the
text spells them, escapes and all) and, per value, a tag for its kind (``n`` null, ``b``
boolean, ``i`` an integer literal that fits 64 bits, ``f`` any other number, ``s`` string) or
the skeletons of what it holds (``{`` keys and values ``}``, ``[`` elements ``]``; an element
whose skeleton equals the one before it is written once, which changes no kind: the join of a
kind with itself is that kind). Rows with equal skeletons therefore have equal shapes, so
Python builds kinds only for the first row of each distinct skeleton.

:func:`scan_skeletons` reads a whole batch: each row it can vouch for (strictly valid JSON
(RFC 8259) and UTF-8, a top-level object, nesting at most :data:`MAX_DEPTH` deep, at most
:data:`MAX_ROW` bytes) gets the
number of its distinct skeleton (by first appearance); every other row is left to the exact
per-row path (it may be valid JSON the scanner does not follow, or the error it gets is
worded by that path). Skeletons are compared byte for byte, not only by hash.

The helpers take raw pointers, not arrays: numba counts references to an array argument at
every call (two atomic operations), which took most of the time of a row of small values.
Compiled with ``cached_njit`` (:mod:`bergstream.core.kernel_cache`): its on-disk cache is keyed
on the source of this file and of every module it imports, so it is recompiled after any of
them changes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.base import BaseContext
from numba.core.typing.templates import Signature
from numba.extending import intrinsic

from bergstream.core.api import cached_njit
from bergstream.plugins.value_codecs.shared.kernel_read import utf8_ok

__all__ = ["MAX_DEPTH", "MAX_ROW", "NULL_ROW", "SLOW_ROW", "scan_skeletons"]

#: Deepest nesting the scanner follows (deeper rows take the exact per-row path).
MAX_DEPTH = 64
#: Longest row the scanner reads (longer ones take the exact per-row path).
MAX_ROW = 1 << 20
#: ``skeleton_of`` for a null row.
NULL_ROW = -1
#: ``skeleton_of`` for a row the scanner leaves to the exact per-row path.
SLOW_ROW = -2

_QUOTE, _BACKSLASH = 0x22, 0x5C
_TAG_KEY = 0x4B  # "K", then the key's length (varint) and raw bytes
_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)
_QUOTES = np.uint64(0x2222222222222222)
_BACKSLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)
_SPACES = np.uint64(0x2020202020202020)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_DIGIT_NIBBLES = np.uint64(0x3030303030303030)
_SIXES = np.uint64(0x0606060606060606)
_LOW_7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_SEED = np.uint64(0xCBF29CE484222325)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # the golden-ratio multiplier
# the 19 digits of the largest 64-bit magnitudes (positive, negative), as two words and 3 bytes
_LONG_MAX_HEAD = np.uint64(int.from_bytes(b"92233720", "little"))
_LONG_MAX_MID = np.uint64(int.from_bytes(b"36854775", "little"))
_LONG_MAX_TAIL = np.uint64(int.from_bytes(b"807", "little"))
_LONG_MIN_TAIL = np.uint64(int.from_bytes(b"808", "little"))
# Python refuses integer literals longer than ``sys.get_int_max_str_digits()`` (at least 640
# unless 0): a row with a longer one may not parse, so it is left to the exact path
_MAX_INT_DIGITS = 639
_TRUE = np.uint64(int.from_bytes(b"true", "little"))
_FALSE = np.uint64(int.from_bytes(b"false", "little"))
_NULL = np.uint64(int.from_bytes(b"null", "little"))

_BYTES = types.CPointer(types.uint8)


@intrinsic
def _address(typingctx: object, array: types.Type) -> tuple[Signature, Callable[..., object]]:
    """A raw pointer to a contiguous array's first item (the caller keeps the array alive)."""
    if not (isinstance(array, types.Array) and array.layout == "C"):
        return None  # type: ignore[return-value]  # not typed: numba reports the call

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        return context.make_array(signature.args[0])(context, builder, args[0]).data

    return types.CPointer(array.dtype)(array), codegen


@intrinsic
def _word(
    typingctx: object, src: types.Type, at: types.Type
) -> tuple[Signature, Callable[..., object]]:
    """The 8 bytes at ``src + at`` as one unaligned little-endian uint64 (bounds are the
    caller's)."""
    if src != _BYTES:
        return None  # type: ignore[return-value]  # not typed: numba reports the call

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        pointer = builder.gep(args[0], [args[1]])
        return builder.load(builder.bitcast(pointer, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(src, types.intp), codegen


@intrinsic
def _at(
    typingctx: object, src: types.Type, at: types.Type
) -> tuple[Signature, Callable[..., object]]:
    """The pointer ``at`` bytes past ``src``."""
    if src != _BYTES:
        return None  # type: ignore[return-value]  # not typed: numba reports the call

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        return builder.gep(args[0], [args[1]])

    return _BYTES(src, types.intp), codegen


@intrinsic
def _low_zeros(typingctx: object, value: types.Type) -> tuple[Signature, Callable[..., object]]:
    """The number of trailing zero bits of a nonzero uint64."""
    if value != types.uint64:
        return None  # type: ignore[return-value]  # not typed: numba reports the call

    def codegen(
        context: BaseContext, builder: ir.IRBuilder, signature: Signature, args: list[ir.Value]
    ) -> ir.Value:
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 1))

    return types.uint64(types.uint64), codegen


@cached_njit(nogil=True, inline="always")
def _high_bit(p: types.CPointer, pos: int, end: int) -> bool:
    """Whether a byte of ``p[pos:end]`` is above 0x7F."""
    words = np.uint64(0)
    while pos + 8 <= end:
        words |= _word(p, pos)
        pos += 8
    while pos < end:
        words |= np.uint64(p[pos])
        pos += 1
    return (words & _HIGH) != 0


@cached_njit(nogil=True, inline="always")
def _ws(p: types.CPointer, pos: int, end: int) -> int:
    """The position of the first byte at or after ``pos`` that is not JSON whitespace."""
    while pos < end:
        c = p[pos]
        if c != 0x20 and c != 0x0A and c != 0x0D and c != 0x09:
            return pos
        pos += 1
    return pos


@cached_njit(nogil=True, inline="always")
def _hex(c: int) -> bool:
    return (0x30 <= c <= 0x39) or (0x41 <= c <= 0x46) or (0x61 <= c <= 0x66)


# the characters a backslash escapes in two bytes, as bits of two words: " / and \\ b f n r t
_ESCAPES_LOW = np.uint64(sum(1 << c for c in b'"/'))
_ESCAPES_HIGH = np.uint64(sum(1 << (c - 64) for c in b"\\bfnrt"))


@cached_njit(nogil=True, inline="always")
def _escapes(c: int) -> bool:
    """Whether ``\\`` then ``c`` is a two-byte escape."""
    if c < 64:
        return (_ESCAPES_LOW >> np.uint64(c)) & np.uint64(1) == 1
    if c < 128:
        return (_ESCAPES_HIGH >> np.uint64(c - 64)) & np.uint64(1) == 1
    return False


@cached_njit(nogil=True, inline="always")
def _string_end(p: types.CPointer, pos: int, end: int) -> int:
    """Where the string whose opening quote is at ``pos`` ends (just past its closing quote);
    -1 if it is not a valid JSON string (a raw control character, a bad escape, no end).
    UTF-8 is the caller's to check."""
    i = pos + 1
    while True:
        while i + 8 <= end:  # 8 bytes at a time while none is a quote, backslash or control
            w = _word(p, i)
            q = w ^ _QUOTES
            b = w ^ _BACKSLASHES
            found = (((q - _ONES) & ~q) | ((b - _ONES) & ~b) | ((w - _SPACES) & ~w)) & _HIGH
            if found:
                # the lowest flagged byte is a special one (a borrow only flags bytes above one)
                i += np.int64(_low_zeros(found) >> np.uint64(3))
                break
            i += 8
        if i >= end:
            return -1
        c = p[i]
        if c == _QUOTE:
            return i + 1
        if c == _BACKSLASH:
            if i + 1 >= end:
                return -1
            e = p[i + 1]
            if e == 0x75:  # \uXXXX: any four hex digits (lone surrogates read as text too)
                if i + 6 > end:
                    return -1
                for k in range(2, 6):
                    if not _hex(p[i + k]):
                        return -1
                i += 6
            elif _escapes(e):
                i += 2
            else:
                return -1
        elif c < 0x20:
            return -1
        else:
            i += 1


@cached_njit(nogil=True, inline="always")
def _digits_end(p: types.CPointer, i: int, end: int) -> int:
    """The end of the run of ASCII digits at ``i`` (no byte of the row is above 0xF4: it is
    ASCII or valid UTF-8, so adding 6 to a byte carries into no other)."""
    while i + 8 <= end:
        w = _word(p, i)
        other = ((w & _HIGH_NIBBLES) ^ _DIGIT_NIBBLES) | (
            ((w + _SIXES) & _HIGH_NIBBLES) ^ _DIGIT_NIBBLES
        )  # per byte: nonzero unless a digit
        other = (((other & _LOW_7) + _LOW_7) | other) & _HIGH
        if other:
            return i + np.int64(_low_zeros(other) >> np.uint64(3))
        i += 8
    while i < end and 0x30 <= p[i] <= 0x39:
        i += 1
    return i


@cached_njit(nogil=True)
def _fits_long(p: types.CPointer, first: int, negative: bool) -> bool:
    """Whether the 19 digits at ``first`` are at most 2**63 - 1 (2**63 when ``negative``)."""
    tail = np.uint64(p[first + 16]) | (np.uint64(p[first + 17]) << np.uint64(8))
    tail |= np.uint64(p[first + 18]) << np.uint64(16)
    for got, limit in (
        (_word(p, first), _LONG_MAX_HEAD),
        (_word(p, first + 8), _LONG_MAX_MID),
        (tail, _LONG_MIN_TAIL if negative else _LONG_MAX_TAIL),
    ):
        if got != limit:  # the first differing byte decides (the lowest, little-endian)
            shift = _low_zeros(got ^ limit) & np.uint64(0x38)
            return (got >> shift) & np.uint64(0xFF) < (limit >> shift) & np.uint64(0xFF)
    return True


@cached_njit(nogil=True, inline="always")
def _number(p: types.CPointer, pos: int, end: int) -> tuple[int, int]:
    """The end of the JSON number at ``pos`` (-1: not a valid one, or an integer literal
    Python may refuse to convert) and its tag: ``i`` for an integer literal within 64 bits,
    ``f`` otherwise."""
    i = pos
    negative = p[i] == 0x2D
    if negative:
        i += 1
        if i >= end:
            return -1, 0
    first = i
    c = p[i]
    if c == 0x30:
        i += 1
    elif 0x31 <= c <= 0x39:
        i = _digits_end(p, i + 1, end)
    else:
        return -1, 0
    digits = i - first
    integer = True
    if i < end and p[i] == 0x2E:  # fraction
        integer = False
        start = i + 1
        i = _digits_end(p, start, end)
        if i == start:
            return -1, 0
    if i < end and (p[i] == 0x65 or p[i] == 0x45):  # exponent
        integer = False
        i += 1
        if i < end and (p[i] == 0x2B or p[i] == 0x2D):
            i += 1
        start = i
        i = _digits_end(p, start, end)
        if i == start:
            return -1, 0
    if not integer:
        return i, 0x66
    if digits > _MAX_INT_DIGITS:
        return -1, 0
    if digits > 19:
        return i, 0x66
    if digits == 19 and not _fits_long(p, first, negative):
        return i, 0x66
    return i, 0x69


@cached_njit(nogil=True, inline="always")
def _spells(p: types.CPointer, pos: int, end: int, word: np.uint64, size: int) -> bool:
    """Whether the ``size`` (1 to 8) bytes at ``pos`` are those of ``word`` (little-endian,
    zero above them)."""
    if pos + size > end:
        return False
    if pos + 8 <= end:
        return (_word(p, pos) & (_ALL >> np.uint64(64 - 8 * size))) == word
    got = np.uint64(0)
    for k in range(size):
        got |= np.uint64(p[pos + k]) << np.uint64(8 * k)
    return got == word


@cached_njit(nogil=True, inline="always")
def _value(p: types.CPointer, pos: int, end: int) -> tuple[int, int]:
    """The end of the value at ``pos`` (``pos < end``; just past ``{`` or ``[`` for a
    container; -1: not a valid value) and its tag."""
    c = p[pos]
    if c == _QUOTE:
        return _string_end(p, pos, end), 0x73
    if c == 0x2D or 0x30 <= c <= 0x39:
        return _number(p, pos, end)
    if c == 0x7B or c == 0x5B:
        return pos + 1, c
    if c == 0x74:
        return (pos + 4 if _spells(p, pos, end, _TRUE, 4) else -1), 0x62
    if c == 0x66:
        return (pos + 5 if _spells(p, pos, end, _FALSE, 5) else -1), 0x62
    if c == 0x6E:
        return (pos + 4 if _spells(p, pos, end, _NULL, 4) else -1), 0x6E
    return -1, 0


@cached_njit(nogil=True, inline="always")
def _equal(a: types.CPointer, b: types.CPointer, size: int) -> bool:
    """Whether the ``size`` bytes at ``a`` and ``b`` are equal."""
    k = 0
    while k + 8 <= size:
        if _word(a, k) != _word(b, k):
            return False
        k += 8
    while k < size:
        if a[k] != b[k]:
            return False
        k += 1
    return True


@cached_njit(nogil=True)
def _skeleton(
    p: types.CPointer,
    pos: int,
    end: int,
    out: types.CPointer,
    room: int,
    arrays: types.CPointer,
    previous: types.CPointer,
    spans: types.CPointer,
    span_room: int,
) -> tuple[int, int]:
    """Write the skeleton of the row ``p[pos:end]`` into ``out`` (``room`` bytes) and each
    value's start, end and tag into ``spans`` (three int64 a value, ``span_room`` int64;
    containers: their opening byte); the skeleton's length and the number of values, or -1
    when the scanner cannot vouch for the row (or it does not fit)."""
    pos = _ws(p, pos, end)
    if pos >= end or p[pos] != 0x7B:
        return -1, 0
    size = 0
    depth = 0  # open containers; arrays[d]: whether container d is an array
    # previous[d], previous[MAX_DEPTH + d]: where the skeleton of array d's previous element and
    # of its current one start (-1: no previous element)
    expect_key = False
    spans_count = 0
    while True:
        if expect_key:  # at a key's opening quote
            if pos >= end or p[pos] != _QUOTE:
                return -1, 0
            after = _string_end(p, pos, end)
            if after < 0:
                return -1, 0
            length = after - pos - 2
            if size + length + 8 > room:
                return -1, 0
            out[size] = _TAG_KEY
            size += 1
            rest = length
            while rest >= 0x80:
                out[size] = (rest & 0x7F) | 0x80
                size += 1
                rest >>= 7
            out[size] = rest
            size += 1
            for k in range(length):
                out[size + k] = p[pos + 1 + k]
            size += length
            pos = _ws(p, after, end)
            if pos >= end or p[pos] != 0x3A:
                return -1, 0
            pos = _ws(p, pos + 1, end)
            expect_key = False
        # a value at pos
        if pos >= end or size + 2 > room or spans_count * 3 + 3 > span_room:
            return -1, 0
        first = pos
        pos, tag = _value(p, pos, end)
        if pos < 0:
            return -1, 0
        spans[3 * spans_count] = first
        spans[3 * spans_count + 1] = pos
        spans[3 * spans_count + 2] = tag
        spans_count += 1
        out[size] = tag
        size += 1
        closed = True  # whether the value is complete (not an opened container)
        if tag == 0x7B or tag == 0x5B:
            if depth >= MAX_DEPTH:
                return -1, 0
            array = tag == 0x5B
            arrays[depth] = array
            previous[depth] = -1
            previous[MAX_DEPTH + depth] = size
            depth += 1
            pos = _ws(p, pos, end)
            if pos < end and p[pos] == (0x5D if array else 0x7D):
                out[size] = p[pos]
                size += 1
                pos += 1
                depth -= 1
            elif array:
                closed = False
                continue  # its first element
            else:
                closed = False
                expect_key = True
                continue
        # after a complete value: close containers as far as the text does
        while closed:
            if depth == 0:
                return (size if _ws(p, pos, end) == end else -1), spans_count
            d = depth - 1
            if arrays[d]:
                current = previous[MAX_DEPTH + d]
                before = previous[d]
                if (
                    before >= 0
                    and current - before == size - current
                    and _equal(_at(out, before), _at(out, current), size - current)
                ):
                    size = current  # the element's skeleton is already there
                else:
                    previous[d] = current
            pos = _ws(p, pos, end)
            if pos >= end or size + 1 > room:
                return -1, 0
            c = p[pos]
            if c == 0x2C:
                pos = _ws(p, pos + 1, end)
                if arrays[d]:
                    previous[MAX_DEPTH + d] = size
                else:
                    expect_key = True
                closed = False
            elif c == (0x5D if arrays[d] else 0x7D):
                out[size] = c
                size += 1
                pos += 1
                depth -= 1
            else:
                return -1, 0


@cached_njit(nogil=True)
def _hash(out: types.CPointer, size: int) -> np.uint64:
    """A hash of the ``size`` bytes at ``out``, 8 at a time (zero-padded past ``size``)."""
    h = _SEED ^ np.uint64(size)
    for k in range(0, size, 8):
        h = (h ^ _word(out, k)) * _MIX
        h ^= h >> np.uint64(29)
    return h


_SLOTS = 8  # children per trie node: one per value tag


@cached_njit(nogil=True, inline="always")
def _slot(tag: int) -> int:
    """The child of a trie node that follows a value of ``tag``."""
    if tag == 0x73:
        return 0
    if tag == 0x69:
        return 1
    if tag == 0x66:
        return 2
    if tag == 0x62:
        return 3
    if tag == 0x6E:
        return 4
    if tag == 0x7B:
        return 5
    return 6


@cached_njit(nogil=True, inline="always")
def _literal_at(lits: types.CPointer, size: int, p: types.CPointer, pos: int, end: int) -> bool:
    """Whether ``p`` holds the ``size`` bytes at ``lits`` at ``pos`` (before ``end``; ``lits``
    has 8 bytes to spare past every literal)."""
    if pos + size > end:
        return False
    if size <= 8 and pos + 8 <= end:
        if size == 0:
            return True
        return ((_word(lits, 0) ^ _word(p, pos)) & (_ALL >> np.uint64(64 - 8 * size))) == 0
    return _equal(lits, _at(p, pos), size)


@cached_njit(nogil=True)
def _walk(
    p: types.CPointer,
    pos: int,
    end: int,
    lits: types.CPointer,
    lit_at: types.CPointer,
    lit_len: types.CPointer,
    child: types.CPointer,
    sibling: types.CPointer,
    final: types.CPointer,
) -> int:
    """The skeleton of the row ``p[pos:end]`` if its path is in the trie (see
    :func:`scan_skeletons`), else -1."""
    node = 0
    while True:
        if final[node] >= 0:
            return final[node] if pos == end else -1
        if pos >= end:
            return -1
        pos, tag = _value(p, pos, end)
        if pos < 0:
            return -1
        candidate = child[node * _SLOTS + _slot(tag)]
        while candidate >= 0:
            if _literal_at(_at(lits, lit_at[candidate]), lit_len[candidate], p, pos, end):
                break
            candidate = sibling[candidate]
        if candidate < 0:
            return -1
        pos += lit_len[candidate]
        node = candidate


@cached_njit(nogil=True)
def _insert(
    p: types.CPointer,
    start: int,
    end: int,
    spans: types.CPointer,
    values: int,
    skeleton: int,
    lits: types.CPointer,
    lit_room: int,
    lit_at: types.CPointer,
    lit_len: types.CPointer,
    child: types.CPointer,
    sibling: types.CPointer,
    final: types.CPointer,
    node_room: int,
    sizes: types.CPointer,
) -> None:
    """Add the path of a row the builder vouched for (``spans``: its ``values``) to the trie,
    ending in ``skeleton``; ``sizes``: the trie's node count and literal bytes, updated. A
    row with leading whitespace, or a full trie, adds nothing (or a dead end, never walked to
    the end)."""
    if spans[0] != start:
        return
    node = 0
    for v in range(values):
        after = spans[3 * v + 1]
        size = (spans[3 * v + 3] if v + 1 < values else end) - after
        slot = node * _SLOTS + _slot(spans[3 * v + 2])
        candidate = child[slot]
        last = -1
        while candidate >= 0:
            if lit_len[candidate] == size and _equal(
                _at(lits, lit_at[candidate]), _at(p, after), size
            ):
                break
            last = candidate
            candidate = sibling[candidate]
        if candidate < 0:
            nodes, used = sizes[0], sizes[1]
            if nodes >= node_room or used + size + 8 > lit_room:
                return
            candidate = nodes
            sizes[0] = nodes + 1
            sizes[1] = used + size
            lit_at[candidate] = used
            lit_len[candidate] = size
            for k in range(size):
                lits[used + k] = p[after + k]
            for k in range(8):
                lits[used + size + k] = 0
            for k in range(_SLOTS):
                child[candidate * _SLOTS + k] = -1
            sibling[candidate] = -1
            final[candidate] = -1
            if last < 0:
                child[slot] = candidate
            else:
                sibling[last] = candidate
        node = candidate
    final[node] = skeleton


_MAX_NODES = 1 << 16
_MAX_LITERALS = 1 << 20


@cached_njit(nogil=True)
def _alive(*arrays: np.ndarray) -> int:
    """0; a use of ``arrays`` that keeps them (and so the pointers into them) alive up to
    here: numba frees an array right after its last use that it can see."""
    return 0


@cached_njit(nogil=True)
def scan_skeletons(
    data: np.ndarray, offsets: np.ndarray, valid: np.ndarray, max_skeletons: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a large_binary array (``offsets``: ``len + 1`` absolute positions in
    ``data``; ``valid``: not null), the number of its distinct skeleton by first appearance,
    :data:`NULL_ROW` or :data:`SLOW_ROW` (also for rows past ``max_skeletons`` distinct
    skeletons); and the first row of each skeleton.

    A row is first walked through a trie of the rows seen: each node is the exact bytes
    between two values (whitespace, punctuation, keys, closing brackets; the root's before the
    first value is empty), its children by the tag of the value that follows. A row whose
    every value scans with its node's tag and whose bytes in between are its nodes' has the
    same tokens as the row that made the path, so the same skeleton; only other rows get their
    skeleton built, hashed and looked up (and their path added)."""
    count = len(offsets) - 1
    skeleton_of = np.empty(count, np.int64)
    longest = 0
    for row in range(count):
        longest = max(longest, min(offsets[row + 1] - offsets[row], MAX_ROW))
    out = np.empty(2 * longest + 24, np.uint8)
    spans = np.empty(3 * (longest // 2 + 2), np.int64)  # a value takes a byte and a separator
    arrays = np.empty(MAX_DEPTH, np.uint8)
    previous = np.empty(2 * MAX_DEPTH, np.int64)
    slots = 16
    while slots < 2 * min(count, max_skeletons):
        slots *= 2
    mask = slots - 1
    table = np.full(slots, -1, np.int64)  # skeleton number per slot
    hashes = np.empty(slots, np.uint64)
    starts = np.zeros(min(count, max_skeletons) + 1, np.int64)  # skeleton k: store[starts[k]:…]
    first_rows = np.empty(min(count, max_skeletons), np.int64)
    store = np.empty(max(1024, 2 * len(out)), np.uint8)
    # the trie: node 0 is the root
    lits = np.empty(min(_MAX_LITERALS, len(data) + 64), np.uint8)
    nodes = min(_MAX_NODES, len(data) + 2)  # a node per value of a row (a byte at least)
    lit_at = np.empty(nodes, np.int64)
    lit_len = np.empty(nodes, np.int64)
    child = np.empty(nodes * _SLOTS, np.int64)
    child[:_SLOTS] = -1
    sibling = np.empty(nodes, np.int64)
    final = np.empty(nodes, np.int64)
    lit_at[0], lit_len[0], sibling[0], final[0] = 0, 0, -1, -1
    sizes = np.array([1, 0], np.int64)
    # raw pointers for the helpers (the arrays above are kept alive to the end: _alive)
    p_data = _address(data)
    p_out, p_spans = _address(out), _address(spans)
    p_arrays, p_previous = _address(arrays), _address(previous)
    p_lits, p_lit_at, p_lit_len = _address(lits), _address(lit_at), _address(lit_len)
    p_child, p_sibling, p_final = _address(child), _address(sibling), _address(final)
    p_store, p_sizes = _address(store), _address(sizes)
    distinct = 0
    for row in range(count):
        if not valid[row]:
            skeleton_of[row] = NULL_ROW
            continue
        start, end = offsets[row], offsets[row + 1]
        if end - start > MAX_ROW:
            skeleton_of[row] = SLOW_ROW
            continue
        if _high_bit(p_data, start, end) and not utf8_ok(data, start, end):
            skeleton_of[row] = SLOW_ROW
            continue
        found = _walk(p_data, start, end, p_lits, p_lit_at, p_lit_len, p_child, p_sibling, p_final)
        if found >= 0:
            skeleton_of[row] = found
            continue
        size, values = _skeleton(
            p_data, start, end, p_out, len(out) - 8, p_arrays, p_previous, p_spans, len(spans)
        )
        if size < 0:
            skeleton_of[row] = SLOW_ROW
            continue
        for k in range(size, size + 8):
            out[k] = 0
        h = _hash(p_out, size)
        slot = np.int64(h & np.uint64(mask))
        while table[slot] >= 0:
            k = table[slot]
            if (
                hashes[slot] == h
                and starts[k + 1] - starts[k] == size
                and _equal(_at(p_store, starts[k]), p_out, size)
            ):
                found = k
                break
            slot = (slot + 1) & mask
        if found < 0:
            if distinct >= max_skeletons:
                skeleton_of[row] = SLOW_ROW
                continue
            base = starts[distinct]
            if base + size > len(store):
                grown = np.empty(2 * (base + size), np.uint8)
                grown[:base] = store[:base]
                store = grown
                p_store = _address(store)
            store[base : base + size] = out[:size]
            starts[distinct + 1] = base + size
            table[slot] = distinct
            hashes[slot] = h
            first_rows[distinct] = row
            found = distinct
            distinct += 1
        skeleton_of[row] = found
        _insert(
            p_data, start, end, p_spans, values, found, p_lits, len(lits), p_lit_at, p_lit_len,
            p_child, p_sibling, p_final, nodes, p_sizes,
        )  # fmt: skip
    distinct += _alive(data, out, spans, arrays, previous, lits, lit_at, lit_len, child)
    distinct += _alive(sibling, final, store, sizes)
    return skeleton_of, first_rows[:distinct].copy()
