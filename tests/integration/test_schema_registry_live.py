"""core.schema_registry against the real registry of the local stack (Apicurio Registry's
Confluent-compatible API): schemas registered with confluent-kafka's client are read back with
their ids, versions, types and references; missing ids, subjects and a wrong base URL give the
errors the pipeline, ISK and KSI act on."""

from __future__ import annotations

import asyncio
import json
import pickle
import socket
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry import SchemaReference as ConfluentReference
from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient

from bergstream.core.typed.schema_registry import (
    RegistryUnavailable,
    SchemaNotFound,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
    SchemaRegistrySettings,
)

pytestmark = pytest.mark.slow

MONEY = {
    "type": "record",
    "name": "Money",
    "namespace": "com.example",
    "fields": [{"name": "cents", "type": "long"}, {"name": "currency", "type": "string"}],
}
PAYMENT_V1 = {
    "type": "record",
    "name": "Payment",
    "namespace": "com.example",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "com.example.Money"}],
}
PAYMENT_V2 = {
    **PAYMENT_V1,
    "fields": [
        *PAYMENT_V1["fields"],
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


@pytest.fixture(scope="module")
def registry_url(stack_env: dict[str, str]) -> str:
    """The Confluent API base of the stack's registry (``BERGSTREAM_SCHEMA_REGISTRY_URL``)."""
    return stack_env["BERGSTREAM_SCHEMA_REGISTRY_URL"]


@pytest.fixture(scope="module")
def confluent(registry_url: str) -> ConfluentClient:
    """confluent-kafka's client: how producers register schemas."""
    return ConfluentClient({"url": registry_url})


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Subject names no other test uses (the registry is shared by the session)."""
    tag = uuid.uuid4().hex[:10]
    return lambda name: f"{tag}-{name}"


def ours(url: str, **settings: object) -> SchemaRegistryClient:
    return SchemaRegistryClient(SchemaRegistrySettings(url=url, **settings))


def avro(schema: dict[str, object], refs: list[ConfluentReference] | None = None) -> Schema:
    return Schema(json.dumps(schema), "AVRO", refs or [])


def test_versions_ids_and_references_read_back(
    registry_url: str, confluent: ConfluentClient, unique: Callable[[str], str]
) -> None:
    money_subject, subject = unique("money"), unique("payments-value")
    money_id = confluent.register_schema(money_subject, avro(MONEY))
    ref = ConfluentReference("com.example.Money", money_subject, 1)
    v1_id = confluent.register_schema(subject, avro(PAYMENT_V1, [ref]))
    v2_id = confluent.register_schema(subject, avro(PAYMENT_V2, [ref]))
    assert len({money_id, v1_id, v2_id}) == 3

    client = ours(registry_url)
    versions = client.subject_schemas(subject)
    assert [(s.schema_id, s.version, s.subject) for s in versions] == [
        (v1_id, 1, subject),
        (v2_id, 2, subject),
    ]
    reference = SchemaReference(name="com.example.Money", subject=money_subject, version=1)
    for schema, registered in zip(versions, (PAYMENT_V1, PAYMENT_V2), strict=True):
        assert schema.schema_type == "AVRO"
        assert json.loads(schema.schema) == registered
        assert schema.schema == confluent.get_schema(schema.schema_id).schema_str
        assert schema.references == (reference,)

    money = client.schema_by_id(money_id)
    assert (money.subject, money.version, money.references) == (None, None, ())
    assert json.loads(money.schema) == MONEY
    # Read by id on a fresh client (no cache filled by the subject), the same schema.
    fresh = ours(registry_url).schema_by_id(v2_id)
    assert fresh.schema == versions[1].schema and fresh.references == (reference,)
    assert client.subject_schemas(money_subject)[0].schema_id == money_id


def test_json_schema_type(
    registry_url: str, confluent: ConfluentClient, unique: Callable[[str], str]
) -> None:
    document = {"type": "object", "properties": {"amount": {"type": "number"}}}
    schema_id = confluent.register_schema(unique("doc-value"), Schema(json.dumps(document), "JSON"))
    found = ours(registry_url).schema_by_id(schema_id)
    assert found.schema_type == "JSON" and json.loads(found.schema) == document


def test_a_new_version_shows_after_the_refresh_time(
    registry_url: str, confluent: ConfluentClient, unique: Callable[[str], str]
) -> None:
    subject = unique("evolving-value")
    confluent.register_schema(subject, avro(MONEY))
    cached, refreshed = ours(registry_url), ours(registry_url, subject_refresh_seconds=0)
    assert len(cached.subject_schemas(subject)) == len(refreshed.subject_schemas(subject)) == 1
    note = {"name": "note", "type": ["null", "string"], "default": None}
    confluent.register_schema(subject, avro({**MONEY, "fields": [*MONEY["fields"], note]}))
    assert [s.version for s in refreshed.subject_schemas(subject)] == [1, 2]
    assert [s.version for s in cached.subject_schemas(subject)] == [1]  # within 30 s


def test_subject_names_with_reserved_characters(
    registry_url: str, confluent: ConfluentClient, unique: Callable[[str], str]
) -> None:
    subject = unique("odd name/with:chars?-ä")
    schema_id = confluent.register_schema(subject, Schema('"string"', "AVRO"))
    (only,) = ours(registry_url).subject_schemas(subject)
    assert (only.subject, only.schema_id, only.schema_type) == (subject, schema_id, "AVRO")


def test_missing_ids_and_subjects(registry_url: str, unique: Callable[[str], str]) -> None:
    client = ours(registry_url)
    with pytest.raises(SchemaNotFound, match="error 40403"):
        client.schema_by_id(2_000_000_000)
    assert client.subject_schemas(unique("never-registered")) == []


def test_a_url_without_the_api_path_is_a_settings_error(
    registry_url: str, confluent: ConfluentClient, unique: Callable[[str], str]
) -> None:
    schema_id = confluent.register_schema(unique("x-value"), Schema('"long"', "AVRO"))
    root = ours(registry_url.removesuffix("/apis/ccompat/v7"))
    with pytest.raises(SchemaRegistryError, match="not the base of a Confluent") as raised:
        root.schema_by_id(schema_id)
    assert not isinstance(raised.value, SchemaNotFound | RegistryUnavailable)


def test_async_and_pickled_clients(
    registry_url: str, confluent: ConfluentClient, unique: Callable[[str], str]
) -> None:
    subject = unique("async-value")
    schema_id = confluent.register_schema(subject, avro(MONEY))
    client = pickle.loads(pickle.dumps(ours(registry_url)))

    async def main() -> tuple[object, object]:
        return await asyncio.gather(
            client.aschema_by_id(schema_id), client.asubject_schemas(subject)
        )

    by_id, versions = asyncio.run(main())
    assert by_id == client.schema_by_id(schema_id)
    assert [s.schema_id for s in versions] == [schema_id]  # type: ignore[attr-defined]


def test_a_stopped_registry_is_unavailable() -> None:
    # Stopping the session's registry would disturb every other test: a closed port instead.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RegistryUnavailable, match="connection refused"):
        ours(f"http://127.0.0.1:{port}/apis/ccompat/v7").subject_schemas("payments-value")
