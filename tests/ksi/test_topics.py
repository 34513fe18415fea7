"""Which topics KSI serves: every topic with a table by default, listed names, glob patterns;
tables appearing later, the namespace listing cached, a failing catalog reported per topic."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bergstream.plugins.ksi_fetch_filter.coldset import ColdsetError
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.store import ColdStore
from bergstream.plugins.ksi_fetch_filter.topics import RETRY_SECONDS, ServedTopics
from tests.kits.coldset_tables import make_lake, make_record, write_cold

LOG = logging.getLogger("tests.ksi.topics")


class Namespace:
    """A fake namespace listing: its table names, how often it was listed, and an outage."""

    def __init__(self, *tables: str) -> None:
        self.tables = set(tables)
        self.calls = 0
        self.down: str | None = None

    async def list_tables(self) -> set[str]:
        self.calls += 1
        await asyncio.sleep(0)
        if self.down is not None:
            raise ColdsetError(self.down)
        return set(self.tables)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _served(namespace: Namespace, clock: Clock, **settings: Any) -> ServedTopics:
    return ServedTopics(KsiConfig(**settings), namespace.list_tables, clock=clock)


async def test_by_default_every_topic_with_a_table_is_served() -> None:
    namespace, clock = Namespace("orders", "payments"), Clock()
    topics = _served(namespace, clock)
    served = await topics.resolve(["orders", "clicks"], LOG)
    assert served.tables == {"orders": "orders"} and served.failed == {}
    assert not served.covers("clicks")  # no table: plain pass-through
    assert namespace.calls == 1
    served = await topics.resolve(["orders", "payments", "clicks"], LOG)
    assert served.tables == {"orders": "orders", "payments": "payments"}
    assert namespace.calls == 1  # the listing is reused within namespace_refresh_seconds


async def test_a_served_topic_never_asks_the_catalog_again() -> None:
    namespace, clock = Namespace("orders"), Clock()
    topics = _served(namespace, clock, namespace_refresh_seconds=1)
    await topics.resolve(["orders"], LOG)
    for _ in range(5):
        clock.now += 10
        assert (await topics.resolve(["orders"], LOG)).tables == {"orders": "orders"}
    assert namespace.calls == 1


async def test_a_table_created_later_is_served_after_the_refresh_interval() -> None:
    namespace, clock = Namespace(), Clock()
    topics = _served(namespace, clock, namespace_refresh_seconds=5)
    assert (await topics.resolve(["orders"], LOG)).tables == {}
    namespace.tables.add("orders")
    clock.now += 4
    assert (await topics.resolve(["orders"], LOG)).tables == {}  # within the interval
    assert namespace.calls == 1
    clock.now += 1
    assert (await topics.resolve(["orders"], LOG)).tables == {"orders": "orders"}
    assert namespace.calls == 2


async def test_a_table_less_topic_costs_one_listing_per_interval() -> None:
    namespace, clock = Namespace("orders"), Clock()
    topics = _served(namespace, clock, namespace_refresh_seconds=5)
    for _ in range(50):
        assert (await topics.resolve(["clicks"], LOG)).tables == {}
        clock.now += 0.5
    assert namespace.calls == 5


async def test_concurrent_misses_share_one_listing() -> None:
    namespace, clock = Namespace("a", "b"), Clock()
    topics = _served(namespace, clock)
    results = await asyncio.gather(*(topics.resolve([name], LOG) for name in "abcab"))
    assert [r.tables for r in results] == [{"a": "a"}, {"b": "b"}, {}, {"a": "a"}, {"b": "b"}]
    assert namespace.calls == 1


async def test_listed_names_are_served_without_listing_the_namespace() -> None:
    namespace, clock = Namespace("orders", "clicks"), Clock()
    namespace.down = "must not be asked"
    topics = _served(namespace, clock, topics=["orders", {"topic": "audit", "table": "audit_v2"}])
    served = await topics.resolve(["orders", "audit", "clicks"], LOG)
    assert served.tables == {"orders": "orders", "audit": "audit_v2"}
    assert served.failed == {} and namespace.calls == 0


async def test_patterns_select_topics_that_have_a_table() -> None:
    namespace, clock = Namespace("orders-eu", "orders-us", "orders", "logs-1"), Clock()
    topics = _served(namespace, clock, topics=["orders-*", "logs-[0-9]", "audit"])
    served = await topics.resolve(["orders-eu", "orders-apac", "orders", "logs-1", "audit"], LOG)
    assert served.tables == {"orders-eu": "orders-eu", "logs-1": "logs-1", "audit": "audit"}
    calls = namespace.calls
    clock.now += 3600
    await topics.resolve(["orders", "payments"], LOG)  # matching no pattern: no listing
    assert namespace.calls == calls
    assert topics.matches("orders-x") and not topics.matches("Orders-x")  # case-sensitive


async def test_a_failing_catalog_reports_unknown_topics_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    namespace, clock = Namespace("orders", "payments"), Clock()
    topics = _served(namespace, clock, namespace_refresh_seconds=5)
    await topics.resolve(["orders"], LOG)
    namespace.down = "catalog unreachable"
    clock.now += 10
    with caplog.at_level(logging.INFO, logger=LOG.name):
        served = await topics.resolve(["orders", "clicks"], LOG)
        # a served topic stays served; another may have a table: guarded, not skipped
        assert served.tables == {"orders": "orders"}
        assert list(served.failed) == ["clicks"] and served.covers("clicks")
        assert "catalog unreachable" in served.failed["clicks"]
        # a topic the last good listing holds is served (its reads fail on their own)
        assert (await topics.resolve(["payments"], LOG)).tables == {"payments": "payments"}
        clock.now += RETRY_SECONDS / 2
        assert list((await topics.resolve(["clicks"], LOG)).failed) == ["clicks"]
        assert namespace.calls == 2  # failing fast, no catalog storm
        clock.now += RETRY_SECONDS
        await topics.resolve(["clicks"], LOG)
        assert namespace.calls == 3
        namespace.down = None
        namespace.tables.add("clicks")
        clock.now += RETRY_SECONDS
        served = await topics.resolve(["clicks"], LOG)
    assert served.tables == {"clicks": "clicks"} and served.failed == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per outage
    assert "listed again" in caplog.text and "serving topic clicks" in caplog.text


def test_topics_are_optional_and_take_names_patterns_or_mappings() -> None:
    assert KsiConfig().topics is None
    assert KsiConfig().patterns() == ["*"] and KsiConfig().table_of() == {}
    config = KsiConfig(topics=["a", "b-*", {"topic": "c", "table": "c_cold"}])
    assert config.table_of() == {"a": "a", "c": "c_cold"}
    assert config.patterns() == ["b-*"]
    with pytest.raises(ValidationError, match="takes no table"):
        KsiConfig(topics=[{"topic": "b-*", "table": "b"}])
    with pytest.raises(ValidationError, match="at least 1"):
        KsiConfig(topics=[])
    with pytest.raises(ValidationError, match="listed twice"):
        KsiConfig(topics=["b-*", "b-*"])


def test_the_store_lists_the_tables_of_the_namespace(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    store = ColdStore(lake, KsiConfig())
    try:
        assert store.table_names() == set()  # no namespace yet
        write_cold(lake, "orders", [(0, 0, make_record(0))], {0: 1})
        assert store.table_names() == {"orders"}
        assert store.table("orders") is None
        cold = store.open_table("orders", "orders")
        assert store.open_table("orders", "orders") is cold and store.table("orders") is cold
        assert cold.boundary(0) == 1
    finally:
        store.close()


def test_an_unreachable_catalog_cannot_list(tmp_path: Path) -> None:
    def broken(_: object) -> object:
        raise OSError("connection refused")

    store = ColdStore(make_lake(tmp_path), KsiConfig(), catalog_factory=broken)  # type: ignore[arg-type]
    try:
        with pytest.raises(ColdsetError, match="connection refused"):
            store.table_names()
    finally:
        store.close()
