"""Total-variation penalties (``unbalanced_type='TV'``): sketchot against POT's ``ot.solve``.

Data: the colours with far outliers of ``benchmarks/unbalanced.py`` (``n`` pixel colours of
each image of the default pair, ``n / 10`` outliers in ``[2, 3]^3`` appended to the source;
uniform weights of mass 1 on each side). ``reg`` 0.1 and 0.01, ``reg_m`` 0.5 on both sides
(an outlier's cheapest transport costs more than ``2 reg_m``: TV leaves it out).

Methods, each timed from the clouds to the result (the cost matrix included for POT):

``sketchot``
    ``sketchot.sinkhorn(a, b, X, Y, reg=reg, reg_m=reg_m, unbalanced_type='TV', rng=seed)``
    (``backend='auto'``): the backend it used, iterations, its certified residual.
``POT``
    ``ot.solve(ot.dist(X, Y), a, b, reg=reg, unbalanced=reg_m, unbalanced_type='TV')``: POT's
    L-BFGS-B on the primal (its only TV solver with ``reg``; its defaults ``max_iter=1000``,
    ``tol=1e-12``).

Both plans are scored with POT's own objective (``ot.unbalanced._lbfgs``'s: ``<P, M> + reg
KL(P | a b^T) + reg_m (||P 1 - a||_1 + ||P^T 1 - b||_1)``) on the dense plan, so ``n`` stays
where POT's L-BFGS-B (one variable per entry of the plan) ends in minutes: 200 and 500
(``--quick``: 200). ``objective - best``: above the lower of the two.

    python benchmarks/unbalanced_tv.py --quick   # -> benchmarks/results/unbalanced_tv_quick.*
    python benchmarks/unbalanced_tv.py           # -> benchmarks/results/unbalanced_tv.*
"""

from __future__ import annotations

import argparse
import os
import platform
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _results import md_table, timed, write_json, write_text
from unbalanced import clouds

import sketchot

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REGS = (0.1, 0.01)
REG_M = 0.5


def objective(P: np.ndarray, M: np.ndarray, a, b, reg: float, reg_m: float) -> float:
    """POT's TV objective at ``P`` (module notes)."""
    c = a[:, None] * b[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.sum(np.where(P > 0, P * np.log(P / c), 0.0)) - P.sum() + c.sum()
    marginals = np.abs(P.sum(1) - a).sum() + np.abs(P.sum(0) - b).sum()
    return float(np.sum(P * M) + reg * kl + reg_m * marginals)


def run(n: int, reg: float, seed: int) -> list[dict[str, Any]]:
    a, b, X, Y = clouds(n, seed)
    M = ot.dist(X, Y)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds, res = timed(
            lambda: sketchot.sinkhorn(
                a, b, X, Y, reg=reg, reg_m=REG_M, unbalanced_type="TV", rng=seed
            )
        )
    rows.append({
        "method": "sketchot", "n": n, "reg": reg, "seconds": seconds, "used": res.backend,
        "n_iter": res.n_iter, "residual": float(res.true_kernel.bound),
        "objective": objective(res.plan, M, a, b, reg, REG_M), "mass": float(res.mass),
    })  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds, sol = timed(
            lambda: ot.solve(ot.dist(X, Y), a, b, reg=reg, unbalanced=REG_M, unbalanced_type="TV")
        )
    plan = np.asarray(sol.plan)
    rows.append({
        "method": "POT ot.solve (L-BFGS-B)", "n": n, "reg": reg, "seconds": seconds,
        "used": "lbfgsb_unbalanced", "n_iter": None, "residual": None,
        "objective": objective(plan, M, a, b, reg, REG_M), "mass": float(plan.sum()),
    })  # fmt: skip
    best = min(row["objective"] for row in rows)
    for row in rows:
        row["above_best"] = row["objective"] - best
        row["time_ratio_to_pot"] = row["seconds"] / rows[1]["seconds"]
    return rows


def markdown(output: dict[str, Any]) -> str:
    lines = [
        "# Total-variation penalties: sketchot against POT's ot.solve",
        "",
        f"`{output['command']}`; load average {output['load_before'][0]:.2f} before, "
        f"{output['load_after'][0]:.2f} after ({output['cpus']} CPUs). reg_m = {REG_M} on both "
        "sides; objective: POT's formula on the dense plan (lower is better).",
        "",
    ]
    header = ["n", "reg", "method", "seconds", "time / POT", "used", "iterations",
              "certified residual", "objective", "objective - best", "mass"]  # fmt: skip
    table = [
        [r["n"], r["reg"], r["method"], f"{r['seconds']:.2f}", f"{r['time_ratio_to_pot']:.2g}",
         r["used"], "-" if r["n_iter"] is None else r["n_iter"],
         "-" if r["residual"] is None else f"{r['residual']:.1e}", f"{r['objective']:.6f}",
         f"{r['above_best']:.1e}", f"{r['mass']:.4f}"]
        for r in output["rows"]
    ]  # fmt: skip
    lines += md_table(header, table)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 200 only")
    parser.add_argument("--sizes", nargs="+", type=int, help="n per side (override)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the numbers here (the .md beside)")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([200] if args.quick else [200, 500])
    load_before = os.getloadavg()
    rows = []
    for n in sizes:
        for reg in REGS:
            for row in run(n, reg, args.seed):
                rows.append(row)
                print(f"n={n} reg={reg} {row['method']}: {row['seconds']:.2f} s, "
                      f"objective {row['objective']:.6f}", flush=True)  # fmt: skip
    output = {
        "command": "python benchmarks/unbalanced_tv.py" + (" --quick" if args.quick else ""),
        "load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "sketchot": sketchot.__version__,
        "pot": ot.__version__, "rows": rows,
    }  # fmt: skip
    name = "unbalanced_tv_quick" if args.quick else "unbalanced_tv"
    path = args.json or RESULTS_DIR / f"{name}.json"
    write_json(path, output)
    write_text(path.with_suffix(".md"), markdown(output))
    return output


if __name__ == "__main__":
    main()
