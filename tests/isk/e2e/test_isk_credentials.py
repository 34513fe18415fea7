"""Vended S3 credentials end to end (``bergstream run`` over the session's Kafka): PyIceberg
loads and scans a table with the temporary credentials LoadTable vends; those credentials read
nothing of another table; the ``credentials`` endpoint refreshes them; an expired session token
is refused with S3's ``ExpiredToken``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from bergstream.plugins.isk_gateway.http.credentials import CredentialKeys
from tests.kits.isk_gateway import ACCESS_KEY, SECRET_KEY, Gateway, produce
from tests.support import boto_s3, consume_rows, s3_error, sort_rows

pytestmark = pytest.mark.slow

BUCKET = "bergstream"


def records(count: int, tag: str) -> list[dict[str, Any]]:
    return [
        {"partition": i % 2, "key": b"k%d" % i, "value": f"{tag}-{i}".encode()}
        for i in range(count)
    ]


def s3_client(gateway: Gateway, config: dict[str, str]) -> Any:
    """A boto3 client signing with the credentials LoadTable vended in ``config``."""
    return boto_s3(
        gateway.s3_url,
        config["s3.access-key-id"],
        config["s3.secret-access-key"],
        config["s3.session-token"],
    )


def key_of(path: str) -> str:
    return path.removeprefix(f"s3://{BUCKET}/")


def data_keys(table: Any) -> list[str]:
    return [key_of(task.file.file_path) for task in table.scan().plan_files()]


def vended(table: Any) -> dict[str, str]:
    from pyiceberg.io import S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN

    keys = (S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN)
    return {key: table.io.properties[key] for key in keys}


def test_pyiceberg_scans_with_vended_session_credentials_scoped_to_the_table(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    own, other = new_topic(partitions=2), new_topic(partitions=2)
    produce(kafka_bootstrap, own, records(21, "own"))
    produce(kafka_bootstrap, other, records(13, "other"))
    catalog = gateway.catalog()
    table = catalog.load_table(f"hotset.{own}")
    config = vended(table)
    assert config["s3.access-key-id"].startswith("ASIA")
    assert config["s3.access-key-id"] != ACCESS_KEY
    assert SECRET_KEY not in config.values()
    # PyIceberg's FileIO signs every read with the session token.
    rows = sort_rows(table.scan().to_arrow().to_pylist())
    assert rows == consume_rows(kafka_bootstrap, own, 21)

    s3 = s3_client(gateway, config)
    own_keys = data_keys(table)
    assert own_keys and s3.get_object(Bucket=BUCKET, Key=own_keys[0])["Body"].read(4) == b"PAR1"
    other_table = catalog.load_table(f"hotset.{other}")
    for key in [*data_keys(other_table), key_of(other_table.metadata_location)]:
        assert s3_error(lambda key=key: s3.get_object(Bucket=BUCKET, Key=key)) == (
            "AccessDenied",
            403,
        )
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="e2e/hotset/")
    assert {obj["Key"].split("/")[2] for obj in listed["Contents"]} == {own}
    assert s3_error(lambda: s3.list_objects_v2(Bucket=BUCKET, Prefix=f"e2e/hotset/{other}/")) == (
        "AccessDenied",
        403,
    )


def test_the_credentials_endpoint_refreshes_them(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    from pyiceberg.io import load_file_io
    from pyiceberg.table import Table

    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, records(9, "refresh"))
    catalog = gateway.catalog()
    table = catalog.load_table(f"hotset.{topic}")
    first = vended(table)
    time.sleep(1.1)  # expiries are whole seconds
    fresh = catalog.load_credentials(f"hotset.{topic}", table.metadata_location)
    assert fresh["s3.session-token"] != first["s3.session-token"]
    assert fresh["s3.access-key-id"] != first["s3.access-key-id"]
    expires = int(fresh["s3.session-token-expires-at-ms"]) / 1000
    assert 3000 < expires - time.time() <= 3600  # the default lifetime, an hour
    io = load_file_io({**table.io.properties, **fresh}, table.metadata_location)
    refreshed = Table(table._identifier, table.metadata, table.metadata_location, io, catalog)
    assert sort_rows(refreshed.scan().to_arrow().to_pylist()) == consume_rows(
        kafka_bootstrap, topic, 9
    )


def test_an_expired_session_token_is_refused(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, records(3, "expired"))
    table = gateway.catalog().load_table(f"hotset.{topic}")
    key = key_of(table.metadata_location)
    scope = key.rsplit("/metadata/", 1)[0]
    # Issued with the gateway's root pair, an hour ago, for a minute: genuine, but expired.
    past = time.time() - 3600
    old = CredentialKeys(ACCESS_KEY, SECRET_KEY, clock=lambda: past).issue(scope, None, 60)
    config = {
        "s3.access-key-id": old.access_key,
        "s3.secret-access-key": old.secret_key,
        "s3.session-token": old.session_token,
    }
    assert s3_error(lambda: s3_client(gateway, config).get_object(Bucket=BUCKET, Key=key)) == (
        "ExpiredToken",
        400,
    )
    # The same, issued now, reads: only the expiry was wrong.
    fresh = CredentialKeys(ACCESS_KEY, SECRET_KEY).issue(scope, None, 60)
    config = {
        "s3.access-key-id": fresh.access_key,
        "s3.secret-access-key": fresh.secret_key,
        "s3.session-token": fresh.session_token,
    }
    assert s3_client(gateway, config).get_object(Bucket=BUCKET, Key=key)["Body"].read()
