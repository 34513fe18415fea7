"""The pipeline's typed-table pieces that need no Spark: typed Arrow columns as Spark's Arrow
reader takes them, the schemas shipped to workers, and the ids a failed job asks for."""

from __future__ import annotations

import uuid
from collections import Counter

import pyarrow as pa
import pytest

from bergstream.core.api import RegisteredSchema, SchemaNotFound
from bergstream.pipeline.spark_arrow import spark_arrow_type, to_spark_array, uuid_text
from bergstream.pipeline.typed import SchemasNeeded, ShippedSchemas, needed_by
from bergstream.pipeline.typed_worker import CausesParam, ShapesParam

UUIDS = [uuid.UUID(int=i * 0x0123456789ABCDEF0123) if i % 3 else None for i in range(8)]


def _uuid_array() -> pa.Array:
    storage = pa.array([None if u is None else u.bytes for u in UUIDS], pa.binary(16))
    return pa.ExtensionArray.from_storage(pa.uuid(), storage)


def test_uuids_become_their_text_and_nulls_stay() -> None:
    array = _uuid_array()
    for start in (0, 1, 5):
        got = uuid_text(array.slice(start))
        assert got.type == pa.string()
        assert got.to_pylist() == [None if u is None else str(u) for u in UUIDS[start:]]


def test_spark_types_have_no_large_lists_fixed_or_uuids() -> None:
    source = pa.struct(
        [
            pa.field("u", pa.uuid()),
            pa.field("f", pa.binary(4)),
            pa.field("l", pa.large_list(pa.field("element", pa.large_string(), False))),
            pa.field("m", pa.map_(pa.large_string(), pa.large_list(pa.binary(2)))),
        ]
    )
    assert spark_arrow_type(source) == pa.struct(
        [
            pa.field("u", pa.string()),
            pa.field("f", pa.binary()),
            pa.field("l", pa.list_(pa.field("element", pa.large_string(), False))),
            pa.field("m", pa.map_(pa.large_string(), pa.list_(pa.binary()))),
        ]
    )


def test_nested_uuids_convert_inside_structs_lists_and_maps() -> None:
    uuids = _uuid_array()
    text = [None if u is None else str(u) for u in UUIDS]
    struct = pa.StructArray.from_arrays(
        [uuids, pa.array(range(8))], names=["u", "n"], mask=pa.array([i == 2 for i in range(8)])
    )
    got = to_spark_array(struct.slice(1)).to_pylist()
    assert got == [None if i == 2 else {"u": text[i], "n": i} for i in range(1, 8)]
    offsets = pa.array([0, 2, 2, 5, 8], pa.int64())
    lists = pa.LargeListArray.from_arrays(offsets, uuids)
    assert to_spark_array(lists.slice(1)).to_pylist() == [[], text[2:5], text[5:8]]
    keys = pa.array([f"k{i}" for i in range(8)], pa.large_string())
    maps = pa.MapArray.from_arrays(pa.array([0, 3, 8], pa.int32()), keys, uuids)
    assert to_spark_array(maps.slice(1)).to_pylist() == [[(f"k{i}", text[i]) for i in range(3, 8)]]


def test_other_columns_pass_or_cast() -> None:
    plain = pa.array([1, None, 3], pa.int64())
    assert to_spark_array(plain) is plain
    fixed = pa.array([b"abcd", None], pa.binary(4))
    assert to_spark_array(fixed).type == pa.binary()
    assert to_spark_array(fixed).to_pylist() == [b"abcd", None]
    chunked = pa.chunked_array([pa.array([[1]], pa.large_list(pa.int32())), pa.array([None],
                                pa.large_list(pa.int32()))])  # fmt: skip
    assert to_spark_array(chunked).to_pylist() == [[1], None]


def _schema(
    schema_id: int, subject: str | None = None, version: int | None = None
) -> RegisteredSchema:
    return RegisteredSchema(schema_id, "AVRO", '"string"', subject=subject, version=version)


def test_shipped_schemas_answer_what_was_shipped_and_ask_for_the_rest() -> None:
    shipped = ShippedSchemas(
        {1: _schema(1, "t-value", 1)}, {"t-value": [_schema(1, "t-value", 1)]}, frozenset({7})
    )
    assert shipped.schema_by_id(1).schema_id == 1
    with pytest.raises(SchemaNotFound, match="unknown schema id 7"):
        shipped.schema_by_id(7)
    with pytest.raises(SchemasNeeded) as needed:
        shipped.schema_by_id(9)
    assert needed.value.ids == [9]
    with pytest.raises(SchemasNeeded) as needed:
        shipped.subject_schemas("refs")
    assert needed.value.subjects == ["refs"]
    shipped.check([1, 7])
    with pytest.raises(SchemasNeeded) as needed:
        shipped.check([1, 3, 7, 4, 3])
    assert needed.value.ids == [3, 4]


def test_a_failed_jobs_message_names_the_schemas_it_needs() -> None:
    first, second = SchemasNeeded([4, 2]), SchemasNeeded(subjects=["refs"])
    message = f"Py4JJavaError: ... Traceback ...\n{first}\n... task 3 ...\n{second}\n"
    found = needed_by(RuntimeError(message))
    assert found is not None and found.ids == [2, 4] and found.subjects == ["refs"]
    assert needed_by(RuntimeError("executor lost")) is None
    assert needed_by(first) is first
    assert not found.fold_shapes


def test_a_failed_jobs_message_says_when_shapes_need_folding() -> None:
    message = f"Py4JJavaError: ... {SchemasNeeded(fold_shapes=True)} ... {SchemasNeeded([9])}"
    found = needed_by(RuntimeError(message))
    assert found is not None and found.fold_shapes and found.ids == [9]
    alone = needed_by(RuntimeError(f"... {SchemasNeeded(fold_shapes=True)} ..."))
    assert alone is not None and alone.fold_shapes and not alone.ids and not alone.subjects


def test_adopted_shapes_add_up() -> None:
    param = ShapesParam()
    one = RegisteredSchema(1, "JSON", "{}", subject="t-value")
    two = RegisteredSchema(2, "JSON", '{"type":"object"}', subject="t-value")
    total = param.addInPlace(param.zero({}), {1: one})
    total = param.addInPlace(total, {1: one, 2: two})
    assert total == {1: one, 2: two}


def test_undecodable_counts_add_up() -> None:
    param = CausesParam()
    total = param.zero(Counter())
    total = param.addInPlace(total, Counter({("value", "no Confluent framing"): 2}))
    total = param.addInPlace(
        total, Counter({("value", "no Confluent framing"): 1, ("key", "x"): 1})
    )
    assert total == Counter({("value", "no Confluent framing"): 3, ("key", "x"): 1})
