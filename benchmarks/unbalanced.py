"""Unbalanced and semi-relaxed transport of colours with far outliers: sketchot against POT.

Data: ``n`` pixel colours of each image of the default pair (``images/default_source.png``
and ``images/default_target.png``, drawn without replacement by
:func:`sketchot.color.sample_pixels` with ``default_rng(seed)``), in ``[0, 1]^3``, and
``n / 10`` far outliers added to the source cloud, uniform in ``[2, 3]^3`` (squared distance
at least 3 from every colour, up to 27, against about 0.2 between the images' colours: a
kernel entry ``exp(-3 / reg)`` is ``e^-300`` at reg 0.01). Uniform weights of mass 1 on each
side, so the outliers carry 1/11 of the source's mass.

Settings: ``reg`` 0.1 and 0.01 (absolute: colours in ``[0, 1]``), ``reg_m = 1`` (both sides
relaxed) and ``(inf, 1)`` (semi-relaxed: the source's marginal, outliers included, is kept).

Methods, each cell timed from the clouds to the result (the cost matrix included for POT):

``sketchot``
    The default call ``sketchot.sinkhorn(a, b, X, Y, reg=reg, reg_m=reg_m, rng=seed)``
    (``backend='auto'``); reported: the backend it used, iterations, and its certified
    residual ``res.true_kernel.bound`` (upper bound of the relative L1 residual of the fixed
    point against the TRUE kernel; sampled rows and columns at large ``n``).
``POT``
    ``ot.unbalanced.sinkhorn_unbalanced(a, b, ot.dist(X, Y), reg, reg_m,
    method='sinkhorn_translation_invariant', stopThr=1e-9, numItermax=20000)``, dense, where
    ``n <= --pot-max-n`` (default 1e4: about 4 GB). The translation-invariant method has the
    plain method's fixed point in fewer iterations; ``'sinkhorn_stabilized'`` is wrong once it
    absorbs (PythonOT/POT issue 711). Its residual is computed here exactly (every row and
    column, dense): ``max(||P 1 - a exp(-f / reg_m_a)||_1, ||P^T 1 - b exp(-g / reg_m_b)||_1)
    / mass(P)`` with ``f = reg log u`` POT's row potential (``a`` itself on a hard side).

Sizes: 2e3, 1e4 (both methods: the same-size time ratio) and 1e5 (sketchot only);
``--quick``: 2e3 and 1e4 only, sketchot and POT at ``stopThr`` 1e-6 and reg 0.1, under a
minute when the machine is idle.

    python benchmarks/unbalanced.py --quick       # -> benchmarks/results/unbalanced_quick.*
    python benchmarks/unbalanced.py               # -> benchmarks/results/unbalanced.{json,md}
    python benchmarks/unbalanced.py --json out.json --methods pot   # POT's side only

Each cell runs in a child process and is stopped after ``--budget`` seconds (reported as
such, never dropped); a cell that raises is reported with its error.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _results import md_table, timed, write_json, write_text
from _running import CellRunner, best_time

import sketchot
from sketchot.color import load_image, sample_pixels

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
INF = float("inf")
REGS = (0.1, 0.01)
REG_MS = {"1": 1.0, "(inf, 1)": (INF, 1.0)}
OUTLIER_FRACTION = 0.1
OUTLIER_BOX = (2.0, 3.0)
#: A POT result whose residual exceeds this is reported as a failure, not timed against.
FAILED_RESIDUAL = 1e-3


def clouds(n: int, seed: int) -> tuple[np.ndarray, ...]:
    """``(a, b, X, Y)``: ``n`` colours per image, ``n / 10`` far outliers appended to ``X``."""
    rng = np.random.default_rng(seed)
    source = load_image(ROOT / "images" / "default_source.png")
    target = load_image(ROOT / "images" / "default_target.png")
    X = sample_pixels(source, n, rng=rng).colors
    Y = sample_pixels(target, n, rng=rng).colors
    low, high = OUTLIER_BOX
    outliers = rng.uniform(low, high, (int(OUTLIER_FRACTION * n), 3))
    X = np.vstack([X, outliers])
    return np.full(len(X), 1.0 / len(X)), np.full(n, 1.0 / n), X, Y


def run_sketchot(n: int, reg: float, reg_m: Any, seed: int, repeats: int) -> dict[str, Any]:
    """One default call (in a child process)."""
    a, b, X, Y = clouds(n, seed)

    def solve() -> sketchot.SinkhornResult:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return sketchot.sinkhorn(a, b, X, Y, reg=reg, reg_m=reg_m, rng=seed)

    try:
        seconds, res = timed(solve)
    except Exception as error:  # reported in the table (e.g. before the solver has reg_m)
        return {"error": f"{type(error).__name__}: {error}"[:300]}
    if repeats > 1:
        seconds = min(seconds, best_time(solve, repeats - 1))
    check = res.true_kernel
    rank = res.kernel.info.rank
    return {
        "seconds": seconds,
        "used": res.backend + (f" rank {rank}" if rank else ""),
        "n_iter": res.n_iter,
        "converged": bool(res.converged),
        "residual": None if check is None else float(check.bound),
        "exhaustive": None if check is None else bool(check.exhaustive),
        "accuracy_met": res.accuracy_met,
        "mass": float(res.mass),
        "value_linear": float(res.value_linear),
        "reason": res.reason,
    }


def pot_residual(a, b, plan, log_u, reg: float, reg_m: Any, log_v) -> float:
    """Relative L1 residual of the fixed point of POT's plan (``log_u = f / reg``)."""
    reg_m_a, reg_m_b = (reg_m, reg_m) if np.ndim(reg_m) == 0 else reg_m
    rows, cols = plan.sum(axis=1), plan.sum(axis=0)
    target_a = a if reg_m_a == INF else a * np.exp(-reg * log_u / reg_m_a)
    target_b = b if reg_m_b == INF else b * np.exp(-reg * log_v / reg_m_b)
    mass = float(rows.sum())
    if not np.isfinite(mass) or mass <= 0:
        return INF
    return float(max(np.abs(rows - target_a).sum(), np.abs(cols - target_b).sum()) / mass)


def run_pot(n: int, reg: float, reg_m: Any, seed: int, stop: float) -> dict[str, Any]:
    """POT's dense solve (in a child process)."""
    a, b, X, Y = clouds(n, seed)

    def solve() -> tuple[np.ndarray, dict[str, Any]]:
        M = ot.dist(X, Y)
        return ot.unbalanced.sinkhorn_unbalanced(
            a, b, M, reg, reg_m, method="sinkhorn_translation_invariant",
            numItermax=20_000, stopThr=stop, log=True,
        )  # fmt: skip

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seconds, (plan, log) = timed(solve)
    with np.errstate(all="ignore"):
        residual = pot_residual(a, b, plan, log["logu"], reg, reg_m, log["logv"])
    notes = sorted({str(w.message).split(" at iteration")[0] for w in caught})
    return {
        "seconds": seconds,
        "used": "translation invariant",
        "n_iter": len(log["err"]),
        "converged": bool(log["err"] and log["err"][-1] < stop),
        "residual": residual,
        "exhaustive": True,
        "mass": float(plan.sum()),
        "value_linear": float(log["cost"]),
        "reason": "; ".join(notes),
    }


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_row(row: dict[str, Any]) -> list[Any]:
    head = [row["n"], f"{row['reg']:g}", row["reg_m"], row["method"]]
    if "error" in row or "stopped" in row:
        return [*head, "-", "-", "-", "-", "-", "-", row.get("error") or row["stopped"]]
    notes = [] if row["converged"] else ["not converged"]
    if row.get("reason") and row["method"] == "POT":
        notes.append(row["reason"])
    if row.get("exhaustive") is False:
        notes.append("sampled check")
    return [
        *head,
        row["used"],
        f"{row['seconds']:.2f}",
        row["n_iter"],
        fmt(row["residual"], ".2g"),
        f"{row['mass']:.4f}",
        f"{row['value_linear']:.5g}",
        "; ".join(notes),
    ]


HEADER = ["n", "reg", "reg_m", "method", "used", "time s", "iterations", "residual", "mass",
          "<P, M>", "notes"]  # fmt: skip


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """Same-size comparison lines: POT's time over sketchot's, and their <P, M> difference."""
    lines = []
    cells = {(r["n"], r["reg"], r["reg_m"], r["method"]): r for r in rows if "seconds" in r}
    for (n, reg, reg_m, method), pot in cells.items():
        ours = cells.get((n, reg, reg_m, "sketchot"))
        if method != "POT" or ours is None:
            continue
        if not pot["residual"] <= FAILED_RESIDUAL:
            lines.append(
                f"- n = {n}, reg {reg:g}, reg_m {reg_m}: POT fails (residual "
                f"{pot['residual']:.2g}: {pot['reason'] or 'no warning'}); sketchot "
                f"{ours['seconds']:.2f} s"
            )
            continue
        difference = abs(ours["value_linear"] / pot["value_linear"] - 1.0)
        lines.append(
            f"- n = {n}, reg {reg:g}, reg_m {reg_m}: POT {pot['seconds']:.2f} s, sketchot "
            f"{ours['seconds']:.2f} s ({pot['seconds'] / ours['seconds']:.1f}x); <P, M> "
            f"differs by {difference:.1e} (relative)"
        )
    return lines


def markdown(output: dict[str, Any]) -> str:
    rows = output["rows"]
    lines = [
        "# Unbalanced transport of colours with 10% far outliers",
        "",
        f"`{output['command']}` on {output['machine']}; started {output['started']}, "
        f"{output['seconds']:.0f} s in all, load average after "
        f"{', '.join(f'{x:.1f}' for x in output['load_average_after'])}.",
        "",
        "Source: n colours of `images/default_source.png` plus n/10 outliers uniform in "
        "[2, 3]^3; target: n colours of `images/default_target.png`; uniform weights of mass 1 "
        "per side. Residual: the relative L1 residual of the fixed point against the true "
        "kernel (sketchot: `res.true_kernel.bound`; POT: computed exactly from its plan).",
        "",
        *md_table(HEADER, (table_row(r) for r in rows), "rrrll" + "r" * 5 + "l"),
        "",
    ]
    same_size = ratios(rows)
    if same_size:
        lines += ["Same size, POT's time over sketchot's:", "", *same_size, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 2e3 and 1e4, reg 0.1")
    parser.add_argument("--json", type=Path, help="write the numbers here (the .md beside)")
    parser.add_argument("--sizes", nargs="+", type=int, help="n per side (override)")
    parser.add_argument("--regs", nargs="+", type=float, help="reg values (override)")
    parser.add_argument("--methods", nargs="+", choices=["sketchot", "pot"],
                        default=["sketchot", "pot"])  # fmt: skip
    parser.add_argument("--pot-max-n", type=int, default=10_000, help="POT's dense limit")
    parser.add_argument("--pot-stop", type=float, help="POT's stopThr (default 1e-9; quick 1e-6)")
    parser.add_argument("--repeats", type=int, default=1, help="best of this many sketchot runs")
    parser.add_argument("--budget", type=float, default=900.0, help="stop slower cells (s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = args.sizes or ([2000, 10_000] if args.quick else [2000, 10_000, 100_000])
    regs = args.regs or ([0.1] if args.quick else list(REGS))
    pot_stop = args.pot_stop or (1e-6 if args.quick else 1e-9)
    stem = "unbalanced_quick" if args.quick else "unbalanced"
    json_path = args.json or RESULTS_DIR / f"{stem}.json"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    start = time.perf_counter()
    runner = CellRunner(args.budget)
    rows: list[dict[str, Any]] = []
    print("| " + " | ".join(HEADER) + " |", flush=True)
    for n in sizes:
        for reg in regs:
            for reg_m_name, reg_m in REG_MS.items():
                cells = []
                if "sketchot" in args.methods:
                    cells.append(("sketchot", run_sketchot, (args.repeats,)))
                if "pot" in args.methods and n <= args.pot_max_n:
                    cells.append(("POT", run_pot, (pot_stop,)))
                for method, function, extra in cells:
                    out = runner(function, n, reg, reg_m, args.seed, *extra)
                    if out is None:
                        out = {"stopped": f"stopped after the {args.budget:g} s budget"}
                    row = {"n": n, "reg": reg, "reg_m": reg_m_name, "method": method, **out}
                    rows.append(row)
                    print("| " + " | ".join(map(str, table_row(row))) + " |", flush=True)
    runner.close()
    output = {
        "command": " ".join(["python", "benchmarks/unbalanced.py", *sys.argv[1:]]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"numpy {np.__version__}, POT {ot.__version__}, sketchot {sketchot.__version__}",
        "started": started,
        "seconds": time.perf_counter() - start,
        "load_average_after": os.getloadavg(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "pot_stop": pot_stop,
        "rows": rows,
    }
    report = markdown(output)
    print(report)
    write_json(json_path, output)
    write_text(json_path.with_suffix(".md"), report)
    print(f"Markdown: {json_path.with_suffix('.md')}")
    return output


if __name__ == "__main__":
    main()
