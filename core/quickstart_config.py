"""The quickstart's config file: ISK, a KSI virtual cluster and a lake, in one YAML file.

It follows ``examples/isk.yaml``, ``examples/ksi.yaml`` and ``examples/lake.yaml`` with every value
resolved (the stack's Kafka address, ports, paths under ``$BERGSTREAM_HOME/quickstart``), so the
file runs as is: ``bergstream run -c $BERGSTREAM_HOME/quickstart.yaml``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bergstream.core.stack.ports import free_port_block, free_ports, port_is_free

__all__ = [
    "DEFAULT_CATALOG_PORT",
    "DEFAULT_PROXY_PORT",
    "DEFAULT_S3_PORT",
    "ISK_ACCESS_KEY",
    "ISK_SECRET_KEY",
    "PROXY_PORTS",
    "QuickstartPorts",
    "choose_ports",
    "quickstart_config",
    "write_config",
]

#: Fixed ports as in the examples, so the printed instructions stay the same from run to run.
DEFAULT_CATALOG_PORT = 18181
DEFAULT_S3_PORT = 19000
DEFAULT_PROXY_PORT = 19092
#: The proxy's bootstrap port plus one port per broker node id 0, 1 and 2.
PROXY_PORTS = 4
#: The demo key pair of ``examples/isk.yaml``: vended to clients, checked by the S3 gateway.
ISK_ACCESS_KEY = "isk-demo"
ISK_SECRET_KEY = "isk-demo-secret"

_ENV = {
    "catalog": "BERGSTREAM_ISK_CATALOG_PORT",
    "s3": "BERGSTREAM_ISK_S3_PORT",
    "proxy": "BERGSTREAM_PROXY_PORT",
}


@dataclass(frozen=True)
class QuickstartPorts:
    """Where ISK's catalog, ISK's S3 gateway and the KSI proxy listen; ``moved`` names the ones
    that had to leave their wanted port because something else held it."""

    catalog: int
    s3: int
    proxy: int
    moved: tuple[str, ...] = ()


def _wanted(name: str, given: int | None, default: int) -> int:
    if given is not None:
        return given
    raw = os.environ.get(_ENV[name])
    if raw:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{_ENV[name]}={raw!r} is not a port number") from None
    return default


def choose_ports(
    catalog: int | None = None, s3: int | None = None, proxy: int | None = None
) -> QuickstartPorts:
    """The ports to use: the given ones, else ``$BERGSTREAM_ISK_CATALOG_PORT``,
    ``$BERGSTREAM_ISK_S3_PORT`` and ``$BERGSTREAM_PROXY_PORT``, else 18181, 19000 and 19092;
    a port that is taken is replaced by a free one (the proxy needs 4 consecutive ports)."""
    want_catalog = _wanted("catalog", catalog, DEFAULT_CATALOG_PORT)
    want_s3 = _wanted("s3", s3, DEFAULT_S3_PORT)
    want_proxy = _wanted("proxy", proxy, DEFAULT_PROXY_PORT)
    moved: list[str] = []
    proxy_block = set(range(want_proxy, want_proxy + PROXY_PORTS))
    if not all(port_is_free(port) for port in proxy_block):
        want_proxy = free_port_block(PROXY_PORTS)
        proxy_block = set(range(want_proxy, want_proxy + PROXY_PORTS))
        moved.append("proxy")
    taken = set(proxy_block)
    if want_catalog in taken or not port_is_free(want_catalog):
        want_catalog = free_ports(1, exclude=taken)[0]
        moved.append("catalog")
    taken.add(want_catalog)
    if want_s3 in taken or not port_is_free(want_s3):
        want_s3 = free_ports(1, exclude=taken)[0]
        moved.append("s3")
    return QuickstartPorts(want_catalog, want_s3, want_proxy, tuple(moved))


def quickstart_config(
    kafka_bootstrap: str, topic: str, ports: QuickstartPorts, workdir: Path
) -> dict[str, Any]:
    """The config as a mapping: the ``isk`` service, the ``ksi`` virtual cluster serving
    ``topic`` and the ``lake:`` section, with all state under ``workdir``."""
    lake = workdir / "lake"
    isk = workdir / "isk"
    return {
        "virtual_clusters": [
            {
                "name": "ksi",
                "target": {"bootstrap": kafka_bootstrap},
                "gateway": {
                    "host": "127.0.0.1",
                    "port": ports.proxy,
                    # The stack's single broker has node id 1; ports cover node ids 0, 1 and 2.
                    "lowest_broker_id": 0,
                    "broker_count": PROXY_PORTS - 1,
                },
                "filters": [
                    {
                        "type": "ksi",
                        "config": {
                            "topics": [topic],
                            "read_ahead_segments": 2,
                            "cache_max_bytes": 268_435_456,
                        },
                    }
                ],
            }
        ],
        "services": [
            {
                "type": "isk",
                "config": {
                    "cluster": "local",
                    "kafka_bootstrap": kafka_bootstrap,
                    "chunk_records": 100_000,
                    "http": {
                        "catalog_host": "127.0.0.1",
                        "catalog_port": ports.catalog,
                        "s3_host": "127.0.0.1",
                        "s3_port": ports.s3,
                        "region": "us-east-1",
                        "bucket": "bergstream",
                        "access_key": ISK_ACCESS_KEY,
                        "secret_key": ISK_SECRET_KEY,
                    },
                    "index": {"type": "sqlite", "config": {"path": str(isk / "index.sqlite")}},
                    "cache": {
                        "type": "local",
                        "config": {"directory": str(isk / "cache"), "max_bytes": 2 * 1024**3},
                    },
                },
            }
        ],
        "lake": {
            "kafka_bootstrap": kafka_bootstrap,
            "namespace": "coldset",
            "catalog": {
                "type": "sql",
                "uri": f"sqlite:///{lake / 'catalog.db'}",
                "warehouse": str(lake / "warehouse"),
            },
            "pipeline": {
                "checkpoint_dir": str(lake / "checkpoints"),
                # Small on purpose: the quickstart runs on a laptop next to Kafka and ISK.
                "spark_conf": {
                    "spark.driver.memory": "1g",
                    "spark.sql.shuffle.partitions": "2",
                },
            },
        },
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` as YAML to ``path`` (with a header saying how to run it)."""
    header = (
        "# Written by `bergstream quickstart`: ISK (Iceberg REST catalog + S3 gateway), a KSI\n"
        "# virtual cluster and the lake the pipeline fills. Run it yourself with\n"
        f"#   bergstream run -c {path}\n"
        "# Every key is in docs/configuration.md.\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path
