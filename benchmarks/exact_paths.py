"""The exact kernel's Sinkhorn strategies (``sketchot.solver.engine``) against POT.

Every sketchot row is ``sketchot.sinkhorn_kernel(a, b, kernel, **options)`` on
``kernel = sketchot.make_kernel(X, Y, reg, 'exact')`` (or ``sketchot.sinkhorn`` where marked),
with the options that select the engine's strategy:

* **plain**: ``log_domain=False, anderson=0``, multiplicative passes, POT's iterates;
* **absorbed**: ``anderson=0`` (``log_domain='auto'``, the default), Schmitzer's absorption on
  ``diag(e^alpha) K diag(e^beta)``, finite for any ``reg``;
* **annealed**: ``epsilon_scaling=True, anderson=0``, the absorbed strategy along a geometric
  schedule of ``reg`` from the squared diameter;
* **defaults**: the solver's defaults (the absorbed strategy with Anderson mixing, memory 5).

Three measurements, POT's baseline in the same run:

1. **Per-iteration time.** ``n`` RGB pixels per side (``default_source.png`` and
   ``default_target.png``, ``sample_pixels(rng=0 / 1)``, centred), ``reg = 0.1`` (nothing
   underflows), 30 iterations with an unreachable tolerance, best of 5 interleaved rounds. POT:
   ``ot.sinkhorn(a, b, M, reg, numItermax=30, stopThr=1e-300)`` minus one timed
   ``exp(-M / reg)`` (the kernel it builds first). sketchot: the loop's own time
   (``result.timings['per_iteration']``) on a kernel built and stored before the rounds, plain
   float64 and float32, and the defaults.
2. **The 2-D Gaussian case.** ``X, Y ~ N(0, I_2)``, ``n = 2000``, ``default_rng(seed)``,
   ``reg = 0.05 x median squared distance``. Seed 4 is a draw where the cheap bound
   ``(max|x| + max|y|)^2 / reg`` is 576 > 500 while the true ``max C / reg`` is 494 (a solver
   choosing its strategy on that bound would leave the multiplicative iteration where it
   works; JSON key ``today_bound_over_reg``). Iterations to ``tol = 1e-9`` and time (kernel
   build included) for ``ot.sinkhorn``, ``sketchot.sinkhorn(..., backend='exact')`` and the
   plain and absorbed strategies.
3. **Colours at small reg.** ``n = 3000`` pixels per side as above, ``reg = 0.003``,
   ``tol = 1e-9`` (float32: ``1e-6 ||b||_2``), ``max_iter = 5000``:
   ``sketchot.sinkhorn(None, None, X, Y, reg=0.003, backend='exact')`` with the defaults, then
   the plain, absorbed and annealed strategies, float64 and float32 kernels, with and without
   Anderson mixing, and the streamed absorbed kernel's time per iteration. Every result's TRUE
   relative L1 marginal errors are computed with an exact log-sum-exp over all ``n x m``
   entries (the solver's own summary is not used: solves run with ``errors='warn'`` so that an
   impossible summary is recorded, not raised).

Usage::

    python benchmarks/exact_paths.py                 # full (several minutes)
    python benchmarks/exact_paths.py --quick         # n <= 2000 everywhere, ~1 minute
    python benchmarks/exact_paths.py --json benchmarks/results/exact_paths.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _results import md_table, timed, write_json
from _running import best_time

import sketchot
from sketchot.color import load_image, sample_pixels
from sketchot.gibbs import gibbs_log_matvec

IMAGES = Path(__file__).resolve().parent.parent / "images"
ITERATIONS = 30
REPEATS = 5

#: Solver options of each strategy (module notes).
PLAIN = {"log_domain": False, "anderson": 0}
ABSORBED = {"anderson": 0}
ANNEALED = {"epsilon_scaling": True, "anderson": 0}


def colours(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pixels of each default image, centred on their common mean."""
    X = sample_pixels(load_image(IMAGES / "default_source.png"), n, rng=0).colors
    Y = sample_pixels(load_image(IMAGES / "default_target.png"), n, rng=1).colors
    center = (X.sum(axis=0) + Y.sum(axis=0)) / (2 * n)
    return X - center, Y - center


def true_errors(Xc, Yc, a, b, reg, log_u, log_v) -> tuple[float, float]:
    """Relative L1 errors of both marginals of ``diag(u) K diag(v)``, exact log-sum-exp."""
    rows = np.exp(log_u + gibbs_log_matvec(Xc, Yc, reg, log_v))
    cols = np.exp(log_v + gibbs_log_matvec(Yc, Xc, reg, log_u))
    return float(np.abs(rows - a).sum() / a.sum()), float(np.abs(cols - b).sum() / b.sum())


def solve(a, b, kernel, **options) -> sketchot.SinkhornResult:
    """``sketchot.sinkhorn_kernel`` recording, not raising or warning (non-convergence and an
    impossible summary are in the result)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sketchot.sinkhorn_kernel(a, b, kernel, errors="warn", **options)


def solve_points(X, Y, reg, **options) -> tuple[float, sketchot.SinkhornResult]:
    """``(seconds, result)`` of ``sketchot.sinkhorn(None, None, X, Y, reg, 'exact')``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timed(
            lambda: sketchot.sinkhorn(None, None, X, Y, reg, "exact", errors="warn", **options)
        )


def built_and_solved(Xc, Yc, reg, a, b, dtype=np.float64, **options):
    """``(seconds, result)`` of building the exact kernel and solving on it."""

    def run():
        kernel = sketchot.make_kernel(Xc, Yc, reg, "exact", dtype=dtype)
        return solve(a, b, kernel, **options)

    return timed(run)


# ------------------------------------------------------------------ 1. per iteration
def _pot_fixed(a: np.ndarray, M: np.ndarray, reg: float) -> None:
    """``ot.sinkhorn`` for ITERATIONS iterations (it warns that it did not converge)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ot.sinkhorn(a, a, M, reg, numItermax=ITERATIONS, stopThr=1e-300)


def _per_iteration(a: np.ndarray, kernel, **options) -> float:
    """Seconds per iteration of the engine's loop (``ITERATIONS`` of them: an unreachable
    tolerance, checked only after the first and the last)."""
    result = solve(
        a, a, kernel, tol=1e-300, max_iter=ITERATIONS, check_every=ITERATIONS, accuracy=None,
        warn=False, **options,
    )  # fmt: skip
    assert result.n_iter == ITERATIONS, result.n_iter
    return result.timings["per_iteration"]


def per_iteration(sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    reg = 0.1
    for n in sizes:
        Xc, Yc = colours(n)
        a = np.full(n, 1.0 / n)
        M = ot.dist(Xc, Yc)
        K = sketchot.make_kernel(Xc, Yc, reg, "exact")
        K32 = sketchot.make_kernel(Xc, Yc, reg, "exact", dtype=np.float32)
        for kernel in (K, K32):
            kernel.matvec(np.ones(n))  # the stored kernel is computed on first use
        default = solve(a, a, K, max_iter=ITERATIONS, accuracy=None, warn=False)
        assert default.iteration_info["strategy"] == "absorb"

        # Interleaved rounds, best of each: a shared machine's load hits all methods alike.
        pot = {"pot": partial(_pot_fixed, a, M, reg), "exp": partial(np.exp, -M / reg)}
        engine = {
            "dense": partial(_per_iteration, a, K, **PLAIN),
            "dense32": partial(_per_iteration, a, K32, **PLAIN),
            "today": partial(_per_iteration, a, K),
        }
        best = {name: math.inf for name in [*pot, *engine]}
        for _ in range(REPEATS):
            for name, function in pot.items():
                best[name] = min(best[name], best_time(function, 1))
            for name, function in engine.items():
                best[name] = min(best[name], function())
        pot_time = best["pot"] - best["exp"]
        row = {
            "n": n,
            "pot_ms": 1e3 * pot_time / ITERATIONS,
            "dense_ms": 1e3 * best["dense"],
            "dense32_ms": 1e3 * best["dense32"],
            "today_ms": 1e3 * best["today"],
        }
        row["speedup"] = row["pot_ms"] / row["dense_ms"]
        row["speedup32"] = row["pot_ms"] / row["dense32_ms"]
        rows.append(row)
        print(
            f"  n={n}: POT {row['pot_ms']:.2f} ms, plain {row['dense_ms']:.2f} ms "
            f"({row['speedup']:.2f}x), float32 {row['dense32_ms']:.2f} ms "
            f"({row['speedup32']:.2f}x), defaults (absorbed, Anderson) {row['today_ms']:.2f} ms",
            flush=True,
        )
    return rows


# ------------------------------------------------------------------ 2. 2-D Gaussian
def gaussian_case(n: int, seeds: list[int]) -> list[dict[str, Any]]:
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        X, Y = rng.standard_normal((n, 2)), rng.standard_normal((n, 2))
        center = (X.sum(axis=0) + Y.sum(axis=0)) / (2 * n)
        Xc, Yc = X - center, Y - center
        a = np.full(n, 1.0 / n)
        M = ot.dist(Xc, Yc)
        reg = 0.05 * float(np.median(M))
        bound = (np.sqrt((Xc**2).sum(1).max()) + np.sqrt((Yc**2).sum(1).max())) ** 2 / reg
        base = {"n": n, "seed": seed, "reg": reg, "max_C_over_reg": float(M.max() / reg)}
        base["today_bound_over_reg"] = float(bound)

        def record(method, seconds, n_iter, converged, extra=None, base=base):
            rows.append(
                {
                    **base,
                    "method": method,
                    "seconds": seconds,
                    "n_iter": int(n_iter),
                    "converged": bool(converged),
                    **(extra or {}),
                }
            )
            print(
                f"  seed {base['seed']} {method}: {n_iter} iterations, {seconds:.3f} s, "
                f"converged={converged} {extra or ''}",
                flush=True,
            )

        def record_result(method, seconds, result):
            info = result.iteration_info
            extra = {"strategy": info["strategy"], "absorptions": info.get("absorptions", 0)}
            record(method, seconds, result.n_iter, result.converged, extra)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # non-convergence is recorded, not warned
            elapsed, (_, log) = timed(partial(ot.sinkhorn, a, a, M, reg, log=True))
        record("POT ot.sinkhorn", elapsed, log["niter"] + 1, log["err"][-1] < 1e-9)
        record_result("sketchot.sinkhorn exact (defaults)", *solve_points(X, Y, reg))
        record_result("plain (K included)", *built_and_solved(Xc, Yc, reg, a, a, **PLAIN))
        record_result("absorbed (K included)", *built_and_solved(Xc, Yc, reg, a, a, **ABSORBED))
    return rows


# ------------------------------------------------------------------ 3. colours, reg 0.003
def colour_case(n: int, reg: float, defaults_max_iter: int) -> list[dict[str, Any]]:
    Xc, Yc = colours(n)
    a = np.full(n, 1.0 / n)
    tol32 = 1e-6 * float(np.linalg.norm(a))
    rows = []

    def record(method, seconds, result, extra=None):
        log_u, log_v = result.potentials
        err_a, err_b = true_errors(Xc, Yc, a, a, reg, log_u, log_v)
        info = result.iteration_info
        row = {
            "n": n,
            "reg": reg,
            "method": method,
            "seconds": seconds,
            "n_iter": int(result.n_iter),
            "converged": bool(result.converged),
            "true_l1_a": err_a,
            "true_l1_b": err_b,
            "strategy": info["strategy"],
            "stop": result.stop,
            **(extra or {}),
        }
        if info["strategy"] != "multiplicative":
            row["absorptions"] = info.get("absorptions", 0)
        if "stages" in info:
            row["stages"] = len(info["stages"])
            row["last_stage_iter"] = info["stages"][-1]["n_iter"]
        rows.append(row)
        print(
            f"  {method}: {result.n_iter} iterations ({result.stop}), {seconds:.2f} s, true L1 "
            f"a {err_a:.2e} b {err_b:.2e} absorptions {row.get('absorptions', '-')}",
            flush=True,
        )

    if defaults_max_iter:
        elapsed, result = solve_points(Xc, Yc, reg, max_iter=defaults_max_iter)
        record("sketchot.sinkhorn exact (defaults)", elapsed, result)
    float32 = {"dtype": np.float32, "tol": tol32}
    variants = [
        ("plain float64", PLAIN),
        ("absorbed float64", ABSORBED),
        ("absorbed float32", {**ABSORBED, **float32}),
        ("annealed float64", ANNEALED),
        ("annealed float32", {**ANNEALED, **float32}),
        ("absorbed float64, Anderson 5", {"anderson": 5}),
        ("absorbed float32, Anderson 5", {"anderson": 5, **float32}),
    ]
    for name, options in variants:
        options = {"max_iter": 5000, "tol": 1e-9, **options}
        dtype = options.pop("dtype", np.float64)
        elapsed, result = built_and_solved(Xc, Yc, reg, a, a, dtype=dtype, **options)
        record(name, elapsed, result, {"tol": options["tol"]})
    # The streamed absorbed kernel (K~ recomputed every iteration): time per iteration only.
    streamed = sketchot.make_kernel(Xc, Yc, reg, "exact", max_dense_bytes=0)
    seconds = min(
        solve(a, a, streamed, tol=1e-300, max_iter=12, accuracy=None, warn=False, **ABSORBED)
        .timings["iterations"]
        for _ in range(2)
    )  # fmt: skip
    rows.append({"n": n, "reg": reg, "method": "streamed float64 (12 its)", "seconds": seconds})
    print(f"  streamed: {1e3 * seconds / 12:.1f} ms per iteration (incl. the first exact one)")
    return rows


# ------------------------------------------------------------------ report
PER_ITERATION_HEADER = (
    "n", "POT ot.sinkhorn (ms)", "plain f64 (ms)", "POT / plain", "plain f32 (ms)",
    "POT / plain f32", "defaults (absorbed, Anderson) (ms)",
)  # fmt: skip
GAUSSIAN_HEADER = (
    "seed", "n", "max C/reg", "bound/reg", "method", "iterations", "converged",
    "s",
)  # fmt: skip
COLOURS_HEADER = (
    "method", "iterations", "s", "speedup vs defaults", "true L1 (a)", "true L1 (b)",
    "absorptions", "converged",
)  # fmt: skip


def per_iteration_cells(r: dict[str, Any]) -> list[Any]:
    return [
        r["n"], f"{r['pot_ms']:.2f}", f"{r['dense_ms']:.2f}", f"{r['speedup']:.2f}x",
        f"{r['dense32_ms']:.2f}", f"{r['speedup32']:.2f}x", f"{r['today_ms']:.2f}",
    ]  # fmt: skip


def gaussian_cells(r: dict[str, Any]) -> list[Any]:
    return [
        r["seed"], r["n"], f"{r['max_C_over_reg']:.0f}", f"{r['today_bound_over_reg']:.0f}",
        r["method"], r["n_iter"], r["converged"], f"{r['seconds']:.3f}",
    ]  # fmt: skip


def colours_cells(r: dict[str, Any], reference: dict[str, Any] | None) -> list[Any]:
    speedup = f"{reference['seconds'] / r['seconds']:.1f}x" if reference else "-"
    return [
        r["method"], r["n_iter"], f"{r['seconds']:.2f}", speedup, f"{r['true_l1_a']:.2e}",
        f"{r['true_l1_b']:.2e}", r.get("absorptions", "-"), r["converged"],
    ]  # fmt: skip


def markdown(output: dict[str, Any]) -> str:
    colours_rows = output.get("colours", [])
    # the solver's defaults ("today" in files written before the engine)
    reference = next(
        (r for r in colours_rows if "defaults" in r["method"] or r["method"].startswith("today")),
        None,
    )
    lines = [
        "# Exact paths: benchmark results",
        "",
        f"Machine: {output['machine']}.",
        "",
        *(
            f"- section `{key}`: `{run['command']}`, started {run['started']}, load average "
            f"after {', '.join(f'{x:.1f}' for x in run['load_average_after'])} (2 shared cores)"
            for key, run in output.get("runs", {}).items()
        ),
        "",
        "## Per-iteration time vs POT (colours, reg 0.1, 30 iterations, best of 5 rounds)",
        "",
        *md_table(PER_ITERATION_HEADER, map(per_iteration_cells, output.get("per_iteration", []))),
        "",
        "## 2-D Gaussian, reg = 0.05 x median squared distance (tol 1e-9)",
        "",
        *md_table(GAUSSIAN_HEADER, map(gaussian_cells, output.get("gaussian", []))),
        "",
        "bound = `(max|x| + max|y|)^2` (centred clouds), the cheap upper bound of `max C`. "
        "POT's `log['niter']` is the 0-based index of its last iteration; the table shows "
        "`niter + 1`.",
        "",
        "## Colours, reg 0.003 (true relative L1 marginal errors by exact log-sum-exp)",
        "",
        *md_table(
            COLOURS_HEADER,
            (colours_cells(r, reference) for r in colours_rows if "n_iter" in r),
        ),
    ]
    streamed = next((r for r in colours_rows if r["method"].startswith("streamed")), None)
    if streamed is not None:
        lines += [
            "",
            f"n = {colours_rows[0]['n']}. Streamed float64 absorbed kernel (K~ recomputed in row "
            f"blocks every iteration): {1e3 * streamed['seconds'] / 12:.1f} ms per iteration "
            "over 12 iterations, including the first one, exact in the log domain.",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n <= 2000 everywhere")
    parser.add_argument("--json", type=Path, help="write the results here (and a .md beside)")
    parser.add_argument(
        "--defaults-max-iter",
        type=int,
        default=5000,
        help="max_iter of the defaults' solve on the colours; 0 skips it",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["per_iteration", "gaussian", "colours"],
        help="run these sections only (with --json, merged into the existing file)",
    )
    args = parser.parse_args()
    sizes = [1000, 2000] if args.quick else [1000, 2000, 5000]
    colour_n = 1000 if args.quick else 3000
    gaussian_n = 1000 if args.quick else 2000
    output: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"numpy {np.__version__}, POT {ot.__version__}",
        "command": " ".join(["python", "benchmarks/exact_paths.py", *sys.argv[1:]]),
    }
    sections = [
        ("per_iteration", "1. per-iteration time vs POT", partial(per_iteration, sizes)),
        ("gaussian", "2. 2-D Gaussian case", partial(gaussian_case, gaussian_n, [0, 4])),
        (
            "colours",
            f"3. colours, n = {colour_n}, reg = 0.003",
            partial(colour_case, colour_n, 0.003, args.defaults_max_iter),
        ),
    ]
    if args.json and args.only and args.json.exists():
        # Keep the other sections of an earlier run (each records when and under what load).
        output = {**json.loads(args.json.read_text()), **output}
    for key, title, run in sections:
        if args.only and key not in args.only:
            continue
        print(title, flush=True)
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        output[key] = run()
        output.setdefault("runs", {})[key] = {
            "started": started,
            "load_average_after": os.getloadavg(),
            "command": output["command"],
        }
        if args.json:  # after every section, so that a long run leaves its numbers behind
            write_json(args.json, output)
    report = markdown(output)
    print(report)
    if args.json:
        args.json.with_suffix(".md").write_text(report)
        print(f"Markdown: {args.json.with_suffix('.md')}")


if __name__ == "__main__":
    main()
