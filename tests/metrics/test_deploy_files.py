"""``deploy/``: the Prometheus alert rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``), and every metric the rules and the Grafana dashboard name is one the
code defines."""

from __future__ import annotations

import importlib
import json
import re
import subprocess

from prometheus_client import REGISTRY

from tests.metrics.deploy_files import DASHBOARD, DEPLOY, RULES, dashboard_exprs, rule_exprs
from tests.metrics.prometheus_server import PROMTOOL, require

#: Every module that defines metrics (on the default registry, as it imports).
METRIC_MODULES = (
    "bergstream.core.metrics",
    "bergstream.pipeline.metrics",
    "bergstream.plugins.isk_gateway.metrics",
    "bergstream.plugins.isk_gateway.kafka.reader",
    "bergstream.plugins.ksi_fetch_filter.metrics",
)
#: Series bergstream does not define: Prometheus' own and prometheus_client's process metrics.
NOT_OURS = re.compile(r"^(up|process_\w+|python_\w+)$")
#: The readiness gauges the metrics endpoint adds at each scrape (core/metrics_http.py).
READINESS = {"bergstream_ready", "bergstream_dependency_up"}


def defined_series() -> set[str]:
    """Every series name the code can expose (a counter's ``_total``, a histogram's ``_bucket``,
    ``_sum`` and ``_count``, ...)."""
    for module in METRIC_MODULES:
        importlib.import_module(module)
    names = set(READINESS)
    for family in REGISTRY.collect():
        names.add(family.name)
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"),
        }.get(family.type, ())
        names.update(family.name + suffix for suffix in suffixes)
    return names


#: PromQL words that are not metrics.
_PROMQL = {
    "by",
    "on",
    "without",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "topk",
    "bottomk",
    "rate",
    "increase",
    "deriv",
    "irate",
    "delta",
    "histogram_quantile",
    "time",
    "abs",
    "absent",
}


def series_in(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers that call nothing, outside label
    matchers, strings, grouping clauses and durations, and that are no PromQL word."""
    text = re.sub(r'"[^"]*"', "", re.sub(r"\{[^}]*\}", "", expr))
    text = re.sub(r"\b(?:by|on|without|ignoring)\s*\([^)]*\)", "", text)
    names = set()
    for found in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        before = text[found.start() - 1] if found.start() else " "
        after = text[found.end() :].lstrip()[:1]
        if before.isdigit() or after == "(" or found.group() in _PROMQL:
            continue
        names.add(found.group())
    return names


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [require(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_the_rules_unit_tests_pass() -> None:
    done = subprocess.run(
        [require(PROMTOOL), "test", "rules", "prometheus-rules.test.yaml"],
        capture_output=True,
        text=True,
        cwd=DEPLOY,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_the_rules_and_the_dashboard_read_is_defined() -> None:
    defined = defined_series()
    exprs = rule_exprs() + dashboard_exprs()
    assert len(exprs) > 30
    read = set().union(*(series_in(expr) for expr in exprs))
    ours = {name for name in read if not NOT_OURS.match(name)}
    assert ours, read
    assert ours - defined == set(), f"not defined by the code: {sorted(ours - defined)}"
    # And every family of ours is on the dashboard or in a rule.
    families = {f.name for f in REGISTRY.collect() if f.name.startswith("bergstream_")}
    unread = {name for name in families | READINESS if not any(r.startswith(name) for r in ours)}
    assert unread == set(), f"no rule or panel reads {sorted(unread)}"


def test_the_expression_reader_sees_metrics_only() -> None:
    assert series_in(
        'sum by (topic, le) (rate(bergstream_pipeline_batch_seconds_bucket{job="x"}[15m]))'
    ) == {"bergstream_pipeline_batch_seconds_bucket"}
    assert series_in("time() - bergstream_pipeline_last_commit_timestamp_seconds > 900") == {
        "bergstream_pipeline_last_commit_timestamp_seconds"
    }


def test_the_dashboard_is_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "bergstream" and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
