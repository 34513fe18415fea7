"""The plots of ``docs/scaling.md``, drawn from the JSON the scale benches print on their last line.

Each input is a file holding one bench's output (its last line is read):

- ``--catalog``: ``bench/isk_catalog_scale.py`` (LoadTable, ListTables, idle memory, index size
  against topics);
- ``--ksi``: ``bench/ksi_partitions.py`` (Fetch latency and proxy CPU against partitions);
- ``--load``: one or more ``bench/isk_load.py`` runs at different ``--clients`` (queries/s, CPU
  per query against clients);
- ``--pipeline``: one or more ``bench/pipeline_many_topics.py`` runs at different ``--topics``
  (records/s against topics, one topic of the same records beside).

Writes one PNG per input kind into ``--out`` (default ``docs/scaling``). Needs matplotlib (the
``bench`` extra: ``pip install -e '.[bench]'``).

    .venv/bin/python bench/scaling_plots.py --catalog catalog.json --ksi ksi.json \\
        --load load-4.json load-16.json --pipeline pipeline-10.json pipeline-50.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def last_json(path: Path) -> dict[str, Any]:
    """The JSON object on the last line of ``path`` that holds one."""
    for line in reversed(path.read_text().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"{path}: no JSON line (is it a bench's output?)")


def _axes(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, which="both", alpha=0.3)
    return figure, axes


def _save(figure: Any, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path)
    print(f"wrote {path}")


def plot_catalog(data: dict[str, Any], out: Path) -> None:
    """LoadTable (first and again) and ListTables against topics; idle memory on the right."""
    rows = sorted(data["counts"], key=lambda r: r["topics"])  # a list, one row per count
    counts = [r["topics"] for r in rows]
    figure, axes = _axes(f"ISK catalog ({data.get('log', 'fake')} log)", "topics", "milliseconds")
    axes.set_xscale("log")
    axes.plot(counts, [r["load_first_ms"] for r in rows], "o-", label="LoadTable, first")
    axes.plot(counts, [r["load_again_ms"] for r in rows], "s-", label="LoadTable, again")
    axes.plot(counts, [r["list_ms"] for r in rows], "^-", label="ListTables (all pages)")
    axes.set_yscale("symlog", linthresh=1.0)  # ListTables takes well under a millisecond
    memory = axes.twinx()
    memory.plot(counts, [r["idle_topic_kb"] for r in rows], "d--", color="grey")
    memory.set_ylabel("KB per idle topic (dashed)")
    axes.legend(loc="upper left")
    _save(figure, out / "isk_catalog.png")


def plot_ksi(data: dict[str, Any], out: Path) -> None:
    """Fetch latency (median) and the proxy's CPU per request against partitions."""
    counts = sorted(int(c) for c in data["counts"])
    figure, axes = _axes("KSI Fetch naming many partitions", "partitions", "milliseconds")
    axes.set_xscale("log")
    axes.set_yscale("log")
    for kind, marker in (("replay", "o-"), ("caught_up", "s-")):
        rows = [data["counts"][str(c)][kind] for c in counts]
        axes.plot(counts, [r["median_ms"] for r in rows], marker, label=f"{kind}: median latency")
        axes.plot(
            counts,
            [r["proxy_cpu_ms_per_request"] for r in rows],
            marker.replace("-", "--"),
            label=f"{kind}: proxy CPU per request",
        )
    axes.legend()
    _save(figure, out / "ksi_partitions.png")


def plot_load(runs: list[dict[str, Any]], out: Path) -> None:
    """Queries/s and ISK's CPU per query against clients (one client from every run, averaged)."""
    points: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        points.setdefault(1, []).append(run["single"])
        points.setdefault(int(run["concurrent"]["clients"]), []).append(run["concurrent"])
    clients = sorted(points)

    def mean(key: str, at: int) -> float:
        return sum(p[key] for p in points[at]) / len(points[at])

    figure, axes = _axes("ISK under concurrent clients (2 cores)", "clients", "queries/s")
    axes.plot(clients, [mean("queries_s", c) for c in clients], "o-", label="queries/s")
    cpu = axes.twinx()
    cpu.plot(clients, [mean("isk_cpu_per_query_s", c) for c in clients], "s--", color="grey")
    cpu.set_ylabel("ISK CPU s per query (dashed)")
    axes.legend(loc="upper left")
    _save(figure, out / "isk_load.png")


def plot_pipeline(runs: list[dict[str, Any]], out: Path) -> None:
    """Records/s of one application against topics, one topic of the same records beside."""
    runs = sorted(runs, key=lambda r: r["topics"])
    topics = [r["topics"] for r in runs]
    figure, axes = _axes("One pipeline, many topics (local[2])", "topics", "records/s")
    axes.plot(topics, [r["many_records_s"] for r in runs], "o-", label="topics in one run")
    axes.plot(topics, [r["one_records_s"] for r in runs], "s--", label="one topic, same records")
    axes.set_ylim(bottom=0)
    axes.legend()
    _save(figure, out / "pipeline_topics.png")


def main() -> None:
    """Read the benches' outputs and write the plots."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", type=Path)
    parser.add_argument("--ksi", type=Path)
    parser.add_argument("--load", type=Path, nargs="*", default=[])
    parser.add_argument("--pipeline", type=Path, nargs="*", default=[])
    parser.add_argument("--out", type=Path, default=Path("docs/scaling"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.catalog:
        plot_catalog(last_json(args.catalog), args.out)
    if args.ksi:
        plot_ksi(last_json(args.ksi), args.out)
    if args.load:
        plot_load([last_json(p) for p in args.load], args.out)
    if args.pipeline:
        plot_pipeline([last_json(p) for p in args.pipeline], args.out)


if __name__ == "__main__":
    main()
