"""Compare two sets of runs of a benchmark (before / after a change) cell by cell.

    python benchmarks/compare_runs.py speed --before B1.json [B2.json ...] --after A1.json [...]
    python benchmarks/compare_runs.py small_reg --before ... --after ...
    python benchmarks/compare_runs.py dask_scale --median --before ... --after ...
    python benchmarks/compare_runs.py loss --before ... --after ...

``speed`` (``sinkhorn_speed.py --json``): each method's time per iteration as a ratio to POT's
dense solver in the same run (the machine's load cancels), best run of each side; prints
``after / before`` of those ratios (``< 1``: faster relative to POT than before).
``small_reg`` (``small_reg.py --json``): each method's time as a ratio to ``POT stabilised``
in the same run, likewise. ``dask_scale`` (``dask_scale.py --json``): Dask's seconds per
iteration over the in-memory solve's in the same run. ``loss`` (``loss.py``'s JSON): each
step's cold and warm seconds and the correctness rows' sketchot seconds, as seconds (the
peers' cells there move as much as ours between runs: compare runs made back to back).
``--median`` takes each cell's median over the runs instead of the best. Prints a table and
the median and range of the ratios.
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


def dask_scale_cells(path: Path) -> dict[tuple, float]:
    """Dask's seconds per iteration over the in-memory solve's, per size."""
    rows = json.loads(path.read_text())["rows"]
    return {
        (f"{r['n']:.0e}", "Dask / memory"): r["dask"]["per_iteration_s"]
        / r["memory"]["per_iteration_s"]
        for r in rows
        if r.get("dask") and r.get("memory")
    }


def loss_cells(path: Path) -> dict[tuple, float]:
    """Seconds: each gradient-flow step cold and warm, and sketchot's correctness rows."""
    data = json.loads(path.read_text())
    out = {}
    for block in data["speed"]:
        for step in block["steps"]:
            for kind in ("cold", "warm"):
                key = (block["n"], block["reg"], f"step {step['step']}", kind, "s")
                out[key] = step[f"{kind}_seconds"]
    for r in data["correctness"]:
        if r["method"].startswith(("exact", "default")):
            out[(r["n"], r["reg"], r["method"], "s")] = r["seconds"]
    return out


CELLS = {
    "speed": (speed_cells, "POT dense"),
    "small_reg": (small_reg_cells, "POT stabilised"),
    "dask_scale": (dask_scale_cells, "memory"),
    "loss": (loss_cells, "seconds"),
}


def best(paths: list[Path], cells) -> dict[tuple, float]:
    """The smallest ratio of each cell over the runs (the least disturbed run)."""
    out: dict[tuple, float] = {}
    for path in paths:
        for key, value in cells(path).items():
            out[key] = min(value, out.get(key, value))
    return out


def median(paths: list[Path], cells) -> dict[tuple, float]:
    """The median of each cell over the runs."""
    values: dict[tuple, list[float]] = {}
    for path in paths:
        for key, value in cells(path).items():
            values.setdefault(key, []).append(value)
    return {key: statistics.median(found) for key, found in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(CELLS))
    parser.add_argument("--before", nargs="+", type=Path, required=True)
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    parser.add_argument("--median", action="store_true", help="median over runs, not best")
    args = parser.parse_args()
    before, after = args.before, args.after
    cells, baseline = CELLS[args.kind]
    over = median if args.median else best
    old, new = over(before, cells), over(after, cells)
    unit = "(s)" if baseline == "seconds" else f"/ {baseline}"
    print(f"| cell | before {unit} | after {unit} | after / before |")
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
            f"range {min(ratios):.2f}-{max(ratios):.2f} ({over.__name__} of {len(before)} and "
            f"{len(after)} runs per side)"
        )


if __name__ == "__main__":
    main()
