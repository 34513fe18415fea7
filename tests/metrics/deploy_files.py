"""deploy/'s files as the tests read them: the alert rules and the dashboard's queries."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus-rules.yaml"
DASHBOARD = DEPLOY / "grafana-dashboard.json"


def rule_exprs() -> list[str]:
    """The expression of every alert rule."""
    rules = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    """The query of every dashboard panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", ())]
