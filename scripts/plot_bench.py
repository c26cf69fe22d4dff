"""Plot each operator's time as a multiple of the raw MPI call, from bench_primitives.py JSON.

    python scripts/plot_bench.py docs/results/primitives-2x2.json docs/results/primitives-1x2-2x1.json \
        --out docs/primitives-ratio.png

Needs matplotlib (the ``bench`` extra). One horizontal bar per operator and
direction, grouped by grid; the dashed lines mark the targets (1.5x for the
collectives, 2x for the halo).
"""

import argparse
import json
import sys


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += json.load(f)["rows"]
    return [r for r in rows if r["raw_call"] != "(local copy)"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="files written by bench_primitives.py --json")
    parser.add_argument("--out", default="primitives-ratio.png")
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = load(args.json)
    labels = [f"{r['grid']}  {r['operator']} {r['direction']}" for r in rows]
    ratios = [r["ratio_raw"] for r in rows]
    colours = ["tab:red" if r["operator"].startswith("Halo") else "tab:blue" for r in rows]
    height = max(4.0, 0.22 * len(rows))
    fig, ax = plt.subplots(figsize=(9, height))
    y = range(len(rows))
    ax.barh(list(y), ratios, color=colours)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(1.5, color="tab:blue", ls="--", lw=0.8, label="target 1.5x (collectives)")
    ax.axvline(2.0, color="tab:red", ls="--", lw=0.8, label="target 2x (halo)")
    ax.set_xlabel("median time / median of the raw mpi4py call on the same bytes (log scale)")
    ax.set_title("mpisphere operators against raw MPI, same run")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
