"""Free-support entropic barycenters: sketchot.barycenter against POT's
``ot.bregman.free_support_sinkhorn_barycenter``.

Data: three clouds of ``n`` points in 3-D (colour-like: Gaussian blobs of different means and
covariances clipped to ``[0, 1]^3``, ``default_rng(seed)``), uniform weights, uniform
coefficients; the support has ``n`` points, initialised (the same ``X_init`` for every method)
by ``n`` distinct points drawn from the pooled clouds. ``reg`` = 0.005 (absolute: the clouds
spread with standard deviations 0.05-0.12 per coordinate, squared distances within a cloud
about 0.04; at reg = 0.05 the entropic maps blur so much that the support collapses to one
point, measured: standard deviation 0 after 10 steps).

Methods, each from the clouds to the support:

``sketchot``
    ``sketchot.barycenter(clouds, reg=reg, X_init=X0, max_iter=..., tol=1e-7,
    inner_tol=1e-9)`` (POT's inner stopThr) where POT runs, the default inner rule (stop each
    solve at the accuracy, 1e-3) beyond it: ``backend='auto'``, warm starts on (the
    default).
``sketchot plain``
    The same with ``acceleration=None``: the plain fixed point ``Z <- T(Z)`` (POT's
    iterates); the default ``sketchot`` row uses the Anderson step.
``sketchot cold``
    The same with ``warm_start=False``: the warm-start saving is the ratio of the inner
    Sinkhorn iterations (and of the times).
``POT``
    ``free_support_sinkhorn_barycenter(clouds, weights, X0, reg, numItermax=..., stopThr=1e-7)``
    (dense, inner ``ot.sinkhorn`` at its defaults: ``stopThr=1e-9``, 1000 iterations), for
    ``n <= --pot-max-n``.

Both stop, as POT, when the squared displacement ``sum_i ||z_i^new - z_i||^2 <= 1e-7`` or
after ``--max-iter`` outer steps (the fixed point creeps: at these sizes it often needs more
than 20). Reported: seconds, outer steps, inner iterations, the last displacement, the
largest distance to POT's support, the objective (POT's support scored by the same
objective: one sketchot solve per cloud at POT's returned support) and the first step whose
objective is at most POT's final one (the supports of this problem sit in a flat valley:
supports 0.06 apart in the max norm differ by 2e-8 in objective, so the objective, not the
distance, says who is nearer the minimum), and whether every final transport met the
accuracy against the true kernel.

    python benchmarks/barycenter.py --quick     # n = 1e3, 10 outer steps, under 2 minutes
    python benchmarks/barycenter.py             # n = 1e3 and 1e4 (POT), 1e5 (sketchot)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _results import md_table, timed, write_json, write_text

import sketchot
from sketchot.barycenter import POT_INNER_TOL

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REG = 0.005
TOL = 1e-7
#: A run reached POT's objective when its objective is at most POT's up to this (relative:
#: POT's iterates, repeated, agree with its own to about 1e-9 in objective).
REACHED_RTOL = 1e-8
MEANS = ([0.3, 0.3, 0.6], [0.7, 0.5, 0.3], [0.5, 0.8, 0.5])
SCALES = ([0.10, 0.05, 0.08], [0.06, 0.12, 0.05], [0.08, 0.08, 0.12])


def make_clouds(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        np.clip(rng.normal(mean, scale, size=(n, 3)), 0.0, 1.0)
        for mean, scale in zip(MEANS, SCALES, strict=True)
    ]


def run(
    n: int, max_iter: int, pot_max_n: int, seed: int, warm_only: bool = False, tol: float = TOL
) -> list[dict[str, Any]]:
    clouds = make_clouds(n, seed)
    X0 = _initial(clouds, n, seed)
    rows = []
    pot_X = None
    if n <= pot_max_n:
        weights = [np.full(n, 1.0 / n)] * 3
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seconds, (pot_X, log) = timed(
                lambda: ot.bregman.free_support_sinkhorn_barycenter(
                    clouds, weights, X0, REG, numItermax=max_iter, stopThr=tol, log=True
                )
            )
        steps = log["displacement_square_norms"]
        rows.append({"method": "POT", "n": n, "seconds": seconds, "outer": len(steps),
                     "displacement": float(steps[-1]), "inner": None, "to_pot": 0.0,
                     "backends": "dense", "inner_stop": "POT 1e-9",
                     "accuracy_met": None, "objective": None,
                     "steps_to_pot_objective": len(steps)})  # fmt: skip
        print(_line(rows[-1]), flush=True)
    inner_tol = POT_INNER_TOL if n <= pot_max_n else None
    pot_objective = None
    if pot_X is not None:
        # POT's support scored by the same objective (one solve per cloud at pot_X)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scored = sketchot.barycenter(
                clouds, reg=REG, X_init=pot_X, max_iter=1, tol=0.0, inner_tol=inner_tol,
                acceleration=None, rng=seed,
            )  # fmt: skip
        pot_objective = scored.objectives[0]
        rows[-1]["objective"] = pot_objective
    methods = (("sketchot", True, "anderson"), ("sketchot plain", True, None),
               ("sketchot cold", False, "anderson"))  # fmt: skip
    for name, warm, acceleration in methods[: 2 if warm_only else 3]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seconds, res = timed(
                lambda warm=warm, acceleration=acceleration: sketchot.barycenter(
                    clouds, reg=REG, X_init=X0, max_iter=max_iter, tol=tol, warm_start=warm,
                    inner_tol=inner_tol, rng=seed, acceleration=acceleration,
                )
            )  # fmt: skip
        reached = None
        if pot_objective is not None:
            # rounding of the two objectives' sums (the plain run repeats POT's iterates)
            level = pot_objective + REACHED_RTOL * abs(pot_objective)
            below = [i for i, f in enumerate(res.objectives, 1) if f <= level]
            reached = below[0] if below else None
        rows.append({
            "method": name, "n": n, "seconds": seconds, "outer": res.n_iter,
            "displacement": res.displacements[-1], "inner": res.total_inner_iterations,
            "to_pot": None if pot_X is None else float(np.abs(res.X - pot_X).max()),
            "backends": ",".join(sorted(set(res.backends))),
            "inner_stop": "POT 1e-9" if n <= pot_max_n else "accuracy",
            "accuracy_met": res.accuracy_met, "objective": res.objectives[-1],
            "steps_to_pot_objective": reached,
        })  # fmt: skip
        print(_line(rows[-1]), flush=True)
    return rows


def _initial(clouds: list[np.ndarray], n: int, seed: int) -> np.ndarray:
    """The default support of :func:`sketchot.barycenter` (``n`` distinct pooled points)."""
    rng = np.random.default_rng(seed)
    pooled = np.concatenate(clouds)
    return pooled[rng.choice(len(pooled), size=n, replace=False)]


def _line(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e3, 10 outer steps")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e3, 1e4, 1e5])
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument(
        "--pot-max-n",
        type=float,
        default=1e4,
        help="largest n where POT runs (and sketchot uses POT's inner tol)",
    )
    parser.add_argument("--out-name", default=None, help="results stem (default barycenter)")
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="leave out the cold run (no warm-start saving is reported)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tol", type=float, default=TOL, help="outer tol (POT's stopThr)")
    args = parser.parse_args()
    sizes, max_iter = ([1000], 10) if args.quick else ([int(s) for s in args.sizes], args.max_iter)
    rows = [
        row
        for n in sizes
        for row in run(n, max_iter, int(args.pot_max_n), args.seed, args.warm_only, args.tol)
    ]
    stem = args.out_name or ("barycenter_quick" if args.quick else "barycenter")
    meta = {"python": sys.version.split()[0], "numpy": np.__version__, "pot": ot.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(), "reg": REG, "tol": args.tol,
            "load": os.getloadavg(),
            "max_iter": max_iter, "clouds": 3, "d": 3}  # fmt: skip
    write_json(RESULTS_DIR / f"{stem}.json", {"meta": meta, "rows": rows})
    saving = {}
    for n in sizes:
        by = {r["method"]: r for r in rows if r["n"] == n}
        if "sketchot cold" in by:
            saving[n] = by["sketchot cold"]["inner"] / max(by["sketchot"]["inner"], 1)
    table = md_table(
        ["n per cloud", "method", "seconds", "outer steps", "inner iterations",
         "inner stop", "last displacement", "objective", "steps to POT's objective",
         "max abs to POT", "kernels", "accuracy met"],
        [[r["n"], r["method"], f"{r['seconds']:.2f}", r["outer"], r["inner"] or "",
          r["inner_stop"], f"{r['displacement']:.2e}",
          "" if r["objective"] is None else f"{r['objective']:.10f}",
          "" if r["steps_to_pot_objective"] is None else r["steps_to_pot_objective"],
          "" if r["to_pot"] is None else f"{r['to_pot']:.1e}",
          r["backends"], "" if r["accuracy_met"] is None else r["accuracy_met"]]
         for r in rows],
        "rlrrrlrrrrll",
    )  # fmt: skip
    notes = [f"warm-start saving at n = {n}: {s:.2f}x fewer inner iterations" for n, s in
             saving.items()]  # fmt: skip
    text = "\n".join([f"# {__doc__.splitlines()[0]}", "", f"{meta}", "", *table, "", *notes, ""])
    print(text)
    write_text(RESULTS_DIR / f"{stem}.md", text)


if __name__ == "__main__":
    main()
