"""Histograms on grids (issue 44): W2 between two real images on the grid backend.

Two 512 x 512 grey images from scikit-image's bundled data (``camera`` and ``astronaut`` in
grey levels; a benchmark dependency only: ``pip install ".[bench]"``), as histograms on the
unit square (POT's ``linspace(0, 1, n)`` axes), a floor of 1e-3 of the largest pixel so
every pixel carries mass. For reg = 1e-2, 1e-3, 1e-4 x the grid's squared diameter:

* the default call ``sketchot.sinkhorn(a, b, X, X, reg)`` on the 262,144 pixel points
  (``'auto'`` now picks the grid backend): time, iterations, certified marginal error
  (the exact kernel's own marginals), value;
* the call before this backend (the block-local kernel, ``backend='polyts_local'``, cold:
  ``coarse_to_fine=False``, as the default ran it then) in a subprocess stopped after
  ``--before-timeout`` seconds (at reg 1e-3 only: the issue's 23.8 s figure);
* the peer ratio: POT's ``ot.sinkhorn2(method='sinkhorn_log')`` on the dense cost of the
  images downsampled to 32 x 32 (POT's log-domain iterations take minutes beyond: 118 s
  at 32 x 32, reg 1e-3, on this machine), against the grid backend on the same
  downsampled problem, and their values.

* 1-D problems (10^5 bins at reg 1e-5 and 10^6 bins at reg 1e-7 x the squared diameter,
  or one of ``--bins`` bins at ``--bins-reg``; two mixtures of Gaussians on
  ``linspace(0, 1, n)`` with a floor) through
  ``sketchot.solve_grid`` (the banded axis pass of ``sketchot.grid``): time, certified
  error, value, against POT's exact ``ot.emd2_1d`` on the same histograms (the ``reg -> 0``
  limit: the entropic ``<P, M>`` lies within ``reg log(n^2)`` plus the certified error's
  share above it).

Every grid row records the coarse-to-fine start (``sketchot.solver.grid_start``): its
seconds, iterations over the coarse levels, and the fine iterations after it.

``--quick`` runs 128 x 128 images, 1e-2, 1e-3 only, and 10^5 bins. ``--oned-only`` reruns
the 1-D rows alone and keeps the image rows of the existing JSON (their run's load stays in
it; each 1-D row records its own). The machine's load
(``os.getloadavg()``) goes into the JSON: timings on a shared machine are noisy, the ratio
to POT in the same run less so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _results import md_table, timed, write_json, write_text

import sketchot
from sketchot import RegularGrid

RESULTS = Path(__file__).parent / "results"
REG_FACTORS = (1e-2, 1e-3, 1e-4)


def images(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The two histograms, ``size x size``, summing to 1."""
    import skimage.color
    import skimage.data
    import skimage.transform

    out = []
    for img in (skimage.data.camera(), skimage.color.rgb2gray(skimage.data.astronaut())):
        img = np.asarray(img, dtype=np.float64)
        if img.shape != (size, size):
            img = skimage.transform.resize(img, (size, size), anti_aliasing=True)
        img = img + 1e-3 * img.max()
        out.append(img / img.sum())
    return out[0], out[1]


def grid_cell(a: np.ndarray, b: np.ndarray, factor: float) -> dict:
    grid = RegularGrid.from_shape(a.shape, extent=1.0)
    X = grid.points()
    reg = factor * grid.squared_diameter
    seconds, res = timed(lambda: sketchot.sinkhorn(a.ravel(), b.ravel(), X, X, reg, warn=False))
    coarse = res.iteration_info.get("coarse_to_fine") or {}
    return {
        "reg_factor": factor,
        "reg": reg,
        "backend": res.backend,
        "seconds": seconds,
        "n_iter": int(res.n_iter),
        "certified_error": float(max(res.marginal_errors)),
        "accuracy_met": res.accuracy_met,
        "value": float(res.value),
        "value_linear": float(res.value_linear),
        "coarse_seconds": coarse.get("seconds"),
        "coarse_iterations": coarse.get("coarse_iter"),
    }


def histograms_1d(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two 1-D histograms of ``n`` bins on ``linspace(0, 1, n)``, summing to 1."""
    x = np.linspace(0, 1, n)
    a = np.exp(-((x - 0.3) ** 2) / 0.005) + 0.5 * np.exp(-((x - 0.7) ** 2) / 0.002) + 1e-3
    b = np.exp(-((x - 0.55) ** 2) / 0.01) + 1e-3
    return a / a.sum(), b / b.sum()


def oned_cell(n: int, factor: float) -> dict:
    """``solve_grid`` on ``n`` bins against POT's exact 1-D solver on the same histograms."""
    import ot

    a, b = histograms_1d(n)
    load = os.getloadavg()
    seconds, res = timed(lambda: sketchot.solve_grid(a, b, factor, warn=False))
    x = np.linspace(0, 1, n)
    pot_s, exact = timed(lambda: float(ot.emd2_1d(x, x, a, b)))
    coarse = res.result.iteration_info.get("coarse_to_fine") or {}
    error = float(max(res.result.marginal_errors))
    return {
        "bins": n,
        "reg": factor,
        "seconds": seconds,
        "n_iter": int(res.result.n_iter),
        "coarse_seconds": coarse.get("seconds"),
        "coarse_iterations": coarse.get("coarse_iter"),
        "certified_error": error,
        "accuracy_met": res.accuracy_met,
        "value_linear": res.value_linear,
        "pot_emd2_1d": exact,
        "pot_seconds": pot_s,
        "entropic_gap": float(factor * np.log(float(n) * n)),
        "relative_difference": abs(res.value_linear - exact) / exact,
        "coarse_stages": len(coarse.get("stages", [])),
        "load_before": load,
        "load_after": os.getloadavg(),
    }


BEFORE = """
import numpy as np, sys, time, json
sys.path.insert(0, {bench!r})
from grids import images
import sketchot
from sketchot import RegularGrid
a, b = images({size})
grid = RegularGrid.from_shape(a.shape, extent=1.0)
X = grid.points()
start = time.perf_counter()
res = sketchot.sinkhorn(a.ravel(), b.ravel(), X, X, {factor} * grid.squared_diameter,
                       backend="polyts_local", warn=False, coarse_to_fine=False)
print(json.dumps({{"seconds": time.perf_counter() - start,
                  "certified_error": float(max(res.marginal_errors)),
                  "accuracy_met": res.accuracy_met, "value": float(res.value)}}))
"""


def before_cell(size: int, factor: float, timeout: float) -> dict:
    """The block-local kernel on the pixel cloud, in a subprocess stopped at ``timeout``."""
    code = BEFORE.format(bench=str(Path(__file__).parent), size=size, factor=factor)
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"backend": "polyts_local", "timeout": timeout, "seconds": None}
    if done.returncode != 0:
        return {"backend": "polyts_local", "error": done.stderr[-500:],
                "seconds": time.perf_counter() - start}  # fmt: skip
    return {"backend": "polyts_local", **json.loads(done.stdout.strip().splitlines()[-1])}


def pot_cell(a: np.ndarray, b: np.ndarray, factor: float) -> dict:
    """POT's log-domain Sinkhorn on the dense cost against the grid backend, same problem."""
    import ot

    grid = RegularGrid.from_shape(a.shape, extent=1.0)
    X = grid.points()
    reg = factor * grid.squared_diameter
    M = ot.dist(X, X)
    pot_s, pot = timed(lambda: float(ot.sinkhorn2(a.ravel(), b.ravel(), M, reg,
                                                  method="sinkhorn_log", stopThr=1e-9,
                                                  numItermax=100_000)))  # fmt: skip
    mine_s, mine = timed(lambda: sketchot.solve_grid(a, b, reg, grid=grid, warn=False))
    return {
        "size": a.shape[0],
        "reg_factor": factor,
        "pot_seconds": pot_s,
        "grid_seconds": mine_s,
        "ratio": pot_s / mine_s,
        "pot_value_linear": pot,
        "grid_value_linear": mine.value_linear,
        "relative_difference": abs(mine.value_linear - pot) / abs(pot),
        "accuracy_met": mine.accuracy_met,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 x 128, reg 1e-2 and 1e-3")
    parser.add_argument("--before-timeout", type=float, default=60.0)
    parser.add_argument("--skip-before", action="store_true")
    parser.add_argument("--bins", type=int, default=None, help="one 1-D cell of this many bins")
    parser.add_argument("--bins-reg", type=float, default=1e-7)
    parser.add_argument("--oned-only", action="store_true", help="rerun the 1-D rows alone")
    args = parser.parse_args()
    if args.bins:
        cells = [(args.bins, args.bins_reg)]
    else:
        cells = [(100_000, 1e-5)] + ([] if args.quick else [(1_000_000, 1e-7)])
    size = 128 if args.quick else 512
    factors = REG_FACTORS[:2] if args.quick else REG_FACTORS
    name = "grids_quick" if args.quick else "grids"
    if args.oned_only:
        data = json.loads((RESULTS / f"{name}.json").read_text())
        data["oned"] = []
    else:
        a, b = images(size)
        data = {"size": size, "quick": args.quick, "load_before": os.getloadavg(), "grid": [],
                "before": [], "pot": [], "oned": []}  # fmt: skip
        for factor in factors:
            data["grid"].append(grid_cell(a, b, factor))
            print(data["grid"][-1], flush=True)
        if not args.skip_before:
            before = before_cell(size, 1e-3, args.before_timeout)
            data["before"].append({"reg_factor": 1e-3, **before})
            print(data["before"][-1], flush=True)
        small_a, small_b = images(32)
        for factor in REG_FACTORS[:2]:
            data["pot"].append(pot_cell(small_a, small_b, factor))
            print(data["pot"][-1], flush=True)
        data["load_after"] = os.getloadavg()
    for bins, reg in cells:
        data["oned"].append(oned_cell(bins, reg))
        print(data["oned"][-1], flush=True)
    write_json(RESULTS / f"{name}.json", data)
    lines = [f"# Grids: W2 between two {size} x {size} images (benchmarks/grids.py)", "",
             f"Load average before / after: {data['load_before'][0]:.1f} / "
             f"{data['load_after'][0]:.1f} (2 cores).", ""]  # fmt: skip
    lines += md_table(
        ["reg / diam^2", "backend", "seconds", "coarse start s", "coarse iterations",
         "fine iterations", "certified error", "met", "value"],
        [
            [
                f"{c['reg_factor']:g}",
                c["backend"],
                f"{c['seconds']:.2f}",
                f"{c['coarse_seconds']:.2f}" if c["coarse_seconds"] is not None else "-",
                c["coarse_iterations"] if c["coarse_iterations"] is not None else "-",
                c["n_iter"],
                f"{c['certified_error']:.1e}",
                c["accuracy_met"],
                f"{c['value_linear']:.6g}",
            ]
            for c in data["grid"]
        ],
        "lllrrrrll",
    )  # fmt: skip
    for cell in data["before"]:
        shown = (f"stopped after {cell['timeout']:.0f} s" if cell.get("timeout")
                 else f"{cell['seconds']:.1f} s" if cell.get("seconds") else "error")  # fmt: skip
        lines += ["", f"Before (block-local kernel on the pixel cloud, reg 1e-3): {shown}."]
    lines += ["", "Peer: POT's ot.sinkhorn2(method='sinkhorn_log') on the dense cost, same "
              "downsampled problem:", ""]  # fmt: skip
    lines += md_table(
        ["size", "reg / diam^2", "POT s", "grid s", "POT / grid", "rel. difference"],
        [
            [
                f"{c['size']} x {c['size']}",
                f"{c['reg_factor']:g}",
                f"{c['pot_seconds']:.2f}",
                f"{c['grid_seconds']:.2f}",
                f"{c['ratio']:.1f}",
                f"{c['relative_difference']:.1e}",
            ]
            for c in data["pot"]
        ],
        "lrrrrr",
    )
    lines += ["", "1-D histograms through solve_grid against POT's exact ot.emd2_1d (the reg -> 0 "
              "limit; reg log(n^2) is the entropic gap's scale), each row with the load "
              "average (1 min) before / after it:", ""]  # fmt: skip
    lines += md_table(
        ["bins", "reg / diam^2", "seconds", "coarse start s", "coarse stages",
         "fine iterations", "certified error", "met", "value", "ot.emd2_1d", "POT s",
         "rel. difference", "reg log(n^2)", "load"],
        [
            [
                f"{c['bins']:.0e}", f"{c['reg']:g}", f"{c['seconds']:.1f}",
                f"{c['coarse_seconds']:.1f}" if c["coarse_seconds"] is not None else "-",
                c.get("coarse_stages", "-"),
                c["n_iter"], f"{c['certified_error']:.1e}", c["accuracy_met"],
                f"{c['value_linear']:.6g}", f"{c['pot_emd2_1d']:.6g}", f"{c['pot_seconds']:.2f}",
                f"{c['relative_difference']:.1e}", f"{c['entropic_gap']:.1e}",
                f"{c['load_before'][0]:.1f} / {c['load_after'][0]:.1f}"
                if "load_before" in c else "-",
            ]
            for c in data["oned"]
        ],
        "lrrrrrrlrrrrrl",
    )  # fmt: skip
    write_text(RESULTS / f"{name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
