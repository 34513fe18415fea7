"""The lake pipeline: Spark Structured Streaming from Kafka into Iceberg, exactly once.

``bergstream pipeline run`` copies a topic into its Iceberg table (the coldset), writing the
boundary (next offset per partition) into every snapshot summary; ``bergstream pipeline
maintain`` compacts, expires snapshots and removes orphan files; ``bergstream table describe``
shows a table. Importing this package does not import pyspark; the modules that need it do.
"""
