"""The public API of bergstream: everything a plugin may use from core, in one module.

A plugin, in this repository or a third party's, imports core only from here, as Kroxylicious
filters build against ``kroxylicious-api`` rather than its runtime::

    from bergstream.core.api import FilterRegistration, ProxyFilter, hookimpl

What it holds: hook markers and registrations; config (the base model, choices of other plugins,
the file, home directories); backend and service interfaces; the lake; the proxy's filter API
with named API keys and version-correct message builders; Kafka's record-batch layout, CRC-32C
and record helpers; the row contract and the boundary; AWS SigV4 signing steps (``sigv4``); the
shared metrics and logs; and testing kits for caches, indexes and filters. ``docs/hooks.md``
shows every hook with this module, and ``docs/architecture.md`` the import rules
``tests/unit/test_import_rules.py`` enforces.

Names load lazily: ``api.pyi`` beside this module lists every name with the core module it comes
from (what type checkers and editors read), and lazy_loader imports that module when a name is
first used, so importing a plugin costs only what the plugin itself uses (``bergstream --help``
loads every plugin).
"""

from __future__ import annotations

import lazy_loader

# The stub's imports are relative to bergstream.core, where the modules live.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub("bergstream.core", __file__)
