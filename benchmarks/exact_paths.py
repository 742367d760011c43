"""Exact-kernel Sinkhorn paths (``sketchot.solver.exact_paths``) against POT and today's solver.

Three measurements, POT's baseline in the same run:

1. **Dense per-iteration time.** ``n`` RGB pixels per side (``default_source.png`` and
   ``default_target.png``, ``sample_pixels(rng=0 / 1)``, centred), ``reg = 0.1`` (nothing
   underflows), 30 iterations with an unreachable tolerance, best of 5 interleaved rounds. POT:
   ``ot.sinkhorn(a, b, M, reg, numItermax=30, stopThr=1e-300)`` minus one timed
   ``exp(-M / reg)`` (the kernel it builds first). sketchot: ``dense_sinkhorn(K, a, b)`` on the
   stored kernel, float64 and float32.
2. **The 2-D Gaussian case.** ``X, Y ~ N(0, I_2)``, ``n = 2000``, ``default_rng(seed)``,
   ``reg = 0.05 x median squared distance``. Seed 4 is a draw where today's solver takes its
   log domain (its bound ``(max|x| + max|y|)^2 / reg`` is 576 > 500 while the true
   ``max C / reg`` is 494). Iterations to ``tol = 1e-9`` and time for ``ot.sinkhorn``,
   ``sketchot.sinkhorn(..., backend='exact')`` and the new paths.
3. **Colours at small reg.** ``n = 3000`` pixels per side as above, ``reg = 0.003``,
   ``tol = 1e-9`` (float32: ``1e-6 ||b||_2``). Today's path
   ``sketchot.sinkhorn(None, None, X, Y, reg=0.003, backend='exact', max_iter=5000)`` (the
   solver's default; sketchot 0.1 ran a log-sum-exp iteration there, 0.2 the stabilised path
   with Anderson mixing) against ``exact_sinkhorn`` with and without epsilon-scaling and
   Anderson mixing, float64 and float32 absorbed kernel, and the streamed path's time per
   iteration. Every result's TRUE relative L1 marginal
   errors are computed with an exact log-sum-exp over all ``n x m`` entries.

Usage::

    python benchmarks/exact_paths.py                 # full (several minutes; today's path
                                                     # alone takes ~100 s at n = 3000)
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
from _results import write_json
from _running import best_time

import sketchot
from sketchot.color import load_image, sample_pixels
from sketchot.gibbs import gibbs_log_matvec
from sketchot.solver.exact_paths import dense_sinkhorn, exact_sinkhorn, stabilized_sinkhorn

IMAGES = Path(__file__).resolve().parent.parent / "images"
ITERATIONS = 30
REPEATS = 5


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


# ------------------------------------------------------------------ 1. per iteration
def _pot_fixed(a: np.ndarray, M: np.ndarray, reg: float) -> None:
    """``ot.sinkhorn`` for ITERATIONS iterations (it warns that it did not converge)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ot.sinkhorn(a, a, M, reg, numItermax=ITERATIONS, stopThr=1e-300)


def per_iteration(sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    reg = 0.1
    for n in sizes:
        Xc, Yc = colours(n)
        a = np.full(n, 1.0 / n)
        M = ot.dist(Xc, Yc)
        K = np.exp(-M / reg)
        K32 = K.astype(np.float32)

        # Interleaved rounds, best of each: a shared machine's load hits all methods alike.
        timed = {
            "pot": partial(_pot_fixed, a, M, reg),
            "exp": partial(np.exp, -M / reg),
            "dense": partial(dense_sinkhorn, K, a, a, tol=1e-300, max_iter=ITERATIONS),
            "dense32": partial(dense_sinkhorn, K32, a, a, tol=1e-300, max_iter=ITERATIONS),
        }
        best = {name: math.inf for name in timed}
        best["today"] = math.inf
        for _ in range(REPEATS):
            for name, function in timed.items():
                best[name] = min(best[name], best_time(function, 1))
            best["today"] = min(best["today"], _today_per_iteration(Xc, Yc, reg))
        pot_time, dense, dense32 = best["pot"] - best["exp"], best["dense"], best["dense32"]
        row = {
            "n": n,
            "pot_ms": 1e3 * pot_time / ITERATIONS,
            "dense_ms": 1e3 * dense / ITERATIONS,
            "dense32_ms": 1e3 * dense32 / ITERATIONS,
        }
        row["today_ms"] = 1e3 * best["today"]
        row["speedup"] = row["pot_ms"] / row["dense_ms"]
        row["speedup32"] = row["pot_ms"] / row["dense32_ms"]
        rows.append(row)
        print(
            f"  n={n}: POT {row['pot_ms']:.2f} ms, dense {row['dense_ms']:.2f} ms "
            f"({row['speedup']:.2f}x), float32 {row['dense32_ms']:.2f} ms "
            f"({row['speedup32']:.2f}x), today's exact backend {row['today_ms']:.2f} ms",
            flush=True,
        )
    return rows


def _today_per_iteration(Xc: np.ndarray, Yc: np.ndarray, reg: float) -> float:
    """Seconds per iteration of today's ``sketchot.sinkhorn(..., backend='exact')`` (kernel
    build excluded; its multiplicative path at this reg)."""
    result = sketchot.sinkhorn(
        None, None, Xc, Yc, reg, backend="exact", max_iter=ITERATIONS, tol=1e-300,
        check_every=ITERATIONS, warn=False,
    )  # fmt: skip
    assert not result.log_domain
    return result.timings["per_iteration"]


def _today(X: np.ndarray, Y: np.ndarray, reg: float, max_iter: int) -> tuple[Any, float]:
    """Today's ``sketchot.sinkhorn(None, None, X, Y, reg, backend='exact')`` and its seconds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # non-convergence is recorded, not warned
        start = time.perf_counter()
        result = sketchot.sinkhorn(None, None, X, Y, reg=reg, backend="exact", max_iter=max_iter)
        return result, time.perf_counter() - start


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

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # non-convergence is recorded, not warned
            start = time.perf_counter()
            _, log = ot.sinkhorn(a, a, M, reg, log=True)
            elapsed = time.perf_counter() - start
            record("POT ot.sinkhorn", elapsed, log["niter"] + 1, log["err"][-1] < 1e-9)
        today, elapsed = _today(X, Y, reg, 1000)
        record(
            "today sketchot.sinkhorn exact",
            elapsed,
            today.n_iter,
            today.converged,
            {"log_domain": bool(today.log_domain)},
        )
        start = time.perf_counter()
        K = np.exp(-M / reg)
        dense = dense_sinkhorn(K, a, a)
        record(
            "dense_sinkhorn (K included)",
            time.perf_counter() - start,
            dense.n_iter,
            dense.converged,
        )
        start = time.perf_counter()
        stab = stabilized_sinkhorn(Xc, Yc, a, a, reg)
        record(
            "stabilized_sinkhorn",
            time.perf_counter() - start,
            stab.n_iter,
            stab.converged,
            {"absorptions": stab.info["absorptions"]},
        )
    return rows


# ------------------------------------------------------------------ 3. colours, reg 0.003
def colour_case(n: int, reg: float, today_max_iter: int) -> list[dict[str, Any]]:
    Xc, Yc = colours(n)
    a = np.full(n, 1.0 / n)
    tol32 = 1e-6 * float(np.linalg.norm(a))
    rows = []

    def record(method, seconds, n_iter, converged, log_u, log_v, extra=None):
        err_a, err_b = true_errors(Xc, Yc, a, a, reg, log_u, log_v)
        row = {
            "n": n,
            "reg": reg,
            "method": method,
            "seconds": seconds,
            "n_iter": int(n_iter),
            "converged": bool(converged),
            "true_l1_a": err_a,
            "true_l1_b": err_b,
            **(extra or {}),
        }
        rows.append(row)
        print(
            f"  {method}: {n_iter} iterations, {seconds:.2f} s, true L1 a {err_a:.2e} "
            f"b {err_b:.2e} {extra or ''}",
            flush=True,
        )

    if today_max_iter:
        today, elapsed = _today(Xc, Yc, reg, today_max_iter)
        record(
            "today sketchot.sinkhorn exact",
            elapsed,
            today.n_iter,
            today.converged,
            *today.potentials,
            {"log_domain": bool(today.log_domain)},
        )
    variants = [
        ("stabilized float64", {}),
        ("stabilized float32", {"dtype": np.float32, "tol": tol32}),
        ("annealed float64", {"epsilon_scaling": True}),
        ("annealed float32", {"epsilon_scaling": True, "dtype": np.float32, "tol": tol32}),
        ("stabilized float64, Anderson 5", {"anderson": 5}),
        ("stabilized float32, Anderson 5", {"anderson": 5, "dtype": np.float32, "tol": tol32}),
    ]
    for name, options in variants:
        start = time.perf_counter()
        result = exact_sinkhorn(Xc, Yc, a, a, reg, max_iter=5000, **options)
        elapsed = time.perf_counter() - start
        extra = {"absorptions": result.info["absorptions"], "tol": options.get("tol", 1e-9)}
        if "stages" in result.info:
            extra["stages"] = len(result.info["stages"])
            extra["last_stage_iter"] = result.info["stages"][-1]["n_iter"]
        record(name, elapsed, result.n_iter, result.converged, result.log_u, result.log_v, extra)
    # The streamed path (K~ recomputed every iteration): time per iteration only.
    streamed = best_time(
        lambda: stabilized_sinkhorn(Xc, Yc, a, a, reg, tol=1e-300, max_iter=12, max_dense_bytes=0),
        repeats=2,
    )
    rows.append({"n": n, "reg": reg, "method": "streamed float64 (12 its)", "seconds": streamed})
    print(f"  streamed: {1e3 * streamed / 12:.1f} ms per iteration (incl. 2 LSE passes)")
    return rows


# ------------------------------------------------------------------ report
def markdown(output: dict[str, Any]) -> str:
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
        "## Dense per-iteration time vs POT (colours, reg 0.1, 30 iterations, best of 5 rounds)",
        "",
        "| n | POT ot.sinkhorn (ms) | dense_sinkhorn f64 (ms) | POT / dense | "
        "dense f32 (ms) | POT / dense f32 | today's exact backend (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in output.get("per_iteration", []):
        lines.append(
            f"| {r['n']} | {r['pot_ms']:.2f} | {r['dense_ms']:.2f} | {r['speedup']:.2f}x | "
            f"{r['dense32_ms']:.2f} | {r['speedup32']:.2f}x | {r['today_ms']:.2f} |"
        )
    lines += [
        "",
        "## 2-D Gaussian, reg = 0.05 x median squared distance (tol 1e-9)",
        "",
        "| seed | n | max C/reg | today's bound/reg | method | iterations | converged | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in output.get("gaussian", []):
        method = r["method"] + (" (log domain)" if r.get("log_domain") else "")
        lines.append(
            f"| {r['seed']} | {r['n']} | {r['max_C_over_reg']:.0f} | "
            f"{r['today_bound_over_reg']:.0f} | {method} | {r['n_iter']} | "
            f"{r['converged']} | {r['seconds']:.3f} |"
        )
    lines += [
        "",
        "POT's `log['niter']` is the 0-based index of its last iteration; the table shows "
        "`niter + 1`.",
        "",
        "## Colours, reg 0.003 (true relative L1 marginal errors by exact log-sum-exp)",
        "",
        "| method | iterations | s | speedup vs today | true L1 (a) | true L1 (b) | "
        "absorptions | converged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    colours_rows = output.get("colours", [])
    today = next((r for r in colours_rows if r["method"].startswith("today")), None)
    for r in colours_rows:
        if "n_iter" not in r:
            continue
        speedup = f"{today['seconds'] / r['seconds']:.1f}x" if today else "-"
        lines.append(
            f"| {r['method']} | {r['n_iter']} | {r['seconds']:.2f} | {speedup} | "
            f"{r['true_l1_a']:.2e} | {r['true_l1_b']:.2e} | {r.get('absorptions', '-')} | "
            f"{r['converged']} |"
        )
    streamed = next((r for r in colours_rows if r["method"].startswith("streamed")), None)
    lines += (
        []
        if streamed is None
        else [
            "",
            f"n = {output['colours'][0]['n']}. Streamed float64 path (K~ recomputed in row blocks "
            f"every iteration): {1e3 * streamed['seconds'] / 12:.1f} ms per iteration over 12 "
            "iterations, including the two log-sum-exp passes of the first iteration.",
            "",
        ]
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n <= 2000 everywhere")
    parser.add_argument("--json", type=Path, help="write the results here (and a .md beside)")
    parser.add_argument(
        "--today-max-iter",
        type=int,
        default=5000,
        help="max_iter of today's path on the colours (its default 1000 stops short of tol "
        "on these samples); 0 skips it",
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
        ("per_iteration", "1. dense per-iteration time vs POT", partial(per_iteration, sizes)),
        ("gaussian", "2. 2-D Gaussian case", partial(gaussian_case, gaussian_n, [0, 4])),
        (
            "colours",
            f"3. colours, n = {colour_n}, reg = 0.003",
            partial(colour_case, colour_n, 0.003, args.today_max_iter),
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
