"""The ``json`` codec's shapes: kinds and their joins, what a window declares, that declaring is
idempotent once the declarations are folded into a table (hypothesis), and that canonical rows
of every shape re-encode to their own bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.types import DoubleType, IcebergType, LongType, StringType

from bergstream.core.api import (
    ROW_ARROW_SCHEMA,
    ROW_SCHEMA,
    VALUE_ERROR_COLUMN,
    VALUE_SCHEMA_ID_COLUMN,
    RegisteredSchema,
    SideCodecs,
    StoredSchemas,
    TopicCodecs,
    TypedLayout,
    TypedRows,
    build_layout,
    build_layout_of_shapes,
)
from bergstream.plugins.value_codecs.plain_json.codec import PlainJsonCodec
from bergstream.plugins.value_codecs.plain_json.shapes import (
    Kind,
    declare_shapes,
    join,
    kind_of,
    observe,
)

SUBJECT = "t-value"


def payloads(*values: Any) -> pa.Array:
    return pa.array(
        [None if v is None else (v if isinstance(v, bytes) else json.dumps(v).encode())
         for v in values],
        pa.large_binary(),
    )  # fmt: skip


def declared(*values: Any, columns: dict[str, IcebergType] | None = None) -> list[dict[str, Any]]:
    found = observe(payloads(*values))
    texts = declare_shapes(found.shapes, columns, window=columns is None)
    return [json.loads(text) for text in texts]


def fold(schemas: list[RegisteredSchema], base: TypedLayout | None = None) -> TypedLayout:
    """The layout of a table whose values had these shapes (in this order)."""
    codec = PlainJsonCodec()
    numbered = [replace(s, version=i + 1) for i, s in enumerate(schemas)]
    codecs = TopicCodecs("t", SideCodecs({"JSON": codec}, SUBJECT))
    schema = ROW_SCHEMA if base is None else base.schema
    last = ROW_SCHEMA.highest_field_id if base is None else base.last_column_id
    return build_layout(schema, last, codecs, StoredSchemas().add(numbered))


def value_columns(layout: TypedLayout) -> dict[str, IcebergType]:
    assert layout.value is not None
    return {c: layout.schema.find_field(c).field_type for c in layout.value.columns}


def test_kinds_join() -> None:
    assert join(kind_of(1), kind_of(1.5)) == Kind("number")
    assert join(kind_of(None), kind_of("a")) == Kind("string", True)
    assert join(kind_of("a"), kind_of(2)).name == "mixed"
    assert kind_of(2**64).name == "number"  # beyond a long
    obj = join(kind_of({"a": 1}), kind_of({"b": "x", "a": 2.0}))
    assert obj == Kind("object", fields=(("a", Kind("number")), ("b", Kind("string"))))
    assert join(kind_of([]), kind_of([1, None])) == Kind("array", items=Kind("integer", True))


def test_window_declares_columns_from_all_its_rows() -> None:
    first, second, third = declared(
        {"id": 1, "amount": 5, "tag": "a"},
        {"id": 2, "amount": 5.5, "tag": 7},
        {"tag": None, "id": 3},
    )
    assert first["properties"] == {
        "id": {"type": "integer"},
        "amount": {"type": "number"},  # the window also holds 5.5
        "tag": {"type": "string"},  # a string in a column of mixed kinds: its text
    }
    assert second["properties"]["tag"] == {}  # any other kind there: its JSON text
    assert list(third["properties"]) == ["tag", "id"]  # the shape's own key order
    assert third["properties"]["tag"] == {"type": ["string", "null"]}


def test_table_columns_decide_over_the_window() -> None:
    (shape,) = declared({"amount": 5, "n": 1.5}, columns={"amount": DoubleType(), "n": LongType()})
    # a double column takes integers; a number where the table has a long is declared as it
    # is (the fold refuses it: its rows keep their bytes)
    assert shape["properties"] == {"amount": {"type": "number"}, "n": {"type": "number"}}
    (text,) = declared({"s": [1, "x"]}, columns={"s": StringType()})
    assert text["properties"]["s"] == {}


def test_nested_objects_and_arrays() -> None:
    (shape,) = declared(
        {"m": {"a": 1, "b": None}, "l": [], "x": [{"k": 1}, {"k": 2, "j": "s"}]},
    )
    assert shape["properties"]["m"] == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"]}},
    }
    assert shape["properties"]["l"] == {"type": "array", "items": {"type": "string"}}
    assert shape["properties"]["x"]["items"]["properties"] == {
        "k": {"type": "integer"},
        "j": {"type": "string"},
    }
    (conflict,) = declared({"m": {"a": 1}}, {"m": {"a": "one"}})[:1]
    assert conflict["properties"]["m"] == {}  # a conflict inside: the whole value as text


def test_nested_keys_are_part_of_the_shape() -> None:
    # one row's declaration never depends on another row's nested keys, so any batch of the
    # same rows declares the same schemas
    values = payloads({"m": {"a": 1}}, {"m": {"b": "x"}}, {"m": {"a": 2}})
    final, layout = settle(values)
    assert len(final.schemas) == 2 and final.ids.tolist()[0] == final.ids.tolist()[2]
    alone = PlainJsonCodec().shapes(values[:1], value_columns(layout), SUBJECT)
    assert [s.schema for s in alone.schemas] == [final.schemas[0].schema]
    struct = layout.schema.find_field("m").field_type
    assert [f.name for f in struct.fields] == ["a", "b"]


def test_rows_without_shape_say_why() -> None:
    found = observe(payloads(b"[1]", b"{", b"\xff", None, b"3", b'{"a":1}'))
    assert found.shape_of.tolist() == [-1, -1, -1, -1, -1, 0]
    assert found.errors[0] == "value: not a JSON object but an array"
    assert found.errors[1] is not None and found.errors[1].startswith("corrupt payload")
    assert found.errors[2] is not None and "UTF-8" in found.errors[2]
    assert found.errors[3] is None
    assert found.errors[4] == "value: not a JSON object but an integer"


def test_too_many_shapes_keep_their_bytes() -> None:
    found = observe(payloads(*({f"k{i}": i} for i in range(5))), limit=3)
    assert found.shape_of.tolist() == [0, 1, 2, -1, -1]
    assert found.errors[3] is not None and "more than 3 distinct shapes" in found.errors[3]


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=3)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)
    ),
    max_leaves=6,
)
_ANY_OBJECTS = st.dictionaries(st.sampled_from(["id", "amount", "tag", "meta", "l"]), _VALUES)
# Objects whose keys keep their kinds (the common case: nested objects that agree, so their
# columns are structs and lists rather than text)
_TYPED = {
    "id": st.integers(0, 9) | st.none(),
    "amount": st.integers(-5, 5) | st.floats(-1e3, 1e3, allow_nan=False),
    "tag": st.text(max_size=2),
    "meta": st.dictionaries(
        st.sampled_from(["a", "b"]),
        st.one_of(st.integers(0, 3), st.none()),
        max_size=2,
    )
    | st.fixed_dictionaries({}, optional={"c": st.booleans(), "a": st.integers(0, 3)}),
    "l": st.lists(st.integers(0, 3) | st.none(), max_size=3),
}
_TYPED_OBJECTS = st.fixed_dictionaries({}, optional=_TYPED)
_OBJECTS = _ANY_OBJECTS | _TYPED_OBJECTS


def settle(values: pa.Array, base: TypedLayout | None = None) -> tuple[Any, TypedLayout]:
    """What a driver does with a new batch: declare with the window, fold, declare again
    against the folded columns, fold those."""
    codec = PlainJsonCodec()
    columns = value_columns(base) if base is not None and base.value is not None else None
    first = codec.shapes(values, columns, SUBJECT, window=True)
    made = fold(first.schemas, base)
    final = codec.shapes(values, value_columns(made), SUBJECT)
    layout = fold(final.schemas, made)
    # the columns the first fold made keep their ids (the second may add some: keys of shapes
    # it takes and the first refused)
    made_fields = {f.field_id: f.name for f in made.schema.fields}
    kept = {f.field_id: f.name for f in layout.schema.fields}
    assert {i: kept.get(i) for i in made_fields} == made_fields
    core = build_layout_of_shapes(
        ROW_SCHEMA if base is None else base.schema,
        ROW_SCHEMA.highest_field_id if base is None else base.last_column_id,
        TopicCodecs("t", SideCodecs({"JSON": codec}, SUBJECT)),
        StoredSchemas(),
        values,
    )
    assert core.layout.schema.as_struct() == layout.schema.as_struct()
    assert sorted(core.shapes) == sorted({s.schema_id for s in final.schemas})
    return final, layout


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_OBJECTS, min_size=1, max_size=12),
    st.lists(_OBJECTS, max_size=12),
    st.integers(0, 12),
)
def test_declarations_settle_and_rows_round_trip(
    window: list[dict[str, Any]], later: list[dict[str, Any]], cut: int
) -> None:
    codec = PlainJsonCodec()
    values = payloads(*window)
    final, layout = settle(values)
    by_id = {s.schema_id: s.schema for s in final.schemas}
    # any batch of the same rows, against the folded table, declares the same schemas
    for part in (values[:cut], values[cut:]):
        if len(part):
            found = codec.shapes(part, value_columns(layout), SUBJECT)
            assert all(by_id.get(s.schema_id) == s.schema for s in found.schemas)
    again = codec.shapes(values, value_columns(layout), SUBJECT)
    assert again.ids.tolist() == final.ids.tolist()
    if later:  # a later batch settles against that table too
        settle(payloads(*later), layout)
    # every shape's rows decode; the ones that keep no bytes re-encode exactly
    assert layout.value is not None
    for schema in final.schemas:
        rows = [i for i, shape in enumerate(final.ids.tolist()) if shape == schema.schema_id]
        chosen = values.take(pa.array(rows))
        decoded = codec.decode(schema, chosen)
        assert decoded.errors == [None] * len(rows), (schema.schema, decoded.errors)
        exact = [i for i, keep in enumerate(decoded.keep_bytes.tolist()) if not keep]
        if exact:
            again_bytes = codec.encode(schema, decoded.values.take(pa.array(exact)))
            assert again_bytes.to_pylist() == chosen.take(pa.array(exact)).to_pylist()


def test_compact_rows_keep_no_bytes() -> None:
    codec = PlainJsonCodec()
    texts = [
        b'{"id":1,"amount":2.5,"tags":["a"],"m":{"x":null}}',
        b'{"id":2,"amount":3.0,"tags":[],"m":{"x":"y"}}',
    ]
    values = pa.array(texts, pa.large_binary())
    final, _ = settle(values)
    decoded = [
        codec.decode(schema, values.take(pa.array([row])))
        for row, schema in enumerate(final.schemas)
    ]
    assert [d.keep_bytes.tolist() for d in decoded] == [[False], [False]]
    assert [d.values.to_pylist()[0] for d in decoded] == [
        {"id": 1, "amount": 2.5, "tags": ["a"], "m": {"x": None}},
        {"id": 2, "amount": 3.0, "tags": [], "m": {"x": "y"}},
    ]
    again = [
        codec.encode(s, d.values).to_pylist()[0]
        for s, d in zip(final.schemas, decoded, strict=True)
    ]
    assert again == texts


@settings(max_examples=100, deadline=None)
@given(st.lists(_OBJECTS, min_size=1, max_size=20))
def test_telling_rows_declare_what_the_whole_batch_declares(window: list[dict[str, Any]]) -> None:
    codec = PlainJsonCodec()
    values = payloads(*window)
    telling = codec.telling_rows(values)
    assert len(telling) <= len(window)
    whole = codec.shapes(values, None, SUBJECT, window=True)
    few = codec.shapes(values.take(pa.array(telling)), None, SUBJECT, window=True)
    assert [s.schema for s in few.schemas] == [s.schema for s in whole.schemas]


def test_within_kinds_says_whether_a_batch_joins_into_the_same_kinds() -> None:
    codec = PlainJsonCodec()
    joined = codec.joined_kinds(payloads({"a": 1, "m": {"x": 1.5}}, {"a": 2, "m": {"x": 2}}))
    assert codec.within_kinds(payloads({"a": 3}, {"m": {"x": 7}}, [1], None), joined)
    assert not codec.within_kinds(payloads({"a": 3.5}), joined)  # integer -> number
    assert not codec.within_kinds(payloads({"a": None}), joined)  # nullable now
    assert not codec.within_kinds(payloads({"b": 1}), joined)  # a key it has not seen
    assert not codec.within_kinds(payloads({"m": {"y": 1}}), joined)  # a nested key


@settings(max_examples=300, deadline=None)
@given(st.lists(_OBJECTS, min_size=1, max_size=8), st.data())
def test_a_sample_that_holds_the_batch_folds_the_batchs_layout(
    first: list[dict[str, Any]], data: st.DataObject
) -> None:
    """The pipeline folds a table's first batch from its first rows when the rest join into the
    same kinds: the layout, and every row decoded with shapes adopted, are the whole fold's."""
    codec = PlainJsonCodec()
    rest = data.draw(st.lists(st.sampled_from(first) | _OBJECTS, max_size=10))
    values = payloads(*first, *rest)
    sample = values[: len(first)]
    topic_codecs = TopicCodecs("t", SideCodecs({"JSON": codec}, SUBJECT))
    base, last = ROW_SCHEMA, ROW_SCHEMA.highest_field_id
    whole = build_layout_of_shapes(base, last, topic_codecs, StoredSchemas(), values)
    joined = codec.joined_kinds(sample)
    if not codec.within_kinds(values, joined):
        return
    sampled = build_layout_of_shapes(base, last, topic_codecs, StoredSchemas(), sample)
    assert sampled.layout.schema.as_struct() == whole.layout.schema.as_struct()
    assert sampled.layout.last_column_id == whole.layout.last_column_id
    assert set(sampled.shapes) <= set(whole.shapes)
    rows = ROW_ARROW_SCHEMA.empty_table()
    table = pa.Table.from_pydict(
        {
            **{f.name: pa.nulls(len(values), f.type) for f in rows.schema},
            "kafka_partition": pa.array([0] * len(values), pa.int32()),
            "kafka_offset": pa.array(range(len(values)), pa.int64()),
            "kafka_headers": pa.array([[]] * len(values), rows.schema.field("kafka_headers").type),
            "kafka_value": values,
        },
        schema=rows.schema,
    )
    adopting = TypedRows(
        sampled.layout,
        topic_codecs,
        StoredSchemas().add(list(sampled.shapes.values())),
        adopt_shapes=True,
        within={"value": joined},
    ).decode(table)
    folded = TypedRows(
        whole.layout, topic_codecs, StoredSchemas().add(list(whole.shapes.values()))
    ).decode(table)
    assert adopting.table.to_pylist() == folded.table.to_pylist()
    assert set(adopting.adopted) | set(sampled.shapes) >= {
        i for i in folded.table.column(VALUE_SCHEMA_ID_COLUMN).to_pylist() if i is not None
    } - {
        i
        for i, error in zip(
            folded.table.column(VALUE_SCHEMA_ID_COLUMN).to_pylist(),
            folded.table.column(VALUE_ERROR_COLUMN).to_pylist(),
            strict=True,
        )
        if error is not None
    }
