"""``python -m ferry.plot RESULTS.jsonl [MORE.jsonl ...] -o out.png`` (and ``ferry bench --plot
out.png``, which runs this file): draws what ``ferry bench --json`` measured. Two panels,
throughput against request size and against threads, one colour per memory kind: ferry's routes
solid, the ``--compare`` baseline dashed and the ``--ceiling`` copy rate dotted in that colour;
below them, where a baseline was measured, ferry's ratio to it. The ceiling does not set the
scale (one far above the reads would flatten them): it is named at the top edge instead. Needs
matplotlib; lines that are not results (blank, ``error``) are skipped, lines that are not JSON
are an error naming the line."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

Record = Dict[str, Any]


def load(paths: Iterable[str]) -> List[Record]:
    """The result lines of `paths` (JSON lines from ferry bench --json), failed cases left out."""
    records: List[Record] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{number}: not a JSON line ({e.msg})") from None
                if not isinstance(record, dict) or "gbps" not in record or "error" in record:
                    continue
                records.append(record)
    return records


def _size_label(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def _series_name(r: Record) -> str:
    if r.get("case") == "baseline":
        return f"{r['route']} baseline, {r['memory']}"
    if r.get("case") == "ceiling":
        return f"ceiling ({r['route']}), {r['memory']}"
    return f"ferry {r['route']}, {r['memory']}"


def _group(r: Record, other: str, several: bool) -> Tuple[str, Any]:
    """What shares a colour: the memory, and the other axis' value where the results hold
    several. ferry's routes, the baseline and the ceiling of one group differ by line style."""
    return (r["memory"], r[other] if several else None)


def _style(case: Optional[str], route_index: int = 0) -> Dict[str, Any]:
    if case == "baseline":
        return {"linestyle": "--", "marker": "s", "markerfacecolor": "none"}
    if case == "ceiling":
        return {"linestyle": ":", "marker": None, "linewidth": 1.2}
    return {"linestyle": "-", "marker": _ROUTE_MARKERS[route_index % len(_ROUTE_MARKERS)],
            "linewidth": 2}


_ROUTE_MARKERS = ("o", "^", "D", "v", "P")


def _title(records: Sequence[Record]) -> str:
    modes = sorted({r["mode"] for r in records})
    cold = {r.get("cold") for r in records if "cold" in r}
    state = "" if not cold else ", cold" if cold == {True} else ", warm" if cold == {False} else ""
    return f"ferry bench: {', '.join(modes)}{state}"


def _other_label(other: str, value: Any) -> str:
    return f"request size {_size_label(value)}" if other == "io_size" else f"threads {value}"


def figure(records: Sequence[Record], title: Optional[str] = None):
    """The matplotlib Figure of `records`. Its first two axes are throughput against request size
    and against threads; where the results hold a baseline (--compare), two more below them show
    ferry's ratio to it. One colour per memory (and per value of the other axis): ferry solid, its
    baseline dashed, the ceiling dotted in the same colour. The ceiling does not set the scale: one
    above the measured lines is named at the top edge instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError("no results to plot (every line failed, or none was a result)")
    with_ratio = any("ratio" in r for r in records if r.get("case") == "ferry")
    if with_ratio:
        fig, axes = plt.subplots(2, 2, figsize=(13, 7.5), sharex="col",
                                 gridspec_kw={"height_ratios": [3, 1.2]})
        (by_size, by_threads), ratios = axes[0], list(axes[1])
    else:
        fig, (by_size, by_threads) = plt.subplots(1, 2, figsize=(13, 6.5))
        ratios = [None, None]
    colours = plt.get_cmap("tab10").colors
    ferry_routes = sorted({r["route"] for r in records if r.get("case") == "ferry"})
    panels = ((by_size, ratios[0], "io_size", "threads", "request size"),
              (by_threads, ratios[1], "threads", "io_size", "threads"))
    for ax, ratio_ax, x, other, xlabel in panels:
        several = len({r[other] for r in records}) > 1
        groups = sorted({_group(r, other, several) for r in records},
                        key=lambda g: (g[0], g[1] or 0))
        colour_of = {g: colours[i % len(colours)] for i, g in enumerate(groups)}
        lines: Dict[Tuple[Any, ...], List[Record]] = defaultdict(list)
        for r in records:
            g = _group(r, other, several)
            lines[(r.get("case", "ferry"), r["route"], g)].append(r)
        measured = [r["gbps"] for r in records if r.get("case") != "ceiling"] or \
            [r["gbps"] for r in records]
        top = max(measured) * 1.15
        off_scale: List[str] = []
        order = {"ferry": 0, "baseline": 1, "ceiling": 2}
        for (case, route, g), points in sorted(lines.items(), key=lambda kv: (
                groups.index(kv[0][2]), order.get(kv[0][0], 3), kv[0][1])):
            points.sort(key=lambda r: r[x])
            label = _series_name(points[0])
            if g[1] is not None:
                label += f", {_other_label(other, g[1])}"
            style = _style(case, ferry_routes.index(route) if route in ferry_routes else 0)
            xs = [r[x] for r in points]
            ys = [r["gbps"] for r in points]
            colour = colour_of[g]
            if len(xs) == 1 and case == "ceiling":
                ax.axhline(ys[0], label=label, color=colour,
                           **{k: v for k, v in style.items() if k != "marker"})
            else:
                ax.plot(xs, ys, label=label, color=colour, **style)
            if case == "ceiling" and max(ys) > top:
                off_scale.append(f"{label}: {max(ys):.1f} GB/s")
            if ratio_ax is not None and case == "ferry" and any("ratio" in r for r in points):
                rated = [r for r in points if "ratio" in r]
                ratio_ax.plot([r[x] for r in rated], [r["ratio"] for r in rated], color=colour,
                              label=label, **style)
        ax.set_ylim(0, top)
        if off_scale:
            ax.text(0.99, 0.98, "above the scale:\n" + "\n".join(off_scale),
                    transform=ax.transAxes, ha="right", va="top", fontsize="x-small",
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"})
        values = sorted({r[x] for r in records})
        bottom_ax = ratio_ax if ratio_ax is not None else ax
        for a in (ax, ratio_ax):
            if a is None:
                continue
            if x == "io_size":
                a.set_xscale("log", base=2)
            a.set_xticks(values)
            a.grid(True, alpha=0.3)
        if x == "io_size":
            bottom_ax.set_xticklabels([_size_label(v) for v in values], rotation=30)
        bottom_ax.set_xlabel(xlabel)
        ax.set_ylabel("throughput (GB/s)")
        if ratio_ax is not None:
            ratio_ax.axhline(1.0, color="0.4", linewidth=1)
            rated = [r["ratio"] for r in records if r.get("case") == "ferry" and "ratio" in r]
            ratio_ax.set_ylim(0, max(1.25, max(rated) * 1.15))
            ratio_ax.set_ylabel("ferry / baseline")
        # One compact legend under each column: a line per colour, then one per line style.
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=colour_of[g], linewidth=3,
                          label=g[0] + ("" if g[1] is None else f", {_other_label(other, g[1])}"))
                   for g in groups]
        cases = {r.get("case", "ferry"): r["route"] for r in records}
        for i, route in enumerate(ferry_routes):
            handles.append(Line2D([], [], color="0.2", label=f"ferry {route}", **_style("ferry", i)))
        baseline_routes = sorted({r["route"] for r in records if r.get("case") == "baseline"})
        if baseline_routes:
            handles.append(Line2D([], [], color="0.2", **_style("baseline"),
                                  label=f"baseline ({', '.join(baseline_routes)})"))
        if "ceiling" in cases:
            handles.append(Line2D([], [], color="0.2", **_style("ceiling"),
                                  label="ceiling (the copy alone)"))
        bottom_ax.legend(handles=handles, fontsize="x-small", loc="upper center",
                         bbox_to_anchor=(0.5, -0.42 if x == "io_size" else -0.3), ncol=2)
    by_size.set_title("throughput against request size")
    by_threads.set_title("throughput against threads")
    fig.suptitle(title or _title(records))
    fig.tight_layout()
    return fig


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ferry.plot",
        description="Plot `ferry bench --json` results: throughput against request size and "
                    "against threads, one line per route or memory kind, with the ceiling where "
                    "it was measured.")
    parser.add_argument("results", nargs="+", help="JSON lines written by ferry bench --json")
    parser.add_argument("-o", "--output", required=True, help="image to write (.png, .svg, ...)")
    parser.add_argument("--title", help="title above both panels (default: the modes measured)")
    args = parser.parse_args(argv)
    try:
        records = load(args.results)
        fig = figure(records, args.title)
    except (OSError, ValueError) as e:
        print(f"python -m ferry.plot: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"python -m ferry.plot: needs matplotlib ({e}); on Debian: apt-get install "
              "python3-matplotlib", file=sys.stderr)
        return 1
    fig.savefig(args.output, dpi=110, bbox_inches="tight")
    print(f"{args.output}: {len(records)} result(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
