"""Set-up shared by the Protobuf codec's comparison tests (:mod:`.test_protobuf_encoder`,
:mod:`.test_protobuf_fast_path`): the hypothesis settings, a proto2 schema without a group
(:func:`proto2_plain`) and one codec with its registered schemas (:class:`SchemaSet`)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

from bergstream.core.api import RegisteredSchema
from bergstream.plugins.value_codecs.protobuf.codec import ProtobufCodec
from tests.kits.protobuf_gen import PROTO2, PROTO3

#: ``PROTOBUF_EXAMPLES`` sets the number of hypothesis examples (60 by default).
SETTINGS = settings(
    max_examples=int(os.environ.get("PROTOBUF_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def proto2_plain(package: str, extra_fields: str = "") -> str:
    """A proto2 file of package ``package`` with one message ``Legacy`` like the generator's
    proto2 one but without a group (defaults, required, packed and unpacked, aliased closed
    enums, a map, nested messages), ``extra_fields`` (whole lines) added to its fields."""
    fields = """
  optional int32 a = 1 [default = 7];
  optional string s = 2 [default = "hi"];
  required int64 r = 3;
  repeated int32 unpacked = 4;
  repeated sint32 packed = 5 [packed = true];
  enum Mode { option allow_alias = true; SLOW = 1; FAST = 2; ALIAS_FAST = 2; }
  optional Mode mode = 6;
  repeated Mode modes = 7;
  optional bytes b = 11;
  optional double d = 12;
  optional uint32 u = 13;
  enum Level { NONE = 0; HIGH = 1; }
  map<string, Level> by_name = 14;
  optional Sub sub = 15;
  repeated Sub subs = 16;
"""
    sub = "  message Sub { optional float f = 1; repeated string names = 2; optional bool ok = 3; }"
    head = f'\nsyntax = "proto2";\npackage {package};\nmessage Legacy {{'
    return f"{head}{fields}{extra_fields}{sub}\n}}\n"


class SchemaSet:
    """One :class:`ProtobufCodec` and the schemas a test module uses, by name: ``v3`` and
    ``v2`` (the generator's :data:`PROTO3` and :data:`PROTO2`), ``v2plain`` (``plain``, see
    :func:`proto2_plain`) and one more of the module's own (``name``: ``text``)."""

    def __init__(self, plain: str, name: str, text: str) -> None:
        self.codec = ProtobufCodec()
        self.schemas = {
            "v3": RegisteredSchema(1, "PROTOBUF", PROTO3),
            "v2": RegisteredSchema(2, "PROTOBUF", PROTO2),
            "v2plain": RegisteredSchema(3, "PROTOBUF", plain),
            name: RegisteredSchema(4, "PROTOBUF", text),
        }

    def compiled(self, name: str) -> Any:
        """The codec's compiled form of schema ``name`` (cached by the codec)."""
        return self.codec._schemas.get(self.schemas[name], None)
