"""The compiled fast path of the ``json`` codec's :func:`observe` (skeletons grouped by
:mod:`.plain_json_scan`, Python kinds for one row per skeleton) gives exactly what parsing every
row in Python gives: shapes, their order, row counts, telling rows, errors."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from bergstream.plugins.value_codecs.plain_json.shapes import observe


def same_observations(payloads: list[bytes | None], limit: int = 256) -> None:
    values = pa.array(payloads, pa.large_binary())
    plain = observe(values, limit, fast=False)
    fast = observe(values, limit)
    assert fast.shape_of.tolist() == plain.shape_of.tolist()
    assert fast.errors == plain.errors
    assert [(s.keys, s.kinds, s.rows) for s in fast.shapes] == [
        (s.keys, s.kinds, s.rows) for s in plain.shapes
    ]
    assert fast.telling == plain.telling


_KEYS = st.sampled_from(["a", "b", "id", "é", "ключ", 'a"q', "", "\\", "\u00e9"])
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 0, -0])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def _texts(draw: st.DrawFn) -> bytes | None:
    """A payload: mostly JSON objects in various spellings, and the odd other thing."""
    kind = draw(st.integers(0, 9))
    obj = draw(st.dictionaries(_KEYS, _VALUES, max_size=5))
    if kind <= 3:  # compact, as producers write it
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    if kind == 4:  # spaced, escaped, indented
        indent = draw(st.sampled_from([None, 1, "\t"]))
        return json.dumps(obj, indent=indent, ensure_ascii=draw(st.booleans())).encode()
    if kind == 5:  # duplicate keys, written by hand
        pairs = draw(st.lists(st.tuples(_KEYS, _VALUES), max_size=4))
        pairs += pairs[: draw(st.integers(0, len(pairs)))]
        inner = ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs)
        return ("{" + inner + "}").encode()
    if kind == 6:  # not an object
        return json.dumps(draw(_VALUES)).encode()
    if kind == 7:  # broken: cut short, or a byte changed
        text = json.dumps(obj, ensure_ascii=False).encode()
        cut = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            return text[:cut]
        return text[:cut] + bytes([draw(st.integers(0, 255))]) + text[cut + 1 :]
    if kind == 8:
        return draw(
            st.sampled_from(
                [
                    b'{"a":NaN}', b'{"a":-Infinity}', b' {"a":1} ', b'{"a":1}\n', b'{"a":01}',
                    b'{"a":1.}', b'{"a":.5}', b'{"a":1e}', b'{"a":-}', b'{"a":"\\x"}',
                    b'{"a":"\\ud800"}', b'{"a":"\x01"}', b'{"a":1,}', b'{,}', b'{"a" 1}',
                    b'{"a":[1,]}', b'{"a":tru}', b'{"a":nul}', b'\xef\xbb\xbf{}', b"{}",
                    b'{"\\u0061":1,"a":"x"}', b'{"a":1}{"b":2}', b'{"a":\xc3\xa9}',
                    b'{"\xed\xa0\x80":1}', b'{"a":"\xc0\xaf"}', b"", b"   ", b'{"a":1e400}',
                    b'{"a":[[[[[[[[[[[[1]]]]]]]]]]]]}', b'{"a":' * 70 + b"1" + b"}" * 70,
                    b'{"a":[1,2.5,null,"x",{"b":1},{"b":2},[],[1]]}', b'{"a":{}}',
                ]
            )
        )  # fmt: skip
    return None


@settings(max_examples=400, deadline=None)
@given(st.lists(_texts(), max_size=30), st.sampled_from([256, 3, 1]))
def test_fast_path_observes_what_parsing_every_row_does(
    payloads: list[bytes | None], limit: int
) -> None:
    same_observations(payloads, limit)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=60), st.data())
def test_repeated_rows_share_skeletons(picks: list[int], data: st.DataObject) -> None:
    # a few distinct rows repeated in any order: the trie and the skeleton table are reused
    rows = [data.draw(_texts()) for _ in range(3)]
    same_observations([rows[i] for i in picks])


def test_known_rows() -> None:
    big = b'{"n":18446744073709551616,"m":9223372036854775808,"k":-9223372036854775808}'
    same_observations(
        [
            b'{"a":1,"b":"x"}',
            b'{"a":2,"b":"yy"}',
            b'{"a":1.5,"b":"x"}',
            None,
            big,
            b'{"a":[1,2,3],"b":{"c":null}}',
            b'{"a":[4],"b":{"c":null}}',
            b'{"a":[4, "x"],"b":{"c":null}}',
            '{"é":"ü","a":1,"é":2}'.encode(),
            b"[1]",
            b'{"a":1',
            b"\xff",
            b'{"a":1,"b":"x"} ',
        ]
    )


def test_integers_python_may_refuse() -> None:
    # json.loads refuses integer literals past sys.get_int_max_str_digits(): such a row has
    # an error, another row of the same keys and kinds (a long float) a shape
    same_observations(
        [
            b'{"a":' + b"7" * 5000 + b"}",
            b'{"a":' + b"7" * 700 + b"}",
            b'{"a":' + b"7" * 639 + b"}",
            b'{"a":1.5}',
            b'{"a":' + b"7" * 5000 + b".5}",
        ]
    )


def test_long_rows_and_many_skeletons() -> None:
    wide = {f"k{i}": ("v" * (i % 40) if i % 3 else i * 10**15) for i in range(300)}
    rows: list[Any] = [wide, *({f"key{i}": i, "x": [i] * (i % 5)} for i in range(400))]
    same_observations([json.dumps(r, separators=(",", ":")).encode() for r in rows])


def test_full_trie() -> None:
    # more distinct paths than the scanner's trie holds (65536 nodes): later rows are built
    rows = [{f"k{i}": i, f"j{i % 7}": [i], "s": "x" * (i % 3)} for i in range(24_000)]
    rows += rows[:50]
    same_observations([json.dumps(r, separators=(",", ":")).encode() for r in rows])


def test_sliced_chunked_and_small_binary_arrays() -> None:
    rows = [b'{"a":1}', None, b'{"a":"x","b":[1]}', b'{"a":1}', b"{", b'{"b":[2,3],"a":"y"}']
    values = pa.array(rows, pa.large_binary())
    for array in (
        values.slice(2),
        values.slice(1, 3),
        pa.array(rows, pa.binary()).slice(1),
        pa.chunked_array([values.slice(0, 2), values.slice(2)]),
    ):
        plain, fast = observe(array, fast=False), observe(array)
        assert fast.shape_of.tolist() == plain.shape_of.tolist()
        assert fast.errors == plain.errors
        assert [(s.keys, s.kinds, s.rows) for s in fast.shapes] == [
            (s.keys, s.kinds, s.rows) for s in plain.shapes
        ]
