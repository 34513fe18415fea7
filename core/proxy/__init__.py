"""The Kafka protocol proxy: virtual clusters, gateways and filter chains (Kroxylicious model).

Modules, each with one job (nothing is re-exported here, so importing the filter API stays
cheap):

* :mod:`~bergstream.core.proxy.api` -- the filter API plugins implement.
* :mod:`~bergstream.core.proxy.server` -- :class:`ProxyServer` (one virtual cluster, a
  :class:`~bergstream.core.service.Service`) and :func:`build_filter_factories`.
* :mod:`~bergstream.core.proxy.connection` -- one client connection (:class:`ProxyConnection`):
  its set-up and tear-down, made of parts with one job each:
  :mod:`~bergstream.core.proxy.connection_state` (the fields they share),
  :mod:`~bergstream.core.proxy.request_path` (client to broker),
  :mod:`~bergstream.core.proxy.response_path` (broker to client, cut-through),
  :mod:`~bergstream.core.proxy.response_order` (responses in request order),
  :mod:`~bergstream.core.proxy.flow_control` (backpressure),
  :mod:`~bergstream.core.proxy.sasl_relay` (the client's SASL exchanges) and
  :mod:`~bergstream.core.proxy.out_of_band` (requests filters send themselves).
* :mod:`~bergstream.core.proxy.chain` -- running a connection's filters.
* :mod:`~bergstream.core.proxy.internal_filters` -- ApiVersions capping, broker address rewriting.
* :mod:`~bergstream.core.proxy.upstream` -- connecting to the target cluster, its node map.
* :mod:`~bergstream.core.proxy.frames` / :mod:`~bergstream.core.proxy.scan` -- bytes-level work
  (frames read from and written to a transport).
* :mod:`~bergstream.core.proxy.codec` / :mod:`~bergstream.core.proxy.versions` -- kio.
* :mod:`~bergstream.core.proxy.errors` -- error responses built from requests.
* :mod:`~bergstream.core.proxy.tls` / :mod:`~bergstream.core.proxy.log` -- TLS contexts, loggers.
"""
