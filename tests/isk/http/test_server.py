"""IskHttpConfig validation and IskHttpService lifecycle."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest
from pydantic import ValidationError

from bergstream.core.service import Service
from bergstream.plugins.isk_gateway.http.server import IskHttpConfig, IskHttpService
from tests.kits.isk_http_fakes import ACCESS_KEY, SECRET_KEY, FakeProvider

BASE = {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}


def test_config_defaults() -> None:
    config = IskHttpConfig(**BASE)
    assert (config.catalog_host, config.catalog_port) == ("127.0.0.1", 18181)
    assert (config.s3_host, config.s3_port) == ("127.0.0.1", 19000)
    assert (config.region, config.bucket, config.prefix) == ("us-east-1", "bergstream", None)
    assert config.client_id is None and config.client_secret is None
    assert SECRET_KEY not in repr(config)


@pytest.mark.parametrize(
    "bad",
    [
        {"client_id": "only-id"},
        {"bucket": "Bad_Bucket"},
        {"prefix": "a/b"},
        {"s3_public_endpoint": "ftp://x"},
        {"catalog_port": 70000},
        {"unknown": 1},
    ],
)
def test_config_rejects(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        IskHttpConfig(**BASE, **bad)


async def test_service_lifecycle(provider: FakeProvider) -> None:
    config = IskHttpConfig(
        **BASE, catalog_port=0, s3_port=0, s3_public_endpoint="https://s3.example.com/"
    )
    service: Service = IskHttpService(config, provider)
    assert service.name == "isk-http"
    await service.start()
    try:
        assert isinstance(service, IskHttpService) and service.catalog_url and service.s3_url
        assert service.catalog_url != service.s3_url
        url = f"{service.catalog_url}/v1/namespaces/hotset/tables/orders"

        def load() -> Any:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)

        body = await asyncio.to_thread(load)
        assert body["config"]["s3.endpoint"] == "https://s3.example.com"
    finally:
        await service.stop()
        await service.stop()
