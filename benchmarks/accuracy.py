"""Does each backend give the answer the user asked for? ``auto`` against the named backends.

For every dataset, size and reg (relative to the mean squared distance between the clouds):
what ``backend='auto'`` used and why, its time (build + solve) and its certified true-kernel
error (the solver's upper bound on the relative L1 marginal error), the same for each named
backend at its defaults, the cost ratio to the exact solve where the exact kernel is
affordable, and in the same run POT's dense ``ot.sinkhorn`` (where ``n x m`` fits) and POT's
Nystroem solver with 1000 anchors (``ot.lowrank.kernel_nystroem`` +
``sinkhorn_low_rank_kernel``), checked against the true kernel by sketchot's check.

    python benchmarks/accuracy.py --quick             # n = 2000, three datasets, three reg
    python benchmarks/accuracy.py --json out.json     # the full grid (long)

Every cell runs in a child process; one that runs past ``--budget`` seconds is stopped and
reported as such (the table says so; it is never dropped).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _results import write_json
from _running import CellRunner

import sketchot
from sketchot.color import load_image, sample_pixels
from sketchot.gibbs import GibbsGeometry
from sketchot.kernels import KernelInfo, LowRankKernel
from sketchot.solver import plan_summary, true_kernel_check

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {
    "colours default": ("default_source.png", "default_target.png"),
    "colours pair2": ("pair2_source.png", "pair2_target.png"),
    "colours pair3": ("pair3_source.png", "pair3_target.png"),
}
RELATIVE_REGS = (1.0, 0.3, 0.1, 0.03, 0.01)
NAMED = ("exact", "nystrom", "rff", "polyts")
CHECK_SAMPLES = 256


def dataset(name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two clouds of ``n`` points each."""
    if name in PAIRS:
        source, target = (load_image(ROOT / "images" / f) for f in PAIRS[name])
        replace = n > min(source.shape[0] * source.shape[1], target.shape[0] * target.shape[1])
        return (
            sample_pixels(source, n, rng=rng, replace=replace).colors,
            sample_pixels(target, n, rng=rng, replace=replace).colors,
        )
    if name == "uniform d=3":
        return rng.random((n, 3)), rng.random((n, 3))
    d = int(name.split("=")[1])
    shift = np.zeros(d)
    shift[0] = 1.0
    return rng.standard_normal((n, d)), rng.standard_normal((n, d)) * 0.8 + shift


def mean_sq_distance(X: np.ndarray, Y: np.ndarray) -> float:
    """``E ||x - y||^2`` over the two clouds (exact, from means and second moments)."""
    return float((X**2).sum(1).mean() + (Y**2).sum(1).mean() - 2.0 * X.mean(0) @ Y.mean(0))


def run_sketchot(X, Y, reg, backend, rng_seed) -> dict[str, Any]:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = sketchot.sinkhorn(
                None, None, X, Y, reg, backend, rng=rng_seed, true_kernel_samples=CHECK_SAMPLES
            )
        except sketchot.InvalidResultError as error:
            return {
                "backend": backend,
                "used": backend,
                "seconds": time.perf_counter() - start,
                "error_bound": float("inf"),
                "cost": float("nan"),
                "status": "refused: impossible result (InvalidResultError)",
                "error_text": str(error),
            }
    return {
        "backend": backend,
        "used": res.backend + (f" rank {res.kernel.info.rank}" if res.kernel.info.rank else ""),
        "reason": res.reason,
        "seconds": time.perf_counter() - start,
        "error_bound": res.true_kernel.bound,
        "cost": res.value_linear,
        "status": "met" if res.accuracy_met else "missed",
    }


def run_pot_dense(X, Y, reg) -> dict[str, Any]:
    start = time.perf_counter()
    a, b = np.full(len(X), 1 / len(X)), np.full(len(Y), 1 / len(Y))
    M = ot.dist(X, Y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = ot.sinkhorn(a, b, M, reg, numItermax=1000, stopThr=1e-9)
    seconds = time.perf_counter() - start
    error = max(np.abs(plan.sum(1) - a).sum(), np.abs(plan.sum(0) - b).sum())
    finite = np.isfinite(plan).all()
    return {
        "backend": "POT dense",
        "used": "ot.sinkhorn",
        "seconds": seconds,
        "error_bound": float(error) if finite else float("inf"),
        "cost": float((plan * M).sum()),
        "status": "met" if finite and error <= 1e-3 else "missed",
    }


def run_pot_nystroem(X, Y, reg, seed) -> dict[str, Any]:
    start = time.perf_counter()
    a, b = np.full(len(X), 1 / len(X)), np.full(len(Y), 1 / len(Y))
    anchors = min(1000, len(X) + len(Y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        A, B = ot.lowrank.kernel_nystroem(
            X, Y, anchors=anchors, sigma=np.sqrt(reg / 2), random_state=seed
        )
        u, v = ot.lowrank.sinkhorn_low_rank_kernel(A, B, a, b, numItermax=1000)[:2]
    seconds = time.perf_counter() - start
    geometry = GibbsGeometry(X, Y, reg)
    kernel = LowRankKernel(
        geometry, KernelInfo("pot-nystroem"), A, B, left_map=None, right_map=None, dtype=np.float64
    )
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        log_u, log_v = np.log(np.asarray(u, float)), np.log(np.asarray(v, float))
        rows = np.sort(rng.choice(len(X), min(CHECK_SAMPLES, len(X)), replace=False))
        cols = np.sort(rng.choice(len(Y), min(CHECK_SAMPLES, len(Y)), replace=False))
        check = true_kernel_check(kernel, a, b, log_u, log_v, rows, cols)
        cost = plan_summary(kernel, log_u, log_v).cost
    bound = check.bound if np.isfinite(check.bound) else float("inf")
    return {
        "backend": f"POT Nystroem {anchors}",
        "used": "ot.lowrank",
        "seconds": seconds,
        "error_bound": bound,
        "cost": float(cost),
        "status": "met" if bound <= 1e-3 and cost >= 0 else "missed",
    }


def stopped(label: str, budget: float) -> dict[str, Any]:
    return {"backend": label, "used": "-", "seconds": budget, "error_bound": float("nan"),
            "cost": float("nan"), "status": f"stopped after the {budget:g} s budget"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 2000, a few cells")
    parser.add_argument("--json", type=Path, help="write the table as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=600.0, help="stop slower cells (s)")
    parser.add_argument("--datasets", nargs="+", help="a subset of the data sets")
    parser.add_argument("--auto-only", action="store_true", help="only backend='auto'")
    parser.add_argument("--sizes", nargs="+", type=int, help="a subset of n")
    parser.add_argument("--regs", nargs="+", type=float, help="reg values (relative)")
    parser.add_argument(
        "--absolute", action="store_true", help="--regs are absolute, not relative to E||x-y||^2"
    )
    args = parser.parse_args()
    if args.quick:
        datasets = ["colours default", "uniform d=3", "gaussian d=10"]
        sizes, regs = [2000], (1.0, 0.1, 0.01)
    else:
        datasets = [*PAIRS, "uniform d=3", "gaussian d=2", "gaussian d=10", "gaussian d=50"]
        sizes, regs = [2000, 20_000, 200_000], RELATIVE_REGS
    datasets, sizes, regs = args.datasets or datasets, args.sizes or sizes, args.regs or regs
    rows: list[dict[str, Any]] = []
    header = (
        "| dataset | n | reg / mean sq. distance | solver | used | time s | certified error | "
        "cost / exact | status |\n|---|---:|---:|---|---|---:|---:|---:|---|"
    )
    print(header)
    runner = CellRunner(args.budget)

    def run(label: str, function: Any, *cell_args: Any) -> dict[str, Any]:
        return runner(function, *cell_args) or stopped(label, args.budget)

    for name in datasets:
        for n in sizes:
            X, Y = dataset(name, n, np.random.default_rng(args.seed))
            spread = mean_sq_distance(X, Y)
            for value in regs:
                reg = value if args.absolute else value * spread
                relative = reg / spread
                cells = [run("auto", run_sketchot, X, Y, reg, "auto", args.seed)]
                exact_cost = cells[0]["cost"] if cells[0]["used"].startswith("exact") else None
                if n <= 20_000 and not args.auto_only:
                    for backend in NAMED:
                        if backend == "exact" and n > 5000:
                            continue  # streamed exact at small reg: minutes per cell
                        cells.append(run(backend, run_sketchot, X, Y, reg, backend, args.seed))
                        if backend == "exact":
                            exact_cost = cells[-1]["cost"]
                    cells.append(run("POT Nystroem", run_pot_nystroem, X, Y, reg, args.seed))
                if n <= 5000 and not args.auto_only:
                    cells.append(run("POT dense", run_pot_dense, X, Y, reg))
                for cell in cells:
                    ratio = (
                        cell["cost"] / exact_cost
                        if exact_cost and np.isfinite(cell["cost"])
                        else float("nan")
                    )
                    row = {"dataset": name, "n": n, "relative_reg": relative, "reg": reg,
                           "cost_ratio": ratio, **cell}  # fmt: skip
                    rows.append(row)
                    print(
                        f"| {name} | {n} | {relative:.3g} | {cell['backend']} | {cell['used']} | "
                        f"{cell['seconds']:.2f} | {cell['error_bound']:.2g} | "
                        f"{ratio:.4f} | {cell['status']} |",
                        flush=True,
                    )
    runner.close()
    print_auto_summary(rows)
    if args.json is not None:
        write_json(args.json, {"seed": args.seed, "quick": args.quick, "rows": rows})


def print_auto_summary(rows: list[dict[str, Any]]) -> None:
    """``auto`` next to POT's dense solver, one line per cell, and the counts that matter."""
    pot = {(r["dataset"], r["n"], r["reg"]): r for r in rows if r["backend"] == "POT dense"}
    auto = [r for r in rows if r["backend"] == "auto"]
    header = ["dataset", "n", "reg / mean sq. distance", "auto used", "auto s",
              "auto certified error", "POT dense s", "POT error", "auto / POT time"]  # fmt: skip
    print("\n| " + " | ".join(header) + " |\n|---|---:|---:|---|---:|---:|---:|---:|---:|")
    ratios = []
    for r in auto:
        p = pot.get((r["dataset"], r["n"], r["reg"]))
        ratio = r["seconds"] / p["seconds"] if p else float("nan")
        ratios += [ratio] if p else []
        theirs = f"{p['seconds']:.2f} | {p['error_bound']:.2g}" if p else "- | -"
        ours = f"{r['used']} | {r['seconds']:.2f} | {r['error_bound']:.2g}"
        print(f"| {r['dataset']} | {r['n']} | {r['relative_reg']:.3g} | {ours} | {theirs} | "
              f"{ratio:.2f} |")  # fmt: skip
    met = sum(r["status"] == "met" for r in auto)
    summary = f"\nauto met the accuracy in {met} of {len(auto)} cells"
    if ratios:
        summary += (f"; time / POT dense: median {np.median(ratios):.2f}, max {max(ratios):.2f}, "
                    f"{sum(x > 1.2 for x in ratios)} cells slower by more than 20%")  # fmt: skip
    print(summary)


if __name__ == "__main__":
    main()
