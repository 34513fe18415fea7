"""ISK's Kafka reads (first step of its data flow, see docs/architecture.md).

- :mod:`.reader`: :class:`~.reader.KafkaReader`, topics, end offsets (log start, high watermark,
  last stable offset) and the raw read_committed record batches of an offset range;
- :mod:`.raw_fetch`: Fetch requests on connections of ISK's own, each response received straight
  into one buffer;
- :mod:`.buffers`: the pooled buffers those responses (and the decoder's columns) live in.
"""
