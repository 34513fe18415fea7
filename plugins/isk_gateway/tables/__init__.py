"""ISK tables layer: what serves the ``hotset`` namespace behind
:class:`~bergstream.plugins.isk_gateway.provider.TableProvider`.

Modules, one job each:

- :mod:`.paths`: the key scheme (data files, manifests, manifest lists, metadata JSON) with
  strict parsing (a key that does not parse is ``NoSuchFile``);
- :mod:`.kafka_reader`: raw read_committed record batches of an offset range and end offsets
  (log start, high watermark, last stable offset) from Kafka;
- :mod:`.metadata`: deterministic DataFiles, manifests, manifest list and ``TableMetadataV2`` from
  the chunk index (same state, same bytes);
- :mod:`.fileio`: in-memory PyIceberg files and a read-only FileIO over a read-by-key function;
- :mod:`.hotset`: :class:`~.hotset.HotsetProvider`, keeping the index up to date on LoadTable and
  serving every file by key.
"""
