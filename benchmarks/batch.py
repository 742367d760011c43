"""Batches of small problems: sketchot.sinkhorn_batch against a Python loop of
sketchot.sinkhorn, a loop of POT's ``ot.solve_sample``, POT's ``ot.solve_sample_batch`` and
GeomLoss's batched ``SamplesLoss`` (where installed).

Data: ``B`` pairs of 200-point clouds in 2-D (``--dim 3``: 3-D; ``default_rng(seed)``: source
uniform in the unit square or cube, target a Gaussian blob of random centre and scale),
uniform weights. ``reg`` =
0.1 and 0.01 times the mean squared distance between the points of a pair (averaged over the
pairs).

Methods, each timed from the clouds to the results (cost matrices included):

``sinkhorn_batch``
    ``sketchot.sinkhorn_batch(X, Y, reg=reg)``: the accuracy's stopping rule (L1 residual
    below 1e-4 of the mass, every pair checked on its own in float64), Anderson mixing per
    pair, float32 passes; at 0.01, 877 of the 1000 2-D pairs first run a coarse stage at 4
    times ``reg`` (sketchot.solver.batch's module notes).
``sinkhorn_batch without coarse stages``
    The same from the cold start at ``reg`` (the stages' threshold raised to infinity for
    the call), timed as often as the default: the stages' gain in the same run.
``sinkhorn_batch anderson=0``
    The same with the plain iteration (no mixing).
``sinkhorn_batch round_iter=100``
    The same with rounds of 100 iterations (the default 40: converged pairs leave sooner).
``sinkhorn_batch tol=1e-9``
    The same at POT's criterion (L2 column residual 1e-9 per pair; float64 passes).
``sinkhorn_batch ragged`` and ``sinkhorn loop ragged``
    A ragged batch: pair ``k`` keeps its first ``n_k`` and ``m_k`` points (drawn in
    ``[100, 200]``), as a list of clouds in one ``sinkhorn_batch`` call (padded with points
    of zero weight) and in a loop of ``sketchot.sinkhorn``.
``pairwise_divergences, 45 clouds``
    ``sketchot.pairwise_divergences(clouds, reg=reg)`` on the first 23 sources and 22
    targets: 990 cross and 45 symmetric problems (``solves / s`` counts all 1035), once.
``sinkhorn loop``
    ``[sketchot.sinkhorn(None, None, X[k], Y[k], reg=reg) for k]`` (``backend='auto'``).
``POT loop``
    ``[ot.solve_sample(X[k], Y[k], reg=reg) for k]`` (``ot.sinkhorn`` at ``stopThr=1e-9``).
``POT batch``
    ``ot.solve_sample_batch(X, Y, reg=reg, method='log_sinkhorn')`` at its defaults
    (``tol=1e-5``, 1000 iterations).
``GeomLoss scaling s``
    ``geomloss.SamplesLoss('sinkhorn', p=2, blur=sqrt(reg / 2), scaling=s, debias=False,
    potentials=True, backend='tensorized')`` on the ``(B, n, 2)`` float32 tensors (CPU; its
    cost ``||x - y||^2 / 2`` at ``eps = blur^2 = reg / 2`` is sketchot's problem), its plans
    ``a_i b_j exp((F_i + G_j - ||x_i - y_j||^2 / 2) / eps)`` rebuilt in float64 from its
    potentials for the error. GeomLoss runs a fixed epsilon-scaling schedule (no tolerance).

The batch solver runs over all ``B`` pairs; sketchot's loop and GeomLoss over the first
``--loop-pairs``, POT's loop and batch over the first ``--peer-pairs`` (solves per second
extrapolate). The default batch solve, sketchot's loop and GeomLoss run ``--repeat`` times
and the fastest run is reported (the machine may be shared); the others run once.
Reported: solves per second and the largest L1 marginal error of any pair relative to its mass
(``max(||P 1 - a||_1, ||P^T 1 - b||_1)``, from each plan: exact for every method).

    python benchmarks/batch.py --quick    # B = 1000 (sketchot's loop and GeomLoss over 100,
                                          # POT over 20), about 2 minutes
    python benchmarks/batch.py            # B = 1000 (loops over 200)
    python benchmarks/batch.py --quick --dim 3 --skip pot geomloss   # batch_quick_3d.md
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
from sketchot.solver import batch as batch_solver

RESULTS_DIR = Path(__file__).resolve().parent / "results"
N_POINTS = 200
#: Clouds of the divergence matrix row (half sources, half targets): 990 + 45 problems.
PAIRWISE_CLOUDS = 45
FACTORS = (0.1, 0.01)


def make_pairs(B: int, seed: int, dim: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.random((B, N_POINTS, dim))
    centres = rng.uniform(0.2, 0.8, size=(B, 1, dim))
    Y = centres + rng.uniform(0.05, 0.3, size=(B, 1, 1)) * rng.normal(size=(B, N_POINTS, dim))
    return X, Y


def mean_sq_distance(X: np.ndarray, Y: np.ndarray) -> float:
    return float(np.mean([ot.dist(x, y).mean() for x, y in zip(X, Y, strict=True)]))


def error_of(plan: np.ndarray) -> float:
    """Largest L1 marginal error relative to the mass (uniform weights)."""
    n, m = plan.shape
    rows = np.abs(plan.sum(axis=1) - 1.0 / n).sum()
    cols = np.abs(plan.sum(axis=0) - 1.0 / m).sum()
    return float(max(rows, cols) / plan.sum())


def run(B: int, loop_pairs: int, peer_pairs: int, seed: int, skip: set[str], repeat: int,
        dim: int = 2):  # fmt: skip
    X, Y = make_pairs(B, seed, dim)
    scale = mean_sq_distance(X, Y)
    rows: list[dict[str, Any]] = []
    for factor in FACTORS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_reg(X, Y, factor, factor * scale, min(loop_pairs, B), min(peer_pairs, B),
                    rows, skip, repeat)  # fmt: skip
    return rows


def run_reg(X, Y, factor, reg, k, peers, rows, skip, repeat) -> None:
    """Every method at one ``reg``; ``k`` pairs for sketchot's loop and GeomLoss, ``peers``
    for POT; the default batch solve, the loop and GeomLoss timed ``repeat`` times (the
    fastest is reported)."""
    B = X.shape[0]

    def record(method, seconds, count, error, extra=""):
        rows.append({"reg_factor": factor, "reg": reg, "method": method, "pairs": count,
                     "seconds": seconds, "solves_per_s": count / seconds,
                     "max_error": error, "notes": extra})  # fmt: skip
        print(", ".join(f"{key}={v:.4g}" if isinstance(v, float) else f"{key}={v}"
                        for key, v in rows[-1].items()), flush=True)  # fmt: skip

    variants = (
        ("sinkhorn_batch", {}),
        ("sinkhorn_batch anderson=0", {"anderson": 0}),
        ("sinkhorn_batch round_iter=100", {"round_iter": 100}),
        ("sinkhorn_batch tol=1e-9", {"tol": 1e-9}),
    )
    for name, options in variants:
        runs = repeat if not options else 1
        seconds, res = fastest(lambda o=options: sketchot.sinkhorn_batch(X, Y, reg=reg, **o),
                               runs)  # fmt: skip
        record(name, seconds, B, float(res.true_kernel_error.max()),
               f"{int(res.converged.sum())}/{B} converged, iterations "
               f"{int(res.n_iter.min())}-{int(res.n_iter.max())} "
               f"(mean {res.n_iter.mean():.1f})")  # fmt: skip
        if options:
            continue
        # the same solve without the coarse stages (the cold start at reg), as often
        seconds, res = fastest(lambda: without_coarse_stages(X, Y, reg), repeat)
        name = "sinkhorn_batch without coarse stages"
        record(name, seconds, B, float(res.true_kernel_error.max()),
               f"{int(res.converged.sum())}/{B} converged, iterations "
               f"{int(res.n_iter.min())}-{int(res.n_iter.max())} "
               f"(mean {res.n_iter.mean():.1f})")  # fmt: skip
    # a ragged batch: pair k keeps its first n_k and m_k points, drawn in [100, 200]
    sizes = np.random.default_rng(B).integers(N_POINTS // 2, N_POINTS + 1, size=(B, 2))
    Xr = [X[i, : sizes[i, 0]] for i in range(B)]
    Yr = [Y[i, : sizes[i, 1]] for i in range(B)]
    seconds, res = fastest(lambda: sketchot.sinkhorn_batch(Xr, Yr, reg=reg), repeat)
    record("sinkhorn_batch ragged", seconds, B, float(res.true_kernel_error.max()),
           f"sizes {N_POINTS // 2}-{N_POINTS}, {int(res.converged.sum())}/{B} converged, "
           f"iterations {int(res.n_iter.min())}-{int(res.n_iter.max())}")  # fmt: skip
    seconds, out = fastest(
        lambda: [sketchot.sinkhorn(None, None, Xr[i], Yr[i], reg=reg) for i in range(k)], repeat
    )
    record("sinkhorn loop ragged", seconds, k, max(r.true_kernel.bound for r in out),
           f"backends {sorted({r.backend for r in out})}")  # fmt: skip
    clouds = np.concatenate(
        [X[: PAIRWISE_CLOUDS // 2], Y[: PAIRWISE_CLOUDS - PAIRWISE_CLOUDS // 2]]
    )
    seconds, res = timed(lambda: sketchot.pairwise_divergences(clouds, reg=reg))
    K = PAIRWISE_CLOUDS
    record(f"pairwise_divergences, {K} clouds", seconds, K * (K + 1) // 2,
           float(res.true_kernel_error.max()),
           f"{K * (K - 1) // 2} cross + {K} symmetric problems, "
           f"{int(res.converged[np.triu_indices(K)].sum())} converged")  # fmt: skip
    seconds, out = fastest(
        lambda: [sketchot.sinkhorn(None, None, X[i], Y[i], reg=reg) for i in range(k)], repeat
    )
    record("sinkhorn loop", seconds, k, max(r.true_kernel.bound for r in out),
           f"backends {sorted({r.backend for r in out})}, iterations "
           f"{min(r.n_iter for r in out)}-{max(r.n_iter for r in out)}")  # fmt: skip
    if "geomloss" not in skip:
        for scaling in (0.5, 0.9):
            measured = geomloss_batch(X[:k], Y[:k], reg, scaling, repeat)
            if measured is not None:
                record(f"GeomLoss scaling {scaling}", measured[0], k, measured[1],
                       "tensorized, float32, CPU")  # fmt: skip
    if "pot" in skip:
        return
    seconds, out = timed(lambda: [ot.solve_sample(X[i], Y[i], reg=reg) for i in range(peers)])
    record("POT loop", seconds, peers, max(error_of(np.asarray(r.plan)) for r in out))
    if hasattr(ot, "solve_sample_batch") and "pot-batch" not in skip:
        seconds, res = timed(lambda: ot.solve_sample_batch(X[:peers], Y[:peers], reg=reg,
                                                           method="log_sinkhorn"))  # fmt: skip
        plans = np.asarray(res.plan)
        record("POT batch", seconds, peers, max(error_of(p) for p in plans))


def without_coarse_stages(X, Y, reg):
    """``sketchot.sinkhorn_batch(X, Y, reg=reg)`` with the coarse stages switched off (their
    threshold raised to infinity for the call): the cold start at ``reg``."""
    saved = batch_solver.COARSE_MIN_SPREAD
    batch_solver.COARSE_MIN_SPREAD = float("inf")
    try:
        return sketchot.sinkhorn_batch(X, Y, reg=reg)
    finally:
        batch_solver.COARSE_MIN_SPREAD = saved


def fastest(function, repeat):
    """``(seconds, value)`` of the fastest of ``repeat`` calls (the machine is shared: the
    fastest run is the one least disturbed)."""
    runs = [timed(function) for _ in range(max(1, repeat))]
    return min(runs, key=lambda run: run[0])


def geomloss_batch(X, Y, reg, scaling, repeat=1):
    """``(seconds, largest relative marginal error)`` of GeomLoss's batched solve (module
    notes), or ``None`` when geomloss is not installed."""
    try:
        import geomloss
        import torch
    except ImportError:
        return None
    loss = geomloss.SamplesLoss("sinkhorn", p=2, blur=float(np.sqrt(reg / 2)), scaling=scaling,
                                debias=False, potentials=True, backend="tensorized")  # fmt: skip
    x, y = torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32)
    seconds, (F, G) = fastest(lambda: loss(x, y), repeat)
    F, G = F.double().numpy(), G.double().numpy()
    eps = reg / 2
    errors = []
    for k in range(X.shape[0]):
        cost = ot.dist(X[k], Y[k]) / 2
        log_plan = (F[k][:, None] + G[k][None, :] - cost) / eps
        plan = np.exp(log_plan - np.log(X.shape[1]) - np.log(Y.shape[1]))
        errors.append(error_of(plan))
    return seconds, float(max(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="B = 1000, the loop and GeomLoss over 100, POT over 20")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--loop-pairs", type=int, default=200)
    parser.add_argument("--peer-pairs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dim", type=int, default=2, choices=[2, 3],
                        help="dimension of the clouds (3: results under *_3d)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of the default batch solve, the loop and GeomLoss (fastest "
                             "reported)")  # fmt: skip
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["pot", "pot-batch", "geomloss"])  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        B, loop, peers = 1000, 100, 20
    else:
        B, loop, peers = args.pairs, args.loop_pairs, args.peer_pairs
    rows = run(B, loop, peers, args.seed, set(args.skip), args.repeat, args.dim)
    stem = ("batch_quick" if args.quick else "batch") + ("_3d" if args.dim == 3 else "")
    meta = {"python": sys.version.split()[0], "numpy": np.__version__, "pot": ot.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(), "pairs": B,
            "loop_pairs": loop, "peer_pairs": peers, "repeat": args.repeat,
            "points": N_POINTS, "d": args.dim, "load": os.getloadavg()}  # fmt: skip
    write_json(RESULTS_DIR / f"{stem}.json", {"meta": meta, "rows": rows})
    table = md_table(
        ["reg / mean sq. dist.", "method", "pairs timed", "seconds", "solves / s",
         "max rel. marginal error", "notes"],
        [[r["reg_factor"], r["method"], r["pairs"], f"{r['seconds']:.2f}",
          f"{r['solves_per_s']:.0f}", f"{r['max_error']:.1e}", r["notes"]] for r in rows],
        "rlrrrrl",
    )  # fmt: skip
    text = "\n".join([f"# {__doc__.splitlines()[0]}", "", f"{meta}", "", *table, ""])
    print(text)
    write_text(RESULTS_DIR / f"{stem}.md", text)


if __name__ == "__main__":
    main()
