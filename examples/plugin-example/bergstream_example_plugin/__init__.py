"""An example third-party bergstream plugin distribution: one subpackage per capability.

:mod:`.add_header_filter` is the ``add-header`` proxy filter (a header appended to every
produced record); :mod:`.sqlite_cache` is the ``example-sqlite`` cache backend for ISK. Each is a
plugin of its own, with its own entry point in ``pyproject.toml`` and its own tests under
``tests/``, and neither imports the other: copy the one you need as the start of yours. Both reach
bergstream only through its public module, ``bergstream.core.api``.
"""
