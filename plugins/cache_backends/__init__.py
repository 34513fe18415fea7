"""Built-in cache backends for synthesized files (see ARCHITECTURE.md, "ISK").

:mod:`.local_disk` (the ``local`` backend: verified, size-bounded, atomic files on local disk) and
:mod:`.plugin` (its registration and config model).
"""
