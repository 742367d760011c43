"""Sinkhorn on sampled RGB pixels: the experiment of Figure 2 of Han et al. (2020), made explicit.

The paper samples ``n`` pixels of a source and ``n`` of a target image, runs 10 Sinkhorn
iterations with the exact Gibbs kernel and with three approximations of it (Coreset-TS, RFF,
Nystrom), and reports (a) the speedup per iteration over the exact computation and (b) the
ratio of the approximate objective to the exact one, averaged over 3 image pairs and 10 trials.
This script adds a fourth line, Nystrom with sketchot's default k-center landmarks. The paper
leaves open the values of ``n``, the pixel scaling, which objective, the start of the
iteration, the handling of non-positive ``K~ v`` and the timing method. This script fixes each
of them as follows (and the README repeats the list):

Data
    Three image pairs (``images/{default,pair2,pair3}_{source,target}.png``), read with Pillow,
    RGB in ``[0, 1]`` (``/ 255``). Per trial, ``n`` pixels are drawn WITHOUT replacement from
    each image (fresh samples every trial); weights ``a = b = 1 / n``.
Kernel
    ``K = exp(-||x - y||^2 / reg)`` (POT's convention; the paper's ``gamma = 1 / reg``).
Iteration (the protocol)
    Exactly the paper's update, from ``v = 1``: ``u = a / (K v)``, ``v = b / (K^T u)``, 10 times,
    through the operator's public products ``op.matvec`` / ``op.rmatvec`` (two kernel
    applications per iteration). No safeguard: a non-positive or non-finite denominator is
    counted ("faults") and the iteration goes on, as the paper's RFF and Nystrom would.
    A trial whose final ``u`` or ``v`` has a non-positive or non-finite entry is a FAILED trial:
    its objectives are undefined (NaN) and it is counted, never dropped.
Library variant
    The same operator through ``sketchot.sinkhorn_kernel(a, b, op, max_iter=10, tol=1e-300,
    safeguard='exact', warn=False)``: sketchot's own solver (POT's order, ``u = 1 / n`` first,
    fused sweeps, exact-kernel repair of bad denominators). Its exact reference is the same
    iteration in the same order on the exact operator (checked against ``sinkhorn_kernel`` on
    the exact operator once per ``(reg, n)``; the largest relative difference is reported).
    Run for ``n <= 5000`` only (``--library-max-n``): at ``reg = 0.1`` its exact-kernel repairs
    cost about 45 s per trial at ``n = 10^4``, more than the exact solver.
Objectives after 10 iterations (ratio = approximate / exact, same samples, same iterations)
    * ``cost (true K)``: ``<P, M>`` with ``P = diag(u) K diag(v)``, ``K`` the EXACT kernel:
      what the approximate scalings really achieve (the primary measure);
    * ``cost (approx K)``: the same with the approximate kernel (what ``sinkhorn2`` reports);
    * ``dual (approx K)``: ``reg (<a, log u> + <b, log v>) - reg (u^T K~ v - 1)``, what the
      method itself would report as its entropic objective;
    * ``dual (true K)``: the same with ``u^T K v``.
    With uniform weights the dual is dominated by the entropy term (about ``-2 reg log n``),
    so its ratio stays near 1 even when the plan is poor; the cost ratios are the
    discriminating measures.
Timing
    Each iteration (two products and two divisions) is timed with ``time.perf_counter``; the
    per-iteration time of a trial is the MEDIAN of its 10 iterations (robust to interference on
    a shared machine). Speedup per iteration = exact median / approximate median in the same
    trial; speedup including the build = (exact build + 10 exact iterations) / (approximate
    build + 10 approximate iterations). The exact build is the dense ``n x n`` kernel. BLAS
    runs on one thread for every backend (``--threads``): on a shared 2-core machine threaded
    BLAS calls made small products 10-100x slower at random.
Settings
    ``paper``: polyts ``m = 20, r = 3, k = 10`` (rank 61), RFF ``D = m r = 60``, Nystrom
    ``s = ceil(max(sqrt(r m), r)) = 8`` (the paper's comparable BUILD cost);
    ``rank 241``: polyts ``m = 80, r = 3`` (rank ``1 + r m = 241``), RFF ``D = 241``, Nystrom
    ``s = 241`` landmarks: equal rank, hence equal per-iteration cost ``O(n rank)``.
    Both at ``reg = 1`` (the paper's ``gamma = 1``) and ``reg = 0.1`` (POT's colour-transfer
    demo). polyts uses sketchot's defaults (coreset coefficients, the reference code's
    'shifted' ridge weights, clouds centred at their common mean). Nystrom runs twice: with
    landmarks drawn uniformly, half from each cloud (``nystrom``: the paper's and POT's
    method), and with sketchot's default greedy k-center landmarks (``nystrom_kc``). Nystrom
    drops eigenvalues of ``K(Z, Z)`` below ``1e-12`` times the largest, so its rank can be
    lower than ``s`` (the tables give the rank used).
Seeds
    One base seed; ``numpy.random.SeedSequence(base).spawn`` per pair, per ``n``, per trial,
    and per trial one child for the pixel samples and one per (setting, backend) for the sketch.
    Every spawn key is in the JSON. ``--quick`` uses the same seeds for the points it runs.

Run ``python benchmarks/paper_sinkhorn.py`` (the full sweep: 3 pairs x 4 values of n x 10
trials x 2 reg x 2 rank settings; 12 minutes on 2 shared cores) or ``--quick`` (one pair,
n in {1000, 2000}, 3 trials, both reg: about 15 seconds). ``--json PATH`` writes every raw
number (failed values as ``null``); ``--replot PATH`` rebuilds tables and figure from such a
file without running. The figure goes to ``images/paper_sinkhorn.png`` and the tables to
``benchmarks/results/paper_sinkhorn.md`` (``--quick``: ``benchmarks/results/
paper_sinkhorn_quick.{png,md}``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json

import sketchot

ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = ROOT / "images"
RESULTS_DIR = ROOT / "benchmarks" / "results"

PAIRS = ("default", "pair2", "pair3")
N_VALUES = (1000, 2000, 5000, 10000)
REGS = (1.0, 0.1)
N_TRIALS = 10
N_ITER = 10
# The methods compared: the paper's three (Nystrom with uniformly drawn landmarks, as the paper
# and POT's kernel_nystroem do) and sketchot's default Nystrom (greedy k-center landmarks).
BACKENDS = ("polyts", "rff", "nystrom", "nystrom_kc")
BACKEND_OF = {"polyts": "polyts", "rff": "rff", "nystrom": "nystrom", "nystrom_kc": "nystrom"}
LABELS = {
    "polyts": "Coreset-TS (polyts)",
    "rff": "RFF",
    "nystrom": "Nystrom, uniform landmarks (paper)",
    "nystrom_kc": "Nystrom, k-center landmarks",
    "exact": "exact",
}
COLORS = {
    "polyts": "tab:red",
    "rff": "tab:blue",
    "nystrom": "tab:green",
    "nystrom_kc": "tab:purple",
}

# Equal-rank setting: rank 1 + r m = 241 for polyts (m = 80, r = 3), the same rank for RFF and
# Nystrom, so that one iteration costs the same O(n * 241) for every backend.
LARGE_RANK = 241
_PAPER = sketchot.comparable_parameters(sketch_dim=20, degree=3)
RANK_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {
        "polyts": {**_PAPER["polyts"], "variant": "paper"},
        "rff": _PAPER["rff"],
        "nystrom": {**_PAPER["nystrom"], "landmarks": "uniform"},
        "nystrom_kc": {**_PAPER["nystrom"], "landmarks": "kcenter"},
    },
    "rank241": {
        "polyts": {"sketch_dim": 80, "degree": 3, "variant": "paper"},
        "rff": {"n_features": LARGE_RANK},
        "nystrom": {"n_landmarks": LARGE_RANK, "landmarks": "uniform"},
        "nystrom_kc": {"n_landmarks": LARGE_RANK, "landmarks": "kcenter"},
    },
}
RANK_LABELS = {
    "paper": "paper ranks (polyts m=20 r=3, RFF D=60, Nystrom s=8)",
    "rank241": "equal rank 241 (polyts m=80 r=3, RFF D=241, Nystrom s=241)",
}

# The fixed order of every (reg, rank setting, backend) triple: trial t gives the method at
# position i the child i + 1 of its seed sequence (child 0 draws the pixels), in quick and in
# full runs alike.
METHOD_ORDER = tuple(
    (reg, setting, backend) for reg in REGS for setting in RANK_SETTINGS for backend in BACKENDS
)

BASE_SEED = 0

# Measures of accuracy, in the order of the tables.
MEASURES = ("cost_true", "cost_approx", "dual_approx", "dual_true")
MEASURE_LABELS = {
    "cost_true": "cost (true K)",
    "cost_approx": "cost (approx K)",
    "dual_approx": "dual (approx K)",
    "dual_true": "dual (true K)",
}


# --------------------------------------------------------------------------------------- data
def load_rgb(path: Path) -> np.ndarray:
    """All pixels of an image as an ``(H * W, 3)`` float array in ``[0, 1]``."""
    from PIL import Image

    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
    return pixels.reshape(-1, 3) / 255.0


def load_pairs(names: tuple[str, ...], synthetic: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{pair: (source pixels, target pixels)}``; ``synthetic`` builds stand-ins instead."""
    if synthetic:
        return {name: synthetic_pair(index) for index, name in enumerate(names)}
    pairs = {}
    for name in names:
        paths = [IMAGES_DIR / f"{name}_{side}.png" for side in ("source", "target")]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise SystemExit(
                f"missing image(s) {', '.join(missing)}: run images/make_images.py first, or "
                "pass --synthetic for synthetic stand-in colour clouds (development only)"
            )
        pairs[name] = (load_rgb(paths[0]), load_rgb(paths[1]))
    return pairs


def synthetic_pair(index: int, n_pixels: int = 40_000) -> tuple[np.ndarray, np.ndarray]:
    """Two clustered colour clouds in ``[0, 1]^3`` with different palettes (development only)."""
    rng = np.random.default_rng(np.random.SeedSequence(BASE_SEED, spawn_key=(999, index)))
    clouds = []
    for _ in range(2):
        centres = rng.random((5, 3))
        labels = rng.integers(0, 5, size=n_pixels)
        points = centres[labels] + 0.08 * rng.standard_normal((n_pixels, 3))
        clouds.append(np.clip(points, 0.0, 1.0))
    return clouds[0], clouds[1]


def sample_pixels(pixels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct pixels of an image (rows drawn without replacement)."""
    if pixels.shape[0] < n:
        raise SystemExit(f"an image has {pixels.shape[0]} pixels, fewer than n = {n}")
    return pixels[rng.choice(pixels.shape[0], size=n, replace=False)]


def data_spread(pairs: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, dict[str, float]]:
    """Scale of each pair relative to ``reg``, computed on ALL pixels (no sampling).

    ``mean_sq_distance``: ``E ||x - y||^2`` over independent source and target pixels
    (``= tr Cov x + tr Cov y + ||E x - E y||^2``); ``half_width``: ``max ||x - c|| max ||y - c||``
    with ``c`` the mean of both images, the interval half-width ``a`` on which polyts fits
    ``exp(2 t)`` is this divided by ``reg``.
    """
    out = {}
    for name, (source, target) in pairs.items():
        mean_x, mean_y = source.mean(axis=0), target.mean(axis=0)
        center = (source.sum(axis=0) + target.sum(axis=0)) / (len(source) + len(target))
        out[name] = {
            "mean_sq_distance": float(
                source.var(axis=0).sum() + target.var(axis=0).sum() + np.sum((mean_x - mean_y) ** 2)
            ),
            "half_width": float(
                np.sqrt(np.max(np.sum((source - center) ** 2, axis=1)))
                * np.sqrt(np.max(np.sum((target - center) ** 2, axis=1)))
            ),
        }
    return out


def spread_table(spread: dict[str, dict[str, float]], regs: list[float]) -> str:
    lines = [
        "Scale of the data relative to reg (all pixels): E||x - y||^2 / reg and the polyts "
        "interval half-width a = max||x - c|| max||y - c|| / reg.\n",
        "| pair | " + " | ".join(f"E||x-y||^2 / {r:g} | a at reg={r:g}" for r in regs) + " |",
        "|:---|" + "---:|---:|" * len(regs),
    ]
    for name, s in spread.items():
        cells = " | ".join(
            f"{s['mean_sq_distance'] / r:.3f} | {s['half_width'] / r:.3f}" for r in regs
        )
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------- iterations
@dataclass
class Run:
    """Scalings after the 10 iterations and what happened on the way."""

    u: np.ndarray
    v: np.ndarray
    iteration_times: list[float]
    faults: int = 0  # non-positive or non-finite entries of K v and K^T u, over all iterations
    warnings: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """Objectives are defined only for finite, positive scalings."""
        return bool(
            np.all(np.isfinite(self.u))
            and np.all(np.isfinite(self.v))
            and np.all(self.u > 0)
            and np.all(self.v > 0)
        )


def count_faults(denominators: np.ndarray) -> int:
    """Entries that are not finite and positive (``NaN`` counts)."""
    return int(np.count_nonzero(~(np.isfinite(denominators) & (denominators > 0))))


def protocol_iterations(op, a: np.ndarray, b: np.ndarray, n_iter: int = N_ITER) -> Run:
    """The paper's update from ``v = 1``: ``u = a / (K v)``, ``v = b / (K^T u)``.

    No safeguard: a bad denominator propagates, as in the paper's baselines. Every numpy warning
    raised on the way is recorded (``warnings='always'``), and the faults are counted outside
    the timed region.
    """
    u, v, times, faults, caught = _alternate(
        op.matvec, a, op.rmatvec, b, np.ones(op.shape[1]), n_iter
    )
    return Run(u, v, times, faults, caught)


def library_order_iterations(op, a: np.ndarray, b: np.ndarray, n_iter: int = N_ITER) -> Run:
    """sketchot's (POT's) order from ``u = 1 / n``: ``v = b / (K^T u)``, ``u = a / (K v)``.

    Used on the exact operator as the reference of the library variant.
    """
    start = np.full(op.shape[0], 1.0 / op.shape[0])
    v, u, times, faults, caught = _alternate(op.rmatvec, b, op.matvec, a, start, n_iter)
    return Run(u, v, times, faults, caught)


def _alternate(first, first_numerator, second, second_numerator, start, n_iter):
    """``x = first_numerator / first(y)``, ``y = second_numerator / second(x)`` from
    ``y = start``, ``n_iter`` times; returns ``(x, y, times, faults, warnings)``, each
    iteration timed, faults counted outside the timed region."""
    y = start
    times, faults = [], 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n_iter):
            begin = time.perf_counter()
            first_den = first(y)
            x = first_numerator / first_den
            second_den = second(x)
            y = second_numerator / second_den
            times.append(time.perf_counter() - begin)
            faults += count_faults(first_den) + count_faults(second_den)
    return x, y, times, faults, [str(w.message) for w in caught]


def library_iterations(op, a: np.ndarray, b: np.ndarray) -> tuple[Run, dict[str, Any]]:
    """``sketchot.sinkhorn_kernel`` for 10 iterations with the exact-kernel safeguard."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = sketchot.sinkhorn_kernel(
            a, b, op, max_iter=N_ITER, tol=1e-300, safeguard="exact", warn=False
        )
    with np.errstate(over="ignore"):
        u, v = np.exp(result.potentials[0]), np.exp(result.potentials[1])
    repairs = result.safeguard["rows_repaired"] + result.safeguard["cols_repaired"]
    run = Run(u, v, [result.timings["per_iteration"]], repairs, [str(w.message) for w in caught])
    return run, {
        "n_iter": result.n_iter,
        "repairs": repairs,
        "clipped": result.safeguard["clipped"],
        "per_iteration": result.timings["per_iteration"],
    }


# --------------------------------------------------------------------------------- objectives
def plan_costs(op, Xc: np.ndarray, Yc: np.ndarray, runs: list[Run]) -> list[tuple[float, float]]:
    """``(<P, M>, 1^T P 1)`` of ``P = diag(u) K diag(v)`` for several scaling pairs at once.

    ``||x - y||^2 = ||x||^2 + ||y||^2 - 2 x.y`` in centred coordinates, so one ``matmat`` with
    ``4`` columns per run (``v`` and ``v * Y``) and one ``rmatmat`` with one column per run
    (``u``) give everything: a single pass over the dense exact kernel for all methods of a
    trial, and ``O(n rank)`` for a low-rank operator. Only called on valid (positive) runs.
    """
    if not runs:
        return []
    d = Yc.shape[1]
    right = np.hstack([np.column_stack([r.v, r.v[:, None] * Yc]) for r in runs])
    left = np.column_stack([r.u for r in runs])
    K_right = op.matmat(right)
    Kt_left = op.rmatmat(left)
    x_sq, y_sq = np.einsum("ij,ij->i", Xc, Xc), np.einsum("ij,ij->i", Yc, Yc)
    out = []
    for index, run in enumerate(runs):
        block = K_right[:, index * (d + 1) : (index + 1) * (d + 1)]
        row = run.u * block[:, 0]
        col = run.v * Kt_left[:, index]
        cross = np.einsum("i,ij,ij->", run.u, Xc, block[:, 1:])
        out.append((float(row @ x_sq + col @ y_sq - 2.0 * cross), float(row.sum())))
    return out


def dual_value(run: Run, a: np.ndarray, b: np.ndarray, reg: float, mass: float) -> float:
    """``reg (<a, log u> + <b, log v>) - reg (mass - sum a)``."""
    return reg * (a @ np.log(run.u) + b @ np.log(run.v) - (mass - a.sum()))


def objectives(
    run: Run, exact_cost: tuple[float, float], approx_cost: tuple[float, float], a, b, reg
) -> dict[str, float]:
    return {
        "cost_true": exact_cost[0],
        "cost_approx": approx_cost[0],
        "dual_approx": dual_value(run, a, b, reg, approx_cost[1]),
        "dual_true": dual_value(run, a, b, reg, exact_cost[1]),
    }


NAN_OBJECTIVES = dict.fromkeys(MEASURES, math.nan)


# -------------------------------------------------------------------------------------- trial
def seed_record(seq: np.random.SeedSequence) -> dict[str, Any]:
    return {"entropy": seq.entropy, "spawn_key": list(seq.spawn_key)}


def run_trial(
    X: np.ndarray,
    Y: np.ndarray,
    regs: tuple[float, ...],
    settings: tuple[str, ...],
    method_seeds: dict[tuple[float, str, str], np.random.SeedSequence],
    check_library_exact: bool,
    run_library: bool = True,
) -> list[dict[str, Any]]:
    """Every method of one trial (one sample of ``X``, ``Y``): a list of flat records."""
    n = X.shape[0]
    a = np.full(n, 1.0 / n)
    b = np.full(n, 1.0 / n)
    records = []
    for reg in regs:
        exact = sketchot.make_kernel(X, Y, reg, "exact")
        Xc, Yc = X - exact.center, Y - exact.center
        exact_run = protocol_iterations(exact, a, b)
        exact_lib = library_order_iterations(exact, a, b) if run_library else None
        lib_check = None
        if check_library_exact and run_library:
            lib_check = check_against_library(exact, a, b, exact_lib, Xc, Yc)

        approx: list[tuple[str, str, Any, Run, Run, dict[str, Any]]] = []
        for setting in settings:
            for backend in BACKENDS:
                params = RANK_SETTINGS[setting][backend]
                rng = np.random.default_rng(method_seeds[(reg, setting, backend)])
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    op = sketchot.make_kernel(X, Y, reg, BACKEND_OF[backend], rng=rng, **params)
                build_warnings = [str(w.message) for w in caught]
                run = protocol_iterations(op, a, b)
                run.warnings = build_warnings + run.warnings
                lib_run, lib_info = library_iterations(op, a, b) if run_library else (None, None)
                approx.append((setting, backend, op, run, lib_run, lib_info))

        # One pass over the dense exact kernel for every valid run of this (trial, reg).
        candidates = [exact_run, exact_lib] + [r for *_, run, lib, _ in approx for r in (run, lib)]
        valid_runs = [r for r in candidates if r is not None and r.valid]
        true_costs = dict(
            zip(map(id, valid_runs), plan_costs(exact, Xc, Yc, valid_runs), strict=True)
        )
        exact_obj = objectives(
            exact_run, true_costs[id(exact_run)], true_costs[id(exact_run)], a, b, reg
        )
        exact_lib_obj = None
        if run_library:
            exact_lib_obj = objectives(
                exact_lib, true_costs[id(exact_lib)], true_costs[id(exact_lib)], a, b, reg
            )
        exact_median = float(np.median(exact_run.iteration_times))
        exact_total = exact.build_time + float(np.sum(exact_run.iteration_times))
        for setting in settings:
            records.append(
                {
                    "reg": reg,
                    "setting": setting,
                    "backend": "exact",
                    "rank": None,
                    "build_time": exact.build_time,
                    "iter_time": exact_median,
                    "iteration_times": exact_run.iteration_times,
                    "faults": exact_run.faults,
                    "warnings": exact_run.warnings,
                    "failed": not exact_run.valid,
                    "values": exact_obj,
                    "library": run_library
                    and {"values": exact_lib_obj, "faults": exact_lib.faults},
                    "library_check": lib_check,
                }
            )
        for setting, backend, op, run, lib_run, lib_info in approx:
            values = NAN_OBJECTIVES
            if run.valid:
                values = objectives(
                    run, true_costs[id(run)], plan_costs(op, Xc, Yc, [run])[0], a, b, reg
                )
            lib_values = NAN_OBJECTIVES
            if lib_run is not None and lib_run.valid:
                lib_values = objectives(
                    lib_run,
                    true_costs[id(lib_run)],
                    plan_costs(op, Xc, Yc, [lib_run])[0],
                    a,
                    b,
                    reg,
                )
            median = float(np.median(run.iteration_times))
            records.append(
                {
                    "reg": reg,
                    "setting": setting,
                    "backend": backend,
                    "params": RANK_SETTINGS[setting][backend],
                    "rank": int(op.rank),
                    "build_time": op.build_time,
                    "iter_time": median,
                    "iteration_times": run.iteration_times,
                    "speedup_iter": exact_median / median,
                    "speedup_total": exact_total
                    / (op.build_time + float(np.sum(run.iteration_times))),
                    "faults": run.faults,
                    "warnings": run.warnings,
                    "failed": not run.valid,
                    "values": values,
                    "ratios": ratios(values, exact_obj),
                    "library": run_library
                    and {
                        **lib_info,
                        "failed": not lib_run.valid,
                        "warnings": lib_run.warnings,
                        "values": lib_values,
                        "ratios": ratios(lib_values, exact_lib_obj),
                    },
                }
            )
        del exact, approx
    return records


def ratios(values: dict[str, float], reference: dict[str, float]) -> dict[str, float]:
    return {k: values[k] / reference[k] for k in MEASURES}


def check_against_library(exact, a, b, exact_lib: Run, Xc, Yc) -> dict[str, float]:
    """``sinkhorn_kernel`` on the exact operator vs the library-order loop (same iteration).

    Also times sketchot's fused exact iteration (one pass over ``K`` per iteration).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = sketchot.sinkhorn_kernel(
            a, b, exact, max_iter=N_ITER, tol=1e-300, safeguard="exact", warn=False
        )
    mine = plan_costs(exact, Xc, Yc, [exact_lib])[0][0]
    return {
        "relative_cost_difference": abs(result.value_linear - mine) / abs(mine),
        "max_abs_log_u_difference": float(
            np.max(np.abs(result.potentials[0] - np.log(exact_lib.u)))
        ),
        "fused_per_iteration": result.timings["per_iteration"],
        "warnings": [str(w.message) for w in caught],
    }


# ---------------------------------------------------------------------------------- the sweep
def sweep(args: argparse.Namespace) -> dict[str, Any]:
    pair_names = PAIRS[:1] if args.quick else PAIRS
    n_values = N_VALUES[:2] if args.quick else N_VALUES
    n_trials = 3 if args.quick else N_TRIALS
    regs = REGS
    settings = tuple(RANK_SETTINGS)
    pairs = load_pairs(pair_names, args.synthetic)
    spread = data_spread(pairs)

    base = np.random.SeedSequence(args.seed)
    pair_seqs = base.spawn(len(PAIRS))
    records: list[dict[str, Any]] = []
    trials_meta = []
    started = time.perf_counter()
    for pair in pair_names:
        source, target = pairs[pair]
        n_seqs = pair_seqs[PAIRS.index(pair)].spawn(len(N_VALUES))
        for n in n_values:
            trial_seqs = n_seqs[N_VALUES.index(n)].spawn(N_TRIALS)
            for trial in range(n_trials):
                children = trial_seqs[trial].spawn(1 + len(METHOD_ORDER))
                sample_rng = np.random.default_rng(children[0])
                X = sample_pixels(source, n, sample_rng)
                Y = sample_pixels(target, n, sample_rng)
                method_seeds = {m: children[1 + i] for i, m in enumerate(METHOD_ORDER)}
                check = trial == 0 and pair == pair_names[0]
                t0 = time.perf_counter()
                trial_records = run_trial(
                    X, Y, regs, settings, method_seeds, check, n <= args.library_max_n
                )
                for record in trial_records:
                    record.update({"pair": pair, "n": n, "trial": trial})
                    key = (record["reg"], record["setting"], record["backend"])
                    if key in method_seeds:
                        record["seed"] = seed_record(method_seeds[key])
                records.extend(trial_records)
                trials_meta.append(
                    {
                        "pair": pair,
                        "n": n,
                        "trial": trial,
                        "sample_seed": seed_record(children[0]),
                        "seconds": time.perf_counter() - t0,
                    }
                )
                print(
                    f"  {pair:8s} n={n:6d} trial {trial}: {time.perf_counter() - t0:6.1f} s "
                    f"(elapsed {time.perf_counter() - started:7.1f} s)",
                    flush=True,
                )
    return {
        "config": {
            "quick": args.quick,
            "synthetic": args.synthetic,
            "base_seed": args.seed,
            "pairs": list(pair_names),
            "n_values": list(n_values),
            "n_trials": n_trials,
            "n_iter": N_ITER,
            "regs": list(regs),
            "library_max_n": args.library_max_n,
            "rank_settings": RANK_SETTINGS,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "sketchot": sketchot.__version__,
            "machine": platform.platform(),
            "seconds": time.perf_counter() - started,
        },
        "data_spread": spread,
        "trials": trials_meta,
        "records": records,
    }


# ------------------------------------------------------------------------------- aggregation
def stats(values: list[float]) -> dict[str, float]:
    """Mean, std, median over the finite values, and how many were not finite."""
    array = np.asarray(values, dtype=np.float64)
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        return {"mean": math.nan, "std": math.nan, "median": math.nan, "count": 0}
    return {
        "mean": float(finite.mean()),
        "std": float(finite.std()),
        "median": float(np.median(finite)),
        "min": float(finite.min()),
        "max": float(finite.max()),
        "count": int(finite.size),
    }


def summarize(records: list[dict[str, Any]], pair: str | None = None) -> list[dict[str, Any]]:
    """One row per (reg, setting, n, backend), pooled over pairs (or for one ``pair``)."""
    rows = []
    keys = sorted(
        {(r["reg"], r["setting"], r["n"], r["backend"]) for r in records},
        key=lambda k: (-k[0], list(RANK_SETTINGS).index(k[1]), k[2], _backend_rank(k[3])),
    )
    for reg, setting, n, backend in keys:
        group = [
            r
            for r in records
            if (r["reg"], r["setting"], r["n"], r["backend"]) == (reg, setting, n, backend)
            and (pair is None or r["pair"] == pair)
        ]
        if not group:
            continue
        row: dict[str, Any] = {
            "reg": reg,
            "setting": setting,
            "n": n,
            "backend": backend,
            "trials": len(group),
            "failed": sum(r["failed"] for r in group),
            "faults": sum(r["faults"] for r in group),
            "trials_with_faults": sum(r["faults"] > 0 for r in group),
            "warnings": sum(len(r["warnings"]) for r in group),
            "warning_messages": dict(Counter(w for r in group for w in r["warnings"])),
            "iter_time": stats([r["iter_time"] for r in group]),
            "build_time": stats([r["build_time"] for r in group]),
        }
        if backend == "exact":
            checks = [r["library_check"] for r in group if r.get("library_check")]
            row["library_check"] = checks
        else:
            row["rank"] = stats([r["rank"] for r in group])
            row["speedup_iter"] = stats([r["speedup_iter"] for r in group])
            row["speedup_total"] = stats([r["speedup_total"] for r in group])
            row["ratios"] = {m: stats([r["ratios"][m] for r in group]) for m in MEASURES}
            lib = [r["library"] for r in group if r["library"]]
            row["library"] = lib and {
                "failed": sum(x["failed"] for x in lib),
                "repairs": sum(x["repairs"] for x in lib),
                "trials_with_repairs": sum(x["repairs"] > 0 for x in lib),
                "clipped": sum(x["clipped"] for x in lib),
                "warnings": sum(len(x["warnings"]) for x in lib),
                "per_iteration": stats([x["per_iteration"] for x in lib]),
                "ratios": {m: stats([x["ratios"][m] for x in lib]) for m in MEASURES},
            }
        rows.append(row)
    return rows


def _backend_rank(backend: str) -> int:
    return (*BACKENDS, "exact").index(backend)


# ------------------------------------------------------------------------------------ tables
def fmt_ratio(s: dict[str, float]) -> str:
    if s["count"] == 0:
        return "n/a"
    return f"{_num(s['mean'])} ± {_num(s['std'])} [{_num(s['median'])}]"


def _num(x: float) -> str:
    if not np.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.2e}"
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"


def markdown_tables(rows: list[dict[str, Any]], title_suffix: str = "") -> str:
    """Speed, protocol accuracy and library accuracy tables, one set per (reg, setting)."""
    out = []
    for reg in sorted({r["reg"] for r in rows}, reverse=True):
        for setting in RANK_SETTINGS:
            block = [r for r in rows if r["reg"] == reg and r["setting"] == setting]
            if not block:
                continue
            out.append(f"### reg = {reg:g}, {RANK_LABELS[setting]}{title_suffix}\n")
            out.append(
                "Speed (median per-iteration time of a trial; mean over trials) and robustness "
                "of the 10-iteration protocol (no safeguard).\n"
            )
            out.append(
                "| n | backend | rank | build s | iter ms | speedup/iter | speedup incl. build "
                "| failed / trials | faults (trials) | warnings |"
            )
            out.append("|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in block:
                rank = "-" if r["backend"] == "exact" else f"{r['rank']['mean']:.0f}"
                speed = (
                    ("-", "-")
                    if r["backend"] == "exact"
                    else (
                        f"{_num(r['speedup_iter']['mean'])} ± {_num(r['speedup_iter']['std'])}",
                        f"{_num(r['speedup_total']['mean'])} ± {_num(r['speedup_total']['std'])}",
                    )
                )
                out.append(
                    f"| {r['n']} | {r['backend']} | {rank} | {r['build_time']['mean']:.3f} | "
                    f"{r['iter_time']['mean'] * 1e3:.3f} | {speed[0]} | {speed[1]} | "
                    f"{r['failed']} / {r['trials']} | {r['faults']} ({r['trials_with_faults']}) "
                    f"| {r['warnings']} |"
                )
            out.append("")
            out.append(
                "Ratio approximate / exact after 10 iterations: mean ± std [median] over the "
                "trials that did not fail.\n"
            )
            out.append(
                "| n | backend | failed | " + " | ".join(MEASURE_LABELS[m] for m in MEASURES) + " |"
            )
            out.append("|---:|:---|---:|" + "---:|" * len(MEASURES))
            for r in block:
                if r["backend"] == "exact":
                    continue
                out.append(
                    f"| {r['n']} | {r['backend']} | {r['failed']} / {r['trials']} | "
                    + " | ".join(fmt_ratio(r["ratios"][m]) for m in MEASURES)
                    + " |"
                )
            out.append("")
            out.append(
                "The same operators through `sketchot.sinkhorn_kernel(..., max_iter=10, "
                "tol=1e-300, safeguard='exact')` (POT's order, fused sweeps, bad denominators "
                "recomputed with the exact kernel); ratios to the exact kernel in the same "
                "order.\n"
            )
            out.append(
                "| n | backend | failed | repairs (trials) | fused iter ms | "
                "cost (true K) | dual (approx K) |"
            )
            out.append("|---:|:---|---:|---:|---:|---:|---:|")
            for r in block:
                if r["backend"] == "exact":
                    continue
                lib = r["library"]
                if not lib:
                    out.append(f"| {r['n']} | {r['backend']} | not run (n > --library-max-n) ||||")
                    continue
                out.append(
                    f"| {r['n']} | {r['backend']} | {lib['failed']} / {r['trials']} | "
                    f"{lib['repairs']} ({lib['trials_with_repairs']}) | "
                    f"{lib['per_iteration']['mean'] * 1e3:.3f} | "
                    f"{fmt_ratio(lib['ratios']['cost_true'])} | "
                    f"{fmt_ratio(lib['ratios']['dual_approx'])} |"
                )
            out.append("")
    return "\n".join(out)


def library_check_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "Exact reference of the library variant vs `sinkhorn_kernel` on the exact operator "
        "(first trial of the first pair), and sketchot's fused exact iteration time:\n",
        "| reg | n | rel. cost difference | max abs log u difference | protocol iter ms "
        "| fused iter ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    seen = set()
    for r in rows:
        if r["backend"] != "exact" or not r["library_check"] or (r["reg"], r["n"]) in seen:
            continue
        seen.add((r["reg"], r["n"]))
        for check in r["library_check"]:
            lines.append(
                f"| {r['reg']:g} | {r['n']} | {check['relative_cost_difference']:.1e} | "
                f"{check['max_abs_log_u_difference']:.1e} | {r['iter_time']['mean'] * 1e3:.2f} "
                f"| {check['fused_per_iteration'] * 1e3:.2f} |"
            )
    return "\n".join(lines) + "\n"


def warning_summary(rows: list[dict[str, Any]]) -> str:
    messages: Counter[str] = Counter()
    for r in rows:
        for message, count in r["warning_messages"].items():
            messages[f"{r['backend']} (reg={r['reg']:g}): {message}"] += count
    if not messages:
        return "Warnings raised during the runs: none.\n"
    lines = ["Warnings raised during the protocol runs (message: count):\n"]
    lines += [f"- {message}: {count}" for message, count in messages.most_common()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ figure
def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    panels = [
        (reg, setting)
        for reg in sorted({r["reg"] for r in rows}, reverse=True)
        for setting in RANK_SETTINGS
        if any(r["reg"] == reg and r["setting"] == setting for r in rows)
    ]
    fig, axes = plt.subplots(
        len(panels), 3, figsize=(13, 3.3 * len(panels)), squeeze=False, constrained_layout=True
    )
    for (reg, setting), ax_row in zip(panels, axes, strict=True):
        block = [r for r in rows if r["reg"] == reg and r["setting"] == setting]
        for backend in BACKENDS:
            series = sorted((r for r in block if r["backend"] == backend), key=lambda r: r["n"])
            if not series:
                continue
            ns = [r["n"] for r in series]
            failed = sum(r["failed"] for r in series)
            total = sum(r["trials"] for r in series)
            label = LABELS[backend] + (f" ({failed}/{total} failed)" if failed else "")
            ax_row[0].plot(
                ns,
                [r["speedup_iter"]["mean"] for r in series],
                "o-",
                color=COLORS[backend],
                label=LABELS[backend],
            )
            for ax, measure in ((ax_row[1], "cost_true"), (ax_row[2], "dual_approx")):
                means = [r["ratios"][measure]["mean"] for r in series]
                stds = [r["ratios"][measure]["std"] for r in series]
                ax.errorbar(
                    ns, means, yerr=stds, fmt="o-", capsize=3, color=COLORS[backend], label=label
                )
        title = f"reg={reg:g}, {'paper ranks' if setting == 'paper' else 'rank 241'}"
        ax_row[0].set(
            xscale="log",
            yscale="log",
            xlabel="n",
            ylabel="speedup per iteration",
            title=f"(a) {title}",
        )
        ax_row[1].set(
            xscale="log",
            xlabel="n",
            ylabel="ratio to exact",
            title=f"(b) <P,M> with true K, {title}",
        )
        ax_row[2].set(
            xscale="log", xlabel="n", ylabel="ratio to exact", title=f"(c) dual (approx K), {title}"
        )
        for ax in ax_row[1:]:
            ax.axhline(1.0, color="gray", lw=0.8, ls="--")
            # Ratios of positive plans are positive: log scale; a lower bar below 0 (std larger
            # than the mean) is clipped at the bottom of the axis.
            ax.set_yscale("log", nonpositive="clip")
        for ax in ax_row:
            ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            low, high = ax.get_ylim()
            # A log axis spanning less than two decades has at most two major ticks: label
            # the minor ticks too (all of them within a decade, else only 2x and 5x).
            ax.yaxis.set_minor_formatter(
                ticker.FormatStrFormatter("%g")
                if high / low < 10
                else ticker.FuncFormatter(_label_2_and_5)
                if high / low < 100
                else ticker.NullFormatter()
            )
        for ax in ax_row:
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3, which="both")
    fig.suptitle(
        "10 Sinkhorn iterations on sampled RGB pixels (mean ± std over image pairs x trials; "
        "failed trials excluded and counted; bars that reach <= 0 are clipped)",
        fontsize=10,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _label_2_and_5(value: float, _position: int) -> str:
    """Tick label for 2x and 5x powers of ten only."""
    if value <= 0:
        return ""
    leading = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if leading in (2, 5) else ""


# -------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="one pair, n in {1000, 2000}, 3 trials"
    )
    parser.add_argument("--json", type=Path, help="write every raw number to this file")
    parser.add_argument("--seed", type=int, default=BASE_SEED, help="base seed (default 0)")
    parser.add_argument(
        "--library-max-n",
        type=int,
        default=5000,
        help="run the sketchot.sinkhorn_kernel variant only up to this n (default 5000: its "
        "exact-kernel repairs at reg=0.1 cost ~45 s per trial at n=10^4)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS threads for every backend (default 1; 0 leaves the BLAS default)",
    )
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help="synthetic colour clouds instead of the images (development only)",
    )
    parser.add_argument(
        "--replot",
        type=Path,
        help="rebuild the tables, the markdown file and the figure from a --json file of an "
        "earlier run, without running anything",
    )
    args = parser.parse_args(argv)
    limiter = limit_blas_threads(args.threads)

    print(
        f"sketchot {sketchot.__version__}, numpy {np.__version__}, Python "
        f"{platform.python_version()}, base seed {args.seed}"
        + (" [QUICK]" if args.quick else "")
        + (" [SYNTHETIC DATA]" if args.synthetic else "")
        + f", BLAS threads: {'default' if args.threads == 0 else args.threads}",
        flush=True,
    )
    if args.replot:
        # Tables and figure again from a finished run (failed values are null there).
        data = json.loads(args.replot.read_text())
        args.quick = data["config"]["quick"]
        args.synthetic = data["config"]["synthetic"]
        args.seed = data["config"]["base_seed"]
    else:
        with limiter:
            data = sweep(args)
        data["config"]["blas_threads"] = args.threads
    rows = summarize(data["records"])
    per_pair = {pair: summarize(data["records"], pair) for pair in data["config"]["pairs"]}
    data["summary"] = rows
    data["summary_per_pair"] = per_pair

    tables = markdown_tables(rows)
    report = "\n".join(
        [
            spread_table(data["data_spread"], data["config"]["regs"]),
            tables,
            library_check_table(rows),
            warning_summary(rows),
            f"Total time: {data['config']['seconds']:.0f} s.",
        ]
    )
    print()
    print(report)

    suffix = ("_quick" if args.quick else "") + ("_synthetic" if args.synthetic else "")
    figure = (
        IMAGES_DIR / "paper_sinkhorn.png"
        if not suffix
        else RESULTS_DIR / f"paper_sinkhorn{suffix}.png"
    )
    plot(rows, figure)
    markdown = RESULTS_DIR / f"paper_sinkhorn{suffix}.md"
    pair_tables = "\n".join(
        f"## Pair '{pair}'\n\n" + markdown_tables(per_pair[pair], f" — pair '{pair}'")
        for pair in per_pair
    )
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(
        "# Sinkhorn on sampled RGB pixels (Figure 2 of Han et al. 2020)\n\n"
        f"Produced by `python benchmarks/paper_sinkhorn.py{' --quick' if args.quick else ''}"
        f"{' --synthetic' if args.synthetic else ''}` (base seed {args.seed}; pairs "
        f"{', '.join(data['config']['pairs'])}; n in {data['config']['n_values']}; "
        f"{data['config']['n_trials']} trials; {N_ITER} iterations). Figure: "
        f"`{figure.relative_to(ROOT)}`.\n\n## All pairs pooled\n\n" + report + "\n\n" + pair_tables
    )
    print(f"\nwrote {figure.relative_to(ROOT)} and {markdown.relative_to(ROOT)}")
    if args.json:
        write_json(
            args.json, _finite_or_null(data), default=_json_default, allow_nan=False, indent=None
        )
    return 0


def limit_blas_threads(threads: int):
    """A context limiting BLAS to ``threads`` threads (``0``: no limit).

    On a shared 2-core machine a multi-threaded BLAS call waits for a busy core: small
    products then took 10-100x longer at random (measured: 16 ms instead of 0.3 ms for a
    rank-60 product at n = 10^4). One thread for every backend, the exact baseline included,
    gives reproducible ratios.
    """
    if threads == 0:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError as exc:  # pragma: no cover - threadpoolctl comes with scikit-learn
        raise SystemExit(
            "--threads needs threadpoolctl (pip install threadpoolctl); pass --threads 0 to "
            "run with the BLAS default"
        ) from exc
    return threadpool_limits(limits=threads, user_api="blas")


def _finite_or_null(value: Any) -> Any:
    """NaN and infinities become ``null`` (strict JSON); failed trials stay visible as nulls."""
    if isinstance(value, dict):
        return {str(k): _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value)}")


if __name__ == "__main__":
    sys.exit(main())
