"""The Spark session of the pipeline, with the Iceberg catalog of a lake: local and bound to
127.0.0.1 by default, or the driver of an application on a cluster (``lake.pipeline.master``:
standalone, YARN, Kubernetes, in client mode), whose executors get the same jars from the driver.

One session can hold several lakes' catalogs (each under its own ``lake.catalog.name``): the
jars and SQL extensions are fixed when the session starts, catalogs are attached afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from bergstream.core.api import ResolvedLake, glue_region, s3_properties
from bergstream.pipeline.class_archive import class_archive_for, with_java_options
from bergstream.pipeline.jars import cache_dir, ivy_dir, ivy_settings, spark_packages
from bergstream.pipeline.settings import DEFAULT_MASTER, is_local_master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PipelineSetupError", "attach_catalog", "build_session", "catalog_conf", "session_conf"]

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"


class PipelineSetupError(RuntimeError):
    """The pipeline cannot start as configured; the message says what to change."""


def session_conf(
    extra: dict[str, str] | None = None, master: str = DEFAULT_MASTER
) -> dict[str, str]:
    """Static Spark settings: ``master`` (``lake.pipeline.master``), no UI, the pinned jars
    (``spark.jars.packages``: resolved by the driver, which serves them to every executor),
    Iceberg's SQL extensions, UTC; a local master binds the driver to 127.0.0.1, any other
    leaves the driver's address to Spark (the machine's name; ``SPARK_LOCAL_IP`` or
    ``spark.driver.host`` choose another), since executors must connect back to it. ``extra``
    (``lake.pipeline.spark_conf``) overrides any of them."""
    conf = {
        "spark.master": master,
        "spark.app.name": "bergstream-pipeline",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "2g",
        "spark.jars.packages": spark_packages(),
        "spark.jars.ivy": str(ivy_dir()),
        "spark.jars.ivySettings": str(ivy_settings()),
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        # One cached Kafka consumer per partition a query reads: a pipeline of many topics reads
        # hundreds, and with Spark's default (64) the pool closes and reopens consumers on every
        # batch ("Pool exceeds its soft max size" in the log).
        "spark.kafka.consumer.cache.capacity": "4096",
        # Spark's default plus the Kafka source's secrets that match none of its words: the JAAS
        # line (username and password) and an inline PEM private key (mutual TLS).
        "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|jaas|keystore[.]key",
    }
    if is_local_master((extra or {}).get("spark.master", master)):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    conf.update(extra or {})
    return conf


@contextlib.contextmanager
def _child_stdout_to_stderr() -> Iterator[None]:
    """Start child processes (the JVM) with their stdout on our stderr: Ivy and Spark print to
    stdout, which the commands keep for their JSON results."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def build_session(
    extra: dict[str, str] | None = None,
    master: str = DEFAULT_MASTER,
    class_data_sharing: bool = True,
) -> SparkSession:
    """Start (or return the running) Spark session with :func:`session_conf`: in process, or
    the driver of an application on the cluster of ``master``.

    The first start downloads the jars from Maven Central into the Ivy cache. With
    ``class_data_sharing`` (``lake.pipeline.class_data_sharing``) the driver's JVM maps the
    class archive of an earlier start, or writes one when it exits (:mod:`.class_archive`),
    unless ``spark.driver.extraJavaOptions`` already chooses an archive.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise PipelineSetupError(
            "the lake pipeline needs pyspark: pip install 'bergstream[pipeline]'"
        ) from None
    conf = session_conf(extra, master)
    if is_local_master(conf["spark.master"]):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        _check_master_answers(conf["spark.master"])
    # Python workers on this interpreter: typed tables decode in them, with bergstream's own
    # modules (PySpark reads only the environment variable, not spark.pyspark.python). On a
    # cluster every executor starts this path, so it must exist there too (see the README).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext

    archive = None
    if class_data_sharing and SparkContext._gateway is None and not _chooses_archive(conf):
        archive = class_archive_for(conf, cache_dir())
        if archive is not None:
            conf = with_java_options(conf, archive.java_options())
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        with _child_stdout_to_stderr(), _ivy_cache_lock():
            spark = builder.getOrCreate()
    except Exception as error:
        if is_local_master(conf["spark.master"]):
            raise
        raise PipelineSetupError(
            f"cannot start the Spark application on master {conf['spark.master']}: "
            f"{_first_line(error)}; check lake.pipeline.master, that the cluster is up and "
            "that it accepts this machine's connections (the driver's log above says more)"
        ) from None
    spark.sparkContext.setLogLevel("WARN")
    jvm = getattr(SparkContext._gateway, "proc", None)
    if archive is not None and not archive.exists and jvm is not None:
        archive.publish_when_exited(jvm)
    return spark


def with_system_properties(conf: Mapping[str, str], props: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with ``-Dkey=value`` for each of ``props`` in the driver's and the executors'
    extra Java options (what a Kafka client needs besides its client properties: Kafka 4's
    allowed OAuth URLs, Kerberos's ``java.security.krb5.conf``)."""
    merged = dict(conf)
    flags = " ".join(f"-D{key}={value}" for key, value in props.items())
    if not flags:
        return merged
    for option in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        merged[option] = f"{merged.get(option, '').strip()} {flags}".strip()
    return merged


def set_system_properties(spark: SparkSession, props: Mapping[str, str]) -> None:
    """Set ``props`` in the driver's running JVM where it has other values (a session started
    before these settings were known; in local mode the executors share that JVM)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    for key, value in props.items():
        if jvm.java.lang.System.getProperty(key) != value:
            jvm.java.lang.System.setProperty(key, value)


def _check_master_answers(master: str, timeout: float = 5.0) -> None:
    """Fail at once when no standalone master of ``spark://host:port[,host:port]`` accepts a
    TCP connection: Spark itself would try three times, 20 s apart, before giving up."""
    if not master.startswith("spark://"):
        return  # yarn, k8s://...: their clients know best
    reasons = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as error:
            reasons.append(f"{address}: {getattr(error, 'strerror', None) or error}")
    raise PipelineSetupError(
        f"cannot start the Spark application on master {master}: no master answers "
        f"({'; '.join(reasons)}); check lake.pipeline.master, that the cluster is up and that "
        "it accepts this machine's connections"
    )


def _chooses_archive(conf: dict[str, str]) -> bool:
    """Whether the driver's own Java options already set up class data sharing."""
    own = conf.get("spark.driver.extraJavaOptions", "")
    return any(flag in own for flag in ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare"))


@contextlib.contextmanager
def _ivy_cache_lock() -> Iterator[None]:
    """Hold ``<ivy cache>/resolve.lock`` while a session starts: Ivy does not lock its cache, so
    two pipelines starting at once on one machine (or two test workers) could write the same
    jar together on a first download."""
    lock_path = ivy_dir() / "resolve.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _first_line(error: BaseException) -> str:
    """The first line of ``error``, the Java exception's where Py4J wraps one (its own first
    line names only the call that failed)."""
    java = getattr(error, "java_exception", None)
    lines = [line.strip() for line in str(java or error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def catalog_conf(lake: ResolvedLake) -> dict[str, str]:
    """``spark.sql.catalog.<name>.*`` settings for the lake's Iceberg catalog."""
    prefix = f"spark.sql.catalog.{lake.catalog_name}"
    props: dict[str, str] = {"cache-enabled": "false"}
    if lake.catalog_type == "sql":
        assert lake.jdbc_uri is not None
        props.update(
            {
                "type": "jdbc",
                "uri": lake.jdbc_uri,
                "jdbc.schema-version": "V1",
                # SQLite locks the whole file; wait for a concurrent commit instead of failing.
                "jdbc.busy_timeout": "30000",
            }
        )
    elif lake.catalog_type == "glue":
        props["type"] = "glue"
        # Topic names hold dashes and dots; Glue's API takes them, Iceberg's check would not.
        props["glue.skip-name-validation"] = "true"
    else:
        props.update({"type": "rest", "uri": lake.catalog_uri})
    if lake.warehouse is not None:
        props["warehouse"] = lake.warehouse
    if (lake.warehouse or "").startswith("s3://") or lake.s3 is not None:
        props["io-impl"] = S3_FILE_IO
    props.update(s3_properties(lake.s3))
    if lake.catalog_type == "glue":
        props.update(_glue_conf(lake))
    props.update(lake.config.catalog.properties)
    conf = {prefix: SPARK_CATALOG}
    conf.update({f"{prefix}.{key}": value for key, value in props.items()})
    return conf


def _glue_conf(lake: ResolvedLake) -> dict[str, str]:
    """Iceberg's GlueCatalog settings: region, endpoint override, catalog id (its keys and
    profile come from the AWS default chain: :func:`lake_system_properties`)."""
    glue = lake.config.catalog.glue
    region = glue_region(lake)
    values = {"client.region": region, "glue.endpoint": glue.endpoint, "glue.id": glue.catalog_id}
    return {key: value for key, value in values.items() if value}


def lake_system_properties(lake: ResolvedLake) -> dict[str, str]:
    """JVM system properties a lake needs: a Glue catalog's access keys and profile, which
    Iceberg's GlueCatalog reads only from the AWS default chain, whose first link is these
    properties (they hold for the whole JVM: one Glue account per Spark application)."""
    if lake.catalog_type != "glue":
        return {}
    glue = lake.config.catalog.glue
    values = {
        "aws.accessKeyId": glue.access_key,
        "aws.secretAccessKey": glue.secret_key,
        "aws.sessionToken": glue.session_token,
        "aws.profile": glue.profile,
    }
    return {key: value for key, value in values.items() if value}


def attach_catalog(spark: SparkSession, lake: ResolvedLake) -> None:
    """Make the lake's catalog usable in ``spark`` under ``lake.catalog_name``.

    Raises :class:`PipelineSetupError` if a catalog of that name is already attached with other
    settings (Spark keeps a catalog once loaded): give the lake another ``catalog.name``.
    """
    conf = catalog_conf(lake)
    for key, value in conf.items():
        current = spark.conf.get(key, None)
        if current is not None and current != value:
            raise PipelineSetupError(
                f"Spark catalog '{lake.catalog_name}' is already attached with {key}={current}, "
                f"not {value}: give this lake another lake.catalog.name"
            )
    for key, value in conf.items():
        spark.conf.set(key, value)
    set_system_properties(spark, lake_system_properties(lake))
    if lake.sqlite_path is not None:
        lake.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    if lake.warehouse is not None and lake.warehouse.startswith("file://"):
        os.makedirs(lake.warehouse.removeprefix("file://"), exist_ok=True)
