"""ISK, an Iceberg API on Kafka (see ARCHITECTURE.md, "ISK").

Modules, one job each: :mod:`.synthesis` (raw Kafka record batches of one partition -> Arrow rows
of the row contract -> a Parquet data file with its Iceberg ``DataFile`` stats). Caches and
indexes are reached through the ``register_cache_backends`` / ``register_index_backends`` hooks,
never imported from their plugins.
"""
