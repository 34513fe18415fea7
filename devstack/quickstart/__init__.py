"""``bergstream quickstart``: one dataset through Kafka and Iceberg, end to end, on the local stack.

- ``run``: the numbered steps and what they print (:func:`run.run_quickstart`);
- ``config``: the config file it writes and checks before ``bergstream run`` starts;
- ``data``: the demo ``payments`` topic on Kafka;
- ``schema``: the payment's Avro schema in the Schema Registry, and the codec of its values;
- ``clients``: DuckDB (offline, extensions from wheels) and a Kafka consumer through KSI.

The ``quickstart`` command itself is in ``bergstream.devstack.plugin``.
"""
