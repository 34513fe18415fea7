"""Scraping a Prometheus endpoint in tests: text exposition format to samples, and the JSON
of ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: (sample name, sorted label items) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Samples:
    """Every sample of an exposition text."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for item in family.samples:
            out[(item.name, tuple(sorted(item.labels.items())))] = item.value
    return out


def scrape(url: str) -> Samples:
    """GET ``url`` and parse it."""
    with urllib.request.urlopen(url, timeout=30) as response:
        return parse_metrics(response.read().decode())


def sample(samples: Samples, name: str, labels: Mapping[str, str]) -> float:
    """The value of one sample (0 when absent, as a counter not yet counted)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every sample whose labels include ``labels``."""
    return sum(
        value
        for (found, items), value in samples.items()
        if found == name and all((k, v) in items for k, v in labels.items())
    )


def get_json(url: str) -> tuple[int, dict[str, Any]]:
    """GET ``url``: its status and JSON body, whatever the status (``/readyz`` answers 503)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
