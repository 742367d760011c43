"""A sparse cost matrix (the stored entries the allowed pairs) against the same problem given
densely, ``+inf`` at the missing pairs, and against POT on a large finite cost there.

The problem: ``n`` source and ``n`` target points uniform in the unit square; the allowed
pairs are each source's ``k`` nearest targets, each target's ``k // 3`` nearest sources and
the pairs ``(i, i)`` (a coupling of the uniform weights exists); costs the squared
distances. Per size: the number of allowed pairs, and for each solver the wall time (and its
ratio to sketchot's dense solve of the same problem in the same run), the iterations,
``<P, M>`` and the L1 marginal error of its plan. POT's ``ot.sinkhorn(...,
method='sinkhorn_log')`` on the dense ``M`` with 1e6 at the missing pairs runs up to
``--pot-max-n`` points, with ``stopThr = accuracy / (2 sqrt(n))`` (its criterion is the L2
norm of the column marginal's miss, and this bounds the L1 miss by half the accuracy, the
share sketchot's stop gives each marginal) and at most ``--pot-max-iter`` iterations (plain
Sinkhorn at this reg needs far more than sketchot's accelerated iteration: the row gives the
error POT reached). A dense solver runs only where its ``n x n``
float64 arrays fit ``--max-dense-gb``; beyond, the row says so.

``--quick``: n = 2000 and 10^4. Default: also 10^5. ``--json`` / ``--md`` write the numbers
(``benchmarks/results/sparse_cost.json`` and ``.md`` by default).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import ot
import scipy.sparse
from _results import md_table, write_json, write_text
from scipy.spatial import cKDTree

import sketchot

RESULTS = Path(__file__).resolve().parent / "results"


def problem(n: int, k: int, seed: int):
    """``(X, Y, sparse M)``: the kNN pattern of the module docstring."""
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 2)), rng.random((n, 2))
    dist, index = cKDTree(Y).query(X, k=k)
    forward = scipy.sparse.csr_array(
        (dist.ravel() ** 2, (np.repeat(np.arange(n), k), index.ravel())), shape=(n, n)
    )
    back_k = max(1, k // 3)
    dist, index = cKDTree(X).query(Y, k=back_k)
    backward = scipy.sparse.csr_array(
        (dist.ravel() ** 2, (index.ravel(), np.repeat(np.arange(n), back_k))), shape=(n, n)
    )
    diagonal = scipy.sparse.csr_array(
        (((X - Y) ** 2).sum(axis=1), (np.arange(n), np.arange(n))), shape=(n, n)
    )
    return X, Y, forward.maximum(backward).maximum(diagonal).tocsr()


def row(name, seconds, plan_cost, errors, n_iter):
    return {
        "solver": name, "seconds": seconds, "cost": plan_cost, "n_iter": n_iter,
        "marginal_error_l1": float(sum(errors)),
    }  # fmt: skip


def run_size(n, k, reg, accuracy, max_dense_gb, pot_max_n, pot_max_iter, seed):
    _, _, M = problem(n, k, seed)
    a = b = np.full(n, 1.0 / n)
    out = {"n": n, "nnz": int(M.nnz), "reg": reg, "rows": []}
    start = time.perf_counter()
    res = sketchot.solve(M, a, b, reg=reg, accuracy=accuracy)
    seconds = time.perf_counter() - start
    out["rows"].append(row("sketchot, sparse M", seconds, res.value_linear,
                           res.marginal_errors, int(res.n_iter)))  # fmt: skip
    print(f"n={n:.0e} nnz={M.nnz}: sparse {seconds:.2f} s, {res.n_iter} it", flush=True)
    if 2 * 8 * n * n > max_dense_gb * 1e9:
        gigabytes = 8 * n * n / 1e9
        out["dense_skipped"] = f"n x n float64 arrays ({gigabytes:.0f} GB) > {max_dense_gb} GB"
        return out
    dense = M.toarray()
    dense[~(M != 0).toarray()] = np.inf  # no stored zeros in this pattern (distances > 0)
    start = time.perf_counter()
    res = sketchot.solve(dense, a, b, reg=reg, accuracy=accuracy)
    seconds = time.perf_counter() - start
    out["rows"].append(row("sketchot, dense M (+inf)", seconds, res.value_linear,
                           res.marginal_errors, int(res.n_iter)))  # fmt: skip
    print(f"  dense {seconds:.2f} s", flush=True)
    if n > pot_max_n:
        return out
    large = np.where(np.isinf(dense), 1e6, dense)
    del dense
    start = time.perf_counter()
    plan, log = ot.sinkhorn(a, b, large, reg, method="sinkhorn_log",
                            stopThr=accuracy / (2 * np.sqrt(n)), numItermax=pot_max_iter,
                            log=True)  # fmt: skip
    seconds = time.perf_counter() - start
    errors = (float(np.abs(plan.sum(1) - a).sum()), float(np.abs(plan.sum(0) - b).sum()))
    cost = float(np.sum(plan[np.isfinite(large) & (large < 1e6)] * large[large < 1e6]))
    out["rows"].append(row("POT sinkhorn_log, dense M (1e6)", seconds, cost, errors,
                           int(log["niter"])))  # fmt: skip
    print(f"  POT {seconds:.2f} s", flush=True)
    return out


def markdown(data) -> str:
    lines = [
        f"# A sparse cost matrix: kNN pairs (k = {data['k']}), reg = {data['reg']}, "
        f"accuracy {data['accuracy']}",
        "",
        f"Machine: {data['machine']}; load average before -> after: {data['load'][0]:.2f} -> "
        f"{data['load'][1]:.2f}",
        "",
    ]
    rows = []
    for size in data["sizes"]:
        base = next(
            (r["seconds"] for r in size["rows"] if r["solver"].startswith("sketchot, dense")), None
        )
        for r in size["rows"]:
            ratio = f"{r['seconds'] / base:.2f}" if base else ""
            rows.append([f"{size['n']:.0e}", size["nnz"], r["solver"], f"{r['seconds']:.2f}",
                         ratio, r["n_iter"], f"{r['cost']:.6g}",
                         f"{r['marginal_error_l1']:.1e}"])  # fmt: skip
        if "dense_skipped" in size:
            rows.append([f"{size['n']:.0e}", size["nnz"], "dense solvers", "skipped", "", "",
                         "", size["dense_skipped"]])  # fmt: skip
    lines += md_table(
        ["n", "allowed pairs", "solver", "seconds", "/ dense", "iterations", "<P, M>",
         "L1 marginal error"], rows, "rrlrrrrr",
    )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 2000 and 1e4")
    parser.add_argument("--k", type=int, default=12)
    parser.add_argument("--reg", type=float, default=1e-4)
    parser.add_argument("--accuracy", type=float, default=1e-3)
    parser.add_argument("--max-dense-gb", type=float, default=4.0)
    parser.add_argument("--pot-max-n", type=int, default=2000, help="largest n POT runs at")
    parser.add_argument("--pot-max-iter", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=RESULTS / "sparse_cost.json")
    parser.add_argument("--md", type=Path, default=RESULTS / "sparse_cost.md")
    args = parser.parse_args()
    sizes = [2000, 10_000] if args.quick else [2000, 10_000, 100_000]
    load = [os.getloadavg()[0]]
    results = [
        run_size(
            n,
            args.k,
            args.reg,
            args.accuracy,
            args.max_dense_gb,
            args.pot_max_n,
            args.pot_max_iter,
            args.seed,
        )
        for n in sizes
    ]
    load.append(os.getloadavg()[0])
    data = {
        "k": args.k, "reg": args.reg, "accuracy": args.accuracy, "sizes": results,
        "load": load, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "versions": {"sketchot": sketchot.__version__, "pot": ot.__version__},
    }  # fmt: skip
    write_json(args.json, data)
    write_text(args.md, markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
