"""The ``add-header`` proxy filter: appends ``header: value`` to every record of every Produce
request passing the proxy.

:mod:`.filter` holds the three parts of a filter (typed config, factory once per virtual cluster,
filter once per client connection); :mod:`.plugin` registers it (the entry point).
"""
