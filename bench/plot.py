#!/usr/bin/env python3
"""Plots and a summary table of the deploy benchmark's results (bench/deploy.py) for docs/performance.md.

  bench/plot.py [--results .cache/bench/deploy/results.json] [--out docs/performance]

Writes deploy-wall.png (wall time against N: first converge and no-op rerun of the full GPU-node play, and the
node_exporter-only baseline), deploy-controller.png (controller CPU seconds and peak RSS against N), and prints a
Markdown table with min / median / max over the runs of each (N, play, connection).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def groups(results: list[dict]) -> dict[tuple, list[dict]]:
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for record in results:
        if "rerun" in record and record["converge"]["rc"] == 0 and record["rerun"]["rc"] == 0:
            grouped[(record["connection"], record["play"], record["nodes"])].append(record)
    return grouped


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return "%g" % values[0]
    return "%g / %g / %g" % (min(values), statistics.median(values), max(values))


def table(grouped: dict[tuple, list[dict]]) -> str:
    rows = ["| connection | play | N | runs | first converge s | no-op rerun s | rerun ratio | tasks/host |"
            " changed on rerun | controller CPU s (converge) | peak RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (connection, play, nodes), records in sorted(grouped.items()):
        rows.append("| %s | %s | %d | %d | %s | %s | %s | %d | %d | %s | %s |" % (
            connection, play, nodes, len(records),
            spread([r["converge"]["wall_s"] for r in records]),
            spread([r["rerun"]["wall_s"] for r in records]),
            spread([r["rerun_ratio"] for r in records]),
            max(r["converge"]["tasks_per_host"] for r in records),
            max(r["rerun"]["changed"] for r in records),
            spread([r["converge"]["cpu_s"] for r in records]),
            spread([max(r["converge"]["peak_rss_mib"], r["rerun"]["peak_rss_mib"]) for r in records])))
    return "\n".join(rows)


def plot(grouped: dict[tuple, list[dict]], out: Path) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("bench/plot.py: matplotlib is missing: make setup installs it (requirements-dev.txt)")
    out.mkdir(parents=True, exist_ok=True)
    series: dict[tuple, list[tuple]] = defaultdict(list)
    for (connection, play, nodes), records in grouped.items():
        series[(connection, play)].append((nodes, records))
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for (connection, play), points in sorted(series.items()):
        points.sort()
        xs = [n for n, _ in points]
        for phase, style in (("converge", "-o"), ("rerun", "--s")):
            ys = [statistics.median(r[phase]["wall_s"] for r in records) for _, records in points]
            lows = [min(r[phase]["wall_s"] for r in records) for _, records in points]
            highs = [max(r[phase]["wall_s"] for r in records) for _, records in points]
            ax.errorbar(xs, ys, yerr=[[y - lo for y, lo in zip(ys, lows)], [hi - y for y, hi in zip(ys, highs)]],
                        fmt=style, capsize=3, label="%s %s (%s)" % (play, "first converge" if phase == "converge"
                                                                   else "no-op rerun", connection))
    every_n = sorted({n for points in series.values() for n, _ in points})
    ax.set_xticks(every_n)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GPU nodes (N)")
    ax.set_ylabel("wall time, s (median; bars: min-max)")
    ax.set_title("Deploy wall time against the number of GPU nodes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "deploy-wall.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(path)

    fig, (cpu_ax, rss_ax) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=110)
    for (connection, play), points in sorted(series.items()):
        points.sort()
        xs = [n for n, _ in points]
        cpu_ax.plot(xs, [statistics.median(r["converge"]["cpu_s"] / n for r in records) for n, records in points],
                    "-o", label="%s (%s)" % (play, connection))
        rss_ax.plot(xs, [statistics.median(max(r["converge"]["peak_rss_mib"], r["rerun"]["peak_rss_mib"])
                                           for r in records) for _, records in points],
                    "-o", label="%s (%s)" % (play, connection))
    cpu_ax.set_title("Controller CPU per GPU node (first converge)")
    cpu_ax.set_xlabel("GPU nodes (N)")
    cpu_ax.set_ylabel("CPU s per node")
    rss_ax.set_title("Controller peak RSS")
    rss_ax.set_xlabel("GPU nodes (N)")
    rss_ax.set_ylabel("MiB")
    for axis in (cpu_ax, rss_ax):
        axis.set_xticks(every_n)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    path = out / "deploy-controller.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=REPO / ".cache" / "bench" / "deploy" / "results.json")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "performance")
    parser.add_argument("--no-png", action="store_true")
    args = parser.parse_args()
    if not args.results.exists():
        sys.exit("bench/plot.py: no results at %s: run bench/deploy.py (make bench-deploy) first" % args.results)
    grouped = groups(json.loads(args.results.read_text()))
    if not grouped:
        sys.exit("bench/plot.py: %s holds no complete run" % args.results)
    print(table(grouped))
    if not args.no_png:
        for path in plot(grouped, args.out):
            print("wrote %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
