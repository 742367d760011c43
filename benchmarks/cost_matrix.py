"""A cost matrix given: ``sketchot.solve(M, a, b, reg)`` against POT's ``ot.sinkhorn`` and
``ot.sinkhorn(..., method='sinkhorn_log')`` on the same ``M``.

Cases (no downloads): uniform points in [0, 1]^3 through ``ot.dist`` (n = m = 1e3, and 1e4
in the full mode); real data: scikit-learn's bundled digits (two halves of the 64-pixel
images, 898 x 898), and in the full mode 1e4 pixel colours of scikit-image's bundled
``astronaut`` against ``coffee`` (RGB in [0, 1]); POT's 1-D grid tests (``ot.datasets.
make_1D_gauss(100, m=20, s=5)`` to ``(100, m=60, s=10)`` on ``ot.utils.dist0(100)``
normalised by its largest entry, as POT's ``test/test_bregman.py`` does) at reg down to
1e-4. reg is 1e-1, 1e-2, 1e-3 times the largest cost.

Each cell: sketchot's default call (``backend='auto'``: which kernel it chose, time, stop,
its certified bound: the upper bound of the true-kernel L1 marginal error, relative to the
mass, exhaustive up to n m = 4e6 entries and sampled above; ``<P, M>`` and the value);
POT's two methods at POT's defaults (``stopThr=1e-9``, ``numItermax=1000``) capped by a
time budget per cell (``--budget`` seconds: the iterations are set from the time of 10 of
them, and a run that was capped before ``stopThr`` is recorded as a miss), with POT's
marginal error (the L1 error of its returned plan's marginals, relative), the same
certified bound of its scalings (sketchot's check on the exact kernel), its ``<P, M>``
and the time. Up to n = 1e3 the exact optimum ``ot.emd2`` is recorded too.
``os.getloadavg()`` goes in the JSON (2 shared cores: times are noisy; compare ratios in
one run).

    python benchmarks/cost_matrix.py --quick      # n = 1e3 and POT's 1-D grid
    python benchmarks/cost_matrix.py              # also n = 1e4 (uniform, colours)
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _results import md_table, timed, write_json, write_text

import sketchot
from sketchot.kernels import build_exact_from_cost
from sketchot.solver.plans import sampled_true_kernel_check

ROOT = Path(__file__).resolve().parents[1]
REG_FACTORS = (1e-1, 1e-2, 1e-3)
GRID_REGS = (1e-1, 1e-2, 1e-3, 1e-4)
#: Rows and columns of the sampled check above 4e6 entries (sketchot's SAMPLED_CHECK_SIZE is
#: 256; more here, for tighter bounds on both solvers).
CHECK_SAMPLES = 1000
STOP_THR = 1e-9
#: POT iterations timed (after one that includes the setup) to set a cell's iteration cap.
PROBE = 2
HEADER = ("case", "reg / max M", "solver", "kernel", "seconds", "x sketchot", "status",
          "certified", "<P, M>", "emd2")  # fmt: skip
POT_MAX_ITER = 1000


def uniform(n: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 3)), rng.random((n, 3))
    return {"name": f"uniform 3-D n={n}", "M": ot.dist(X, Y), "a": ot.unif(n), "b": ot.unif(n)}


def digits() -> dict[str, Any]:
    from sklearn.datasets import load_digits

    images = load_digits().data / 16.0
    half = len(images) // 2
    M = ot.dist(images[:half], images[half : 2 * half])
    return {"name": f"digits 64-D n={half}", "M": M, "a": ot.unif(half), "b": ot.unif(half)}


def colours(n: int, seed: int) -> dict[str, Any]:
    import skimage.data

    rng = np.random.default_rng(seed)
    source = skimage.data.astronaut().reshape(-1, 3) / 255.0
    target = skimage.data.coffee().reshape(-1, 3) / 255.0
    X = source[rng.choice(len(source), n, replace=False)]
    Y = target[rng.choice(len(target), n, replace=False)]
    M = ot.dist(X, Y)
    return {"name": f"colours astronaut/coffee n={n}", "M": M, "a": ot.unif(n), "b": ot.unif(n)}


def pot_grid() -> dict[str, Any]:
    n = 100
    M = ot.utils.dist0(n)
    M /= M.max()
    a = ot.datasets.make_1D_gauss(n, m=20, s=5)
    b = ot.datasets.make_1D_gauss(n, m=60, s=10)
    return {"name": "POT 1-D dist0(100)/max", "M": M, "a": a, "b": b, "regs": GRID_REGS}


def certify(M: np.ndarray, reg: float, a, b, log_u, log_v, seed: int) -> float:
    """sketchot's true-kernel check of any scalings on ``exp(-M / reg)``: the upper bound of
    the relative L1 marginal error (exhaustive up to 4e6 entries)."""
    kernel = build_exact_from_cost(M, reg, max_dense_bytes=0)
    n, m = M.shape
    samples = max(n, m) if n * m <= 4_000_000 else CHECK_SAMPLES
    with np.errstate(all="ignore"):
        check = sampled_true_kernel_check(
            kernel, a, b, log_u, log_v, samples, np.random.default_rng(seed), (1.0, 1.0)
        )
    return float(check.bound)


def run_pot(case: dict[str, Any], reg: float, method: str, budget: float) -> dict[str, Any]:
    """POT at its defaults, capped by ``budget`` seconds (estimated from 10 iterations)."""
    M, a, b = case["M"], case["a"], case["b"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the setup (K = exp(-M / reg)) from one iteration, the iterations from PROBE more
        setup, _ = timed(lambda: ot.sinkhorn(a, b, M, reg, method=method, numItermax=1))
        longer, _ = timed(
            lambda: ot.sinkhorn(a, b, M, reg, method=method, numItermax=1 + PROBE, stopThr=0.0)
        )
        per_iteration = max(longer - setup, 1e-9) / PROBE
        cap = int(min(POT_MAX_ITER, max(10, (budget - setup) / per_iteration)))
        start = time.perf_counter()
        plan, log = ot.sinkhorn(
            a, b, M, reg, method=method, numItermax=cap, stopThr=STOP_THR, log=True
        )
        seconds = time.perf_counter() - start
    with np.errstate(all="ignore"):
        if "log_u" in log:
            log_u, log_v = log["log_u"], log["log_v"]
        else:
            log_u, log_v = np.log(log["u"]), np.log(log["v"])
        marginal = float((np.abs(plan.sum(1) - a).sum() + np.abs(plan.sum(0) - b).sum()) / a.sum())
        linear = float((plan * M).sum())
    errors = log.get("err") or [np.nan]
    converged = bool(errors[-1] < STOP_THR)
    row = {
        "solver": f"POT {method}", "seconds": seconds, "iterations": int(log.get("niter", cap)),
        "cap": cap, "capped": cap < POT_MAX_ITER,
        "status": "converged" if converged else ("budget" if cap < POT_MAX_ITER else "max_iter"),
        "marginal_error": marginal, "certified": certify(M, reg, a, b, log_u, log_v, 1),
        "value_linear": linear,
    }  # fmt: skip
    row["miss"] = not converged
    return row


def run_sketchot(case: dict[str, Any], reg: float) -> dict[str, Any]:
    M, a, b = case["M"], case["a"], case["b"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        result = sketchot.solve(M, a, b, reg=reg, rng=0)
        seconds = time.perf_counter() - start
    return {
        "solver": "sketchot.solve", "seconds": seconds, "backend": result.backend,
        "rank": result.kernel.info.rank, "iterations": int(result.n_iter),
        "status": result.status, "accuracy_met": bool(result.accuracy_met),
        "certified": float(result.true_kernel.bound),
        "exhaustive": bool(result.true_kernel.exhaustive),
        "value_linear": float(result.value_linear), "value": float(result.value),
        "reason": result.reason, "timings": dict(result.timings),
        "attempts": [str(attempt) for attempt in result.attempts],
    }  # fmt: skip


def write(args: Any, stem: str, budget: float, load_start: Any, rows: list) -> None:
    """The JSON and the markdown table of the rows so far."""
    command = "python benchmarks/cost_matrix.py" + (" --quick" if args.quick else "")
    command += " --large-only" if args.large_only else ""
    command += f" --budget {budget:g}"
    meta = {
        "version": sketchot.__version__, "pot": ot.__version__, "cores": os.cpu_count(),
        "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "budget_s": budget,
        "stopThr": STOP_THR, "pot_max_iter": POT_MAX_ITER, "command": command,
    }  # fmt: skip
    write_json(args.out / f"{stem}.json", {**meta, "rows": rows})
    table = [
        (r["case"], f"{r['reg_over_max_cost']:.0e}", r["solver"],
         r.get("backend", ""), f"{r['seconds']:.2f}", f"{r['time_over_sketchot']:.2f}",
         r["status"] + (" (miss)" if r.get("miss") else ""), f"{r['certified']:.2e}",
         f"{r['value_linear']:.6g}", "" if r["emd2"] is None else f"{r['emd2']:.6g}")
        for r in rows
    ]  # fmt: skip
    lines = [
        f"# A cost matrix given: sketchot.solve(M) against POT's sinkhorn on the same M ({stem})",
        "",
        f"`{command}`; sketchot {meta['version']}, POT {meta['pot']}, "
        f"{meta['cores']} cores, load average {load_start[0]:.2f} at the start and "
        f"{meta['loadavg_end'][0]:.2f} at the end (shared machine: compare the ratios). POT "
        f"at stopThr={STOP_THR:g}, numItermax={POT_MAX_ITER}, capped at {budget:g} s per "
        "cell (a run stopped before stopThr is a miss). Certified: the upper bound of the "
        "true-kernel L1 marginal error relative to the mass (sketchot's check on exp(-M / reg), "
        "applied to both solvers' scalings). x sketchot: the row's time over sketchot's.",
        "",
        *md_table(HEADER, table, "llllrrlrrr"),
        "",
    ]
    write_text(args.out / f"{stem}.md", "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e3 and POT's 1-D grid")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per POT cell (default 20 quick, 60 full)")  # fmt: skip
    parser.add_argument("--label", default=None, help="suffix of the output files")
    parser.add_argument("--large-only", action="store_true",
                        help="only the n = 1e4 cases (files cost_matrix_1e4.*)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    budget = args.budget or (20.0 if args.quick else 60.0)
    cases = [] if args.large_only else [pot_grid(), uniform(1000, 0), digits()]
    if not args.quick:
        cases += [uniform(10_000, 1), colours(10_000, 2)]
    stem = "cost_matrix" + ("_quick" if args.quick else "_1e4" if args.large_only else "")
    stem += f"_{args.label}" if args.label else ""
    load_start = os.getloadavg()
    rows = []
    for case in cases:
        largest = float(case["M"].max())
        regs = case.get("regs") or [factor * largest for factor in REG_FACTORS]
        exact = None
        if case["M"].size <= 1_000_000:
            exact = float(ot.emd2(case["a"], case["b"], case["M"], numItermax=10**7))
        for reg in regs:
            cell = {"case": case["name"], "n": case["M"].shape[0], "reg": reg,
                    "reg_over_max_cost": reg / largest, "emd2": exact}  # fmt: skip
            solved = [run_sketchot(case, reg)]
            solved += [
                run_pot(case, reg, method, budget) for method in ("sinkhorn", "sinkhorn_log")
            ]
            base = solved[0]["seconds"]
            for row in solved:
                row.update(cell)
                row["time_over_sketchot"] = row["seconds"] / base
                rows.append(row)
                print(
                    f"{case['name']:34s} reg/max={reg / largest:7.0e} {row['solver']:20s} "
                    f"{row['seconds']:8.2f} s {row['status']:16s} "
                    f"certified {row['certified']:.2e} <P,M> {row['value_linear']:.6g}",
                    flush=True,
                )
            write(args, stem, budget, load_start, rows)  # after each cell: a stop keeps them


if __name__ == "__main__":
    main()
