"""A topic's Iceberg table as the JVM sees it: created from the row contract, checked, and read
for its boundary. Goes through Iceberg's Java API (py4j), the same code Spark writes with."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from bergstream.core.api import (
    BOUNDARY_PROPERTY,
    PARTITION_SPEC,
    ROW_SCHEMA,
    SORT_ORDER,
    Boundary,
    ResolvedLake,
    RowContractError,
    check_schema,
    parse_boundary,
)
from bergstream.pipeline.session import PipelineSetupError

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table.sorting import SortOrder
    from pyspark.sql import SparkSession

    from bergstream.pipeline.typed_files import WrittenFile

__all__ = [
    "TABLE_PROPERTIES",
    "BoundarySnapshot",
    "LakeTable",
    "TableSchema",
    "create_table",
    "ensure_bucket",
    "load_table",
    "open_catalog",
    "open_table",
    "s3_filesystem_options",
]

#: Properties of a new topic table.
TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    "write.distribution-mode": "hash",
    # Every streaming commit writes a metadata file; keep only the recent ones.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}


@dataclass(frozen=True)
class BoundarySnapshot:
    """The newest snapshot in the current ancestry that carries a boundary."""

    snapshot_id: int | None
    timestamp_ms: int | None
    boundary: Boundary


@dataclass(frozen=True)
class TableSchema:
    """A table's current schema (field ids included), its last column id and its
    properties."""

    schema: Schema
    last_column_id: int
    properties: Mapping[str, str]


#: Attempts at a schema commit that lost a race with another commit (maintenance).
_COMMIT_ATTEMPTS = 5


def _java_error_class(error: Exception) -> str:
    java = getattr(error, "java_exception", None)
    return "" if java is None else str(java.getClass().getName())


class LakeTable:
    """One table of a topic (its log table, or its table in ``namespace``), loaded through the
    lake's catalog in a Spark session."""

    def __init__(
        self,
        spark: SparkSession,
        lake: ResolvedLake,
        topic: str,
        java_table: Any,
        namespace: str | None = None,
    ):
        self.spark = spark
        self.lake = lake
        self.topic = topic
        self.java = java_table
        self.namespace = namespace or lake.namespace

    @property
    def name(self) -> str:
        """Spark SQL name, ``catalog.namespace.`topic```."""
        return self.lake.spark_table_name(self.topic, self.namespace)

    @property
    def qualified(self) -> str:
        """``namespace.topic``, as messages name the table."""
        return f"{self.namespace}.{self.topic}"

    @property
    def uuid(self) -> str:
        """The table's UUID (a recreated table gets a new one)."""
        return str(self.java.uuid())

    def refresh(self) -> None:
        """Reload the table's metadata from the catalog."""
        self.java.refresh()

    def _snapshot(self, snapshot_id: int | None) -> Any:
        return None if snapshot_id is None else self.java.snapshot(snapshot_id)

    def summaries(self) -> Iterator[tuple[int, int, dict[str, str]]]:
        """(snapshot id, timestamp ms, summary) along the current ancestry, newest first;
        lazy, so a caller that finds what it needs early stops walking."""
        snapshot = self.java.currentSnapshot()
        while snapshot is not None:
            summary = string_map(self.spark, snapshot.summary())
            yield int(snapshot.snapshotId()), int(snapshot.timestampMillis()), summary
            snapshot = self._snapshot(snapshot.parentId())

    def boundary_snapshot(self, refresh: bool = True) -> BoundarySnapshot:
        """The current boundary and the snapshot that holds it: the newest snapshot of the
        current ancestry with a boundary (compaction snapshots carry none)."""
        if refresh:
            self.refresh()
        for snapshot_id, timestamp_ms, summary in self.summaries():
            if summary.get(BOUNDARY_PROPERTY):
                return BoundarySnapshot(
                    snapshot_id, timestamp_ms, parse_boundary(summary[BOUNDARY_PROPERTY])
                )
        return BoundarySnapshot(None, None, {})

    def boundary(self, refresh: bool = True) -> Boundary:
        """The table's boundary: next offset per Kafka partition (``{}`` for a new table)."""
        return self.boundary_snapshot(refresh).boundary

    def current_schema(self, refresh: bool = True) -> TableSchema:
        """The table's schema, last column id and properties as the catalog has them now."""
        from pyiceberg.schema import Schema

        if refresh:
            self.refresh()
        metadata = self.java.operations().current()
        jvm = _jvm(self.spark)
        text = str(jvm.org.apache.iceberg.SchemaParser.toJson(metadata.schema()))
        properties = string_map(self.spark, metadata.properties())
        return TableSchema(
            Schema.model_validate_json(text), int(metadata.lastColumnId()), properties
        )

    def commit_schema(
        self, schema: Schema, last_column_id: int, properties: Mapping[str, str]
    ) -> bool:
        """Make ``schema`` (with its own field ids, not renumbered) the current schema, with
        ``last_column_id``, and set ``properties``, in one metadata commit; nothing happens
        when the table has them already. Returns whether it committed. A commit that lost a
        race (a maintenance commit in between) is tried again on the fresh metadata."""
        jvm = _jvm(self.spark)
        java_schema = jvm.org.apache.iceberg.SchemaParser.fromJson(schema.model_dump_json())
        for attempt in range(_COMMIT_ATTEMPTS):
            current = self.current_schema()
            new_schema = (
                current.schema.as_struct() != schema.as_struct()
                or current.last_column_id != last_column_id
            )
            changed = {k: v for k, v in properties.items() if current.properties.get(k) != v}
            if not new_schema and not changed:
                return False
            operations = self.java.operations()
            base = operations.current()
            builder = jvm.org.apache.iceberg.TableMetadata.buildFrom(base)
            if new_schema:
                builder = builder.setCurrentSchema(java_schema, last_column_id)
            if changed:
                updates = jvm.java.util.HashMap()
                for key, value in changed.items():
                    updates.put(key, value)
                builder = builder.setProperties(updates)
            try:
                operations.commit(base, builder.build())
            except Exception as error:
                if "CommitFailedException" not in _java_error_class(error) or (
                    attempt == _COMMIT_ATTEMPTS - 1
                ):
                    raise
                continue
            self.refresh()
            return True
        return False

    def data_location(self) -> str:
        """Where the table's data files go (``write.data.path``, else ``<location>/data``)."""
        probe = str(self.java.locationProvider().newDataLocation("probe"))
        return probe[: -len("/probe")]

    def partition_spec(self) -> PartitionSpec:
        """The table's current partition spec (PyIceberg's form)."""
        from pyiceberg.partitioning import PartitionSpec

        jvm = _jvm(self.spark)
        text = str(jvm.org.apache.iceberg.PartitionSpecParser.toJson(self.java.spec()))
        return PartitionSpec.model_validate_json(text)

    def append_files(self, files: Sequence[WrittenFile], properties: Mapping[str, str]) -> None:
        """Commit ``files`` (Parquet data files of the current schema, in the current spec)
        in one append with ``properties`` in its snapshot summary; each file's metrics are
        read from its footer by Iceberg's Java code, as its own writers make them."""
        jvm = _jvm(self.spark)
        iceberg = jvm.org.apache.iceberg
        self.refresh()
        table = self.java
        spec = table.spec()
        metrics_config = iceberg.MetricsConfig.forTable(table)
        append = table.newAppend()
        for written in files:
            partition = iceberg.PartitionData(spec.partitionType())
            partition.set(0, written.kafka_partition)
            partition.set(1, written.time_bucket)
            source = table.io().newInputFile(written.path, written.size)
            metrics = iceberg.parquet.ParquetUtil.fileMetrics(source, metrics_config)
            data_file = (
                iceberg.DataFiles.builder(spec)
                .withPath(written.path)
                .withFormat(iceberg.FileFormat.PARQUET)
                .withFileSizeInBytes(written.size)
                .withPartition(partition)
                .withMetrics(metrics)
                .build()
            )
            append.appendFile(data_file)
        for key, value in properties.items():
            append.set(key, value)
        append.commit()

    def snapshot_count(self) -> int:
        """Number of snapshots in the table's metadata."""
        self.refresh()
        return sum(1 for _ in self.java.snapshots())


def _jvm(spark: SparkSession) -> Any:
    return spark.sparkContext._jvm  # type: ignore[attr-defined]


def string_map(spark: SparkSession, java_map: Any) -> dict[str, str]:
    """A Java ``Map<String, String>`` as a dict, in one py4j call: iterating it through py4j
    costs several calls per entry (a snapshot summary's 15 entries took about 20 ms with
    the group's threads calling at once)."""
    text = _jvm(spark).org.apache.iceberg.util.JsonUtil.mapper().writeValueAsString(java_map)
    return {str(k): str(v) for k, v in json.loads(text).items()}


def _identifier(
    spark: SparkSession, lake: ResolvedLake, topic: str, namespace: str | None = None
) -> tuple[Any, Any]:
    jvm = _jvm(spark)
    gateway = spark.sparkContext._gateway  # type: ignore[attr-defined]
    levels = gateway.new_array(jvm.java.lang.String, 1)
    levels[0] = namespace or lake.namespace
    namespace = jvm.org.apache.iceberg.catalog.Namespace.of(levels)
    return namespace, jvm.org.apache.iceberg.catalog.TableIdentifier.of(namespace, topic)


def open_catalog(spark: SparkSession, lake: ResolvedLake) -> None:
    """Load the lake's catalog into the session once: threads that each open a table then find
    it loaded (Spark's first load of a JDBC catalog, made by several threads at once, fails).
    Raises :class:`PipelineSetupError` naming the catalog when it cannot be opened."""
    _java_catalog(spark, lake)


def _java_catalog(spark: SparkSession, lake: ResolvedLake) -> Any:
    jvm = _jvm(spark)
    try:
        return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergCatalog(
            spark._jsparkSession,  # type: ignore[attr-defined]
            lake.catalog_name,
        )
    except Exception as error:
        where = lake.catalog_uri or lake.config.catalog.glue.endpoint or "AWS"
        raise PipelineSetupError(
            f"cannot open the {lake.catalog_type} catalog '{lake.catalog_name}' at {where}: {error}"
        ) from error


def s3_filesystem_options(lake: ResolvedLake) -> dict[str, Any]:
    """pyarrow ``S3FileSystem`` options for the lake's ``s3`` settings (``{}``: pyarrow's own
    defaults and credential chain)."""
    s3 = lake.s3
    options: dict[str, Any] = {}
    if s3 is not None:
        options = {"region": s3.region, "force_virtual_addressing": not s3.path_style}
        if s3.endpoint:
            parsed = urlparse(s3.endpoint)
            options["endpoint_override"] = parsed.netloc or s3.endpoint
            options["scheme"] = parsed.scheme or "https"
        if s3.access_key is not None:
            options["access_key"] = s3.access_key
            options["secret_key"] = s3.secret_key or ""
    return options


def ensure_bucket(lake: ResolvedLake) -> None:
    """Create the bucket of an ``s3://`` warehouse if it does not exist yet."""
    if not (lake.warehouse or "").startswith("s3://"):
        return
    from pyarrow import fs

    bucket = urlparse(lake.warehouse).netloc
    options = s3_filesystem_options(lake)
    filesystem = fs.S3FileSystem(allow_bucket_creation=True, **options)
    info = filesystem.get_file_info(bucket)
    if info.type == fs.FileType.NotFound:
        filesystem.create_dir(bucket)


def create_table(
    spark: SparkSession,
    lake: ResolvedLake,
    namespace: str,
    topic: str,
    schema: Schema,
    spec: PartitionSpec | None,
    sort_order: SortOrder | None,
    properties: Mapping[str, str],
) -> bool:
    """Create ``namespace.topic`` (and its namespace) unless it exists; whether it did. Iceberg
    gives a new table's columns fresh field ids in schema order: ``schema``'s must be those
    (the row contract's are); a table of other ids is made from such a schema and then given
    its own with :meth:`LakeTable.commit_schema`."""
    jvm = _jvm(spark)
    catalog = _java_catalog(spark, lake)
    java_namespace, identifier = _identifier(spark, lake, topic, namespace)
    if catalog.tableExists(identifier):
        return False
    ensure_bucket(lake)
    if not catalog.namespaceExists(java_namespace):
        try:
            catalog.createNamespace(java_namespace)
        except Exception as error:
            if "AlreadyExists" not in _java_error_class(error):
                raise
    java_schema = jvm.org.apache.iceberg.SchemaParser.fromJson(schema.model_dump_json())
    builder = catalog.buildTable(identifier, java_schema)
    if spec is not None:
        builder = builder.withPartitionSpec(
            jvm.org.apache.iceberg.PartitionSpecParser.fromJson(java_schema, spec.model_dump_json())
        )
    if sort_order is not None:
        builder = builder.withSortOrder(
            jvm.org.apache.iceberg.SortOrderParser.fromJson(
                java_schema, sort_order.model_dump_json()
            )
        )
    java_properties = jvm.java.util.HashMap()
    for key, value in properties.items():
        java_properties.put(key, value)
    try:
        builder.withProperties(java_properties).create()
    except Exception as error:
        if "AlreadyExists" not in _java_error_class(error):
            raise PipelineSetupError(
                f"cannot create table {namespace}.{topic} in catalog '{lake.catalog_name}': {error}"
            ) from error
        return False
    return True


def load_table(
    spark: SparkSession, lake: ResolvedLake, namespace: str, topic: str
) -> LakeTable | None:
    """``namespace.topic`` of the lake, or None if it does not exist."""
    catalog = _java_catalog(spark, lake)
    _, identifier = _identifier(spark, lake, topic, namespace)
    if not catalog.tableExists(identifier):
        return None
    return LakeTable(spark, lake, topic, catalog.loadTable(identifier), namespace)


def open_table(spark: SparkSession, lake: ResolvedLake, topic: str, create: bool) -> LakeTable:
    """Load the topic's table, creating namespace and table from the row contract first when
    ``create`` is set; raise :class:`PipelineSetupError` when it is missing or does not follow
    the row contract."""
    jvm = _jvm(spark)
    if create:
        create_table(
            spark, lake, lake.namespace, topic, ROW_SCHEMA, PARTITION_SPEC, SORT_ORDER,
            TABLE_PROPERTIES,
        )  # fmt: skip
    table = load_table(spark, lake, lake.namespace, topic)
    if table is None:
        raise PipelineSetupError(
            f"table {lake.namespace}.{topic} does not exist in catalog '{lake.catalog_name}' "
            f"({lake.catalog_uri}): run `bergstream pipeline run --topic {topic}` first"
        )
    try:
        check_schema(str(jvm.org.apache.iceberg.SchemaParser.toJson(table.java.schema())))
    except RowContractError as error:
        raise PipelineSetupError(f"table {lake.namespace}.{topic}: {error}") from None
    return table
