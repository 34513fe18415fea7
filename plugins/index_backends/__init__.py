"""Built-in index backends for ISK's chunk index (see docs/architecture.md, "ISK").

:mod:`.sqlite_index` (``sqlite``: one SQLite file in WAL mode), :mod:`.rocksdb_index`
(``rocksdb``: a RocksDB directory through ``rocksdict``) and :mod:`.plugin` (their registrations
and config models).
"""
