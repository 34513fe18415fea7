"""The hotset key scheme: round trips and strict parsing."""

from __future__ import annotations

import pytest

from bergstream.plugins.isk_gateway.tables.paths import (
    DataKey,
    ManifestKey,
    ManifestListKey,
    MetadataKey,
    day_of,
    key_from_uri,
    parse_key,
    table_location,
)
from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile

DIGEST = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "parsed",
    [
        DataKey("c1", "orders", 0, 19_675, 0, 100),
        DataKey("c1", "orders.v2_x-y", 12, None, 100, 2**63 - 1),
        DataKey("c1", "we/ird %topic", 3, 0, 5, 6),
        ManifestKey("c1", "orders", DIGEST),
        ManifestListKey("c1", "orders", 2**63 - 1, DIGEST),
        MetadataKey("c1", "orders", 42),
        MetadataKey("c1", "orders", 0),
        MetadataKey("c1", "orders", 2**63 - 1, "merged", "00000000000000ff", 2**31 - 1),
        MetadataKey("c1", "a/b", 9, "current", "", 4),
    ],
)
def test_round_trip(parsed) -> None:
    assert parse_key(parsed.key) == parsed


def test_layout() -> None:
    assert (
        DataKey("c1", "orders", 2, 19_675, 10, 20).key
        == "c1/hotset/orders/data/p=2/day=2023-11-14/10-20.parquet"
    )
    assert DataKey("c1", "a/b", 0, None, 0, 1).key == "c1/hotset/a%2Fb/data/p=0/day=-/0-1.parquet"
    assert (
        MetadataKey("c", "t", 7, sequence_number=3).key
        == "c/hotset/t/metadata/3-00000000-0000-0007-0000-000000000000.metadata.json"
    )
    assert (
        MetadataKey("c", "t", 2**63 - 1, version="0123456789abcdef", sequence_number=2**31 - 1).key
        == "c/hotset/t/metadata/2147483647-7fffffff-ffff-ffff-0123-456789abcdef.metadata.json"
    )
    assert ManifestKey("c", "t", DIGEST).key == f"c/hotset/t/metadata/manifest-{DIGEST}.avro"
    assert ManifestListKey("c", "t", 9, DIGEST).key == f"c/hotset/t/metadata/snap-9-{DIGEST}.avro"
    assert table_location("bk", "c", "t") == "s3://bk/c/hotset/t"
    assert key_from_uri("bk", "s3://bk/c/hotset/t/x") == "c/hotset/t/x"
    assert day_of(0) == "1970-01-01"
    with pytest.raises(NoSuchFile):
        key_from_uri("bk", "s3://other/c/hotset/t/x")


@pytest.mark.parametrize(
    "key",
    [
        "",
        "c1/hotset/orders",
        "c1/hotset/orders/data/p=01/day=2023-11-14/10-20.parquet",  # leading zero
        "c1/hotset/orders/data/p=1/day=2023-11-14/010-20.parquet",
        "c1/hotset/orders/data/p=1/day=2023-11-14/20-20.parquet",  # empty range
        "c1/hotset/orders/data/p=1/day=2023-11-14/30-20.parquet",  # inverted
        "c1/hotset/orders/data/p=1/day=2023-02-30/10-20.parquet",  # no such date
        "c1/hotset/orders/data/p=1/day=2023-11-14/10-20.parquet.bak",
        "c1/hotset/orders/data/p=1/day=2023-11-14/10-99999999999999999999.parquet",
        "c1/hotset/orders/data/p=-1/day=2023-11-14/10-20.parquet",
        "c1/coldset/orders/data/p=1/day=2023-11-14/10-20.parquet",
        "c1/hotset/a%2fb/data/p=0/day=-/0-1.parquet",  # lower-case escape: not canonical
        "c1/hotset/%61/data/p=0/day=-/0-1.parquet",  # needless escape
        "c1/hotset/../data/p=0/day=-/0-1.parquet",
        "c1/hotset/orders/metadata/manifest-0123.avro",
        f"c1/hotset/orders/metadata/manifest-{DIGEST.upper()}.avro",
        f"c1/hotset/orders/metadata/snap-0-{DIGEST}.avro",  # snapshot ids are > 0
        f"c1/hotset/orders/metadata/snap-9223372036854775808-{DIGEST}.avro",
        "c1/hotset/orders/metadata/v1.metadata.json",
        "c1/hotset/orders/metadata/1.metadata.json",  # the names before the spec's convention
        "c1/hotset/orders/metadata/01-00000000-0000-0001-0000-000000000000.metadata.json",
        "c1/hotset/orders/metadata/2147483648-00000000-0000-0001-0000-000000000000.metadata.json",
        "c1/hotset/orders/metadata/1-00000000-0000-0001-0000-00000000000.metadata.json",
        "c1/hotset/orders/metadata/1-00000000-0000-0001-0000-00000000000A.metadata.json",
        "c1/hotset/orders/metadata/1-80000000-0000-0000-0000-000000000000.metadata.json",
        "/c1/hotset/orders/metadata/1.metadata.json",
        "bad cluster/hotset/orders/metadata/1.metadata.json",
    ],
)
def test_strict_parsing(key: str) -> None:
    with pytest.raises(NoSuchFile):
        parse_key(key)


def test_invalid_fields_are_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="32-bit"):
        MetadataKey("c1", "t", 1, sequence_number=2**31)
    with pytest.raises(ValueError, match="metadata version"):
        MetadataKey("c1", "t", 1, version="XYZ")
    with pytest.raises(ValueError):
        DataKey("c1", "t", 0, None, 5, 5)
    with pytest.raises(ValueError):
        DataKey("c1", "", 0, None, 0, 5).key  # noqa: B018
    with pytest.raises(ValueError):
        MetadataKey("bad/cluster", "t", 1).key  # noqa: B018
