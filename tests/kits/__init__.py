"""Helpers shared by more than one test folder (``from tests.kits.<kit> import ...``).

A test folder imports only its own modules, these kits and ``tests.support``; no module imports
a ``test_*.py`` module (tests/unit/test_test_layout.py checks both). A helper only one folder
uses stays in that folder. Kits import only other kits, ``tests.support`` and the package.

The stack and its processes:

- ``ksi_stack``: known records produced to Kafka, ``bergstream pipeline run --once`` (in the
  test process's Spark session, on the session's stack or a secured one: ``pipeline_once``),
  DeleteRecords, a lake section, and ``bergstream run`` with the ksi filter.
- ``worker_spark``: the test process's one Spark session, and the pipeline's ``run --once`` run
  in it (a lake's catalog attached for the run, then what its name meant
  before restored).
- ``lake``: records produced exactly, everything consumed back as ground truth, a table read
  back with PyIceberg and with Spark; the pipeline tests' topic settings.
- ``record_strategies``: hypothesis strategies of Kafka records (odd keys, values, headers,
  timestamps), the pipeline round trip's.
- ``debezium``: Debezium connectors on the CDC stack's Kafka Connect worker.
- ``token_gateway``: an API gateway wanting a bearer token in front of the stack's REST catalog
  (Iceberg's own server).
- ``clickhouse``: chDB (ClickHouse in process) with ISK's catalog as a ``DataLakeCatalog``
  database.
- ``moto_server``: moto's server (AWS S3, Glue and STS on one port) as a process of its own.

ISK (the ``isk`` service):

- ``isk_gateway``: ``bergstream run`` serving ISK over the session's Kafka, records of every odd
  kind, DuckDB and Spark attached to its catalog, timestamps as engines show them.
- ``isk_secure_gateway``: ISK over the secured stack (SASL_SSL), over HTTP or HTTPS.
- ``certs``: a CA and a server certificate for ISK's HTTPS.
- ``isk_http_fakes``: an in-memory table provider and ISK's HTTP service in a thread.
- ``sigv4``: S3 requests signed by botocore's SigV4 signers.
- ``fake_log``: an in-process Kafka log of real record batches, for hotset tables.
- ``hotset_reader``: a hotset table read with PyIceberg without HTTP; a table's metadata built
  from its chunks.
- ``merged_topic``: the ``merged`` tests' stage: a topic half in the coldset, half in Kafka.
- ``upsert_topic``: the ``current`` tests' stage: an upsert topic, and its replayed state.
- ``trino``: Trino catalogs on an ISK gateway.

KSI (the ksi filter):

- ``coldset_tables``: coldset tables written with PyIceberg in the row contract, a KSI config.
- ``ksi_filter``: the ksi filter in-process against a fake upstream, Fetch requests and answers.

The proxy:

- ``proxy``: a kio-speaking fake broker, a raw Kafka client, cluster configs, filter factories,
  a self-signed certificate and a fuzz target.

Values and typed tables:

- ``avro_wire``: Avro schemas of two versions, values written canonically or with the liberties
  Avro allows by a writer of the tests' own, and Confluent framing (the typed KSI tests').
- ``avro_registry``: Avro values produced with confluent-kafka's ``AvroSerializer`` through the
  Schema Registry, and the ``codecs:`` section as a service context or YAML (ISK's typed tests').
- ``avro_gen``: hypothesis strategies of Avro schemas and values, normalized for comparison.
- ``avro_noncanonical``: an Avro writer taking the liberties the specification allows.
- ``json_gen``: hypothesis strategies of JSON Schemas, values and liberal spellings.
- ``protobuf_gen``: Protobuf test schemas, messages and a reference decoding.
- ``connect_gen``: Kafka Connect JSON envelopes as ``JsonConverter`` writes them.

The docs:

- ``hook_examples``: the examples of docs/hooks.md executed as modules, their registrations.
"""
