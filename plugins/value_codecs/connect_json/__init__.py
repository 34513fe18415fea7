"""The ``connect-json`` value codec: Kafka Connect ``JsonConverter`` envelopes, each distinct
embedded Connect schema declared as a shape, payloads read in Python with orjson."""
