"""Small pairs at small reg: does every pair of a ``sketchot.sinkhorn_batch`` call converge,
as each does alone in ``sketchot.sinkhorn``?

Data (``default_rng(seed)`` per call, seeds 0-7): 4 pairs per call, ``n`` source points
uniform in the unit square and ``n + 5`` target points uniform in a square of side 0.5 to 2
shifted by 0.3, random positive weights; ``n`` in 5, 20, 100; ``reg`` 1e-2, 3e-3, 1e-3
(absolute), ``max_iter=3000``, the default accuracy rule. On a few points at small ``reg``
Anderson's extrapolations can break a stack's passes down: the row counts the pairs left
unconverged (``converged`` false), which a loop of ``sketchot.sinkhorn`` over the same pairs
solves.

    python benchmarks/batch_small.py                         # results/batch_small.md, .json
    PYTHONPATH=/path/to/other/checkout python benchmarks/batch_small.py --out-name NAME
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from pathlib import Path

import numpy as np
from _results import md_table, write_json, write_text

import sketchot

RESULTS = Path(__file__).parent / "results"
SEEDS = range(8)
REGS = (1e-2, 3e-3, 1e-3)
SIZES = (5, 20, 100)
PAIRS = 4
MAX_ITER = 3000
HEADER = [
    "reg", "points", "pairs", "batch unconverged", "loop unconverged", "batch mean iterations",
    "batch max error", "batch s", "loop s",
]  # fmt: skip


def make_pairs(seed: int, n: int) -> tuple[np.ndarray, ...]:
    """``PAIRS`` pairs of ``n`` and ``n + 5`` points with random weights."""
    rng = np.random.default_rng(seed)
    m = n + 5
    X = rng.random((PAIRS, n, 2))
    Y = rng.random((PAIRS, m, 2)) * rng.uniform(0.5, 2.0, size=(PAIRS, 1, 1)) + 0.3
    a, b = rng.random((PAIRS, n)) + 0.1, rng.random((PAIRS, m)) + 0.1
    return X, Y, a / a.sum(axis=1, keepdims=True), b / b.sum(axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-name", default="batch_small")
    args = parser.parse_args()
    rows, records = [], []
    for reg in REGS:
        for n in SIZES:
            total = unconverged = loop_unconverged = iterations = 0
            worst = 0.0
            seconds = loop_seconds = 0.0
            for seed in SEEDS:
                X, Y, a, b = make_pairs(seed, n)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    begin = time.perf_counter()
                    res = sketchot.sinkhorn_batch(X, Y, a, b, reg=reg, max_iter=MAX_ITER)
                    seconds += time.perf_counter() - begin
                    begin = time.perf_counter()
                    alone = [
                        sketchot.sinkhorn(
                            a[k], b[k], X[k], Y[k], reg=reg, backend="exact", max_iter=MAX_ITER
                        )
                        for k in range(PAIRS)
                    ]
                    loop_seconds += time.perf_counter() - begin
                total += PAIRS
                unconverged += int((~res.converged).sum())
                loop_unconverged += sum(not r.converged for r in alone)
                iterations += int(res.n_iter.sum())
                worst = max(worst, float(res.errors.max()))
            record = {
                "reg": reg, "n": n, "m": n + 5, "pairs": total, "unconverged": unconverged,
                "loop_unconverged": loop_unconverged, "mean_iterations": iterations / total,
                "max_error": worst, "tol": float(res.tol), "seconds": seconds,
                "loop_seconds": loop_seconds,
            }  # fmt: skip
            records.append(record)
            rows.append([f"{reg:g}", f"{n} x {n + 5}", total, unconverged, loop_unconverged,
                         f"{iterations / total:.0f}", f"{worst:.1e}", f"{seconds:.2f}",
                         f"{loop_seconds:.2f}"])  # fmt: skip
            print(record, flush=True)
    meta = {
        "sketchot": sketchot.__version__, "python": platform.python_version(),
        "numpy": np.__version__, "max_iter": MAX_ITER, "seeds": len(SEEDS),
        "pairs_per_call": PAIRS,
    }  # fmt: skip
    total = sum(r["pairs"] for r in records)
    missed = sum(r["unconverged"] for r in records)
    missed_loop = sum(r["loop_unconverged"] for r in records)
    lines = [
        "# Small pairs at small reg: unconverged pairs of sinkhorn_batch and of a sinkhorn loop",
        "",
        str(meta),
        "",
        *md_table(HEADER, rows, "rrrrrrrrr"),
        "",
        f"In all: {missed} of {total} pairs unconverged in sinkhorn_batch, {missed_loop} in the "
        f"loop of sinkhorn (error: the L1 column error relative to the mass, tol "
        f"{records[0]['tol']:g}).",
        "",
    ]
    write_text(RESULTS / f"{args.out_name}.md", "\n".join(lines))
    write_json(RESULTS / f"{args.out_name}.json", {"meta": meta, "rows": records})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
