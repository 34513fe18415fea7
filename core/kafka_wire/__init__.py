"""Kafka's wire format, written down once for all of bergstream.

- :mod:`.api_keys`: :class:`~.api_keys.ApiKey`, the named API keys of request headers.
- :mod:`.record_batch`: the v2 record batch layout (header field offsets and lengths, attribute
  bits, magic) and helpers to read, write and re-seal header fields.
- :mod:`.crc`: CRC-32C, the batch checksum, from one library.

Message bodies (requests and responses) are kio's business (:mod:`bergstream.core.proxy.codec`);
what a batch's records mean for a table row is :mod:`bergstream.core.typed.row_contract`'s.
"""

# ``bergstream.core.api`` exports ``record_batch`` as an attribute of this package: make it one
# however the package is first imported.
from bergstream.core.kafka_wire import record_batch as record_batch
