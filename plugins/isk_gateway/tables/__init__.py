"""ISK's table serving (third step of its data flow, see docs/architecture.md): what answers
behind :class:`~.provider.TableProvider`, the seam to the HTTP front.

- :mod:`.provider`: the seam (the protocol and the errors the HTTP front maps to statuses);
- :mod:`.paths`: the key scheme (data files, coldset files, manifests, manifest lists, metadata
  JSON) with strict parsing (a key that does not parse is ``NoSuchFile``);
- :mod:`.store`: :class:`~.store.FileStore`, where built files are kept (memory, then the cache
  backend) and listed;
- :mod:`.resilient_cache`: the cache backend wrapper that keeps serving while the cache is down;
- :mod:`.hotset`: the ``hotset`` namespace, made of its indexer (:mod:`.hotset_index`: the chunk
  index up to date, chunk planning) and its file serving (:mod:`.hotset_files`: reads,
  read-ahead, a missing file built once); :mod:`.background_index` runs the indexer on every
  topic in the background;
- :mod:`.coldset`: the ``coldset`` namespace, the lake's tables republished under gateway keys;
- :mod:`.merged`: the ``merged`` namespace, coldset below the boundary and hotset above it;
- :mod:`.router`: one provider over the three namespaces.
"""
