"""The JVM side of the pipeline: Maven coordinates, pinned in one place, resolved by Spark.

Spark downloads them from Maven Central on first use (``spark.jars.packages``) into an Ivy cache
under ``$BERGSTREAM_CACHE`` (default ``~/.cache/bergstream``), so later starts need no network.
"""

from __future__ import annotations

import os
from pathlib import Path

from bergstream.core.api import bergstream_cache

__all__ = [
    "ICEBERG_VERSION",
    "SPARK_VERSION",
    "SQLITE_JDBC_VERSION",
    "cache_dir",
    "ivy_dir",
    "ivy_settings",
    "spark_packages",
]

#: Spark release the pipeline runs on (the ``pyspark`` pin in pyproject.toml must match).
SPARK_VERSION = "4.0.0"
#: Iceberg release of the Spark runtime and the AWS bundle.
ICEBERG_VERSION = "1.11.0"
#: SQLite JDBC driver for the embedded SQL catalog.
SQLITE_JDBC_VERSION = "3.50.3.0"
SCALA_BINARY = "2.13"
SPARK_MINOR = ".".join(SPARK_VERSION.split(".")[:2])

PACKAGES: tuple[str, ...] = (
    f"org.apache.iceberg:iceberg-spark-runtime-{SPARK_MINOR}_{SCALA_BINARY}:{ICEBERG_VERSION}",
    f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{SPARK_VERSION}",
    f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION}",
    f"org.xerial:sqlite-jdbc:{SQLITE_JDBC_VERSION}",
)

MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"

_IVY_SETTINGS = f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by bergstream: resolve the pipeline's jars from Maven Central only. -->
<ivysettings>
  <settings defaultResolver="bergstream"/>
  <resolvers>
    <chain name="bergstream" returnFirst="true">
      <ibiblio name="central" m2compatible="true" root="{MAVEN_CENTRAL}"/>
    </chain>
  </resolvers>
</ivysettings>
"""


def spark_packages() -> str:
    """The ``spark.jars.packages`` value."""
    return ",".join(PACKAGES)


def cache_dir() -> Path:
    """``$BERGSTREAM_CACHE`` (default ``~/.cache/bergstream``): downloads and JVM archives."""
    return bergstream_cache()


def ivy_dir() -> Path:
    """``$BERGSTREAM_CACHE/ivy`` (default ``~/.cache/bergstream/ivy``): Spark's jar cache."""
    return cache_dir() / "ivy"


def ivy_settings() -> Path:
    """Write (if changed) and return the Ivy settings file naming Maven Central only."""
    path = ivy_dir() / "ivysettings.xml"
    if not path.is_file() or path.read_text(encoding="utf-8") != _IVY_SETTINGS:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(_IVY_SETTINGS, encoding="utf-8")
        tmp.replace(path)
    return path
