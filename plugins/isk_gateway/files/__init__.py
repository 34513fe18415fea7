"""ISK's file building (second step of its data flow, see docs/architecture.md): everything a
table is made of, built in memory and deterministic (the same state gives the same bytes).

Data files:

- :mod:`.batch_kernels`: compiled loops (numba) over record batches and their records;
- :mod:`.batch_decoder`: record batches -> Arrow rows of the row contract, read_committed;
- :mod:`.synthesis`: Arrow rows -> a Parquet file, with its Iceberg ``DataFile`` stats;
- :mod:`.hotset_layout`: which rows one hotset data file holds and how they are written;
- :mod:`.hotset_parquet`: ``hotset-parquet``, the file synthesizer rebuilding a data file from
  its key alone.

Metadata:

- :mod:`.data_files`: ``DataFile`` entries of hotset chunks, from the chunk index;
- :mod:`.manifests`: manifests and manifest lists (Avro);
- :mod:`.table_metadata`: a table's snapshot and ``TableMetadataV2``, and the composition of
  the steps;
- :mod:`.digests`: the digests and Avro sync markers that make rebuilds byte-identical;
- :mod:`.fileio`: in-memory PyIceberg files.
"""
