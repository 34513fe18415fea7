"""Fixtures: the fake provider and running ISK HTTP services (see
:mod:`tests.kits.isk_http_fakes`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.kits.isk_http_fakes import FakeProvider, RunningService


@pytest.fixture(scope="module")
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture(scope="module")
def isk(provider: FakeProvider) -> Iterator[RunningService]:
    running = RunningService(provider)
    yield running
    running.close()


@pytest.fixture
def make_isk(provider: FakeProvider) -> Iterator[Callable[..., RunningService]]:
    started: list[RunningService] = []

    def make(**config: Any) -> RunningService:
        running = RunningService(provider, **config)
        started.append(running)
        return running

    yield make
    for running in started:
        running.close()


@pytest.fixture
def outage(provider: FakeProvider) -> Iterator[FakeProvider]:
    provider.unavailable = True
    yield provider
    provider.unavailable = False
