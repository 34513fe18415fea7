"""The built-in value codecs, one subpackage per format, registered by :mod:`.plugin`:

- ``raw`` (:mod:`.raw`): values stay bytes;
- ``avro`` (:mod:`.avro`), ``json-schema`` (:mod:`.json_schema`) and ``protobuf``
  (:mod:`.protobuf`): Schema Registry values as typed columns and back, byte for byte;
- ``json`` (:mod:`.plain_json`): plain JSON objects, no registry, columns from the shapes the
  data has;
- ``connect-json`` (:mod:`.connect_json`): Kafka Connect ``JsonConverter`` envelopes, columns
  typed by the embedded Connect schema.

:mod:`.shared` holds what the formats share: the column arenas their numba kernels write into
and their assembly into Arrow, the kernels' reading and writing helpers, the slot tree of a
compiled program, Arrow arrays flattened back into columns, and the per-codec schema cache.
"""
