"""ISK's HTTP front (last step of its data flow, see docs/architecture.md): the Iceberg REST
catalog and the S3 gateway over a ``TableProvider``.

:mod:`.catalog` (REST routes), :mod:`.s3` (S3 routes), :mod:`.sigv4` (signature checks),
:mod:`.credentials` (the temporary S3 credentials LoadTable vends), :mod:`.principals`,
:mod:`.logfields` (log fields of a request) and :mod:`.server` (:class:`IskHttpService`, two
listeners, and its config :class:`IskHttpConfig`).
"""

from bergstream.plugins.isk_gateway.http.server import IskHttpConfig, IskHttpService

__all__ = ["IskHttpConfig", "IskHttpService"]
