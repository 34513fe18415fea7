"""The typed engine: Kafka records as typed Iceberg rows and back, byte for byte.

A library core holds for the plugins that type records (ISK's tables, KSI's fetch filter, the
pipeline, the value codecs): the row contract (one record is one row; the boundary), the Schema
Registry client, the ``codecs:`` section and each topic's codecs, schema evolution, the typed
rows per schema id and the compiled framing loops. Plugins reach it through
``bergstream.core.api`` like the rest of core.

Its own import rule (``tests/unit/test_import_rules.py``): it builds on core's base only
(:data:`BASE`: models, problems, choices, records, the backend interfaces, metrics and the
numba helpers), never on core's runtimes (the proxy, the CLI, the runner, config loading), so
importing it pulls in no server code and core's runtimes stay free to change.
"""

from typing import Final

#: The modules of core (besides its own) the typed engine may import.
BASE: Final = frozenset(
    {
        "bergstream.core.models",
        "bergstream.core.problems",
        "bergstream.core.choices",
        "bergstream.core.records",
        "bergstream.core.backends",
        "bergstream.core.metrics",
        "bergstream.core.byte_copy",
        "bergstream.core.kernel_cache",
        "bergstream.core.varints",
        "bergstream.core.plugins",  # the registry's type, for codecs_config's annotations
    }
)
