"""Built-in index backends for ISK's chunk index (see ARCHITECTURE.md, "ISK").

:mod:`.sqlite_index` (the ``sqlite`` backend: one SQLite file in WAL mode) and :mod:`.plugin`
(its registration and config model).
"""
