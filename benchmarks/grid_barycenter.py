"""Convolutional barycenters of images: sketchot.convolutional_barycenter2d against POT's
``ot.bregman.convolutional_barycenter2d`` on the same inputs at the same reg.

Data: three of scikit-image's bundled images in grey levels, ``camera``, ``coins`` and
``astronaut`` (``rgb2gray``), resized to ``size x size`` (``skimage.transform.resize``,
anti-aliased), each normalised to mass 1 (about 2.6% of the pixels are 0 at 256 x 256).
scikit-image is a benchmark dependency only (``pip install scikit-image``); the package never
imports it. Uniform barycentric weights; POT's grid (each axis ``linspace(0, 1, size)``), so
``reg`` is in units of the squared side of the image.

Methods, each called as a POT user calls it, ``stopThr`` = POT's default 1e-4 (the spread of
the plans' barycenter-side marginals), ``numItermax`` = ``--max-iter``:

``sketchot``
    ``sketchot.convolutional_barycenter2d(A, reg, numItermax=..., log=True)``: the log-domain
    iteration on the separable kernel (:mod:`sketchot.grid`), criterion tested every
    iteration.
``POT sinkhorn``
    ``ot.bregman.convolutional_barycenter2d(A, reg, numItermax=..., log=True)``: the
    multiplicative form (POT's default), criterion every tenth iteration.
``POT sinkhorn_log``
    The same with ``method='sinkhorn_log'`` for ``--log-iters`` iterations only (it is
    ``O(N n)`` exponentials per product: the per-iteration time is what is reported).

Reported: seconds and iterations (and seconds per iteration), whether each met stopThr, the
last criterion, the L1 marginal errors ``||u_k K v_k - a_k||_1`` of the plans of each
method's returned scalings (POT's from its ``U``, ``V``; the barycenter side is exact for
both: ``v_k = p / K^T u_k``; computed with the exact log convolution), NaN/inf counts, and
the L1 and max differences between the barycenters. The machine's ``os.getloadavg()`` is
recorded: the two cores are shared, so the ratio of the two times in one run is the number
to read.

    python benchmarks/grid_barycenter.py --quick    # 64 x 64, under a minute
    python benchmarks/grid_barycenter.py            # 256 x 256, reg 3e-3, 1e-3, 3e-4
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
from _results import md_table, write_json, write_text

import sketchot
from sketchot.grid import RegularGrid, log_convolve

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def images(size: int) -> np.ndarray:
    """The three grey images, ``(3, size, size)``, each of mass 1."""
    from skimage import color, data, transform

    raw = [data.camera(), data.coins(), color.rgb2gray(data.astronaut())]
    A = np.stack(
        [transform.resize(np.asarray(im, dtype=np.float64), (size, size), anti_aliasing=True)
         for im in raw]
    )  # fmt: skip
    A = np.clip(A, 0.0, None)
    return A / A.sum(axis=(1, 2), keepdims=True)


def marginal_errors(A: np.ndarray, log_u: np.ndarray, bary: np.ndarray, reg: float) -> list:
    """``||u_k K v_k - a_k||_1`` with ``v_k = p / K^T u_k`` (exact log convolutions)."""
    grid = RegularGrid.from_shape(A.shape[1:], extent=1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_v = np.log(bary)[None] - log_convolve(log_u, grid, grid, reg)
        row = np.exp(log_u + log_convolve(log_v, grid, grid, reg))
    return [float(np.abs(row[k] - A[k]).sum()) for k in range(A.shape[0])]


def run_pot(A, reg, method, max_iter, stop) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        bary, log = ot.bregman.convolutional_barycenter2d(
            A, reg, method=method, numItermax=max_iter, stopThr=stop, log=True
        )
        seconds = time.perf_counter() - start
    n_iter = log["niter"] + 1
    err = float(log["err"][-1]) if log["err"] else float("nan")
    row = {"seconds": seconds, "iterations": n_iter, "converged": bool(err < stop),
           "criterion": err, "nan": int(np.isnan(bary).sum()),
           "inf": int(np.isinf(bary).sum()),
           "warnings": sorted({str(w.message)[:60] for w in caught})}  # fmt: skip
    if "U" in log and np.isfinite(bary).all() and bary.min() > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            log_u = np.log(np.asarray(log["U"]))
        row["marginal_errors"] = (
            marginal_errors(A, log_u, bary, reg) if np.isfinite(log_u).any() else None
        )
    else:
        row["marginal_errors"] = None
    return row, bary


def run(size: int, reg: float, max_iter: int, log_iters: int, stop: float) -> list[dict]:
    A = images(size)
    rows = []
    start = time.perf_counter()
    ours, log = sketchot.convolutional_barycenter2d(
        A, reg, numItermax=max_iter, stopThr=stop, log=True, warn=False
    )
    seconds = time.perf_counter() - start
    res = log["result"]
    rows.append({"method": "sketchot", "seconds": seconds, "iterations": res.n_iter,
                 "converged": res.converged, "criterion": res.err[-1],
                 "nan": int(np.isnan(ours).sum()), "inf": int(np.isinf(ours).sum()),
                 "marginal_errors": [float(e) for e in res.marginal_errors],
                 "warnings": []})  # fmt: skip
    print(f"  sketchot: {seconds:.1f} s, {res.n_iter} it", flush=True)
    pot_row, pot = run_pot(A, reg, "sinkhorn", max_iter, stop)
    pot_row["method"] = "POT sinkhorn"
    if np.isfinite(pot).all():
        pot_row["l1_to_sketchot"] = float(np.abs(pot - ours).sum())
        pot_row["max_to_sketchot"] = float(np.abs(pot - ours).max())
    rows.append(pot_row)
    print(f"  POT: {pot_row['seconds']:.1f} s, {pot_row['iterations']} it", flush=True)
    if log_iters:
        log_row, _ = run_pot(A, reg, "sinkhorn_log", log_iters, 0.0)
        log_row.update(method=f"POT sinkhorn_log ({log_iters} it only)", converged=None,
                       marginal_errors=None)  # fmt: skip
        rows.append(log_row)
        print(f"  POT log: {log_row['seconds']:.1f} s", flush=True)
    for row in rows:
        row.update(size=size, reg=reg, per_iteration=row["seconds"] / max(row["iterations"], 1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 x 64, reg 1e-2 and 1e-3")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--regs", type=float, nargs="+", default=[3e-3, 1e-3, 3e-4])
    parser.add_argument("--max-iter", type=int, default=3000)
    parser.add_argument("--log-iters", type=int, default=3, help="POT sinkhorn_log iterations")
    parser.add_argument("--stop", type=float, default=1e-4, help="stopThr (POT's default)")
    parser.add_argument("--out-name", default=None)
    args = parser.parse_args()
    if args.quick:
        args.size, args.regs, args.max_iter, args.log_iters = 64, [1e-2, 1e-3], 500, 3
    rows = []
    for reg in args.regs:
        print(f"size {args.size}, reg {reg:g}", flush=True)
        rows += run(args.size, reg, args.max_iter, args.log_iters, args.stop)
    stem = args.out_name or ("grid_barycenter_quick" if args.quick else "grid_barycenter")
    meta = {"python": sys.version.split()[0], "numpy": np.__version__, "pot": ot.__version__,
            "sketchot": sketchot.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "load": os.getloadavg(), "size": args.size,
            "regs": args.regs, "max_iter": args.max_iter, "stopThr": args.stop,
            "images": ["camera", "coins", "astronaut (grey)"]}  # fmt: skip
    write_json(RESULTS_DIR / f"{stem}.json", {"meta": meta, "rows": rows})

    def fmt(value, spec):
        return "" if value is None else format(value, spec)

    table = md_table(
        ["size", "reg", "method", "seconds", "iterations", "s / iteration", "met stopThr",
         "criterion", "max L1 marginal error", "NaN pixels", "L1 to sketchot",
         "max to sketchot"],
        [[r["size"], f"{r['reg']:g}", r["method"], f"{r['seconds']:.2f}", r["iterations"],
          f"{r['per_iteration']:.4f}", r["converged"], fmt(r["criterion"], ".2e"),
          fmt(max(r["marginal_errors"]) if r["marginal_errors"] else None, ".2e"), r["nan"],
          fmt(r.get("l1_to_sketchot"), ".2e"), fmt(r.get("max_to_sketchot"), ".2e")]
         for r in rows],
        "rrlrrrlrrrrr",
    )  # fmt: skip
    ratios = []
    for reg in args.regs:
        by = {r["method"]: r for r in rows if r["reg"] == reg}
        ratio = by["POT sinkhorn"]["seconds"] / by["sketchot"]["seconds"]
        per_it = by["POT sinkhorn"]["per_iteration"] / by["sketchot"]["per_iteration"]
        ratios.append(f"reg {reg:g}: POT / sketchot time {ratio:.2f}x, per iteration "
                      f"{per_it:.2f}x")  # fmt: skip
    text = "\n".join([f"# {__doc__.splitlines()[0]}", "", f"{meta}", "", *table, "", *ratios, ""])
    print(text)
    write_text(RESULTS_DIR / f"{stem}.md", text)


if __name__ == "__main__":
    main()
