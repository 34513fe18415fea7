"""The ``example-sqlite`` cache backend for ISK: entries as rows of one SQLite file.

:mod:`.cache` is the backend; :mod:`.plugin` its config model, factory and registration (the
entry point).
"""
