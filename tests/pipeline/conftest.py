"""Fixtures of the pipeline tests: one Spark session per test run, lakes under a temporary home,
Kafka topics for them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.lake import LakeCatalogConfig, LakeConfig, LakeS3Config
from bergstream.pipeline.settings import PipelineLake, resolve_pipeline_lake
from tests.kits.lake import TOPIC_CONFIG


@pytest.fixture(scope="session")
def lake_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$BERGSTREAM_HOME`` of the pipeline tests' lakes."""
    return tmp_path_factory.mktemp("lake-home")


@pytest.fixture(scope="session")
def make_lake(kafka_bootstrap: str, lake_home: Path) -> Callable[..., PipelineLake]:
    """Build a resolved lake with the pipeline's settings; ``catalog`` and ``pipeline`` take
    LakeCatalogConfig and LakePipelineConfig fields, ``home`` another home directory."""

    def make(
        *,
        home: Path | None = None,
        catalog: dict[str, Any] | None = None,
        pipeline: dict[str, Any] | None = None,
        s3: dict[str, Any] | None = None,
        **fields: Any,
    ) -> PipelineLake:
        config = LakeConfig(
            kafka_bootstrap=kafka_bootstrap,
            catalog=LakeCatalogConfig(**(catalog or {})),
            pipeline=pipeline or {},
            s3=LakeS3Config(**s3) if s3 is not None else None,
            **fields,
        )
        return resolve_pipeline_lake(config, home=home or lake_home)

    return make


@pytest.fixture(scope="session")
def lake(make_lake: Callable[..., PipelineLake]) -> PipelineLake:
    """The default lake: embedded SQL catalog and local warehouse under ``lake_home``."""
    return make_lake()


@pytest.fixture(scope="session")
def spark(lake: PipelineLake) -> Iterator[Any]:
    """One local Spark session for the whole test run, with the default lake attached."""
    from bergstream.pipeline.session import attach_catalog, build_session

    session = build_session({"spark.driver.memory": "1g"})
    attach_catalog(session, lake)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def admin(kafka_bootstrap: str) -> Any:
    """A confluent-kafka admin client on the stack's Kafka."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture(scope="session")
def create_topic(admin: Any) -> Callable[..., str]:
    """Create a uniquely named topic with :data:`TOPIC_CONFIG` (plus ``configs``)."""
    from confluent_kafka.admin import NewTopic

    def create(partitions: int = 3, prefix: str = "lake", **configs: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=1,
            config={**TOPIC_CONFIG, **configs},
        )
        admin.create_topics([topic])[name].result(timeout=30)
        return name

    return create
