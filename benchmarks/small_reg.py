"""Small reg: the block-local polynomial kernel against the exact paths, Nystrom and POT.

Photo pixels of ``images/`` (the default pair) and uniform points in ``[0, 1]^3``; n points
per side; reg relative to colours in ``[0, 1]``. Every cell but the default calls solves
to ``tol = 1e-9`` with ``accuracy = 1e-6``; each reports: time (build + solve), iterations,
the certified true-kernel error (upper bound of the relative L1 marginal error, 256 sampled
rows and columns, or all of them), peak resident memory of the cell (each cell runs in a
fresh process), and for the local kernel its clusters and features per point. Methods: the
default call (``backend='auto'``, ``accuracy=1e-3``, its own tol) with and without the
coarse-to-fine start; ``polyts_local`` (with and without the coarse start) and ``exact``
(absorption-stabilised, stored when ``n x m`` fits 1 GiB,
streamed otherwise), each with and without Anderson acceleration (``anderson=0``); exact
with epsilon-scaling; ``nystrom`` with ``rank='auto'``; POT's
``ot.sinkhorn(method='sinkhorn_stabilized')`` where the dense cost fits; GeomLoss's
``SamplesLoss('sinkhorn', p=2, blur=sqrt(reg / 2), debias=False, potentials=True)`` (the same
kernel) with KeOps, ``multiscale`` at ``scaling`` 0.5 and 0.9 and ``online`` at 0.9, on
float64 CPU tensors, its potentials certified by the same check (skipped without geomloss,
pykeops or torch; KeOps compiles its formulas outside the timing).

    python benchmarks/small_reg.py --quick            # n = 10^4, photo pixels, two reg
    python benchmarks/small_reg.py --json out.json    # n up to 10^6 (cells over --budget skip)
    python benchmarks/small_reg.py --sizes 100000 --regs 0.01 --methods local   # one cell
"""

from __future__ import annotations

import argparse
import resource
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _peers import CHECK_SAMPLES, certified, geomloss_potentials, geomloss_steps
from _results import write_json
from _running import CellRunner

import sketchot
from sketchot.color import load_image, sample_pixels

ROOT = Path(__file__).resolve().parents[1]
REGS = (0.1, 0.03, 0.01, 0.003)
METHODS = {
    "local": {"backend": "polyts_local"},
    "local, no Anderson": {"backend": "polyts_local", "anderson": 0},
    "exact": {"backend": "exact"},
    "exact, no Anderson": {"backend": "exact", "anderson": 0},
    "exact stored 4 GiB": {"backend": "exact", "max_dense_bytes": 4 << 30},
    "exact + eps-scaling": {"backend": "exact", "epsilon_scaling": True},
    "nystrom rank=auto": {"backend": "nystrom", "rank": "auto"},
    # the default call (issue 21's target): backend='auto', accuracy 1e-3, its own tol
    "default call": {"backend": "auto", "tol": None, "accuracy": 1e-3},
    "default call, no coarse start": {
        "backend": "auto",
        "tol": None,
        "accuracy": 1e-3,
        "coarse_to_fine": False,
    },
    "local, no coarse start": {"backend": "polyts_local", "coarse_to_fine": False},
}
#: GeomLoss's methods, "GeomLoss <backend> <scaling>" (run by ``_peers.geomloss_potentials``)
PEERS = ("GeomLoss multiscale 0.5", "GeomLoss multiscale 0.9", "GeomLoss online 0.9")


def clouds(data: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if data == "uniform":
        return rng.random((n, 3)), rng.random((n, 3))
    source = load_image(ROOT / "images" / "default_source.png")
    target = load_image(ROOT / "images" / "default_target.png")
    replace = n > 480_000  # the target has 640 x 960 pixels
    return (
        sample_pixels(source, n, rng=rng, replace=replace).colors,
        sample_pixels(target, n, rng=rng, replace=replace).colors,
    )


def cell(data: str, n: int, reg: float, method: str, seed: int) -> dict[str, Any]:
    """One solve (run in a fresh process, so that the peak memory is the cell's)."""
    X, Y = clouds(data, n, seed)
    if method.startswith("GeomLoss"):
        return geomloss_cell(X, Y, reg, method, seed)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "POT stabilised":
            a = np.full(n, 1.0 / n)
            plan = ot.sinkhorn(a, a, ot.dist(X, Y), reg, method="sinkhorn_stabilized",
                               numItermax=5000, stopThr=1e-9)  # fmt: skip
            seconds = time.perf_counter() - start
            error = max(np.abs(plan.sum(1) - a).sum(), np.abs(plan.sum(0) - a).sum())
            return {"seconds": seconds, "n_iter": None, "error": float(error),
                    "peak_mib": peak_mib(), "detail": ""}  # fmt: skip
        params = {"max_iter": 5000, "tol": 1e-9, "accuracy": 1e-6, **METHODS[method]}
        backend = params.pop("backend")
        res = sketchot.sinkhorn(None, None, X, Y, reg, backend, rng=seed, errors="warn", **params)
    seconds = time.perf_counter() - start
    info = res.kernel.info
    detail = ""
    if "clusters" in info.params:
        detail = f"clusters {info.params['clusters']}, degree {info.params['degree']}"
    elif info.rank:
        detail = f"rank {info.rank}"
    if backend == "auto":
        detail = f"{res.backend}; {detail}" if detail else res.backend
    coarse = res.iteration_info.get("coarse_to_fine")
    if coarse is not None:
        detail += (
            f"; coarse start {coarse['clusters'][0]}x{coarse['clusters'][1]} clusters, "
            f"{coarse['coarse_iter']} its, {coarse['seconds']:.1f} s"
        )
    return {
        "seconds": seconds,
        "n_iter": res.n_iter,
        "error": res.true_kernel.bound,
        "converged": bool(res.converged),
        "peak_mib": peak_mib(),
        "detail": detail,
    }


def geomloss_cell(X: np.ndarray, Y: np.ndarray, reg: float, method: str, seed: int) -> dict:
    """GeomLoss's potentials (``method`` names its backend and scaling) and their certified
    true-kernel error; ``skipped`` with the reason when it cannot run."""
    _, backend, scaling = method.split()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = geomloss_potentials(X, Y, reg, float(scaling), backend)
    except Exception as exc:  # a peer that cannot run (KeOps without a compiler) says why
        return {"skipped": f"{type(exc).__name__}: {str(exc)[:80]}"}
    if out is None:
        return {"skipped": "geomloss, pykeops or torch not installed"}
    seconds, log_u, log_v = out
    return {
        "seconds": seconds,
        "n_iter": None,
        "error": certified(X, Y, reg, log_u, log_v, seed, CHECK_SAMPLES),
        "peak_mib": peak_mib(),
        "detail": f"geomloss {backend}, scaling {scaling}",
    }


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def estimated_seconds(method: str, n: int, reg: float) -> float:
    """A rough cost model to skip cells: exact O(n^2) per iteration; iterations ~ 1 / reg
    plain, ~ 1 / sqrt(reg) Anderson-mixed (measured on photo colours); GeomLoss measured on
    uniform points (two CPU cores)."""
    plain = "no Anderson" in method or method.startswith("POT")
    iterations = min(5000, 3.0 / reg if plain else 6.0 / reg**0.5)
    if method.startswith("POT"):  # log-stabilised: exponentials of the whole matrix, often
        return iterations * n * n * 1e-7
    if method.startswith("exact"):
        return iterations * n * n * 2e-9 * (1 if n <= 11_000 else 10)
    if method.startswith("GeomLoss"):
        _, backend, scaling = method.split()
        steps = geomloss_steps(reg, float(scaling), 3**0.5)  # from the unit cube's diameter
        if backend == "online":  # two n x n softmins a step, ~6e-9 s an entry (float64 KeOps)
            return steps * n * n * 1.2e-8
        if reg / 2 >= 2000 ** (-2 / 3):  # blur over its cluster scale: clusters, one fine pass
            return 3.0 + n * n * 3e-10
        # fine steps on 5 blurs of truncation: ~36 s at n = 1e5, reg 0.01; 53-102 s at 0.003
        return 40.0 * (n / 1e5) ** 1.4 * (0.01 / reg)
    if method == "nystrom rank=auto":
        return 30.0 if reg >= 0.1 else n * n * 5e-9
    # the local kernel: two products per iteration, ~5e-6 s per point at reg 0.01 on photos
    return iterations * n * 5e-6 * (0.01 / max(reg, 1e-3)) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=900.0, help="skip or stop slower cells (s)")
    parser.add_argument("--data", nargs="+", default=["photo", "uniform"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 20_000, 10**5, 10**6])
    parser.add_argument("--regs", nargs="+", type=float, default=list(REGS))
    parser.add_argument("--methods", nargs="+", default=[*METHODS, "POT stabilised", *PEERS])
    args = parser.parse_args()
    if args.quick:
        grid = [("photo", 10_000, reg) for reg in (0.1, 0.01)]
    else:
        grid = [(data, n, reg) for data in args.data for n in args.sizes for reg in args.regs]
    methods = args.methods
    rows = []
    print("| data | n | reg | method | time s | iterations | certified error | peak MiB | notes |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|")
    runner = CellRunner(args.budget, fresh=True)
    for data, n, reg in grid:
        for method in methods:
            if method == "POT stabilised" and n > 10_000:
                continue
            estimate = estimated_seconds(method, n, reg)
            out = None if estimate > args.budget else runner(cell, data, n, reg, method, args.seed)
            if out is None or "skipped" in out:
                if out is None:
                    why = f"estimated {estimate:.0f} s" if estimate > args.budget else "stopped"
                    shown = f"{why}; budget {args.budget:g} s"
                else:  # a peer that cannot run here
                    why = shown = out["skipped"]
                row = {"data": data, "n": n, "reg": reg, "method": method, "skipped": why}
                rows.append(row)
                print(f"| {data} | {n} | {reg:g} | {method} | skipped ({shown}) | | | | |",
                      flush=True)  # fmt: skip
                continue
            rows.append({"data": data, "n": n, "reg": reg, "method": method, **out})
            print(
                f"| {data} | {n} | {reg:g} | {method} | {out['seconds']:.2f} | "
                f"{out['n_iter'] if out['n_iter'] is not None else '-'} | {out['error']:.2g} | "
                f"{out['peak_mib']:.0f} | {out['detail']} |",
                flush=True,
            )
    runner.close()
    if args.json is not None:
        write_json(args.json, {"seed": args.seed, "quick": args.quick, "rows": rows})


if __name__ == "__main__":
    main()
