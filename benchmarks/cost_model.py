"""The constants of ``'auto'``'s cost model (:mod:`sketchot.kernels.cost`), measured here.

``'auto'`` and ``polyts_local``'s ``tau='auto'`` compare kernels by counted work (pairs,
entries, multiply-adds, entries read, batched products) times one constant per unit, never
by timing them during the call. This script measures the constants on this machine, on one
core (sketchot's pool and BLAS held to one thread: the kernels compared share their work
among the same threads), best of ``--repeat``:

* ``entry`` and ``entry_per_dim``: one pass of the streamed exact kernel (4000 x 4000
  points, uniform in d = 1 to 4 dimensions), per entry, a line fitted through d;
* ``read``: one product of the stored exact kernel (4000 x 4000), per entry;
* ``pair``, ``fma``, ``exact`` and ``call``: a non-negative least-squares fit of the timed
  iterations of the block-local kernel (:meth:`~sketchot.sketch.LocalGaussianExpansion.
  iteration_seconds`) against their counted work
  (:meth:`~sketchot.sketch.LocalGaussianExpansion.iteration_work`), over photo pixels
  (the default pair of ``images/``) and uniform points in 3-D, n = 10^4 and 2 10^4, reg
  0.1, 0.03, 0.01 and 0.003, tau 1, 2 and 4.

It then prints, for every timed iteration, the seconds predicted by the COMMITTED constants
against the measured ones (the ratio ``measured / predicted``), and the constants measured
now, ready to be committed as ``COSTS = CostConstants(...)`` in
:mod:`sketchot.kernels.cost` (with this run named in its comment).

    python benchmarks/cost_model.py                                     # table only
    python benchmarks/cost_model.py --json benchmarks/results/cost_model.json
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from _results import md_table, write_json, write_text
from scipy.optimize import nnls
from threadpoolctl import threadpool_limits

import sketchot
from sketchot.color import load_image, sample_pixels
from sketchot.kernels.cost import COSTS, local_iteration_cost
from sketchot.sketch import LocalGaussianExpansion

ROOT = Path(__file__).resolve().parents[1]


def best(function, repeat: int) -> float:
    """The fastest of ``repeat`` timed calls (after one untimed call)."""
    function()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def clouds(data: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if data == "uniform":
        return rng.random((n, 3)), rng.random((n, 3))
    source = load_image(ROOT / "images" / "default_source.png")
    target = load_image(ROOT / "images" / "default_target.png")
    return (
        sample_pixels(source, n, rng=rng).colors,
        sample_pixels(target, n, rng=rng).colors,
    )


def measure_exact(repeat: int, rng: np.random.Generator) -> tuple[dict, list]:
    """``entry``, ``entry_per_dim`` and ``read`` (one core), and the table's rows."""
    rows, per_entry, dims, n = [], [], (1, 2, 3, 4), 4000
    ones = np.ones(n)
    for d in dims:
        X, Y = rng.random((n, d)), rng.random((n, d))
        streamed = sketchot.make_kernel(X, Y, 0.1, backend="exact", max_dense_bytes=0)
        per_entry.append(best(lambda k=streamed: k.matmat(ones), repeat) / n**2)
        rows.append(("entry", f"streamed exact pass, d = {d}", f"{per_entry[-1]:.3g}"))
    slope, _ = np.polyfit(dims, per_entry, 1)
    entry_per_dim = max(float(slope), 0.0)
    entry = float(np.mean(per_entry) - entry_per_dim * np.mean(dims))
    stored = sketchot.make_kernel(X, Y, 0.1, backend="exact", max_dense_bytes=1 << 30)
    stored.matmat(ones)  # computed at its first product
    read = best(lambda: (stored.matmat(ones), stored.rmatmat(ones)), repeat) / (2 * n**2)
    rows.append(("read", "stored exact product, per entry", f"{read:.3g}"))
    return {"entry": entry, "entry_per_dim": entry_per_dim, "read": read}, rows


def local_iterations(repeat: int, rng: np.random.Generator) -> list[dict]:
    """Timed block-local iterations (one core) and their counted work."""
    cells = []
    for data in ("photo", "uniform"):
        for n in (10_000, 20_000):
            X, Y = clouds(data, n, rng)
            for reg in (0.1, 0.03, 0.01, 0.003):
                for tau in (1.0, 2.0, 4.0):
                    expansion = LocalGaussianExpansion(
                        reg, tau=tau, rtol=2e-5, truncate=2e-5, rng=0
                    ).fit(X, Y)
                    seconds = best(lambda e=expansion: e.iteration_seconds(), repeat)
                    cells.append({
                        "data": data, "n": n, "reg": reg, "tau": tau,
                        "degree": expansion.degree_, "work": expansion.iteration_work(),
                        "measured_s": seconds,
                    })  # fmt: skip
    return cells


LOCAL_UNITS = ("pair", "fma", "exact", "call")
WORK_OF = {"pair": "exp", "fma": "fma", "exact": "exact", "call": "calls"}


def fit_local(cells: list[dict]) -> dict:
    """The local constants: non-negative least squares of the seconds on the counted work,
    each row weighted by 1 / seconds (relative errors: small and large iterations alike)."""
    A = np.array([[c["work"][WORK_OF[u]] for u in LOCAL_UNITS] for c in cells])
    y = np.array([c["measured_s"] for c in cells])
    solution, _ = nnls(A / y[:, None], np.ones_like(y))
    return dict(zip(LOCAL_UNITS, map(float, solution), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the constants and checks as JSON")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    with sketchot.thread_limit(1), threadpool_limits(limits=1, user_api="blas"):
        exact, rows = measure_exact(args.repeat, rng)
        cells = local_iterations(args.repeat, rng)
    constants = {**fit_local(cells), **exact}
    for c in cells:
        c["predicted_s"] = local_iteration_cost(c["work"])
        c["ratio"] = c["measured_s"] / c["predicted_s"]
    local_rows = [
        (c["data"], c["n"], c["reg"], c["tau"], c["degree"],
         *(f"{c['work'][k]:.3g}" for k in ("exp", "fma", "exact", "calls")),
         f"{c['predicted_s']:.3g}", f"{c['measured_s']:.3g}", f"{c['ratio']:.2f}")
        for c in cells
    ]  # fmt: skip
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ratios = np.array([c["ratio"] for c in cells])
    lines = [
        f"Cost model constants (seconds per unit, one core), {when}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end",
        "",
        *md_table(("unit", "measured", "seconds"), rows, "llr"),
        "",
        "Block-local iterations, one core: the work counted, the seconds the committed "
        "constants predict, and the seconds measured:",
        "",
        *md_table(
            (
                "data",
                "n",
                "reg",
                "tau",
                "degree",
                "pairs",
                "fma",
                "exact",
                "calls",
                "predicted s",
                "measured s",
                "measured / predicted",
            ),
            local_rows,
            "lrrrrrrrrrrr",
        ),
        "",
        f"measured / predicted: median {np.median(ratios):.2f}, range "
        f"{ratios.min():.2f} to {ratios.max():.2f}",
        "",
        "Committed (sketchot/kernels/cost.py): "
        + ", ".join(f"{k}={getattr(COSTS, k):.2g}" for k in constants),
        "",
        "Measured now: COSTS = CostConstants("
        + ", ".join(f"{k}={v:.2g}" for k, v in constants.items())
        + ")",
    ]
    print("\n".join(lines))
    if args.json:
        write_json(args.json, {"when": when, "constants": constants, "exact": rows,
                               "local": cells})  # fmt: skip
        write_text(args.json.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
