"""Sinkhorn on sampled RGB pixels: the experiment of Figure 2 of Han et al. (2020), made explicit.

``n`` pixels of a source and ``n`` of a target image (``images/{default,pair2,pair3}``), 10
Sinkhorn iterations with the exact Gibbs kernel ``exp(-||x - y||^2 / reg)`` and with its
approximations Coreset-TS (``polyts``), RFF and Nystrom (uniform landmarks as in the paper,
and sketchot's default k-center ones); measured: (a) the speedup per iteration over the exact
computation (median of a trial's 10 ``perf_counter`` times; also including the build) and (b)
the ratio approximate / exact of four objectives after 10 iterations (``cost (true K)``, the
primary one, ``cost (approx K)``, ``dual (approx K)``, ``dual (true K)``), over 3 pairs x 10
trials, at ``reg`` 1 and 0.1, at the paper's comparable ranks and at equal rank 241. The
iteration is ``sketchot.solver.plain_sinkhorn(..., order='paper')`` (from ``v = 1``, no
safeguard: bad denominators counted as faults, a trial with a non-finite or non-positive final
scaling FAILED); for ``n <= --library-max-n`` the same operators also run through
``sketchot.sinkhorn_kernel(..., safeguard='exact')``. Every choice the paper leaves open (data,
iteration, objectives, timing, settings, seeds: ``SeedSequence(base).spawn`` per pair, ``n``,
trial and method, all in the JSON) is listed in the README, "Protocol choices the paper leaves
open".

Run ``python benchmarks/paper_sinkhorn.py`` (3 pairs x 4 values of n x 10 trials x 2 reg x 2
settings) or ``--quick`` (one pair, n in {1000, 2000}, 3 trials). ``--json PATH`` writes every raw
number (failed values as ``null``); ``--replot PATH`` rebuilds tables and figure from such a
file. The figure goes to ``images/paper_sinkhorn.png`` and the tables to
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
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from _results import md_table, write_json, write_text

import sketchot
from sketchot.color import color_spread, load_image_pair
from sketchot.solver import PlainRun, entropic_dual, plain_sinkhorn, plan_summaries

ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = ROOT / "images"
RESULTS_DIR = ROOT / "benchmarks" / "results"

PAIRS = ("default", "pair2", "pair3")
N_VALUES = (1000, 2000, 5000, 10000)
REGS = (1.0, 0.1)
N_TRIALS = 10
N_ITER = 10
# The paper's three methods (Nystrom with uniform landmarks, as the paper and POT's
# kernel_nystroem) and sketchot's default Nystrom (greedy k-center landmarks).
BACKENDS = ("polyts", "rff", "nystrom", "nystrom_kc")
BACKEND_OF = {"polyts": "polyts", "rff": "rff", "nystrom": "nystrom", "nystrom_kc": "nystrom"}
LANDMARKS = {"nystrom": {"landmarks": "uniform"}, "nystrom_kc": {"landmarks": "kcenter"}}
LABELS = {
    "polyts": "Coreset-TS (polyts)", "rff": "RFF", "nystrom": "Nystrom, uniform landmarks (paper)",
    "nystrom_kc": "Nystrom, k-center landmarks",
}  # fmt: skip
COLORS = dict(zip(BACKENDS, ("tab:red", "tab:blue", "tab:green", "tab:purple"), strict=True))

# The paper's comparable-cost setting, from the backend records. The paper's polyts algorithm
# is PAPER["polyts"]: its one place here (the equal-rank polyts setting starts from it too).
PAPER = sketchot.comparable_parameters()
LARGE_RANK = 241  # equal rank: one iteration costs O(n * 241) for every backend


def _setting(rank: int | None) -> dict[str, dict[str, Any]]:
    """Parameters of every method: the paper's comparable cost (``None``) or equal ``rank``
    (polyts: the paper's variant and degree, ``m = (rank - 1) / r``)."""
    out = {}
    for method in BACKENDS:
        backend = BACKEND_OF[method]
        params = {**PAPER[backend]}
        if rank is not None and backend == "polyts":
            params["sketch_dim"] = (rank - 1) // params["degree"]
        elif rank is not None:
            params = sketchot.get_backend(backend).params_for_rank(rank)
        out[method] = {**params, **LANDMARKS.get(method, {})}
    return out


RANK_SETTINGS = {"paper": _setting(None), f"rank{LARGE_RANK}": _setting(LARGE_RANK)}


def _rank_label(setting: str) -> str:
    p = RANK_SETTINGS[setting]
    head = "paper ranks" if setting == "paper" else f"equal rank {LARGE_RANK}"
    return (
        f"{head} (polyts m={p['polyts']['sketch_dim']} r={p['polyts']['degree']}, RFF "
        f"D={p['rff']['n_features']}, Nystrom s={p['nystrom']['n_landmarks']})"
    )


# Trial t gives the method at position i of this order the child i + 1 of its seed sequence
# (child 0 draws the pixels), in quick and in full runs alike.
METHOD_ORDER = tuple((reg, s, b) for reg in REGS for s in RANK_SETTINGS for b in BACKENDS)
BASE_SEED = 0
MEASURES = ("cost_true", "cost_approx", "dual_approx", "dual_true")
# "cost (true K)", "cost (approx K)", "dual (approx K)", "dual (true K)"
MEASURE_LABELS = {m: "{} ({} K)".format(*m.split("_")) for m in MEASURES}


# --------------------------------------------------------------------------------------- data
def load_pairs(names: tuple[str, ...], synthetic: bool) -> dict[str, tuple[np.ndarray, ...]]:
    """``{pair: (source image, target image)}``; ``synthetic`` builds stand-ins instead."""
    if synthetic:
        return {name: synthetic_pair(index) for index, name in enumerate(names)}
    try:
        return {name: load_image_pair(IMAGES_DIR, name) for name in names}
    except FileNotFoundError as error:
        raise SystemExit(
            f"{error}: run images/make_images.py first, or pass --synthetic for synthetic "
            "stand-in colour clouds (development only)"
        ) from None


def synthetic_pair(index: int, n_pixels: int = 40_000) -> tuple[np.ndarray, np.ndarray]:
    """Two clustered colour clouds as ``(n_pixels, 1, 3)`` images (development only)."""
    rng = np.random.default_rng(np.random.SeedSequence(BASE_SEED, spawn_key=(999, index)))
    clouds = []
    for _ in range(2):
        centres, labels = rng.random((5, 3)), rng.integers(0, 5, size=n_pixels)
        points = centres[labels] + 0.08 * rng.standard_normal((n_pixels, 3))
        clouds.append(np.clip(points, 0.0, 1.0)[:, None, :])
    return clouds[0], clouds[1]


def spread_table(spread: dict[str, dict[str, float]], regs: list[float]) -> str:
    """``sketchot.color.color_spread`` of each pair (all pixels) relative to each ``reg``."""
    head = [h.format(r) for r in regs for h in ("E||x-y||^2 / {:g}", "a at reg={:g}")]
    rows = [[name, *(f"{s[k] / r:.3f}" for r in regs for k in ("mean_sq_distance", "half_width"))]
            for name, s in spread.items()]  # fmt: skip
    return "\n".join([
        "Scale of the data relative to reg (all pixels): E||x - y||^2 / reg and the polyts "
        "interval half-width a = max||x - c|| max||y - c|| / reg.\n",
        *md_table(["pair", *head], rows, "l" + "r" * len(head)),
    ]) + "\n"  # fmt: skip


# ------------------------------------------------------------------------------------- trial
def protocol(op, a: np.ndarray, b: np.ndarray, order: str = "paper") -> tuple[PlainRun, list]:
    """``plain_sinkhorn`` for 10 iterations, every numpy warning on the way recorded."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = plain_sinkhorn(op, a, b, N_ITER, order)
    return run, [str(w.message) for w in caught]


def library_solve(op, a: np.ndarray, b: np.ndarray):
    """``sketchot.sinkhorn_kernel`` for 10 iterations with the exact-kernel safeguard."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = sketchot.sinkhorn_kernel(
            a, b, op, max_iter=N_ITER, tol=1e-300, safeguard="exact", accuracy=None,
            errors="warn", warn=False,
        )  # fmt: skip
    return result, [str(w.message) for w in caught]


def library_run(op, a: np.ndarray, b: np.ndarray) -> tuple[PlainRun, dict[str, Any]]:
    result, caught = library_solve(op, a, b)
    with np.errstate(over="ignore"):
        u, v = np.exp(result.potentials[0]), np.exp(result.potentials[1])
    guard, per_iteration = result.safeguard, result.timings["per_iteration"]
    repairs = guard["rows_repaired"] + guard["cols_repaired"]
    info = {"n_iter": result.n_iter, "repairs": repairs, "clipped": guard["clipped"]}
    info = {**info, "per_iteration": per_iteration, "warnings": caught}
    return PlainRun(u, v, [per_iteration], repairs), info


def objectives(run: PlainRun, op, *, exact, true_plans, a, b, reg: float) -> dict[str, float]:
    """The four measures of a run (NaN if it failed); ``true_plans``: plans with the exact
    kernel by ``id`` of the run."""
    if not run.valid:
        return dict.fromkeys(MEASURES, math.nan)
    true = true_plans[id(run)]
    approx = true if op is exact else plan_summaries(op, [(run.u, run.v)])[0]
    duals = [entropic_dual(a, b, run.u, run.v, s.mass, reg) for s in (approx, true)]
    return dict(zip(MEASURES, [true.cost, approx.cost, *duals], strict=True))


def ratios(values: dict[str, float], reference: dict[str, float]) -> dict[str, float]:
    return {k: values[k] / reference[k] for k in MEASURES}


def seed_record(seq: np.random.SeedSequence) -> dict[str, Any]:
    return {"entropy": seq.entropy, "spawn_key": list(seq.spawn_key)}


def run_trial(X, Y, method_seeds, check_library_exact: bool, run_library: bool) -> list[dict]:
    """Every method of one trial (one sample of ``X``, ``Y``): a list of flat records."""
    n = X.shape[0]
    a = b = np.full(n, 1.0 / n)
    records = []
    for reg in REGS:
        exact = sketchot.make_kernel(X, Y, reg, "exact")
        exact_run, exact_warnings = protocol(exact, a, b)
        exact_lib = protocol(exact, a, b, order="pot")[0] if run_library else None
        methods = []  # (setting, backend, op, protocol run, its warnings, library run, info)
        for setting, backend in ((s, m) for s in RANK_SETTINGS for m in BACKENDS):
            params = RANK_SETTINGS[setting][backend]
            rng = np.random.default_rng(method_seeds[(reg, setting, backend)])
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                op = sketchot.make_kernel(X, Y, reg, BACKEND_OF[backend], rng=rng, **params)
            run, run_warnings = protocol(op, a, b)
            lib = library_run(op, a, b) if run_library else (None, None)
            methods.append((setting, backend, op, run, [str(w.message) for w in caught]
                            + run_warnings, *lib))  # fmt: skip
        # One pass over the dense exact kernel for the true plans of every valid run.
        runs = [exact_run, exact_lib] + [r for m in methods for r in (m[3], m[5])]
        valid = [r for r in runs if r is not None and r.valid]
        summaries = plan_summaries(exact, [(r.u, r.v) for r in valid])
        true = dict(zip(map(id, valid), summaries, strict=True))
        measure = partial(objectives, exact=exact, true_plans=true, a=a, b=b, reg=reg)
        exact_obj = measure(exact_run, exact)
        exact_lib_obj = measure(exact_lib, exact) if run_library else None
        lib_check = None
        if run_library and check_library_exact:
            lib_check = check_against_library(exact, a, b, exact_lib, exact_lib_obj)
        exact_median = float(np.median(exact_run.iteration_times))
        exact_total = exact.info.build_time + float(np.sum(exact_run.iteration_times))
        for setting in RANK_SETTINGS:
            records.append({
                "reg": reg, "setting": setting, "backend": "exact", "rank": None,
                "build_time": exact.info.build_time, "iter_time": exact_median,
                "iteration_times": exact_run.iteration_times, "faults": exact_run.faults,
                "warnings": exact_warnings, "failed": not exact_run.valid, "values": exact_obj,
                "library": run_library and {"values": exact_lib_obj, "faults": exact_lib.faults},
                "library_check": lib_check,
            })  # fmt: skip
        for setting, backend, op, run, run_warnings, lib_run, lib_info in methods:
            median, build = float(np.median(run.iteration_times)), op.info.build_time
            record = {
                "reg": reg, "setting": setting, "backend": backend,
                "params": RANK_SETTINGS[setting][backend], "rank": int(op.info.rank),
                "build_time": build, "iter_time": median, "iteration_times": run.iteration_times,
                "speedup_iter": exact_median / median,
                "speedup_total": exact_total / (build + float(np.sum(run.iteration_times))),
                "faults": run.faults, "warnings": run_warnings, "failed": not run.valid,
                "values": measure(run, op),
            }  # fmt: skip
            record.update(ratios=ratios(record["values"], exact_obj), library=False)
            if run_library:
                lib_values = measure(lib_run, op)
                record["library"] = {**lib_info, "failed": not lib_run.valid, "values": lib_values,
                                     "ratios": ratios(lib_values, exact_lib_obj)}  # fmt: skip
            records.append(record)
    return records


def check_against_library(exact, a, b, exact_lib: PlainRun, exact_lib_obj) -> dict[str, Any]:
    """``sinkhorn_kernel`` on the exact operator vs the same iteration run here; also times
    sketchot's fused exact iteration (one pass over ``K`` per iteration)."""
    result, caught = library_solve(exact, a, b)
    mine, log_u = exact_lib_obj["cost_true"], np.log(exact_lib.u)
    return {
        "relative_cost_difference": abs(result.value_linear - mine) / abs(mine),
        "max_abs_log_u_difference": float(np.max(np.abs(result.potentials[0] - log_u))),
        "fused_per_iteration": result.timings["per_iteration"],
        "warnings": caught,
    }


# ---------------------------------------------------------------------------------- the sweep
def sweep(args: argparse.Namespace) -> dict[str, Any]:
    pair_names = PAIRS[:1] if args.quick else PAIRS
    n_values = N_VALUES[:2] if args.quick else N_VALUES
    n_trials = 3 if args.quick else N_TRIALS
    pairs = load_pairs(pair_names, args.synthetic)
    spread = {name: color_spread(*images) for name, images in pairs.items()}
    pair_seqs = np.random.SeedSequence(args.seed).spawn(len(PAIRS))
    records: list[dict[str, Any]] = []
    trials_meta = []
    started = time.perf_counter()
    for pair in pair_names:
        n_seqs = pair_seqs[PAIRS.index(pair)].spawn(len(N_VALUES))
        for n in n_values:
            trial_seqs = n_seqs[N_VALUES.index(n)].spawn(N_TRIALS)
            for trial in range(n_trials):
                children = trial_seqs[trial].spawn(1 + len(METHOD_ORDER))
                sample_rng = np.random.default_rng(children[0])
                X, Y = (sketchot.sample_pixels(im, n, rng=sample_rng).colors for im in pairs[pair])
                method_seeds = {m: children[1 + i] for i, m in enumerate(METHOD_ORDER)}
                check = trial == 0 and pair == pair_names[0]
                t0 = time.perf_counter()
                trial_records = run_trial(X, Y, method_seeds, check, n <= args.library_max_n)
                for record in trial_records:
                    record.update({"pair": pair, "n": n, "trial": trial})
                    key = (record["reg"], record["setting"], record["backend"])
                    if key in method_seeds:
                        record["seed"] = seed_record(method_seeds[key])
                records.extend(trial_records)
                seconds = time.perf_counter() - t0
                sample_seed = seed_record(children[0])
                trials_meta.append({"pair": pair, "n": n, "trial": trial,
                                    "sample_seed": sample_seed, "seconds": seconds})  # fmt: skip
                elapsed = time.perf_counter() - started
                print(f"  {pair:8s} n={n:6d} trial {trial}: {seconds:6.1f} s "
                      f"(elapsed {elapsed:7.1f} s)", flush=True)  # fmt: skip
    config = {
        "quick": args.quick, "synthetic": args.synthetic, "base_seed": args.seed,
        "pairs": list(pair_names), "n_values": list(n_values), "n_trials": n_trials,
        "n_iter": N_ITER, "regs": list(REGS), "library_max_n": args.library_max_n,
        "rank_settings": RANK_SETTINGS, "python": platform.python_version(),
        "numpy": np.__version__, "sketchot": sketchot.__version__,
        "machine": platform.platform(), "seconds": time.perf_counter() - started,
    }  # fmt: skip
    return {"config": config, "data_spread": spread, "trials": trials_meta, "records": records}


# ------------------------------------------------------------------------------- aggregation
def stats(values: list[float]) -> dict[str, float]:
    """Mean, std, median over the finite values, and how many were not finite."""
    array = np.asarray(values, dtype=np.float64)
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        return {"mean": math.nan, "std": math.nan, "median": math.nan, "count": 0}
    return {
        "mean": float(finite.mean()), "std": float(finite.std()),
        "median": float(np.median(finite)), "min": float(finite.min()),
        "max": float(finite.max()), "count": int(finite.size),
    }  # fmt: skip


def summarize(records: list[dict[str, Any]], pair: str | None = None) -> list[dict[str, Any]]:
    """One row per (reg, setting, n, backend), pooled over pairs (or for one ``pair``)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        if pair is None or r["pair"] == pair:
            groups.setdefault((r["reg"], r["setting"], r["n"], r["backend"]), []).append(r)
    rows = []
    for (reg, setting, n, backend), group in sorted(groups.items(), key=lambda kv: (
            -kv[0][0], list(RANK_SETTINGS).index(kv[0][1]), kv[0][2],
            (*BACKENDS, "exact").index(kv[0][3]))):  # fmt: skip
        row: dict[str, Any] = {
            "reg": reg, "setting": setting, "n": n, "backend": backend, "trials": len(group),
            "failed": sum(r["failed"] for r in group), "faults": sum(r["faults"] for r in group),
            "trials_with_faults": sum(r["faults"] > 0 for r in group),
            "warnings": sum(len(r["warnings"]) for r in group),
            "warning_messages": dict(Counter(w for r in group for w in r["warnings"])),
            "iter_time": stats([r["iter_time"] for r in group]),
            "build_time": stats([r["build_time"] for r in group]),
        }  # fmt: skip
        if backend == "exact":
            row["library_check"] = [r["library_check"] for r in group if r.get("library_check")]
            rows.append(row)
            continue
        for key in ("rank", "speedup_iter", "speedup_total"):
            row[key] = stats([r[key] for r in group])
        row["ratios"] = {m: stats([r["ratios"][m] for r in group]) for m in MEASURES}
        lib = [r["library"] for r in group if r["library"]]
        row["library"] = lib and {
            "failed": sum(x["failed"] for x in lib), "repairs": sum(x["repairs"] for x in lib),
            "trials_with_repairs": sum(x["repairs"] > 0 for x in lib),
            "clipped": sum(x["clipped"] for x in lib),
            "warnings": sum(len(x["warnings"]) for x in lib),
            "per_iteration": stats([x["per_iteration"] for x in lib]),
            "ratios": {m: stats([x["ratios"][m] for x in lib]) for m in MEASURES},
        }  # fmt: skip
        rows.append(row)
    return rows


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
            approx = [r for r in block if r["backend"] != "exact"]
            if not block:
                continue
            speed = []
            for r in block:
                exact = r["backend"] == "exact"
                speed.append([
                    r["n"], r["backend"], "-" if exact else f"{r['rank']['mean']:.0f}",
                    f"{r['build_time']['mean']:.3f}", f"{r['iter_time']['mean'] * 1e3:.3f}",
                    *(["-"] * 2 if exact else [f"{_num(r[k]['mean'])} ± {_num(r[k]['std'])}"
                                             for k in ("speedup_iter", "speedup_total")]),
                    f"{r['failed']} / {r['trials']}", f"{r['faults']} ({r['trials_with_faults']})",
                    r["warnings"],
                ])  # fmt: skip
            accuracy = [[r["n"], r["backend"], f"{r['failed']} / {r['trials']}",
                         *(fmt_ratio(r["ratios"][m]) for m in MEASURES)]
                        for r in approx]  # fmt: skip
            library = [
                [r["n"], r["backend"], f"{r['library']['failed']} / {r['trials']}",
                 f"{r['library']['repairs']} ({r['library']['trials_with_repairs']})",
                 f"{r['library']['per_iteration']['mean'] * 1e3:.3f}",
                 fmt_ratio(r["library"]["ratios"]["cost_true"]),
                 fmt_ratio(r["library"]["ratios"]["dual_approx"])]
                if r["library"] else
                f"| {r['n']} | {r['backend']} | not run (n > --library-max-n) ||||"
                for r in approx
            ]  # fmt: skip
            out += [
                f"### reg = {reg:g}, {_rank_label(setting)}{title_suffix}\n",
                "Speed (median per-iteration time of a trial; mean over trials) and robustness "
                "of the 10-iteration protocol (no safeguard).\n",
                *md_table(["n", "backend", "rank", "build s", "iter ms", "speedup/iter",
                           "speedup incl. build", "failed / trials", "faults (trials)",
                           "warnings"], speed, "rl" + "r" * 8),
                "",
                "Ratio approximate / exact after 10 iterations: mean ± std [median] over the "
                "trials that did not fail.\n",
                *md_table(["n", "backend", "failed", *(MEASURE_LABELS[m] for m in MEASURES)],
                          accuracy, "rl" + "r" * 5),
                "",
                "The same operators through `sketchot.sinkhorn_kernel(..., max_iter=10, "
                "tol=1e-300, safeguard='exact')` (POT's order, fused sweeps, bad denominators "
                "recomputed with the exact kernel); ratios to the exact kernel in the same "
                "order.\n",
                *md_table(["n", "backend", "failed", "repairs (trials)", "fused iter ms",
                           "cost (true K)", "dual (approx K)"], library, "rl" + "r" * 5),
                "",
            ]  # fmt: skip
    return "\n".join(out)


def library_check_table(rows: list[dict[str, Any]]) -> str:
    checks = {}
    for r in rows:
        if r["backend"] == "exact" and r["library_check"]:
            checks.setdefault((r["reg"], r["n"]), (r, r["library_check"]))
    lines = [
        [f"{reg:g}", n, f"{c['relative_cost_difference']:.1e}",
         f"{c['max_abs_log_u_difference']:.1e}", f"{r['iter_time']['mean'] * 1e3:.2f}",
         f"{c['fused_per_iteration'] * 1e3:.2f}"]
        for (reg, n), (r, group) in checks.items() for c in group
    ]  # fmt: skip
    head = ["reg", "n", "rel. cost difference", "max abs log u difference",
            "protocol iter ms", "fused iter ms"]  # fmt: skip
    return "\n".join([
        "Exact reference of the library variant vs `sinkhorn_kernel` on the exact operator "
        "(first trial of the first pair), and sketchot's fused exact iteration time:\n",
        *md_table(head, lines, "r" * 6),
    ]) + "\n"  # fmt: skip


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

    present = {(r["reg"], r["setting"]) for r in rows}
    regs = sorted({r["reg"] for r in rows}, reverse=True)
    panels = [(reg, s) for reg in regs for s in RANK_SETTINGS if (reg, s) in present]
    fig, axes = plt.subplots(
        len(panels), 3, figsize=(13, 3.3 * len(panels)), squeeze=False, constrained_layout=True
    )
    for (reg, setting), ax_row in zip(panels, axes, strict=True):
        block = [r for r in rows if r["reg"] == reg and r["setting"] == setting]
        for backend in BACKENDS:
            series = sorted((r for r in block if r["backend"] == backend), key=lambda r: r["n"])
            if not series:
                continue
            ns, color = [r["n"] for r in series], COLORS[backend]
            failed, total = (sum(r[k] for r in series) for k in ("failed", "trials"))
            label = LABELS[backend] + (f" ({failed}/{total} failed)" if failed else "")
            speedups = [r["speedup_iter"]["mean"] for r in series]
            ax_row[0].plot(ns, speedups, "o-", color=color, label=LABELS[backend])
            for ax, measure in ((ax_row[1], "cost_true"), (ax_row[2], "dual_approx")):
                means = [r["ratios"][measure]["mean"] for r in series]
                stds = [r["ratios"][measure]["std"] for r in series]
                ax.errorbar(ns, means, yerr=stds, fmt="o-", capsize=3, color=color, label=label)
        title = f"reg={reg:g}, {'paper ranks' if setting == 'paper' else 'rank 241'}"
        heads = ("(a)", "(b) <P,M> with true K,", "(c) dual (approx K),")
        for index, (ax, head) in enumerate(zip(ax_row, heads, strict=True)):
            ylabel = "ratio to exact" if index else "speedup per iteration"
            ax.set(xscale="log", yscale="log", xlabel="n", ylabel=ylabel, title=f"{head} {title}")
            if index:
                ax.axhline(1.0, color="gray", lw=0.8, ls="--")
                # Ratios of positive plans are positive: log scale; a lower bar below 0 (std
                # larger than the mean) is clipped at the bottom of the axis.
                ax.set_yscale("log", nonpositive="clip")
            ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            low, high = ax.get_ylim()
            ax.yaxis.set_minor_formatter(ticker.FuncFormatter(partial(_minor_label, high / low)))
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


def _minor_label(span: float, value: float, _position: int) -> str:
    """A log axis spanning less than two decades (``span``: top / bottom) has at most two major
    ticks: label the minor ticks too, all of them within a decade, else only 2x and 5x."""
    if value <= 0 or span >= 100:
        return ""
    leading = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if span < 10 or leading in (2, 5) else ""


# -------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="one pair, n in {1000, 2000}, 3 trials")
    add("--json", type=Path, help="write every raw number to this file")
    add("--seed", type=int, default=BASE_SEED, help="base seed (default 0)")
    add("--library-max-n", type=int, default=5000,
        help="run the sketchot.sinkhorn_kernel variant only up to this n (default 5000: its "
        "exact-kernel repairs at reg=0.1 cost ~45 s per trial at n=10^4)")  # fmt: skip
    add("--threads", type=int, default=1,
        help="BLAS threads for every backend (default 1; 0 leaves the BLAS default)")  # fmt: skip
    add("--synthetic", action="store_true",
        help="synthetic colour clouds instead of the images (development only)")  # fmt: skip
    add("--replot", type=Path,
        help="rebuild the tables, the markdown file and the figure from a --json file of an "
        "earlier run, without running anything")  # fmt: skip
    args = parser.parse_args(argv)
    print(
        f"sketchot {sketchot.__version__}, numpy {np.__version__}, Python "
        f"{platform.python_version()}, base seed {args.seed}"
        + (" [QUICK]" if args.quick else "") + (" [SYNTHETIC DATA]" if args.synthetic else "")
        + f", BLAS threads: {'default' if args.threads == 0 else args.threads}", flush=True,
    )  # fmt: skip
    if args.replot:
        # Tables and figure again from a finished run (failed values are null there).
        data = json.loads(args.replot.read_text())
        args.quick = data["config"]["quick"]
        args.synthetic = data["config"]["synthetic"]
        args.seed = data["config"]["base_seed"]
    else:
        with limit_blas_threads(args.threads):
            data = sweep(args)
        data["config"]["blas_threads"] = args.threads
    rows = summarize(data["records"])
    per_pair = {pair: summarize(data["records"], pair) for pair in data["config"]["pairs"]}
    data.update(summary=rows, summary_per_pair=per_pair)

    tables = markdown_tables(rows)
    report = "\n".join([
        spread_table(data["data_spread"], data["config"]["regs"]), tables,
        library_check_table(rows), warning_summary(rows),
        f"Total time: {data['config']['seconds']:.0f} s.",
    ])  # fmt: skip
    print("\n" + report)

    suffix = ("_quick" if args.quick else "") + ("_synthetic" if args.synthetic else "")
    figure = (
        RESULTS_DIR / f"paper_sinkhorn{suffix}.png" if suffix else IMAGES_DIR / "paper_sinkhorn.png"
    )
    plot(rows, figure)
    markdown = RESULTS_DIR / f"paper_sinkhorn{suffix}.md"
    pair_tables = "\n".join(
        f"## Pair '{pair}'\n\n" + markdown_tables(per_pair[pair], f" — pair '{pair}'")
        for pair in per_pair
    )
    write_text(
        markdown,
        "# Sinkhorn on sampled RGB pixels (Figure 2 of Han et al. 2020)\n\n"
        f"Produced by `python benchmarks/paper_sinkhorn.py{' --quick' if args.quick else ''}"
        f"{' --synthetic' if args.synthetic else ''}` (base seed {args.seed}; pairs "
        f"{', '.join(data['config']['pairs'])}; n in {data['config']['n_values']}; "
        f"{data['config']['n_trials']} trials; {N_ITER} iterations). Figure: "
        f"`{figure.relative_to(ROOT)}`.\n\n## All pairs pooled\n\n" + report + "\n\n" + pair_tables,
    )
    print(f"\nwrote {figure.relative_to(ROOT)} and {markdown.relative_to(ROOT)}")
    if args.json:
        json_data = _finite_or_null(data)
        write_json(args.json, json_data, default=lambda v: v.tolist(), allow_nan=False, indent=None)
    return 0


def limit_blas_threads(threads: int):
    """BLAS limited to ``threads`` threads (``0``: no limit). On a shared 2-core machine a
    threaded BLAS call waits for a busy core: small products took 10-100x longer at random."""
    from threadpoolctl import threadpool_limits

    return contextlib.nullcontext() if threads == 0 else threadpool_limits(threads, "blas")


def _finite_or_null(value: Any) -> Any:
    """NaN and infinities become ``null`` (strict JSON); failed trials stay visible as nulls."""
    if isinstance(value, dict):
        return {str(k): _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    return value


if __name__ == "__main__":
    sys.exit(main())
