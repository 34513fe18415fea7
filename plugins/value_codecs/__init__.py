"""The built-in value codecs: ``raw`` (values stay bytes), ``avro``, ``json-schema`` and
``protobuf`` (Schema Registry values as typed columns and back, byte for byte), ``json`` (plain
JSON objects, columns inferred from the data) and ``connect-json`` (Kafka Connect
``JsonConverter`` envelopes, columns typed by the embedded Connect schema)."""
