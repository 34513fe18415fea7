"""The key scheme: S3 keys inside the gateway bucket that say what each file holds.

Layout, under ``<cluster>/<namespace>/<topic>/`` (namespace ``hotset``, ``coldset`` or
``merged``; the topic percent-encoded, so any name is one segment):

- ``data/p=<partition>/day=<yyyy-mm-dd>/<start>-<end>.parquet`` (hotset, merged): the rows of
  Kafka offsets ``[start, end)`` of one partition, all of that day (``day=-``: a range without
  rows); ``hour=<yyyy-mm-dd-HH>`` instead of ``day=`` when the hotset is partitioned by hour;
  ``data/layout=<digest>/p=...`` for a typed topic: the rows decoded into the typed columns of
  the layout ``digest`` names (:mod:`..files.typed_topic`), so a file of another layout (another
  schema version, another coldset schema) is never found under this key;
- ``files/<path>`` (coldset, merged): the file at ``<path>`` under the physical table's location.

A merged table's data files live under its own prefix (DuckDB scopes vended credentials to the
table's location), as aliases of the same hotset and coldset files.
- ``metadata/manifest-<digest>.avro``: a manifest, ``digest`` hashing what it lists;
- ``metadata/snap-<snapshot_id>-<digest>.avro``: a snapshot's manifest list;
- ``metadata/<sequence>-<uuid>.metadata.json``: the table metadata of one snapshot, in the
  spec's ``<version>-<uuid>`` convention that engines parse (ClickHouse reads the version as a
  32-bit integer): the version is the snapshot's sequence number, the UUID's first 16 hex digits
  the snapshot id, its last 16 the history digest (zeros: none).

A data key is enough to rebuild its file from Kafka, a coldset file key to find it in the lake.
Parsing is strict: anything that is not a key this module would write (leading zeros, an
inverted range, an invalid date, a non-canonical topic encoding) raises
:class:`~bergstream.plugins.isk_gateway.tables.provider.NoSuchFile`.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from bergstream.plugins.isk_gateway.tables.provider import NoSuchFile

__all__ = [
    "CHANGE_KINDS",
    "COLDSET",
    "CURRENT",
    "DAY",
    "HOTSET",
    "HOUR",
    "LAYOUT_DIGEST_LENGTH",
    "MERGED",
    "NAMESPACES",
    "REJECTED",
    "UNIT_MICROS",
    "ChangesKey",
    "ColdFileKey",
    "DataKey",
    "ManifestKey",
    "ManifestListKey",
    "MetadataKey",
    "ParsedKey",
    "bucket_label",
    "day_of",
    "encode_topic",
    "key_from_uri",
    "key_namespace",
    "parse_key",
    "table_location",
    "table_prefix",
    "uri",
]

DAY = "day"
HOUR = "hour"
#: Time units a hotset can be partitioned by, with their length in µs.
UNIT_MICROS = {DAY: 86_400_000_000, HOUR: 3_600_000_000}

HOTSET = "hotset"
COLDSET = "coldset"
MERGED = "merged"
#: The current state of upsert and debezium topics.
CURRENT = "current"
#: Records a state could not apply (and undecodable values), with the reason.
REJECTED = "rejected"
#: The namespaces an ISK gateway may serve, in listing order.
NAMESPACES = (HOTSET, COLDSET, MERGED, CURRENT, REJECTED)
#: Namespaces that list files of a physical lake table (``files/<path>`` keys).
_FILE_NAMESPACES = (COLDSET, MERGED, CURRENT, REJECTED)
#: What a changes file holds: the rows a snapshot adds, or the positions it deletes.
CHANGE_KINDS = ("rows", "deletes")

_EPOCH = dt.date(1970, 1, 1)
_NUMBER = r"(0|[1-9][0-9]{0,18})"
_SEGMENT = r"([^/]+)"
_DIGEST = r"([0-9a-f]{32})"
#: Length of a typed layout's digest in data keys (hex characters).
LAYOUT_DIGEST_LENGTH = 20
_LAYOUT = re.compile(f"[0-9a-f]{{{LAYOUT_DIGEST_LENGTH}}}")
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_PREFIX = rf"{_SEGMENT}/({'|'.join(NAMESPACES)})/{_SEGMENT}"
_DATA = re.compile(
    rf"{_SEGMENT}/({HOTSET}|{MERGED})/{_SEGMENT}/data/(?:layout=([0-9a-f]+)/)?p={_NUMBER}/"
    rf"(day|hour)=(-|[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}(?:-[0-9]{{2}})?)/{_NUMBER}-{_NUMBER}"
    r"\.parquet"
)
_MANIFEST = re.compile(rf"{_PREFIX}/metadata/manifest-{_DIGEST}\.avro")
_MANIFEST_LIST = re.compile(rf"{_PREFIX}/metadata/snap-{_NUMBER}-{_DIGEST}\.avro")
_COLD_FILE = re.compile(rf"{_SEGMENT}/({'|'.join(_FILE_NAMESPACES)})/{_SEGMENT}/files/(.+)")
_CHANGES = re.compile(
    rf"{_SEGMENT}/({CURRENT}|{REJECTED})/{_SEGMENT}/changes/(?:layout=([0-9a-f]+)/)?"
    rf"{_NUMBER}-({'|'.join(CHANGE_KINDS)})\.parquet"
)
_METADATA = re.compile(
    rf"{_PREFIX}/metadata/(0|[1-9][0-9]{{0,9}})-([0-9a-f]{{8}})-([0-9a-f]{{4}})-([0-9a-f]{{4}})-"
    r"([0-9a-f]{4})-([0-9a-f]{12})\.metadata\.json"
)
_MAX_INT64 = 2**63 - 1
#: The largest metadata version engines accept (ClickHouse parses it as a signed 32-bit int).
_MAX_METADATA_VERSION = 2**31 - 1
_NO_VERSION = "0" * 16


def encode_topic(topic: str) -> str:
    """The topic as one key segment: percent-encoded, ``/`` included (Kafka names never need it,
    but any string round-trips)."""
    if not topic or topic in (".", ".."):
        raise ValueError(f"invalid topic name {topic!r}")
    return quote(topic, safe="")


def _check_cluster(cluster: str) -> str:
    if not _CLUSTER.fullmatch(cluster):
        raise ValueError(f"cluster name {cluster!r} must match {_CLUSTER.pattern}")
    return cluster


def _check_namespace(namespace: str) -> str:
    if namespace not in NAMESPACES:
        raise ValueError(f"namespace {namespace!r} is not one of {', '.join(NAMESPACES)}")
    return namespace


def table_prefix(cluster: str, topic: str, namespace: str = HOTSET) -> str:
    """``<cluster>/<namespace>/<topic>``: the prefix of every key of a topic's table."""
    return f"{_check_cluster(cluster)}/{_check_namespace(namespace)}/{encode_topic(topic)}"


def table_location(bucket: str, cluster: str, topic: str, namespace: str = HOTSET) -> str:
    """The table's ``location``: ``s3://<bucket>/<cluster>/<namespace>/<topic>``."""
    return uri(bucket, table_prefix(cluster, topic, namespace))


def uri(bucket: str, key: str) -> str:
    """``s3://<bucket>/<key>``."""
    return f"s3://{bucket}/{key}"


def key_from_uri(bucket: str, location: str) -> str:
    """The key of an ``s3://<bucket>/<key>`` (or ``s3a://``) location; :class:`NoSuchFile` if
    it is in another bucket."""
    for scheme in ("s3://", "s3a://"):
        prefix = f"{scheme}{bucket}/"
        if location.startswith(prefix):
            return location[len(prefix) :]
    raise NoSuchFile(f"{location!r} is not in bucket {bucket!r}")


def day_of(day: int | None) -> str:
    """A day number (days since the epoch) as ``yyyy-mm-dd``; ``-`` for None."""
    return "-" if day is None else (_EPOCH + dt.timedelta(days=day)).isoformat()


def bucket_label(bucket: int | None, unit: str) -> str:
    """A time bucket (days or hours since the epoch) as ``yyyy-mm-dd`` or ``yyyy-mm-dd-HH``."""
    if unit == DAY or bucket is None:
        return day_of(bucket)
    return f"{day_of(bucket // 24)}-{bucket % 24:02d}"


@dataclass(frozen=True)
class DataKey:
    """A data file: offsets ``[start, end)`` of ``partition`` whose rows are all in one time
    bucket: ``bucket`` days (``unit`` day) or hours (``unit`` hour) since the epoch; ``layout``:
    the digest of the typed layout its rows are decoded into (None: a raw topic's file)."""

    cluster: str
    topic: str
    partition: int
    bucket: int | None
    start: int
    end: int
    namespace: str = HOTSET
    unit: str = DAY
    layout: str | None = None

    def __post_init__(self) -> None:
        if self.layout is not None and not _LAYOUT.fullmatch(self.layout):
            raise ValueError(f"invalid layout digest {self.layout!r}")
        if self.partition < 0 or not 0 <= self.start < self.end <= _MAX_INT64:
            raise ValueError(f"invalid data key fields: {self!r}")
        if self.namespace not in (HOTSET, MERGED):
            raise ValueError(f"data keys are in {HOTSET} or {MERGED}, not {self.namespace}")
        if self.unit not in UNIT_MICROS:
            raise ValueError(f"unit must be {DAY} or {HOUR}, not {self.unit!r}")

    @property
    def key(self) -> str:
        layout = f"layout={self.layout}/" if self.layout is not None else ""
        return (
            f"{table_prefix(self.cluster, self.topic, self.namespace)}/data/{layout}"
            f"p={self.partition}/{self.unit}={bucket_label(self.bucket, self.unit)}/"
            f"{self.start}-{self.end}.parquet"
        )


@dataclass(frozen=True)
class ColdFileKey:
    """A file of a physical lake table: ``path`` relative to the table's location (the
    topic's log table for ``coldset`` and ``merged``; its state table for ``current``; its
    rejected table for ``rejected``)."""

    cluster: str
    topic: str
    path: str
    namespace: str = COLDSET

    def __post_init__(self) -> None:
        segments = self.path.split("/")
        if any(segment in ("", ".", "..") for segment in segments):
            raise ValueError(f"invalid coldset file path {self.path!r}")
        if self.namespace not in _FILE_NAMESPACES:
            raise ValueError(f"lake files are in {_FILE_NAMESPACES}, not {self.namespace}")

    @property
    def key(self) -> str:
        return f"{table_prefix(self.cluster, self.topic, self.namespace)}/files/{self.path}"


@dataclass(frozen=True)
class ChangesKey:
    """A file ISK builds for one snapshot of a ``current`` or ``rejected`` table: the rows the
    records not yet in the lake make (``rows``), or the positions of the lake table's rows they
    replace (``deletes``); ``layout`` is the typed layout's digest (None: raw)."""

    cluster: str
    topic: str
    snapshot_id: int
    kind: str
    namespace: str = CURRENT
    layout: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.snapshot_id <= _MAX_INT64:
            raise ValueError(f"invalid snapshot id {self.snapshot_id}")
        if self.kind not in CHANGE_KINDS:
            raise ValueError(f"changes files hold {CHANGE_KINDS}, not {self.kind!r}")
        if self.namespace not in (CURRENT, REJECTED):
            raise ValueError(f"changes files are in {CURRENT} or {REJECTED}, not {self.namespace}")
        if self.layout is not None and not _LAYOUT.fullmatch(self.layout):
            raise ValueError(f"invalid layout digest {self.layout!r}")

    @property
    def key(self) -> str:
        layout = f"layout={self.layout}/" if self.layout is not None else ""
        return (
            f"{table_prefix(self.cluster, self.topic, self.namespace)}/changes/{layout}"
            f"{self.snapshot_id}-{self.kind}.parquet"
        )


@dataclass(frozen=True)
class ManifestKey:
    """A manifest, named by the digest of its content."""

    cluster: str
    topic: str
    digest: str
    namespace: str = HOTSET

    @property
    def key(self) -> str:
        prefix = table_prefix(self.cluster, self.topic, self.namespace)
        return f"{prefix}/metadata/manifest-{self.digest}.avro"


@dataclass(frozen=True)
class ManifestListKey:
    """A snapshot's manifest list."""

    cluster: str
    topic: str
    snapshot_id: int
    digest: str
    namespace: str = HOTSET

    def __post_init__(self) -> None:
        if not 0 < self.snapshot_id <= _MAX_INT64:
            raise ValueError(f"invalid snapshot id {self.snapshot_id}")

    @property
    def key(self) -> str:
        return (
            f"{table_prefix(self.cluster, self.topic, self.namespace)}/metadata/"
            f"snap-{self.snapshot_id}-{self.digest}.avro"
        )


@dataclass(frozen=True)
class MetadataKey:
    """The metadata JSON of one snapshot (snapshot id 0: the table has no snapshot); ``version``
    (16 hex digits, or empty) tells apart the metadata of one current snapshot with different
    histories (older snapshots expired); ``sequence_number`` is the snapshot's (0: none), the
    file's version in the name."""

    cluster: str
    topic: str
    snapshot_id: int
    namespace: str = HOTSET
    version: str = ""
    sequence_number: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.snapshot_id <= _MAX_INT64:
            raise ValueError(f"invalid snapshot id {self.snapshot_id}")
        if self.version and not re.fullmatch("[0-9a-f]{16}", self.version):
            raise ValueError(f"invalid metadata version {self.version!r}")
        if not 0 <= self.sequence_number <= _MAX_METADATA_VERSION:
            raise ValueError(
                f"sequence number {self.sequence_number} is out of the 32-bit range engines "
                "parse in metadata file names"
            )

    @property
    def key(self) -> str:
        prefix = table_prefix(self.cluster, self.topic, self.namespace)
        digits = f"{self.snapshot_id:016x}{self.version or _NO_VERSION}"
        name = f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
        return f"{prefix}/metadata/{self.sequence_number}-{name}.metadata.json"


ParsedKey = DataKey | ColdFileKey | ChangesKey | ManifestKey | ManifestListKey | MetadataKey


def key_namespace(key: ParsedKey) -> str:
    """The namespace a parsed key belongs to."""
    return key.namespace


def _parse_bucket(text: str, unit: str, key: str) -> int | None:
    if text == "-":
        return None
    try:
        if unit == DAY:
            return (dt.date.fromisoformat(text) - _EPOCH).days
        day, _, hour = text.rpartition("-")
        if not (len(hour) == 2 and hour.isdigit() and int(hour) < 24):
            raise ValueError(text)
        return (dt.date.fromisoformat(day) - _EPOCH).days * 24 + int(hour)
    except ValueError:
        raise NoSuchFile(f"no such key {key!r} (invalid {unit} {text!r})") from None


def parse_key(key: str) -> ParsedKey:
    """Parse a key; :class:`NoSuchFile` unless it is exactly what this scheme writes."""
    parsed: ParsedKey
    try:
        if match := _DATA.fullmatch(key):
            cluster, namespace, topic, layout, partition, unit, bucket, start, end = match.groups()
            parsed = DataKey(
                cluster,
                unquote(topic),
                int(partition),
                _parse_bucket(bucket, unit, key),
                int(start),
                int(end),
                namespace,
                unit,
                layout,
            )
        elif match := _COLD_FILE.fullmatch(key):
            cluster, namespace, topic, path = match.groups()
            parsed = ColdFileKey(cluster, unquote(topic), path, namespace)
        elif match := _CHANGES.fullmatch(key):
            cluster, namespace, topic, layout, snapshot, kind = match.groups()
            parsed = ChangesKey(cluster, unquote(topic), int(snapshot), kind, namespace, layout)
        elif match := _MANIFEST.fullmatch(key):
            cluster, namespace, topic, digest = match.groups()
            parsed = ManifestKey(cluster, unquote(topic), digest, namespace)
        elif match := _MANIFEST_LIST.fullmatch(key):
            cluster, namespace, topic, snapshot, digest = match.groups()
            parsed = ManifestListKey(cluster, unquote(topic), int(snapshot), digest, namespace)
        elif match := _METADATA.fullmatch(key):
            cluster, namespace, topic, sequence, *parts = match.groups()
            digits = "".join(parts)
            version = "" if digits[16:] == _NO_VERSION else digits[16:]
            parsed = MetadataKey(
                cluster, unquote(topic), int(digits[:16], 16), namespace, version, int(sequence)
            )
        else:
            raise NoSuchFile(f"no such key {key!r}")
        canonical = parsed.key  # re-encoding must give the key back (strict, one spelling)
    except ValueError:
        raise NoSuchFile(f"no such key {key!r}") from None
    if canonical != key:
        raise NoSuchFile(f"no such key {key!r}")
    return parsed
