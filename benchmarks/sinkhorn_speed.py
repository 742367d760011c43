"""Sinkhorn speed, memory and true-kernel accuracy: sketchot's backends next to POT's solvers.

``n`` points per side uniform in ``[0, 1]^3`` (``default_rng([seed, n])``), uniform weights,
``reg`` in ``{1, 0.1}``; every configuration runs a fixed number of iterations (``tol=1e-300``)
in its own subprocess, which reports build time, time per iteration and total wall time; peak
RSS (``ru_maxrss``) and its increase over the child's baseline after imports, a small warm-up
and data generation; and the L1 marginal errors of the returned scalings against the EXACT
kernel on sampled rows and columns (``sketchot.solver.sampled_true_kernel_check``, the draw
of ``SinkhornResult.check_true_kernel``, the same for every method). Methods:

``pot-dense``
    ``ot.dist`` then ``ot.sinkhorn(a, b, M, reg)`` (dense ``n x n``, ~5 such float64 arrays at
    peak). Build = ``ot.dist`` + one ``exp(-M / reg)`` timed separately (the kernel
    ``ot.sinkhorn`` computes first); per iteration = (solve - that exp) / iterations.
``pot-nystrom``
    ``ot.lowrank.kernel_nystroem`` + ``sinkhorn_low_rank_kernel`` (the two calls of
    ``ot.bregman.empirical_sinkhorn_nystroem2``) with ``sigma = sqrt(reg / 2)``, timed
    separately; POT draws ``anchors // 2`` landmarks per cloud, so it gets the even number of
    anchors at or above the rank; ``random_state`` seeds POT's own NumpyBackend generator.
``exact``, ``rff``, ``nystrom``, ``polyts``
    ``sketchot.sinkhorn(None, None, X, Y, reg, backend, max_iter, tol=1e-300,
    check_every=max_iter, safeguard=..., accuracy=None, errors='warn')`` (``check_every``: the
    float32 tolerance floor cannot stop a run early). Low-rank backends at equal rank 61 and
    199 (each record's ``params_for_rank``: polyts ``m = 20`` and ``66``, ``r = 3``). Safeguard
    ``'clip'`` by default (``'exact'`` repairs would dominate RFF's timings at ``reg = 0.1``);
    the number of repairs is reported.

Targets printed (computed, not asserted): polyts, ``n = 10^6``, ``reg = 1``, 100 iterations,
build included, at most 15 s and 2 GB peak RSS in float64 and float32; low-rank backends at
``n = 10^4`` at least 100x faster per iteration than ``ot.sinkhorn``; sketchot's Nystrom faster
per iteration than POT's at equal rank with no worse true-kernel error.

Usage::

    python benchmarks/sinkhorn_speed.py                 # full grid (tens of minutes)
    python benchmarks/sinkhorn_speed.py --quick         # n <= 10^4, a few minutes
    python benchmarks/sinkhorn_speed.py --only-target   # the two n = 10^6 polyts rows
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from _results import md_row, md_table, timed, write_json, write_text

import sketchot
from sketchot.solver import sampled_true_kernel_check

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT_MARKER = "RESULT_JSON:"

SKETCHOT_BACKENDS = ("exact", "nystrom", "rff", "polyts")
LOW_RANK = ("nystrom", "rff", "polyts")
POT_LABELS = {"pot-dense": "POT ot.sinkhorn (dense)", "pot-nystrom": "POT nystroem"}


def equal_rank_settings(rank: int) -> dict[str, dict[str, int]]:
    """Every low-rank backend at about ``rank`` features (its record's ``params_for_rank``);
    POT draws ``anchors // 2`` landmarks per cloud, so it gets the even number at or above."""
    settings = {b: sketchot.get_backend(b).params_for_rank(rank) for b in LOW_RANK}
    return {**settings, "pot-nystrom": {"anchors": rank + rank % 2}}


RANKS = {label: equal_rank_settings(int(label)) for label in ("61", "199")}

# Largest n per side for POT's dense solver: ~5 n x n float64 arrays at peak (4 GB at 10^4).
POT_DENSE_MAX_N = 10_000
# Largest n for sketchot's exact backend: beyond 2 10^4 a streamed product costs minutes.
EXACT_MAX_N = 20_000
# The exact backend streams (recomputes exp per entry) above this many bytes; then it runs
# only a few iterations.
EXACT_DENSE_BYTES = 1 << 30
STREAMED_EXACT_ITERATIONS = 10

# Targets.
TARGET_N = 1_000_000
TARGET_REG = 1.0
TARGET_ITERATIONS = 100
TARGET_SECONDS = 15.0
TARGET_PEAK_BYTES = 2e9
TARGET_SPEEDUP_N = 10_000
TARGET_SPEEDUP = 100.0


# ---------------------------------------------------------------------------- child process
def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_pot_dense(X, Y, reg, iterations):
    import ot

    a, b = np.full(X.shape[0], 1.0 / X.shape[0]), np.full(Y.shape[0], 1.0 / Y.shape[0])
    dist_seconds, M = timed(lambda: ot.dist(X, Y))
    exp_seconds = timed(lambda: np.exp(M / (-reg)))[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        solve_seconds, (_, log) = timed(
            lambda: ot.sinkhorn(
                a, b, M, reg, numItermax=iterations, stopThr=1e-300, log=True, warn=False
            )
        )
    record = pot_record(log, caught, dist_seconds + exp_seconds, solve_seconds - exp_seconds)
    return {**record, "total_s": dist_seconds + solve_seconds}, (log["u"], log["v"])


def run_pot_nystrom(X, Y, reg, iterations, anchors, seed):
    import ot

    a, b = np.full(X.shape[0], 1.0 / X.shape[0]), np.full(Y.shape[0], 1.0 / Y.shape[0])
    # POT's sampling goes through its NumpyBackend RandomState, seeded from our generator.
    random_state = int(np.random.default_rng(seed).integers(2**31 - 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_seconds, (left, right) = timed(
            lambda: ot.lowrank.kernel_nystroem(X, Y, anchors, math.sqrt(reg / 2.0), random_state)
        )
        loop_seconds, (u, v, log) = timed(
            lambda: ot.lowrank.sinkhorn_low_rank_kernel(
                left, right, a, b, numItermax=iterations, stopThr=1e-300, log=True, warn=False
            )
        )
    record = pot_record(log, caught, build_seconds, loop_seconds, int(left.shape[1]))
    return {**record, "random_state": random_state}, (u, v)


def pot_record(log, caught, build_seconds, loop_seconds, rank=None) -> dict[str, Any]:
    """Timings of one POT solve; POT's ``niter`` counts one short unless it stopped on a
    numerical error."""
    numerical = any("numerical errors" in str(w.message) for w in caught)
    n_iter = log["niter"] + (0 if numerical else 1)
    return {
        "rank": rank, "n_iter": n_iter, "build_s": build_seconds, "iterations_s": loop_seconds,
        "per_iteration_s": loop_seconds / max(n_iter, 1), "total_s": build_seconds + loop_seconds,
        "warnings": [str(w.message)[:200] for w in caught],
    }  # fmt: skip


def run_sketchot(X, Y, reg, backend, iterations, params, dtype, safeguard, seed):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        total_seconds, result = timed(lambda: sketchot.sinkhorn(
            None, None, X, Y, reg, backend, max_iter=iterations, tol=1e-300,
            rng=np.random.default_rng(seed), accuracy=None, errors="warn",
            check_every=iterations, safeguard=safeguard, warn=False,
            dtype=np.dtype(dtype).type, **params,
        ))  # fmt: skip
    timings = result.timings
    return {
        "rank": result.kernel.info.rank, "n_iter": result.n_iter, "build_s": timings["build"],
        "iterations_s": timings["iterations"], "per_iteration_s": timings["per_iteration"],
        "total_s": total_seconds, "safeguard": result.safeguard,
        "used_kernel_marginal_errors": list(result.marginal_errors),
        "warnings": [str(w.message)[:200] for w in caught],
    }, result  # fmt: skip


def solve(config: dict[str, Any], X, Y, iterations: int, seed, safeguard: str) -> tuple:
    """``(record, (u, v))`` of a POT method, ``(record, SinkhornResult)`` of a sketchot one."""
    method, reg, params = config["method"], config["reg"], config["params"]
    if method == "pot-dense":
        return run_pot_dense(X, Y, reg, iterations)
    if method == "pot-nystrom":
        return run_pot_nystrom(X, Y, reg, iterations, params["anchors"], seed)
    return run_sketchot(X, Y, reg, method, iterations, params, config["dtype"], safeguard, seed)


def run_single(config: dict[str, Any]) -> dict[str, Any]:
    """One configuration (in a fresh process): timings, peak memory, true-kernel errors."""
    import ot  # noqa: F401  (imported before the baseline so every child counts the same)

    # Warm-up: a tiny run of the same method, so that one-time costs (lazy imports, FFT
    # set-up) stay out.
    rng = np.random.default_rng(12345)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        solve(config, rng.random((200, 3)), rng.random((200, 3)), 2, [0], "clip")
    n, reg, method = config["n"], config["reg"], config["method"]
    data_rng = np.random.default_rng(config["data_seed"])
    X, Y = (data_rng.random((n, 3)) for _ in range(2))
    baseline = peak_rss_bytes()

    cpu_start = time.process_time()
    record, result = solve(config, X, Y, config["iterations"], config["method_seed"],
                           config["safeguard_policy"])  # fmt: skip
    peak = peak_rss_bytes()
    # CPU seconds of all threads: next to the wall time it shows contention on a busy machine.
    record["cpu_s"] = time.process_time() - cpu_start

    start = time.perf_counter()
    if method in SKETCHOT_BACKENDS:
        kernel, a, b, (log_u, log_v) = result.kernel, result.a, result.b, result.potentials
    else:  # POT's scalings, against the exact kernel streamed (no n x n array)
        kernel = sketchot.make_kernel(X, Y, reg, "exact", max_dense_bytes=0)
        a = b = np.full(n, 1.0 / n)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_u, log_v = np.log(result[0]), np.log(result[1])
    # Rows and columns drawn as SinkhornResult.check_true_kernel draws them.
    rng = np.random.default_rng(config["check_seed"])
    check = sampled_true_kernel_check(kernel, a, b, log_u, log_v, config["check_samples"], rng)
    errors = {k: getattr(check, k) for k in ("error_a", "error_b", "n_rows", "n_cols")}
    record.update(
        baseline_rss_bytes=baseline, peak_rss_bytes=peak, delta_rss_bytes=peak - baseline,
        true_kernel=errors, check_seconds=time.perf_counter() - start,
    )  # fmt: skip
    return record


# --------------------------------------------------------------------------- parent process
def make_config(args, n, reg, method, rank_label, dtype="float64", iterations=None):
    params = dict(RANKS[rank_label][method]) if rank_label is not None else {}
    # Rows (and columns) of the true-kernel check: at most check_budget / n (>= 100).
    check_samples = int(min(args.check_samples, max(100, args.check_budget // n)))
    return {
        "method": method, "n": n, "reg": reg, "rank_label": rank_label, "params": params,
        "dtype": dtype, "iterations": args.iterations if iterations is None else iterations,
        "safeguard_policy": args.safeguard, "data_seed": [args.seed, n],
        "method_seed": [args.seed, n, 1], "check_seed": [args.seed, n, 2],
        "check_samples": check_samples,
    }  # fmt: skip


def plan(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Configurations to run, and skipped ones with the reason."""
    if args.only_target:
        return [
            make_config(args, TARGET_N, TARGET_REG, "polyts", "61", dtype, TARGET_ITERATIONS)
            for dtype in ("float64", "float32")
        ], []
    configs, skipped = [], []
    for n, reg in ((n, reg) for n in args.sizes for reg in args.regs):
        config = partial(make_config, args, n, reg)
        if n <= POT_DENSE_MAX_N:
            configs.append(config("pot-dense", None, iterations=args.dense_iterations))
        else:
            reason = f"dense n x n: ~5 x {8 * n * n / 1e9:.0f} GB at peak"
            skipped.append({"method": "pot-dense", "n": n, "reg": reg, "reason": reason})
        if n <= EXACT_MAX_N:
            iterations = args.dense_iterations
            if 8 * n * n > EXACT_DENSE_BYTES:
                iterations = min(iterations, STREAMED_EXACT_ITERATIONS)
            configs.append(config("exact", None, iterations=iterations))
        else:
            reason = f"streamed: {n * n:.0e} exp per product, minutes per iteration"
            skipped.append({"method": "exact", "n": n, "reg": reg, "reason": reason})
        methods = ("pot-nystrom", "nystrom", "rff", "polyts")
        configs += [config(method, rank_label) for rank_label in args.ranks for method in methods]
        if n == TARGET_N and reg == TARGET_REG and "61" in args.ranks:
            configs.append(config("polyts", "61", "float32", TARGET_ITERATIONS))
    return configs, skipped


def run_child(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--single", json.dumps(config)]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**config, "error": f"timed out after {timeout:.0f} s"}
    for line in completed.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return {**config, **json.loads(line[len(RESULT_MARKER) :])}
    tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
    return {**config, "error": f"exit code {completed.returncode}: {' | '.join(tail)}"}


def label(row: dict[str, Any]) -> str:
    method, params = row["method"], row["params"]
    if method == "polyts" and "sketch_dim" in params:
        return f"polyts (m={params['sketch_dim']}, r={params['degree']})"
    return POT_LABELS.get(method, method)


def find(rows, **criteria) -> dict[str, Any] | None:
    """The first row without an error that matches every ``key=value`` of ``criteria``."""
    fits = (r for r in rows if "error" not in r and all(r.get(k) == v for k, v in criteria.items()))
    return next(fits, None)


def speedup(rows, row) -> float | None:
    dense = find(rows, method="pot-dense", n=row["n"], reg=row["reg"])
    if dense is None or row.get("per_iteration_s", 0) <= 0:
        return None
    return dense["per_iteration_s"] / row["per_iteration_s"]


def row_error(row: dict[str, Any]) -> float:
    """Worse of the two sampled true-kernel L1 marginal errors (total mass is 1)."""
    return max(row["true_kernel"]["error_a"], row["true_kernel"]["error_b"])


def table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        head = [f"{row['n']:,}", f"{row['reg']:g}", label(row)]
        if "error" in row:
            lines.append(
                md_row([*head, "-", row["dtype"], "-", f"failed: {row['error']}"]) + " |" * 7
            )
            continue
        guard, tk, ratio = row.get("safeguard"), row["true_kernel"], speedup(rows, row)
        lines.append([
            *head, "n" if row["rank"] is None else row["rank"], row["dtype"], row["n_iter"],
            f"{row['build_s']:.3f}", f"{1e3 * row['per_iteration_s']:.2f}", f"{row['total_s']:.2f}",
            f"{row['peak_rss_bytes'] / 2**20:.0f}", f"{row['delta_rss_bytes'] / 2**20:.0f}",
            "-" if ratio is None else f"{ratio:.1f}", f"{tk['error_a']:.2e} / {tk['error_b']:.2e}",
            "-" if guard is None else guard["rows_repaired"] + guard["cols_repaired"],
        ])  # fmt: skip
    header = ["n", "reg", "method", "rank", "dtype", "iters", "build s", "ms / iter", "total s",
              "peak RSS MiB", "+RSS MiB", "speedup / iter vs POT dense",
              "true-kernel L1 err a / b", "repairs"]  # fmt: skip
    return "\n".join(md_table(header, lines))


def evaluate_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target that the rows allow to check, with the numbers behind it."""
    targets = []

    def target(name: str, holds: bool, detail: str) -> None:
        targets.append({"name": name, "holds": bool(holds), "detail": detail})

    for dtype in ("float64", "float32"):
        row = find(rows, method="polyts", n=TARGET_N, reg=TARGET_REG, rank_label="61",
                   dtype=dtype, iterations=TARGET_ITERATIONS)  # fmt: skip
        if row is None:
            continue
        ok_time = row["total_s"] <= TARGET_SECONDS and row["n_iter"] == TARGET_ITERATIONS
        target(
            f"polyts n=10^6 reg=1 {dtype}: {TARGET_ITERATIONS} iterations + build "
            f"<= {TARGET_SECONDS:g} s, peak RSS <= 2 GB",
            ok_time and row["peak_rss_bytes"] <= TARGET_PEAK_BYTES,
            f"total {row['total_s']:.2f} s (build {row['build_s']:.2f} s, "
            f"{row['n_iter']} iterations {row['iterations_s']:.2f} s), peak RSS "
            f"{row['peak_rss_bytes'] / 1e9:.2f} GB (+{row['delta_rss_bytes'] / 1e9:.2f} GB "
            "over baseline)",
        )
    for row in rows:
        ratio = speedup(rows, row) if "error" not in row else None
        if row["method"] in LOW_RANK and row["n"] == TARGET_SPEEDUP_N and ratio is not None:
            target(
                f"{label(row)} rank {row['rank']} n=10^4 reg={row['reg']:g}: >= "
                f"{TARGET_SPEEDUP:g}x faster per iteration than POT dense",
                ratio >= TARGET_SPEEDUP,
                f"{ratio:.0f}x ({1e3 * row['per_iteration_s']:.2f} ms vs "
                f"{1e3 * row['per_iteration_s'] * ratio:.1f} ms)",
            )
    for row in rows:
        keys = {"n": row["n"], "reg": row["reg"], "rank_label": row["rank_label"]}
        pot = find(rows, method="pot-nystrom", **keys) if row["method"] == "nystrom" else None
        if pot is None or "error" in row:
            continue
        target(
            f"nystrom vs POT nystroem n={row['n']:,} reg={row['reg']:g} rank "
            f"{row['rank']} vs {pot['rank']}: faster per iteration, no worse true error",
            row["per_iteration_s"] < pot["per_iteration_s"] and row_error(row) <= row_error(pot),
            f"{1e3 * row['per_iteration_s']:.2f} vs {1e3 * pot['per_iteration_s']:.2f} ms/iter "
            f"({pot['per_iteration_s'] / row['per_iteration_s']:.1f}x), true error "
            f"{row_error(row):.2e} vs {row_error(pot):.2e}",
        )
    return targets


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--single", type=str, default=None, help=argparse.SUPPRESS)
    add("--quick", action="store_true", help="n <= 10^4, rank 61, 10 dense iterations")
    add("--only-target", action="store_true",
        help="only the n = 10^6 polyts float64/float32 100-iteration target rows")  # fmt: skip
    add("--sizes", type=int, nargs="+", default=None)
    add("--regs", type=float, nargs="+", default=[1.0, 0.1])
    add("--ranks", nargs="+", default=None, choices=list(RANKS), help="default all (quick: 61)")
    add("--iterations", type=int, default=100, help="iterations per run")
    add("--dense-iterations", type=int, default=None,
        help="iterations of POT's dense solver and the exact backend (default --iterations; "
        "quick: 10)")  # fmt: skip
    add("--safeguard", default="clip", choices=("clip", "exact", "raise"))
    add("--check-samples", type=int, default=1000)
    add("--check-budget", type=int, default=200_000_000,
        help="exact kernel entries per side for the true-kernel check "
        "(samples >= 100)")  # fmt: skip
    add("--seed", type=int, default=0)
    add("--child-timeout", type=float, default=1800.0)
    add("--json", type=Path, default=None)
    add("--out-md", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.single is not None:
        record = run_single(json.loads(args.single))
        print(RESULT_MARKER + json.dumps(record))
        return None

    args.sizes = args.sizes or ([1_000, 10_000] if args.quick else [1_000, 10_000, 10**5, 10**6])
    args.ranks = args.ranks or (["61"] if args.quick else list(RANKS))
    if args.dense_iterations is None:
        args.dense_iterations = 10 if args.quick else args.iterations
    full = not args.quick and not args.only_target
    if args.out_md is None and full:
        args.out_md = RESULTS_DIR / "sinkhorn_speed.md"

    configs, skipped = plan(args)
    started = time.perf_counter()
    rows = []
    for index, config in enumerate(configs, 1):
        row = run_child(config, args.child_timeout)
        rows.append(row)
        status = row.get("error") or (
            f"{row['total_s']:.2f} s, {1e3 * row['per_iteration_s']:.2f} ms/iter, "
            f"peak {row['peak_rss_bytes'] / 2**20:.0f} MiB"
        )
        print(f"[{index}/{len(configs)}] n={config['n']:,} reg={config['reg']:g} "
              f"{label(config)} {config['dtype']}: {status}", flush=True)  # fmt: skip

    text = table(rows)
    skips = [f"- skipped {s['method']} at n={s['n']:,}: {s['reason']}" for s in skipped]
    targets = evaluate_targets(rows)
    verdicts = [(t["holds"], f"{t['name']} -- {t['detail']}") for t in targets]
    print("\n" + text + ("\n\n" + "\n".join(skips) if skips else "") + "\n")
    for holds, line in verdicts:
        print(f"Target {'HOLDS' if holds else 'FAILS'}: {line}")
    elapsed = time.perf_counter() - started
    print(f"\nWall time of the benchmark: {elapsed:.0f} s")

    if args.out_md is not None:
        write_text(args.out_md, "\n".join([
            "# Sinkhorn speed and memory", "",
            f"Produced by `python benchmarks/sinkhorn_speed.py {' '.join(sys.argv[1:])}`. "
            f"Uniform [0,1]^3 points, {args.iterations} iterations ({args.dense_iterations} for "
            f"POT dense and exact, {STREAMED_EXACT_ITERATIONS} for streamed exact), peak RSS of "
            "a fresh child process per row, true-kernel errors on sampled rows/columns.", "",
            text, "", *skips, "",
            *[f"- {'holds' if holds else 'FAILS'}: {line}" for holds, line in verdicts], "",
        ]))  # fmt: skip
        print(f"Table: {args.out_md}")
    config = {
        "sizes": args.sizes, "regs": args.regs,
        "ranks": {label_: RANKS[label_] for label_ in args.ranks},
        "iterations": args.iterations, "dense_iterations": args.dense_iterations,
        "safeguard": args.safeguard, "seed": args.seed, "only_target": args.only_target,
        "quick": args.quick,
    }  # fmt: skip
    output = dict(config=config, rows=rows, skipped=skipped, targets=targets, seconds=elapsed)
    if args.json is not None:
        write_json(args.json, output)
    return output


if __name__ == "__main__":
    main()
