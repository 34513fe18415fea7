"""ISK, an Iceberg API on Kafka: an Iceberg REST catalog and an S3 gateway serving Kafka topics
as tables (``hotset``), the lake's tables (``coldset``) and both joined at the boundary
(``merged``). See docs/architecture.md for the layers and the data flow.

Grouped along the data flow, each subpackage one step of it:

- :mod:`.kafka`: reading Kafka (end offsets, record-batch bytes of an offset range);
- :mod:`.files`: building files (record batches decoded into Arrow, Parquet data files, the
  ``hotset-parquet`` file synthesizer, manifests, manifest lists and table metadata);
- :mod:`.tables`: serving tables (the hotset's indexer and file serving, the coldset, merged,
  the router over them, where built files are kept);
- :mod:`.http`: the REST catalog and the S3 gateway in front.

:mod:`.plugin` registers the ``isk`` service and the ``hotset-parquet`` synthesizer;
:mod:`.service` wires the pieces into one gateway. Core is reached only through
``bergstream.core.api``; caches and indexes through the ``register_cache_backends`` /
``register_index_backends`` hooks, never imported from their plugins.
"""
