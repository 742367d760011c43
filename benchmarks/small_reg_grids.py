"""Small reg on grids: histograms on 1-D and 2-D grids far below the grid's squared spacing.

POT's 1-D test histograms (``ot.datasets.make_1D_gauss`` on ``dist0(n)``: the squared
Euclidean cost of the points ``0, 1, ..., n - 1``, whose largest entry is ``(n - 1)^2``) and
Gaussian bumps on a 2-D grid, at reg from 1e-1 to 1e-5 (largest cost / reg from 1e5 to
1e10). Each cell: sketchot's default call (``sketchot.sinkhorn(a, b, X, X, reg)``), its time,
stop, iterations, Sinkhorn-Newton steps, certified bound (the true-kernel check, exhaustive
here) and ``<P, M>`` minus the exact optimum ``ot.emd2``; POT's ``ot.sinkhorn2`` with
``method='sinkhorn_log'`` (its stable method; ``numItermax`` 1e4, ``stopThr`` 1e-9) on the
same ``M`` on grids of at most ``--pot-max`` bins (100: 10^4 log-domain iterations of a
300 x 300 grid take over a minute): time, its own marginal error (relative L1 of both
marginals of its plan) and value minus ``ot.emd2``. Run the old code with
``PYTHONPATH=<old checkout>`` to get "before" numbers from the same script.

    python benchmarks/small_reg_grids.py --quick          # dist0(100), reg 1e-2 and 1e-3
    python benchmarks/small_reg_grids.py                  # every grid and reg
    python benchmarks/small_reg_grids.py --label before   # name the output files
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import ot
from _results import md_row, md_table, write_json, write_text

import sketchot

ROOT = Path(__file__).resolve().parents[1]
REGS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
QUICK_REGS = (1e-2, 1e-3)


def one_d(n: int, source: tuple[float, float], target: tuple[float, float]) -> dict[str, Any]:
    """POT's histograms on ``n`` bins: means and widths in units of ``n / 100``."""
    scale = n / 100
    a = ot.datasets.make_1D_gauss(n, m=source[0] * scale, s=source[1] * scale)
    b = ot.datasets.make_1D_gauss(n, m=target[0] * scale, s=target[1] * scale)
    X = np.arange(n, dtype=float)[:, None]
    name = f"1-D n={n} {source[0]:g}/{source[1]:g} to {target[0]:g}/{target[1]:g}"
    return {"name": name, "a": a, "b": b, "X": X}


def two_d(k: int) -> dict[str, Any]:
    """Two Gaussian bumps on a ``k x k`` grid of unit spacing."""
    X = np.stack(np.meshgrid(np.arange(k), np.arange(k)), axis=-1).reshape(-1, 2).astype(float)
    a = np.exp(-((X - [0.3 * k, 0.3 * k]) ** 2).sum(1) / (2 * (0.15 * k) ** 2))
    b = np.exp(-((X - [0.6 * k, 0.65 * k]) ** 2).sum(1) / (2 * (0.2 * k) ** 2))
    return {"name": f"2-D {k}x{k}", "a": a / a.sum(), "b": b / b.sum(), "X": X}


def cases(quick: bool) -> list[dict[str, Any]]:
    pot = [((20, 5), (60, 10)), ((30, 10), (40, 10))]
    if quick:
        return [one_d(100, s, t) for s, t in pot]
    return [one_d(n, s, t) for n in (100, 300) for s, t in pot] + [two_d(15), two_d(25)]


def sketchot_cell(case: dict[str, Any], reg: float, optimum: float) -> dict[str, Any]:
    a, b, X = case["a"], case["b"], case["X"]
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = sketchot.sinkhorn(a, b, X, X, reg=reg)
        except sketchot.InvalidResultError as error:
            seconds = time.perf_counter() - start
            return {"time_s": seconds, "stop": "refused", "error": str(error)[:160]}
    seconds = time.perf_counter() - start
    check = result.true_kernel
    return {
        "time_s": seconds,
        "stop": result.stop,
        "accuracy_met": bool(result.accuracy_met),
        "iterations": int(result.n_iter),
        "newton_steps": int(result.iteration_info.get("newton_steps", 0)),
        "certified": None if check is None else float(check.bound),
        "value_minus_emd": float(result.value_linear) - optimum,
        "warnings": len(caught),
    }


def pot_cell(case: dict[str, Any], reg: float, M: np.ndarray, optimum: float) -> dict[str, Any]:
    a, b = case["a"], case["b"]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = ot.sinkhorn(a, b, M, reg, method="sinkhorn_log", numItermax=10000, stopThr=1e-9)
    seconds = time.perf_counter() - start
    error = float(np.abs(plan.sum(axis=0) - b).sum() + np.abs(plan.sum(axis=1) - a).sum())
    return {
        "time_s": seconds,
        "marginal_error": error / float(a.sum()),
        "value_minus_emd": float((plan * M).sum()) - optimum,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="dist0(100) at reg 1e-2, 1e-3")
    parser.add_argument("--label", default=None, help="suffix of the output files")
    parser.add_argument(
        "--pot-max", type=int, default=100,
        help="run POT's sinkhorn_log on grids of at most this many bins (0: never)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    regs = QUICK_REGS if args.quick else REGS
    rows, table = [], []
    for case in cases(args.quick):
        M = ot.dist(case["X"], case["X"])
        optimum = float(ot.emd2(case["a"], case["b"], M))
        for reg in regs:
            mine = sketchot_cell(case, reg, optimum)
            small = len(case["a"]) <= args.pot_max
            pot = pot_cell(case, reg, M, optimum) if small else None
            row = {"case": case["name"], "reg": reg, "cost_over_reg": M.max() / reg}
            rows.append({**row, "sketchot": mine, "pot_sinkhorn_log": pot})
            table.append(format_row(row, mine, pot))
            print(md_row(table[-1]), flush=True)
    stem = (
        "small_reg_grids"
        + ("_quick" if args.quick else "")
        + (f"_{args.label}" if args.label else "")
    )
    header = [
        "case", "reg", "max M / reg", "sketchot s", "stop", "its", "Newton", "certified",
        "value - emd2", "POT log s", "POT marg. err", "POT value - emd2", "time / POT",
    ]  # fmt: skip
    lines = [
        f"# Small reg on grids (sketchot {sketchot.__version__}, POT {ot.__version__})",
        "",
        "Written by `benchmarks/small_reg_grids.py`"
        + (" --quick" if args.quick else "")
        + ". sketchot: the default call; certified: the true-kernel check's bound (relative "
        "L1, target 1e-3). POT: `ot.sinkhorn(method='sinkhorn_log', numItermax=1e4, "
        "stopThr=1e-9)`, its marginal error computed from its plan.",
        "",
        *md_table(header, table, "lrrrlrrrrrrrr"),
    ]
    write_text(args.out / f"{stem}.md", "\n".join(lines) + "\n")
    print(f"table: {args.out / f'{stem}.md'}")
    write_json(args.out / f"{stem}.json", {"version": sketchot.__version__, "rows": rows})


def format_row(row: dict[str, Any], mine: dict[str, Any], pot: dict[str, Any] | None) -> list:
    def number(value: Any, spec: str = ".2g") -> str:
        return "-" if value is None or not math.isfinite(value) else format(value, spec)

    pot = pot or {}
    ratio = mine["time_s"] / pot["time_s"] if pot else None
    return [
        row["case"], f"{row['reg']:g}", f"{row['cost_over_reg']:.1e}",
        f"{mine['time_s']:.2f}", mine["stop"], mine.get("iterations", "-"),
        mine.get("newton_steps", "-"), number(mine.get("certified")),
        number(mine.get("value_minus_emd"), ".3g"), number(pot.get("time_s"), ".2f"),
        number(pot.get("marginal_error")), number(pot.get("value_minus_emd"), ".3g"),
        number(ratio, ".2f"),
    ]  # fmt: skip


if __name__ == "__main__":
    main()
