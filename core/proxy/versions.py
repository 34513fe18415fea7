"""Which Kafka API keys and versions the proxy's codec (kio) knows, and their header versions.

Everything here is read from kio's schema index; schema modules are imported lazily, one
(api key, version) at a time, and the answers are cached.
"""

from __future__ import annotations

from functools import cache
from types import MappingProxyType
from typing import Final

from kio.index import load_request_schema
from kio.schema.index import api_key_map, schema_name_map

from bergstream.core.kafka_wire.api_keys import ApiKey

#: api key -> (lowest, highest) version kio can decode and encode.
KIO_VERSIONS: Final[MappingProxyType[int, tuple[int, int]]] = MappingProxyType(
    {
        key: (min(schema_name_map[name]), max(schema_name_map[name]))
        for key, name in api_key_map.items()
    }
)


def api_name(api_key: int) -> str:
    """kio's name of an API (``fetch``, ``metadata``, ...) or ``api-<key>`` if it is unknown."""
    return api_key_map.get(api_key, f"api-{api_key}")


def is_supported(api_key: int, api_version: int) -> bool:
    """True when kio has schemas for this API key and version."""
    bounds = KIO_VERSIONS.get(api_key)
    return bounds is not None and bounds[0] <= api_version <= bounds[1]


@cache
def is_flexible(api_key: int, api_version: int) -> bool | None:
    """Whether the version uses the flexible encoding (tagged fields), or None if unknown.

    Versions above kio's highest are assumed to be flexible if kio's highest is (flexible
    versions never become inflexible again); versions below kio's lowest are not flexible.
    Unknown API keys give None.
    """
    bounds = KIO_VERSIONS.get(api_key)
    if bounds is None:
        return None
    low, high = bounds
    if api_version < low:
        return False
    version = min(api_version, high)
    return bool(load_request_schema(api_key, version).__flexible__)


def request_header_version(api_key: int, api_version: int) -> int | None:
    """Request header version (1 or 2) of a request, or None for an unknown API key."""
    flexible = is_flexible(api_key, api_version)
    if flexible is None:
        return None
    return 2 if flexible else 1


def response_header_version(api_key: int, api_version: int) -> int | None:
    """Response header version (0 or 1); ApiVersions responses always use v0 (KIP-511)."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    flexible = is_flexible(api_key, api_version)
    if flexible is None:
        return None
    return 1 if flexible else 0
