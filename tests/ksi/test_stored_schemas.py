"""The schemas a typed table keeps in its properties carry their references, and the schemas
they reference are kept under their subject and version, so KSI loads a schema that imports
another file with no registry at all."""

from __future__ import annotations

from bergstream.core.api import (
    SCHEMA_PROPERTY_PREFIX,
    RegisteredSchema,
    SchemaReference,
    schema_property,
)
from bergstream.plugins.ksi_fetch_filter.typed import TableSchemas, stored_schemas
from bergstream.plugins.value_codecs.protobuf.codec import ProtobufCodec

COMMON = RegisteredSchema(
    1,
    "PROTOBUF",
    'syntax = "proto3";\npackage c;\nmessage Money { string currency = 1; int64 cents = 2; }\n',
    subject="common.proto",
    version=3,
)
ORDER = RegisteredSchema(
    2,
    "PROTOBUF",
    'syntax = "proto3";\npackage o;\nimport "common.proto";\n'
    "message Order { int64 id = 1; c.Money price = 2; }\n",
    (SchemaReference("common.proto", "common.proto", 3),),
    subject="orders-value",
    version=1,
)


def test_references_survive_the_table_properties() -> None:
    properties = {
        f"{SCHEMA_PROPERTY_PREFIX}2": schema_property(ORDER),
        f"{SCHEMA_PROPERTY_PREFIX}1": schema_property(COMMON, with_subject=True),
        "unrelated": "x",
    }
    stored = stored_schemas(properties)
    order = stored.schema_by_id(2)
    assert order.references == ORDER.references and order.subject is None  # a layout version
    assert stored.subject_schemas("common.proto") == [COMMON]
    # no registry: the import resolves from the table alone
    source = TableSchemas(stored, None)
    codec = ProtobufCodec()
    resolved = source.subject_schemas("common.proto")
    type_ = codec.iceberg_type(order, lambda reference: resolved[-1])
    assert [f.name for f in type_.fields] == ["id", "price"]
    assert [f.name for f in type_.fields[1].field_type.fields] == ["currency", "cents"]


def test_a_property_without_references_reads_as_before() -> None:
    stored = stored_schemas({f"{SCHEMA_PROPERTY_PREFIX}7": '{"schemaType":"AVRO","schema":"1"}'})
    assert stored.schema_by_id(7) == RegisteredSchema(7, "AVRO", "1")
