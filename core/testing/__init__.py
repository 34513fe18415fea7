"""Test kits shipped with bergstream for plugin authors.

:mod:`bergstream.core.testing.backends` is the conformance suite of cache and index backends
(the hook contract of ``register_cache_backends`` / ``register_index_backends``): every built-in
backend passes it, and a third party runs it from its own pytest against its backend. Importing
these modules imports neither pytest nor any plugin.
"""
