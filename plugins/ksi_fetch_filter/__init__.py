"""KSI, a Kafka API on Iceberg: a proxy filter that serves offsets Kafka no longer holds from the
coldset (the Iceberg table the lake pipeline writes), with the original offsets, timestamps,
keys, values and headers, then hands over to Kafka. See README.md ("KSI") and
docs/architecture.md.

Modules, one job each: :mod:`.config` (settings), :mod:`.topics` (which topics are served:
listed ones, or every topic with a table), :mod:`.cache` (memory-bounded LRU),
:mod:`.segments` (decoded row groups), :mod:`.typed` (typed tables' rows back to their original
bytes), :mod:`.projection` (older data files read in the table's current schema),
:mod:`.coldset` (pruned reads of the tables),
:mod:`.store` (catalog, reader threads, caches, read-ahead),
:mod:`.batches` (record batches within byte budgets), :mod:`.batch_encoder` and
:mod:`.encode_kernels` (those batches written from Arrow columns in one compiled loop),
:mod:`.planner` (which partitions the coldset serves, and what), :mod:`.ahead` (the next
answer of a sequential consumer encoded while it reads this one), :mod:`.kafka_state` (topic ids,
end offsets and the client's READ right, asked of Kafka out of band), :mod:`.responses` (Fetch
and ListOffsets messages split and merged), :mod:`.filter` (the filter and its factory),
:mod:`.plugin` (the registration).
"""
