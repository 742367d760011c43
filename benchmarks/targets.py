"""Several targets on one source: ``b`` of shape ``(m, k)`` in one call against ``k``
separate solves and POT's ``sinkhorn2`` with the same ``(m, k)`` ``b``.

Data (``default_rng(seed)``):

``cloud``
    Source: ``n`` colours uniform in ``[0, 1]^3`` (uniform weights). Targets: ``k`` colour
    histograms on a ``10 x 10 x 10`` palette (``m = 1000`` bin centres), each a mixture of
    three Gaussian blobs of random centres, widths and weights plus a 1% uniform floor
    (every bin has mass), normalised to 1. ``reg`` = 0.05 and 0.01 (the largest squared
    distance is 3).
``grid``
    Source and targets on one ``s x s`` grid of the unit square (``n = m = s^2``): the
    source a uniform image, the targets ``k`` images of two Gaussian blobs each plus a 1%
    floor, solved with ``backend='grid'`` (the separable kernel), ``reg = 0.01`` (half a
    percent of the squared diameter 2).

Methods, each timed from the arrays to the ``k`` values (kernel and cost matrix included):

``one call``
    ``sketchot.sinkhorn(a, B, X, Y, reg=reg, backend=...)``: the ``k`` targets on one
    kernel, one matrix product per half-iteration (:mod:`sketchot.solver.targets`).
``k calls, one kernel``
    ``make_kernel`` once, then ``sketchot.sinkhorn_kernel(a, B[:, j], K)`` per column.
``k calls``
    ``sketchot.sinkhorn(a, B[:, j], X, Y, reg=reg, backend=...)`` per column (a kernel per
    call).
``POT sinkhorn2``
    ``ot.sinkhorn2(a, B, M, reg)`` on ``M = ot.dist(X, Y)`` (its ``n_hists`` path, one
    product per half-iteration too), at its default ``stopThr=1e-9`` and at ``stopThr=1e-5``,
    where the dense ``M`` fits (``--pot-max-entries``).

The "k calls" rows run over the first ``--separate`` targets (all of them by default) and
are extrapolated to ``k`` (said in the row). sketchot stops at its accuracy rule
(``accuracy=1e-3``: L1 marginal error below 1e-3 of the mass, certified per target against
the exact kernel); the error column is the largest over the targets of the L1 marginal error
of the plan relative to its mass, computed for every method from its potentials (sketchot's
certified bound; for POT ``||u (K v) - a||_1 + ||v (K^T u) - b||_1`` from its ``log``), and
``value diff`` the largest relative difference of the ``k`` values from the one call's.
The machine's load average is recorded before and after (the machine may be shared).

    python benchmarks/targets.py --quick   # n = 2000, k = 20 (s = 30 on the grid)
    python benchmarks/targets.py           # n = 10^4, k = 100 (s = 100 on the grid)
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import md_table, timed, write_json, write_text

import sketchot

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def colour_case(n: int, k: int, seed: int) -> tuple[np.ndarray, ...]:
    """Uniform colours and ``k`` blob histograms on a 10^3 palette (module notes)."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, 3))
    side = (np.arange(10) + 0.5) / 10
    Y = np.stack(np.meshgrid(side, side, side, indexing="ij"), axis=-1).reshape(-1, 3)
    return np.full(n, 1.0 / n), blobs(Y, k, 3, rng), X, Y


def grid_case(s: int, k: int, seed: int) -> tuple[np.ndarray, ...]:
    """A uniform image and ``k`` two-blob images on an ``s x s`` grid (module notes)."""
    rng = np.random.default_rng(seed)
    side = np.linspace(0.0, 1.0, s)
    P = np.stack(np.meshgrid(side, side, indexing="ij"), axis=-1).reshape(-1, 2)
    return np.full(s * s, 1.0 / (s * s)), blobs(P, k, 2, rng), P, P


def blobs(points: np.ndarray, k: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` normalised mixtures of ``count`` Gaussian blobs on ``points``, 1% floor."""
    d = points.shape[1]
    B = np.empty((len(points), k))
    for j in range(k):
        centres = rng.random((count, d))
        widths = rng.uniform(0.05, 0.2, count)
        weights = rng.dirichlet(np.ones(count))
        sq = ((points[:, None, :] - centres[None]) ** 2).sum(axis=-1)
        h = (weights * np.exp(-sq / (2 * widths**2))).sum(axis=1)
        h /= h.sum()
        B[:, j] = 0.99 * h + 0.01 / len(points)
    return B / B.sum(axis=0)


def pot_error(a, B, M, reg, log) -> float:
    """POT's plans' largest L1 marginal error relative to the mass, from its log."""
    K = np.exp(-M / reg)
    u, v = log["u"], log["v"]
    rows = np.abs(u * (K @ v) - a[:, None]).sum(axis=0)
    cols = np.abs(v * (K.T @ u) - B).sum(axis=0)
    return float(np.max(rows + cols))


def run_case(
    name, a, B, X, Y, reg, backend, separate, pot_max_entries, pot_stops
) -> list[dict[str, Any]]:
    k = B.shape[1]
    rows: list[dict[str, Any]] = []

    def record(method, seconds, values, error, note="", solved=k):
        rows.append({"case": name, "reg": reg, "backend": backend, "method": method,
                     "seconds": seconds * k / solved, "measured_seconds": seconds,
                     "targets_solved": solved, "values": np.asarray(values).tolist(),
                     "max_error": error, "note": note})  # fmt: skip

    seconds, one = timed(lambda: sketchot.sinkhorn(a, B, X, Y, reg=reg, backend=backend, rng=0))
    record("one call", seconds, one.value_linear, max(c.bound for c in one.true_kernel),
           f"{int(one.accuracy_met.sum())}/{k} certified; iterations max "
           f"{int(one.n_iter.max())}; {one.iteration_info['strategy']}; alone "
           f"{len(one.iteration_info['alone'])}")  # fmt: skip
    part = B[:, :separate]

    def one_kernel():
        K = sketchot.make_kernel(X, Y, reg, backend, rng=0)
        return [sketchot.sinkhorn_kernel(a, part[:, j], K, rng=0) for j in range(separate)]

    seconds, results = timed(one_kernel)
    record("k calls, one kernel", seconds, [r.value_linear for r in results],
           max(r.true_kernel.bound for r in results), solved=separate)  # fmt: skip
    seconds, results = timed(
        lambda: [
            sketchot.sinkhorn(a, part[:, j], X, Y, reg=reg, backend=backend, rng=0)
            for j in range(separate)
        ]
    )
    record("k calls", seconds, [r.value_linear for r in results],
           max(r.true_kernel.bound for r in results), solved=separate)  # fmt: skip
    if len(X) * len(Y) <= pot_max_entries:
        import ot

        for stop in pot_stops:

            def pot(stop=stop):
                M = ot.dist(X, Y)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    values, log = ot.sinkhorn2(a, B, M, reg, stopThr=stop, log=True)
                return values, log, M

            seconds, (values, log, M) = timed(pot)
            record(f"POT sinkhorn2 stopThr={stop:g}", seconds, values,
                   pot_error(a, B, M, reg, log), f"{log['niter']} iterations")  # fmt: skip
    base = rows[0]
    for row in rows:
        count = row["targets_solved"]
        ours = np.asarray(base["values"][:count])
        row["value_diff"] = float(np.max(np.abs(np.asarray(row["values"]) - ours) / ours))
        row["ratio_to_one_call"] = row["seconds"] / base["seconds"]
    return rows


def write_report(rows, meta, stem, quick) -> None:
    """The JSON and the markdown table of the rows so far (written after every case: a
    long run that is stopped keeps what it measured)."""
    meta = {**meta, "load_after": os.getloadavg()}
    write_json(RESULTS_DIR / f"{stem}.json", {"meta": meta, "rows": rows})
    k = meta["k"]
    table = md_table(
        ["case", "n x m", "reg", "method", "seconds (k targets)", "ratio to one call",
         "max L1 error", "value diff", "note"],
        [[r["case"], r["shape"], f"{r['reg']:g}", r["method"],
          f"{r['seconds']:.2f}" + ("" if r["targets_solved"] == k
                                   else f" ({r['targets_solved']} timed)"),
          f"{r['ratio_to_one_call']:.2f}", f"{r['max_error']:.2g}", f"{r['value_diff']:.1e}",
          r["note"]] for r in rows],
        "lllllrrrl",
    )  # fmt: skip
    text = "\n".join(
        [f"# Several targets: k = {k} histograms against one source", "",
         f"`python benchmarks/targets.py{' --quick' if quick else ''}`; load average "
         f"{meta['load_before'][0]:.2f} before, {meta['load_after'][0]:.2f} after "
         f"({os.cpu_count()} CPUs, shared). Seconds for all k targets (extrapolated from the "
         "timed ones where fewer were timed); ratios to the one call of the same case.", "",
         *table, ""]
    )  # fmt: skip
    write_text(RESULTS_DIR / f"{stem}.md", text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 2000, k = 20, s = 30")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--side", type=int, default=None, help="grid side s")
    parser.add_argument("--separate", type=int, default=None,
                        help="targets solved one by one (default: all k)")  # fmt: skip
    parser.add_argument("--regs", type=float, nargs="*", default=[0.05, 0.01])
    parser.add_argument("--pot-stops", type=float, nargs="*", default=[1e-9, 1e-5],
                        help="POT's stopThr values (none: POT not run)")  # fmt: skip
    parser.add_argument("--pot-max-entries", type=float, default=2e7)
    parser.add_argument("--skip-grid", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = args.n or (2000 if args.quick else 10_000)
    k = args.k or (20 if args.quick else 100)
    side = args.side or (30 if args.quick else 100)
    separate = min(args.separate or k, k)
    stem = "targets_quick" if args.quick else "targets"
    meta = {"python": platform.python_version(), "numpy": np.__version__,
            "sketchot": sketchot.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "n": n, "m_cloud": 1000, "k": k, "grid_side": side,
            "separate": separate, "pot_stops": args.pot_stops, "seed": args.seed,
            "load_before": os.getloadavg()}  # fmt: skip
    rows = []
    cases = [("cloud", colour_case(n, k, args.seed), reg, "exact") for reg in args.regs]
    if not args.skip_grid and "grid" in sketchot.available_backends():
        cases.append(("grid", grid_case(side, k, args.seed), 0.01, "grid"))
    for name, (a, B, X, Y), reg, backend in cases:
        new = run_case(name, a, B, X, Y, reg, backend, separate, args.pot_max_entries,
                       args.pot_stops)  # fmt: skip
        for row in new:
            row["shape"] = f"{len(X)} x {len(Y)}"
        rows += new
        write_report(rows, meta, stem, args.quick)


if __name__ == "__main__":
    main()
