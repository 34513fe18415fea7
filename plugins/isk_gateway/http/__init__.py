"""ISK's HTTP front (last step of its data flow, see docs/architecture.md): the Iceberg REST
catalog and the S3 gateway over a ``TableProvider``.

:mod:`.catalog` (REST routes), :mod:`.s3` (S3 routes), :mod:`.sigv4` (signature checks),
:mod:`.credentials` (the temporary S3 credentials LoadTable vends), :mod:`.principals`,
:mod:`.logfields` (log fields of a request), :mod:`.config` (:class:`IskHttpConfig`, the
listeners' settings) and :mod:`.server` (:class:`IskHttpService`, two listeners).

Nothing is imported here: the plugin registry loads :mod:`.config` without aiohttp.
"""
