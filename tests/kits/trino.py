"""Trino catalogs on an ISK gateway (on the session's one Trino: the ``trino`` fixture of
tests/conftest.py): ``CREATE CATALOG`` with only what a user's catalog has."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from bergstream.devstack.stack.trino import TrinoServer, iceberg_rest_catalog_sql
from tests.kits.isk_gateway import Gateway


@dataclass
class TrinoCatalog:
    """A Trino catalog (``name``) on an ISK gateway."""

    trino: TrinoServer
    gateway: Gateway
    name: str

    def table(self, namespace: str, topic: str, suffix: str = "") -> str:
        """The quoted name of ``namespace.topic`` (``suffix``: ``$snapshots`` etc.)."""
        return f'{self.name}.{namespace}."{topic}{suffix}"'


def create_catalog(trino: TrinoServer, gateway: Gateway) -> TrinoCatalog:
    """``CREATE CATALOG`` on ``gateway`` with only the REST catalog's URI, vended credentials
    and the S3 endpoint, region and path-style settings."""
    name = f"isk_{uuid.uuid4().hex[:8]}"
    trino.query(iceberg_rest_catalog_sql(name, gateway.catalog_url, gateway.s3_url))
    return TrinoCatalog(trino, gateway, name)
