"""Compare two sets of runs of a benchmark (before / after a change) cell by cell.

    python benchmarks/compare_runs.py speed --before B1.json [B2.json ...] --after A1.json [...]
    python benchmarks/compare_runs.py small_reg --before ... --after ...

``speed`` (``sinkhorn_speed.py --json``): each method's time per iteration as a ratio to POT's
dense solver in the same run (the machine's load cancels), best run of each side; prints
``after / before`` of those ratios (``< 1``: faster relative to POT than before).
``small_reg`` (``small_reg.py --json``): each method's time as a ratio to ``POT stabilised``
in the same run, likewise. Prints a table and the median and range of the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def speed_cells(path: Path) -> dict[tuple, float]:
    rows = json.loads(path.read_text())["rows"]
    pot = {(r["n"], r["reg"]): r["per_iteration_s"] for r in rows if r["method"] == "pot-dense"}
    return {
        (r["n"], r["reg"], r["method"], r.get("rank_label")): r["per_iteration_s"]
        / pot[r["n"], r["reg"]]
        for r in rows
        if r["method"] != "pot-dense" and (r["n"], r["reg"]) in pot and r.get("per_iteration_s")
    }


def small_reg_cells(path: Path) -> dict[tuple, float]:
    """Seconds over POT's in the same run; where POT was skipped (over the budget), the
    seconds themselves (cells marked ``s``: compare runs made back to back only)."""
    rows = json.loads(path.read_text())["rows"]
    pot = {
        (r["data"], r["n"], r["reg"]): r["seconds"]
        for r in rows
        if r["method"] == "POT stabilised" and r.get("seconds")
    }
    out = {}
    for r in rows:
        cell = (r["data"], r["n"], r["reg"])
        if r["method"] == "POT stabilised" or not r.get("seconds"):
            continue
        if cell in pot:
            out[(*cell, r["method"])] = r["seconds"] / pot[cell]
        else:
            out[(*cell, r["method"], "s")] = r["seconds"]
    return out


def best(paths: list[Path], cells) -> dict[tuple, float]:
    """The smallest ratio of each cell over the runs (the least disturbed run)."""
    out: dict[tuple, float] = {}
    for path in paths:
        for key, value in cells(path).items():
            out[key] = min(value, out.get(key, value))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["speed", "small_reg"])
    parser.add_argument("--before", nargs="+", type=Path, required=True)
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    args = parser.parse_args()
    before, after = args.before, args.after
    cells = speed_cells if args.kind == "speed" else small_reg_cells
    old, new = best(before, cells), best(after, cells)
    baseline = "POT dense" if args.kind == "speed" else "POT stabilised"
    print(f"| cell | before / {baseline} | after / {baseline} | after / before |")
    print("|---|---:|---:|---:|")
    ratios = []
    for key in sorted(set(old) & set(new), key=str):
        ratio = new[key] / old[key]
        ratios.append(ratio)
        print(f"| {' '.join(str(k) for k in key if k is not None)} | {old[key]:.3g} | "
              f"{new[key]:.3g} | {ratio:.2f} |")  # fmt: skip
    if ratios:
        print(
            f"\nafter / before over {len(ratios)} cells: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f} (best of {len(before)} and {len(after)} "
            "runs per side)"
        )


if __name__ == "__main__":
    main()
