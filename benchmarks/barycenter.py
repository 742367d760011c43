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

``sketchot before`` (``--baseline DIR``)
    The default ``sketchot`` call on the code at ``DIR`` (a clean checkout, first on a child
    process's ``PYTHONPATH``), in the same run: before and after a change, with the largest
    distance between the two supports.

Times: wall seconds and CPU seconds of the process (``time.process_time``, all threads: on a
shared machine the wall clock also counts the waits for a core), the seconds of each outer
step (from ``verbose`` lines) and their median after the first (``seconds per warm step``);
``os.getloadavg()`` before and after is in the JSON.

    python benchmarks/barycenter.py --quick     # n = 1e3, 10 outer steps, under 2 minutes
    python benchmarks/barycenter.py             # n = 1e3 and 1e4 (POT), 1e5 (sketchot)
    python benchmarks/barycenter.py --sizes 1e4 --max-iter 10 --pot-max-iter 2 \
        --baseline /tmp/baseline --first-only --out-name barycenter_1e4
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
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
    n: int,
    max_iter: int,
    pot_max_n: int,
    seed: int,
    warm_only: bool = False,
    tol: float = TOL,
    *,
    pot_max_iter: int | None = None,
    baseline: Path | None = None,
    first_only: bool = False,
    pot_inner_tol: bool = True,
) -> list[dict[str, Any]]:
    clouds = make_clouds(n, seed)
    X0 = _initial(clouds, n, seed)
    rows = []
    pot_X = None
    if n <= pot_max_n:
        weights = [np.full(n, 1.0 / n)] * 3
        cpu = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seconds, (pot_X, log) = timed(
                lambda: ot.bregman.free_support_sinkhorn_barycenter(
                    clouds,
                    weights,
                    X0,
                    REG,
                    numItermax=pot_max_iter or max_iter,
                    stopThr=tol,
                    log=True,
                )
            )
        steps = log["displacement_square_norms"]
        cpu = time.process_time() - cpu
        rows.append({"method": "POT", "n": n, "seconds": seconds, "cpu_seconds": cpu,
                     "outer": len(steps),
                     "displacement": float(steps[-1]), "inner": None, "to_pot": 0.0,
                     "backends": "dense", "inner_stop": "POT 1e-9",
                     "accuracy_met": None, "objective": None,
                     "steps_to_pot_objective": len(steps),
                     "seconds_to_pot_objective": seconds,
                     "warm_step_seconds": seconds / len(steps)})  # fmt: skip
        print(_line(rows[-1]), flush=True)
    inner_tol = POT_INNER_TOL if n <= pot_max_n and pot_inner_tol else None
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
    methods = methods[: 1 if first_only else 2 if warm_only else 3]
    if baseline is not None:
        # the same call on the code at ``baseline`` (a clean checkout), in a child process
        methods = (*methods[:1], ("sketchot before", True, "anderson"), *methods[1:])
    supports: dict[str, np.ndarray] = {}
    for name, warm, acceleration in methods:
        if name == "sketchot before":
            row = _baseline_row(baseline, n, max_iter, seed, tol, inner_tol)
        else:
            row = sketchot_row(clouds, X0, n, max_iter, seed, tol, inner_tol, warm, acceleration)
        row["method"] = name
        reached, level = None, None
        if pot_objective is not None:
            # rounding of the two objectives' sums (the plain run repeats POT's iterates)
            level = pot_objective + REACHED_RTOL * abs(pot_objective)
            below = [i for i, f in enumerate(row["objectives"], 1) if f <= level]
            reached = below[0] if below else None
        X = supports[name] = row.pop("X")
        rows.append({
            **row, "to_pot": None if pot_X is None else float(np.abs(X - pot_X).max()),
            "inner_stop": "POT 1e-9" if inner_tol is not None else "accuracy",
            "steps_to_pot_objective": reached,
            "seconds_to_pot_objective": None if reached is None else float(
                sum(row["step_seconds"][:reached])),
        })  # fmt: skip
        print(_line({k: v for k, v in rows[-1].items() if not isinstance(v, list)}), flush=True)
    if "sketchot before" in supports:
        # the same call before and after: supports apart by at most this
        for row in rows:
            if row["method"] == "sketchot":
                row["to_before"] = float(
                    np.abs(supports["sketchot"] - supports["sketchot before"]).max()
                )
    return rows


def sketchot_row(
    clouds, X0, n, max_iter, seed, tol, inner_tol, warm=True, acceleration="anderson"
) -> dict[str, Any]:
    """One :func:`sketchot.barycenter` run: its numbers and the seconds of each outer step
    (from its verbose lines, which every version prints alike)."""
    lines = io.StringIO()
    cpu = time.process_time()
    with warnings.catch_warnings(), contextlib.redirect_stdout(lines):
        warnings.simplefilter("ignore")
        seconds, res = timed(
            lambda: sketchot.barycenter(
                clouds, reg=REG, X_init=X0, max_iter=max_iter, tol=tol, warm_start=warm,
                inner_tol=inner_tol, rng=seed, acceleration=acceleration, verbose=True,
            )
        )  # fmt: skip
    cpu = time.process_time() - cpu
    steps = [float(m) for m in re.findall(r"([0-9.]+) s$", lines.getvalue(), re.MULTILINE)]
    return {
        "n": n, "seconds": seconds, "cpu_seconds": cpu, "outer": res.n_iter,
        "displacement": res.displacements[-1], "inner": res.total_inner_iterations,
        "backends": ",".join(sorted(set(res.backends))), "accuracy_met": res.accuracy_met,
        "objective": res.objectives[-1], "final_objective": res.objective,
        "objectives": [float(f) for f in res.objectives], "step_seconds": steps,
        "warm_step_seconds": float(np.median(steps[1:])) if len(steps) > 1 else None,
        "X": res.X,
    }  # fmt: skip


def _baseline_row(baseline, n, max_iter, seed, tol, inner_tol) -> dict[str, Any]:
    """:func:`sketchot_row` of the sketchot at ``baseline`` (first on the child's path)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "row.npz"
        args = [sys.executable, __file__, "--child", str(out), "--sizes", str(n),
                "--max-iter", str(max_iter), "--seed", str(seed), "--tol", str(tol),
                "--child-inner-tol", str(inner_tol)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(baseline)}
        subprocess.run(args, env=env, cwd=folder, check=True)
        data = np.load(out, allow_pickle=False)
        row = json.loads(str(data["row"]))
        row["X"] = data["X"]
    return row


def _child(args: argparse.Namespace) -> None:
    n = int(args.sizes[0])
    clouds = make_clouds(n, args.seed)
    inner_tol = None if args.child_inner_tol == "None" else float(args.child_inner_tol)
    row = sketchot_row(
        clouds, _initial(clouds, n, args.seed), n, args.max_iter, args.seed, args.tol, inner_tol
    )
    X = row.pop("X")
    row["sketchot_path"] = sketchot.__file__
    np.savez(args.child, row=json.dumps(row), X=X)


def _initial(clouds: list[np.ndarray], n: int, seed: int) -> np.ndarray:
    """The default support of :func:`sketchot.barycenter` (``n`` distinct pooled points)."""
    rng = np.random.default_rng(seed)
    pooled = np.concatenate(clouds)
    return pooled[rng.choice(len(pooled), size=n, replace=False)]


def _fmt(value: Any, spec: str) -> str:
    return "" if value is None else format(value, spec)


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
    parser.add_argument("--pot-max-iter", type=int, default=None,
                        help="POT's outer steps (default --max-iter)")  # fmt: skip
    parser.add_argument(
        "--baseline", type=Path, default=None,
        help="also run the default method from this checkout (e.g. a clean clone of main)",
    )  # fmt: skip
    parser.add_argument("--first-only", action="store_true", help="only the default method")
    parser.add_argument(
        "--accuracy-inner", action="store_true",
        help="stop each solve at the accuracy (the default rule) where POT runs too",
    )  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-inner-tol", default="None", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return _child(args)
    load_before = os.getloadavg()
    sizes, max_iter = ([1000], 10) if args.quick else ([int(s) for s in args.sizes], args.max_iter)
    rows = [
        row
        for n in sizes
        for row in run(
            n, max_iter, int(args.pot_max_n), args.seed, args.warm_only, args.tol,
            pot_max_iter=args.pot_max_iter, baseline=args.baseline, first_only=args.first_only,
            pot_inner_tol=not args.accuracy_inner,
        )
    ]  # fmt: skip
    stem = args.out_name or ("barycenter_quick" if args.quick else "barycenter")
    meta = {"python": sys.version.split()[0], "numpy": np.__version__, "pot": ot.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(), "reg": REG, "tol": args.tol,
            "load_before": load_before, "load": os.getloadavg(),
            "baseline": None if args.baseline is None else str(args.baseline),
            "pot_max_iter": args.pot_max_iter,
            "max_iter": max_iter, "clouds": 3, "d": 3}  # fmt: skip
    write_json(RESULTS_DIR / f"{stem}.json", {"meta": meta, "rows": rows})
    saving = {}
    for n in sizes:
        by = {r["method"]: r for r in rows if r["n"] == n}
        if "sketchot cold" in by and "sketchot" in by:
            saving[n] = by["sketchot cold"]["inner"] / max(by["sketchot"]["inner"], 1)
    table = md_table(
        ["n per cloud", "method", "seconds", "CPU seconds", "outer steps", "seconds per warm step",
         "inner iterations", "inner stop", "last displacement", "objective",
         "steps to POT's objective", "seconds to POT's objective", "max abs to POT",
         "kernels", "accuracy met"],
        [[r["n"], r["method"], f"{r['seconds']:.2f}", _fmt(r.get("cpu_seconds"), ".1f"),
          r["outer"],
          _fmt(r.get("warm_step_seconds"), ".2f"), r["inner"] or "",
          r["inner_stop"], f"{r['displacement']:.2e}", _fmt(r["objective"], ".10f"),
          _fmt(r["steps_to_pot_objective"], "d"),
          _fmt(r.get("seconds_to_pot_objective"), ".2f"), _fmt(r["to_pot"], ".1e"),
          r["backends"], _fmt(r["accuracy_met"], "")]
         for r in rows],
        "rlrrrrrlrrrrrll",
    )  # fmt: skip
    notes = [f"n = {r['n']}: the support of `sketchot` is within {r['to_before']:.1e} (max abs) "
             "of `sketchot before`'s" for r in rows if "to_before" in r]  # fmt: skip
    notes += [f"warm-start saving at n = {n}: {s:.2f}x fewer inner iterations" for n, s in
             saving.items()]  # fmt: skip
    text = "\n".join([f"# {__doc__.splitlines()[0]}", "", f"{meta}", "", *table, "", *notes, ""])
    print(text)
    write_text(RESULTS_DIR / f"{stem}.md", text)


if __name__ == "__main__":
    main()
