"""The ``lake:`` section of the config: where the coldset lives (Kafka, catalog, warehouse, S3).

Shared by the pipeline (Spark), ISK and KSI (PyIceberg). :func:`resolve_lake` fills the defaults
(everything under ``$BERGSTREAM_HOME/lake``) and :func:`load_catalog` opens the catalog with
PyIceberg. Plugins may add sections under ``lake:`` (``register_config_sections``; the lake
pipeline defines ``lake.pipeline`` and ``lake.maintenance``), which core never reads (see
:mod:`.sections`). Nothing here imports pyspark.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlparse

from pydantic import ConfigDict, Field, field_validator, model_validator

from bergstream.core.home import bergstream_home
from bergstream.core.kafka_client import KafkaClientSettings
from bergstream.core.models import Bootstrap, StrictModel
from bergstream.core.sections import OpenToPluginSections

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

__all__ = [
    "DEFAULT_CURRENT_NAMESPACE",
    "DEFAULT_NAMESPACE",
    "DEFAULT_REJECTED_NAMESPACE",
    "LakeCatalogConfig",
    "LakeConfig",
    "LakeConfigError",
    "LakeGlueConfig",
    "LakeS3Config",
    "ResolvedLake",
    "glue_properties",
    "glue_region",
    "load_catalog",
    "pyiceberg_catalog_properties",
    "resolve_lake",
]

#: Namespace of the topic tables unless ``lake.namespace`` says otherwise.
DEFAULT_NAMESPACE = "coldset"
#: Namespace of the state tables of upsert and debezium topics (``lake.current_namespace``).
DEFAULT_CURRENT_NAMESPACE = "current"
#: Namespace of the tables of records a state table could not apply (``lake.rejected_namespace``).
DEFAULT_REJECTED_NAMESPACE = "rejected"


class LakeConfigError(ValueError):
    """The lake settings cannot be used as given; the message says what to change and ``path``
    (``lake.catalog.uri``) which setting it is."""

    def __init__(self, message: str, path: str = "lake") -> None:
        super().__init__(message)
        self.path = path


class LakeS3Config(StrictModel):
    """S3 (or an S3-compatible server) holding an ``s3://`` warehouse."""

    endpoint: str | None = Field(
        None, description="S3 endpoint URL, e.g. http://127.0.0.1:8333; AWS if unset"
    )
    access_key: str | None = Field(None, description="access key id; default AWS chain if unset")
    secret_key: str | None = Field(None, description="secret access key")
    region: str = Field("us-east-1", description="region (clients need one even off AWS)")
    path_style: bool = Field(True, description="path-style addressing (needed off AWS)")


class LakeGlueConfig(StrictModel):
    """AWS Glue as the catalog (``lake.catalog.type: glue``). Unset keys take the AWS default
    chain: ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
    ``AWS_PROFILE``, then the instance's role."""

    region: str | None = Field(
        None, description="the Glue region, e.g. eu-west-1 (default: AWS_REGION, then lake.s3)"
    )
    endpoint: str | None = Field(
        None, description="Glue endpoint URL override (a VPC endpoint, a test server); AWS if unset"
    )
    catalog_id: str | None = Field(
        None,
        description="the Glue catalog id (the AWS account id owning it); the caller's if unset",
    )
    profile: str | None = Field(None, description="a profile of ~/.aws/config to use")
    access_key: str | None = Field(None, description="access key id (default: the AWS chain)")
    secret_key: str | None = Field(None, description="secret access key")
    session_token: str | None = Field(None, description="session token of temporary keys")

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value  # ${VAR:-} of a variable not set

    @model_validator(mode="after")
    def _keys_in_pairs(self) -> LakeGlueConfig:
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError(
                "lake.catalog.glue: give access_key and secret_key together (or neither, for "
                "the AWS default chain)"
            )
        if self.session_token is not None and self.access_key is None:
            raise ValueError("lake.catalog.glue.session_token needs access_key and secret_key")
        return self


class LakeCatalogConfig(StrictModel):
    """The Iceberg catalog holding one table per topic."""

    type: Literal["sql", "rest", "glue"] = Field(
        "sql",
        description="sql (embedded SQLite), rest (an Iceberg REST catalog) or glue (AWS Glue)",
    )
    name: str = Field(
        "bergstream",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="catalog name (Spark catalog name; the SQL catalog stores it with each table)",
    )
    uri: str | None = Field(
        None,
        description="sql: sqlite:///PATH (default $BERGSTREAM_HOME/lake/catalog.db); "
        "rest: the catalog's base URL; glue: none",
    )
    warehouse: str | None = Field(
        None,
        description="directory or s3://bucket/prefix for table files "
        "(default $BERGSTREAM_HOME/lake/warehouse for sql; glue needs an s3:// one)",
    )
    glue: LakeGlueConfig = Field(
        default_factory=LakeGlueConfig, description="AWS Glue settings (type: glue)"
    )
    properties: dict[str, str] = Field(
        default_factory=dict, description="more Iceberg catalog properties, for every client"
    )


class LakeConfig(StrictModel, OpenToPluginSections):
    """The ``lake:`` section; keys it does not declare are sections of plugins (checked by
    :func:`~bergstream.core.sections.check_sections`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kafka_bootstrap: Bootstrap = Field(description="host:port list of the Kafka cluster to copy")
    kafka_client: KafkaClientSettings = Field(
        default_factory=KafkaClientSettings,
        description="how the pipeline connects to Kafka (TLS, SASL; librdkafka key names): "
        "Spark's Kafka source and admin client, and the workers' own reads",
    )
    namespace: str = Field(
        DEFAULT_NAMESPACE,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Iceberg namespace of the topic tables",
    )
    current_namespace: str = Field(
        DEFAULT_CURRENT_NAMESPACE,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Iceberg namespace of the state tables the pipeline keeps for upsert and "
        "debezium topics (tables: section)",
    )
    rejected_namespace: str = Field(
        DEFAULT_REJECTED_NAMESPACE,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Iceberg namespace of the records a state table could not apply, with the "
        "reason",
    )
    catalog: LakeCatalogConfig = Field(default_factory=LakeCatalogConfig)
    s3: LakeS3Config | None = Field(None, description="S3 settings for an s3:// warehouse")

    @model_validator(mode="after")
    def _distinct_namespaces(self) -> LakeConfig:
        names = {
            "namespace": self.namespace,
            "current_namespace": self.current_namespace,
            "rejected_namespace": self.rejected_namespace,
        }
        if len(set(names.values())) < len(names):
            raise ValueError(
                "namespace, current_namespace and rejected_namespace must differ (a topic has a "
                f"table in each): {names}"
            )
        return self


# --------------------------------------------------------------------------- resolution


@dataclass(frozen=True)
class ResolvedLake:
    """Lake settings with every default filled in and every path absolute."""

    config: LakeConfig
    catalog_type: str
    catalog_name: str
    catalog_uri: str  # sqlite:////abs/path.db, the REST base URL, or "" for Glue
    warehouse: str | None  # file:///abs/dir or s3://bucket/prefix (None: the REST server's own)
    namespace: str

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file of a ``sql`` catalog."""
        if self.catalog_type != "sql":
            return None
        return Path(self.catalog_uri.removeprefix("sqlite:///"))

    @property
    def jdbc_uri(self) -> str | None:
        """The JDBC URL of a ``sql`` catalog (what Java's JdbcCatalog opens)."""
        path = self.sqlite_path
        return None if path is None else f"jdbc:sqlite:{path}"

    @property
    def s3(self) -> LakeS3Config | None:
        """S3 settings, if any."""
        return self.config.s3

    def table_identifier(self, topic: str) -> tuple[str, str]:
        """(namespace, table) of a topic's table: the table is named like the topic."""
        return (self.namespace, topic)

    def spark_table_name(self, topic: str, namespace: str | None = None) -> str:
        """``catalog.namespace.`topic``` for Spark SQL (the topic may hold dots and dashes); the
        topic's log table, or its table in ``namespace``."""
        quoted = topic.replace("`", "``")
        return f"{self.catalog_name}.{namespace or self.namespace}.`{quoted}`"

    @property
    def current_namespace(self) -> str:
        """The namespace of the state tables of upsert and debezium topics."""
        return self.config.current_namespace

    @property
    def rejected_namespace(self) -> str:
        """The namespace of the tables of records a state table could not apply."""
        return self.config.rejected_namespace


def _sqlite_uri(uri: str | None, home: Path) -> str:
    if uri is None:
        return f"sqlite:///{home / 'lake' / 'catalog.db'}"
    if not uri.startswith("sqlite:///"):
        raise LakeConfigError(
            f"lake.catalog.uri '{uri}': the sql catalog takes a sqlite:///PATH URI (e.g. "
            "sqlite:////var/lib/bergstream/catalog.db); for a shared catalog use type: rest",
            "lake.catalog.uri",
        )
    path = Path(uri.removeprefix("sqlite:///")).expanduser()
    return f"sqlite:///{path.resolve()}"


def _warehouse(value: str | None, home: Path, catalog_type: str) -> str | None:
    if value is None:
        return f"file://{home / 'lake' / 'warehouse'}" if catalog_type == "sql" else None
    parsed = urlparse(value)
    if parsed.scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise LakeConfigError(
                f"lake.catalog.warehouse '{value}' names no bucket: write s3://BUCKET/PREFIX",
                "lake.catalog.warehouse",
            )
        return f"s3://{parsed.netloc}{parsed.path.rstrip('/')}"
    if parsed.scheme == "file":
        return f"file://{Path(parsed.path).resolve()}"
    if parsed.scheme == "" and catalog_type == "sql":
        return f"file://{Path(value).expanduser().resolve()}"
    if catalog_type == "rest":
        return value  # a warehouse name the REST server understands
    raise LakeConfigError(
        f"lake.catalog.warehouse '{value}': use a directory, file:///DIR or s3://BUCKET/PREFIX",
        "lake.catalog.warehouse",
    )


def _check_glue(config: LakeConfig) -> None:
    catalog = config.catalog
    if catalog.uri:
        raise LakeConfigError(
            "lake.catalog.uri: a glue catalog has no URI (for an endpoint override, e.g. a "
            "VPC endpoint, set lake.catalog.glue.endpoint)",
            "lake.catalog.uri",
        )
    if not catalog.warehouse or urlparse(catalog.warehouse).scheme not in ("s3", "s3a"):
        raise LakeConfigError(
            "lake.catalog.warehouse: a glue catalog keeps its table files on S3: set "
            "s3://BUCKET/PREFIX",
            "lake.catalog.warehouse",
        )


def glue_region(lake: ResolvedLake) -> str | None:
    """The region of a Glue catalog: ``lake.catalog.glue.region``, else ``AWS_REGION`` (or
    ``AWS_DEFAULT_REGION``), else ``lake.s3.region`` when an ``s3`` section is given."""
    glue = lake.config.catalog.glue
    return (
        glue.region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or (lake.s3.region if lake.s3 is not None else None)
    )


def glue_properties(lake: ResolvedLake) -> dict[str, str]:
    """PyIceberg's ``glue.*`` catalog properties of a Glue lake (its boto3 client)."""
    glue = lake.config.catalog.glue
    values = {
        "glue.region": glue_region(lake),
        "glue.endpoint": glue.endpoint,
        "glue.id": glue.catalog_id,
        "glue.profile-name": glue.profile,
        "glue.access-key-id": glue.access_key,
        "glue.secret-access-key": glue.secret_key,
        "glue.session-token": glue.session_token,
    }
    return {key: value for key, value in values.items() if value}


def resolve_lake(config: LakeConfig, home: Path | str | None = None) -> ResolvedLake:
    """Fill the defaults of ``config`` (under ``home``, else ``$BERGSTREAM_HOME``, else
    ``./.bergstream``) and check that the pieces fit together."""
    root = bergstream_home(home)
    catalog = config.catalog
    if catalog.type == "sql":
        uri = _sqlite_uri(catalog.uri, root)
    elif catalog.type == "glue":
        _check_glue(config)
        uri = ""
    else:
        if not catalog.uri or urlparse(catalog.uri).scheme not in ("http", "https"):
            raise LakeConfigError(
                "lake.catalog.uri: a rest catalog needs its base URL, e.g. http://127.0.0.1:8181",
                "lake.catalog.uri",
            )
        uri = catalog.uri.rstrip("/")
    warehouse = _warehouse(catalog.warehouse, root, catalog.type)
    return ResolvedLake(
        config=config,
        catalog_type=catalog.type,
        catalog_name=catalog.name,
        catalog_uri=uri,
        warehouse=warehouse,
        namespace=config.namespace,
    )


# --------------------------------------------------------------------------- PyIceberg


def s3_properties(s3: LakeS3Config | None) -> dict[str, str]:
    """Iceberg FileIO properties (``s3.*``) for these S3 settings; the same names work for
    Java's S3FileIO and PyIceberg's FileIOs."""
    if s3 is None:
        return {}
    props = {
        "s3.path-style-access": str(s3.path_style).lower(),
        "s3.region": s3.region,
        "client.region": s3.region,
    }
    if s3.endpoint:
        props["s3.endpoint"] = s3.endpoint
    if s3.access_key is not None:
        props["s3.access-key-id"] = s3.access_key
    if s3.secret_key is not None:
        props["s3.secret-access-key"] = s3.secret_key
    return props


def pyiceberg_catalog_properties(lake: ResolvedLake) -> dict[str, str]:
    """Properties for ``pyiceberg.catalog.load_catalog(lake.catalog_name, **props)``."""
    props: dict[str, str] = {"type": lake.catalog_type}
    if lake.catalog_type == "glue":
        props.update(glue_properties(lake))
    else:
        props["uri"] = lake.catalog_uri
    if lake.warehouse is not None:
        props["warehouse"] = lake.warehouse
    props.update(s3_properties(lake.s3))
    props.update(lake.config.catalog.properties)
    return props


def load_catalog(lake: ResolvedLake) -> Catalog:
    """Open the lake's catalog with PyIceberg (creating the SQLite file's directory)."""
    from pyiceberg.catalog import load_catalog as pyiceberg_load_catalog

    if lake.sqlite_path is not None:
        lake.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    return pyiceberg_load_catalog(lake.catalog_name, **pyiceberg_catalog_properties(lake))
