"""``python -m ferry.plot RESULTS.jsonl [MORE.jsonl ...] -o out.png``: draws what ``ferry bench
--json`` measured. Two panels: throughput against request size, and throughput against threads;
one line per route and memory kind (ferry's cases solid, the ``--compare`` baseline dashed), and
the copy ceiling dotted where ``--ceiling`` measured it. Needs matplotlib; lines that are not
results (blank, ``error``) are skipped, lines that are not JSON are an error naming the line."""

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


def _series(records: Sequence[Record], x: str, other: str) -> Dict[Tuple[str, Any], List[Record]]:
    """Lines of one panel: by case, route and memory, and by the other axis' value where the
    results hold several (the largest alone otherwise would hide the rest)."""
    several = len({r[other] for r in records}) > 1
    lines: Dict[Tuple[str, Any], List[Record]] = defaultdict(list)
    for r in records:
        lines[(_series_name(r), r[other] if several else None)].append(r)
    for points in lines.values():
        points.sort(key=lambda r: r[x])
    return lines


def _style(case: Optional[str]) -> Dict[str, Any]:
    if case == "baseline":
        return {"linestyle": "--", "marker": "s"}
    if case == "ceiling":
        return {"linestyle": ":", "marker": None}
    return {"linestyle": "-", "marker": "o"}


def _title(records: Sequence[Record]) -> str:
    modes = sorted({r["mode"] for r in records})
    cold = {r.get("cold") for r in records if "cold" in r}
    state = "" if not cold else ", cold" if cold == {True} else ", warm" if cold == {False} else ""
    return f"ferry bench: {', '.join(modes)}{state}"


def figure(records: Sequence[Record], title: Optional[str] = None):
    """The matplotlib Figure of `records`: its two axes are throughput against request size and
    against threads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError("no results to plot (every line failed, or none was a result)")
    fig, (by_size, by_threads) = plt.subplots(1, 2, figsize=(13, 6.5))
    panels = ((by_size, "io_size", "threads", "request size", "threads"),
              (by_threads, "threads", "io_size", "threads", "request size"))
    for ax, x, other, xlabel, other_label in panels:
        for (name, value), points in sorted(_series(records, x, other).items(),
                                            key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            label = name
            if value is not None:
                label += f", {other_label} {_size_label(value) if other == 'io_size' else value}"
            xs = [r[x] for r in points]
            ys = [r["gbps"] for r in points]
            case = points[0].get("case")
            if len(xs) == 1 and case == "ceiling":
                ax.axhline(ys[0], label=label, **{k: v for k, v in _style(case).items()
                                                  if k != "marker"})
            else:
                ax.plot(xs, ys, label=label, **_style(case))
        values = sorted({r[x] for r in records})
        if x == "io_size":
            ax.set_xscale("log", base=2)
            ax.set_xticks(values)
            ax.set_xticklabels([_size_label(v) for v in values], rotation=30)
        else:
            ax.set_xticks(values)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("throughput (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
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
    fig.savefig(args.output, dpi=110)
    print(f"{args.output}: {len(records)} result(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
