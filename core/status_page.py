"""The status page of a process (``GET /`` and ``GET /status.json`` on its metrics endpoint):
sections that services give (tables of figures, facts, and line charts of the last hour), drawn
as one self-contained HTML page (inline CSS, charts as inline SVG: no script, no other request).

A service takes part by an ``async status_sections(authorization)`` method returning
:class:`StatusSection`\\ s for the request's ``Authorization`` header; it raises
:class:`StatusUnauthorized` when it keeps principals and the header names none of them, and the
page then answers 401 with a Basic challenge (``docs/hooks.md``, *Services*).
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "StatusChart",
    "StatusSection",
    "StatusTable",
    "StatusUnauthorized",
    "render_page",
    "status_json",
]


class StatusUnauthorized(Exception):
    """The request's credentials name no principal the service knows."""


@dataclass(frozen=True)
class StatusTable:
    """A table of figures: ``columns`` and one tuple per row."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    note: str = ""


@dataclass(frozen=True)
class StatusChart:
    """Lines over time: each series a list of ``(unix seconds, value)`` points."""

    title: str
    unit: str
    series: Mapping[str, Sequence[tuple[float, float]]]


@dataclass(frozen=True)
class StatusSection:
    """What one service shows: facts (name, value), tables and charts."""

    title: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    tables: list[StatusTable] = field(default_factory=list)
    charts: list[StatusChart] = field(default_factory=list)


def status_json(sections: Sequence[StatusSection], generated: float) -> dict[str, Any]:
    """The sections as ``GET /status.json`` gives them."""
    return {"generated": generated, "sections": [asdict(section) for section in sections]}


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2330;background:#fafbfc}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.15rem;margin:1.6rem 0 .4rem}
h3{font-size:1rem;margin:1rem 0 .3rem}.when{color:#667;font-size:.85rem}
table{border-collapse:collapse;margin:.2rem 0 .6rem;font-size:.85rem;background:#fff}
th,td{border:1px solid #d6dbe3;padding:.25rem .55rem;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#eef1f6}
dl{display:grid;grid-template-columns:max-content auto;gap:.15rem .8rem;font-size:.9rem}
dt{color:#556}dd{margin:0}.note{color:#667;font-size:.8rem}
.charts{display:flex;flex-wrap:wrap;gap:1rem}figure{margin:0;background:#fff;
border:1px solid #d6dbe3;padding:.4rem}figcaption{font-size:.85rem;margin-bottom:.2rem}
"""

_COLORS = ("#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c")


def render_page(title: str, sections: Sequence[StatusSection], generated: float) -> bytes:
    """The whole page, refreshing itself every 30 s."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(generated))
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        '<meta http-equiv="refresh" content="30">',
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1><div class=when>as of {stamp}; refreshes every 30 s; "
        '<a href="status.json">JSON</a> · <a href="metrics">metrics</a> · '
        '<a href="readyz">readiness</a></div>',
    ]
    if not sections:
        parts.append("<p>This process has no service that reports a status.</p>")
    for section in sections:
        parts.append(f"<section><h2>{_e(section.title)}</h2>")
        if section.facts:
            parts.append("<dl>")
            for name, value in section.facts.items():
                parts.append(f"<dt>{_e(name)}</dt><dd>{_e(_text(value))}</dd>")
            parts.append("</dl>")
        if section.charts:
            parts.append("<div class=charts>")
            parts.extend(_chart(chart) for chart in section.charts)
            parts.append("</div>")
        parts.extend(_table(table) for table in section.tables)
        parts.append("</section>")
    parts.append("</body></html>")
    return "".join(parts).encode()


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _table(table: StatusTable) -> str:
    head = "".join(f"<th>{_e(column)}</th>" for column in table.columns)
    body = []
    for row in table.rows:
        cells = "".join(
            f'<td class="n">{_e(_text(v))}</td>'
            if isinstance(v, int | float) and not isinstance(v, bool)
            else f"<td>{_e(_text(v))}</td>"
            for v in row
        )
        body.append(f"<tr>{cells}</tr>")
    if not table.rows:
        body.append(f'<tr><td colspan="{len(table.columns)}">none</td></tr>')
    note = f"<div class=note>{_e(table.note)}</div>" if table.note else ""
    return (
        f"<h3>{_e(table.title)}</h3><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>{note}"
    )


def _chart(chart: StatusChart, width: int = 460, height: int = 150, window: float = 3600.0) -> str:
    points = [p for series in chart.series.values() for p in series]
    caption = f"<figcaption>{_e(chart.title)} ({_e(chart.unit)})</figcaption>"
    if not points:
        return f"<figure>{caption}<div class=note>no samples yet</div></figure>"
    t1 = max(p[0] for p in points)
    span = max(t1 - min(p[0] for p in points), window)  # the last hour, or longer
    t0 = t1 - span
    top = max(max(p[1] for p in points), 1e-9)
    left, bottom = 44, height - 18

    def xy(t: float, v: float) -> str:
        x = left + (t - t0) / span * (width - left - 6)
        y = bottom - v / top * (bottom - 8)
        return f"{x:.1f},{y:.1f}"

    lines = []
    legend = []
    for index, (name, series) in enumerate(sorted(chart.series.items())):
        color = _COLORS[index % len(_COLORS)]
        path = " ".join(xy(t, v) for t, v in series)
        lines.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{path}">'
            f"<title>{_e(name)}</title></polyline>"
        )
        x, y = xy(*series[-1]).split(",") if series else ("0", "0")
        if series:  # the latest point, visible even when it is the only one
            lines.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>')
        legend.append(f'<span style="color:{color}">&#9632; {_e(name)}</span>')
    minutes = max(round(span / 60), 1)
    svg = (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{_e(chart.title)}">'
        f'<line x1="{left}" y1="{bottom}" x2="{width - 4}" y2="{bottom}" stroke="#99a"/>'
        f'<line x1="{left}" y1="6" x2="{left}" y2="{bottom}" stroke="#99a"/>'
        f'<text x="{left - 4}" y="12" font-size="10" text-anchor="end">{_e(_text(top))}</text>'
        f'<text x="{left - 4}" y="{bottom}" font-size="10" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 4}" font-size="10">-{minutes} min</text>'
        f'<text x="{width - 4}" y="{height - 4}" font-size="10" text-anchor="end">now</text>'
        + "".join(lines)
        + "</svg>"
    )
    return f"<figure>{caption}{svg}<div class=note>{' '.join(legend)}</div></figure>"
