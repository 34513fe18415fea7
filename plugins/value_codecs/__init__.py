"""The built-in value codecs: ``raw`` (values stay bytes) and ``avro`` (Schema Registry Avro
values as typed columns and back, byte for byte)."""
