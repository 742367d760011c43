"""Block-local polynomial expansion of the Gibbs kernel: build time, product time, accuracy, memory.

For each data set, ``n`` (``n`` points per side) and ``reg``:

* ``LocalGaussianExpansion(reg, rng=seed).fit(X, Y)`` (defaults: ``tau = 1``, degree 9,
  ``R = 220`` features in 3-D); build time split into clustering and features;
* one log-domain product ``log_matvec(log_v)`` (best of ``--repeats``; one run at n >= 1e6),
  split into the input-side moments (``G_AB = Psi_B^T w``) and the output side
  (``Phi_A G_A`` and the log-sum-exp over target clusters);
* a stored dense exact ``K`` product (``K @ v``, ``K`` built untimed) where ``n^2`` doubles fit
  ``--dense-bytes``, and the on-the-fly exact log-domain product
  (``sketchot.gibbs.gibbs_log_matvec``) timed on ``--exact-rows`` rows and extrapolated
  linearly to all ``n`` rows (it is ``O(n m)``; marked ``*``);
* the max relative error of ``K v`` on ``--check-rows`` sampled rows, for ``v`` uniform in
  ``(0, 1)`` and for scalings ``log v ~ 100 N(0, 1)`` (spanning hundreds of orders of
  magnitude), against ``gibbs_log_matvec``;
* peak traced memory (``tracemalloc``, numpy's allocations included) of fit plus one product
  (build times are measured under tracemalloc, product times are not);
* with ``--truncate T > 0`` (default ``1e-9``, the ``polyts_local`` backend's default: its
  ``rtol``): the same product on ``LocalGaussianExpansion(reg, truncate=T)``, its time, the
  share of expanded cluster pairs the bound keeps (``_kept_pairs``, these weights) and its
  max relative error on the sampled rows (at most the entry bound plus ``T``).

Data: ``photo`` = pixels of ``images/default_source.png`` (X) and ``images/default_target.png``
(Y) in ``[0, 1]^3`` (drawn with replacement); ``uniform`` = uniform on ``[0, 1]^3``. Cases whose
predicted product cost ``4 (n k_Y + m k_X) R`` flops (expanded clusters) plus
``20`` per exact entry exceeds ``--max-flops`` are built but not
multiplied (the expansion loses to the exact kernel there anyway).

``--quick`` runs n = 2000 and 10000; the full run n = 1e4, 2e4, 1e5, 1e6. ``--json PATH``
writes every number; the markdown table goes to ``benchmarks/results/local_kernel.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json
from _running import best_time

from sketchot import get_num_threads
from sketchot.color import load_image, sample_pixels
from sketchot.gibbs import gibbs_block, gibbs_log_matvec
from sketchot.sketch.local import LocalGaussianExpansion, expansion, fit, products

RESULTS_DIR = Path(__file__).resolve().parent / "results"
IMAGES = Path(__file__).resolve().parents[1] / "images"
REGS = (0.1, 0.03, 0.01, 0.003)


class KeptPairs:
    """Wraps ``_kept_pairs`` (as the products read it) to add up the cluster pairs the
    truncation bound keeps."""

    def __init__(self) -> None:
        self.kept, self.pairs = 0, 0
        self._kept_pairs = products._kept_pairs

    def __enter__(self) -> KeptPairs:
        def kept_pairs(*args):
            keep = self._kept_pairs(*args)
            self.kept += int(keep.sum())
            self.pairs += keep.size
            return keep

        products._kept_pairs = kept_pairs
        return self

    def __exit__(self, *exc: Any) -> None:
        products._kept_pairs = self._kept_pairs

    @property
    def share(self) -> float | None:
        return self.kept / self.pairs if self.pairs else None


class PhaseTimer:
    """Wraps ``run_parts`` (features and products) and ``_cover`` (the fit's clustering) where
    the block-local expansion reads them, to add up the time of each phase."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._run_parts = products.run_parts  # the same function in fit
        self._cover = expansion._cover

    def __enter__(self) -> PhaseTimer:
        def run_parts(function, items, parallel):
            start = time.perf_counter()
            result = self._run_parts(function, items, parallel)
            self.totals[function.__name__] += time.perf_counter() - start
            return result

        def cover(*args, **kwargs):
            start = time.perf_counter()
            result = self._cover(*args, **kwargs)
            self.totals["clustering"] += time.perf_counter() - start
            return result

        fit.run_parts = products.run_parts = run_parts
        expansion._cover = cover
        return self

    def __exit__(self, *exc: Any) -> None:
        fit.run_parts = products.run_parts = self._run_parts
        expansion._cover = self._cover


def data(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == "photo":
        X = sample_pixels(load_image(IMAGES / "default_source.png"), n, rng=seed, replace=True)
        Y = sample_pixels(load_image(IMAGES / "default_target.png"), n, rng=seed + 1, replace=True)
        return X.colors, Y.colors
    rng = np.random.default_rng(seed)
    return rng.random((n, 3)), rng.random((n, 3))


def one_case(kind: str, n: int, reg: float, args: argparse.Namespace) -> dict[str, Any]:
    X, Y = data(kind, n, args.seed)
    rng = np.random.default_rng(args.seed + 2)
    log_v = np.log(rng.random(n))
    log_v_wide = 100 * rng.normal(size=n)
    row: dict[str, Any] = {"data": kind, "n": n, "reg": reg}

    tracemalloc.start()
    with PhaseTimer() as phases:
        start = time.perf_counter()
        kernel = LocalGaussianExpansion(reg, rng=args.seed).fit(X, Y)
        row["build_s"] = time.perf_counter() - start
    row["cluster_s"] = phases.totals["clustering"]
    row["features_s"] = phases.totals["fill"]
    row["clusters"] = list(kernel.n_clusters_)
    row["features"] = kernel.n_features_
    row["features_stored"] = kernel._x.features is not None
    row["exact_points"] = list(kernel.n_exact_points_)
    row["entry_error_bound"] = kernel.entry_error_bound_
    # Expanded pairs: 2 R flops per (point, cluster of the other side) on each side; exact
    # entries: ~20 flop-equivalents each (distance and exponential).
    k_x = kernel.n_clusters_[0] - kernel._x.n_small
    k_y = kernel.n_clusters_[1] - kernel._y.n_small
    e_x, e_y = kernel.n_exact_points_
    flops = 4.0 * (n * k_y + n * k_x) * kernel.n_features_ + 20.0 * (n * e_y + e_x * n)
    row["predicted_flops"] = flops
    if flops > args.max_flops:
        row["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        row["skipped"] = f"predicted {flops:.1e} flops > --max-flops"
        return row

    approx = kernel.log_matvec(log_v)
    row["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    repeats = 1 if n >= 10**6 else args.repeats
    with PhaseTimer() as phases:
        row["product_s"] = best_time(lambda: kernel.log_matvec(log_v), repeats)
    row["moments_s"] = phases.totals["input_batches"] / repeats
    row["outputs_s"] = phases.totals["output_batches"] / repeats
    row["exact_part_s"] = phases.totals["blocks"] / repeats

    check = rng.choice(n, min(n, args.check_rows), replace=False)
    exact = gibbs_log_matvec(X[check], Y, reg, log_v)
    row["max_rel_error"] = float(np.max(np.abs(np.expm1(approx[check] - exact))))
    if args.truncate > 0:
        cut = LocalGaussianExpansion(reg, truncate=args.truncate, rng=args.seed).fit(X, Y)
        with KeptPairs() as kept:
            cut_values = cut.log_matvec(log_v)
        row["pairs_kept"] = kept.share
        row["truncated_s"] = best_time(lambda: cut.log_matvec(log_v), repeats)
        errors = np.abs(np.expm1(cut_values[check] - exact))
        row["max_rel_error_truncated"] = float(np.max(errors))
        del cut
    wide = kernel.log_matvec(log_v_wide)[check]
    exact = gibbs_log_matvec(X[check], Y, reg, log_v_wide)
    row["max_rel_error_wide"] = float(np.max(np.abs(np.expm1(wide - exact))))

    rows = min(n, args.exact_rows if n < 10**6 else args.exact_rows // 4)
    exact_rows_s = best_time(lambda: gibbs_log_matvec(X[:rows], Y, reg, log_v), 1)
    row["exact_on_the_fly_s"] = exact_rows_s * n / rows
    row["exact_extrapolated"] = rows < n
    if n * n * 8 <= args.dense_bytes:
        K = gibbs_block(X, Y, reg)
        v = np.exp(log_v)
        row["dense_product_s"] = best_time(lambda: K @ v, args.repeats)
        del K
    return row


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| data | n | reg | clusters (X, Y) | exact pts | R | build s (cluster + features) | "
        "log_matvec s (moments + outputs + exact part) | dense K@v s | exact on the fly s | "
        "max rel err K v | max rel err (log v spread 100) | peak MB | "
        "truncated log_matvec s (pairs kept) | max rel err truncated |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        clusters = f"{r['clusters'][0]}, {r['clusters'][1]} | {r['exact_points'][0]}, " + str(
            r["exact_points"][1]
        )
        build = f"{r['build_s']:.3f} ({r['cluster_s']:.3f} + {r['features_s']:.3f})"
        if "skipped" in r:
            lines.append(
                f"| {r['data']} | {r['n']:.0e} | {r['reg']} | {clusters} | {r['features']} | "
                f"{build} | skipped: {r['skipped']} | | | | | {r['peak_mb']:.0f} | | |"
            )
            continue
        product = (
            f"{r['product_s']:.3f} ({r['moments_s']:.3f} + {r['outputs_s']:.3f} + "
            f"{r['exact_part_s']:.3f})"
        )
        exact = f"{r['exact_on_the_fly_s']:.2f}" + ("*" if r["exact_extrapolated"] else "")
        truncated = "-"
        if r.get("truncated_s") is not None:
            kept = r["pairs_kept"]
            share = "no expanded pairs" if kept is None else f"{100 * kept:.0f}% of pairs"
            truncated = f"{r['truncated_s']:.3f} ({share})"
        lines.append(
            f"| {r['data']} | {r['n']:.0e} | {r['reg']} | {clusters} | {r['features']} | "
            f"{build} | {product} | {fmt(r.get('dense_product_s'), '.4f')} | {exact} | "
            f"{r['max_rel_error']:.1e} | {r['max_rel_error_wide']:.1e} | {r['peak_mb']:.0f} | "
            f"{truncated} | {fmt(r.get('max_rel_error_truncated'), '.1e')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 2000 and 10000 only")
    parser.add_argument("--n", type=int, nargs="*", default=None, help="sizes (override)")
    parser.add_argument("--reg", type=float, nargs="*", default=list(REGS))
    parser.add_argument("--data", nargs="*", default=["photo", "uniform"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check-rows", type=int, default=300)
    parser.add_argument("--exact-rows", type=int, default=2000)
    parser.add_argument("--dense-bytes", type=float, default=3.5e9, help="n^2 doubles limit")
    parser.add_argument("--max-flops", type=float, default=1e12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--truncate", type=float, default=1e-9, help="0: no truncated product")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out-name", default="local_kernel.md", help="the table's file name")
    args = parser.parse_args(argv)
    command = sys.argv[1:] if argv is None else argv
    sizes = args.n or ([2000, 10000] if args.quick else [10**4, 2 * 10**4, 10**5, 10**6])

    load_start = os.getloadavg()[0]  # the machine is shared: say how busy it was
    rows = []
    for kind in args.data:
        for n in sizes:
            for reg in args.reg:
                row = one_case(kind, n, reg, args)
                rows.append(row)
                print(table([row])[-1], flush=True)

    lines = [
        "# Block-local polynomial expansion of the Gibbs kernel",
        "",
        f"Produced by `python benchmarks/local_kernel.py {' '.join(command)}` "
        f"({platform.processor() or platform.machine()}, {get_num_threads()} pool threads).",
        "",
        "Defaults: tau = 1, degree 9, R = C(9 + 3, 3) = 220 features, relative entry error bound "
        f"{rows[0]['entry_error_bound']:.2e}. Times in seconds (best of {args.repeats}; one "
        "run at n = 1e6). `*`: timed on the first rows and extrapolated linearly to n rows "
        "(the exact product is O(n m)). Dense K@v: a stored exact K (built untimed) where n^2 "
        f"doubles fit {args.dense_bytes / 1e9:.1f} GB. Peak MB: tracemalloc of fit plus one "
        "product. Phase times in brackets are means over the timed runs and the total is the "
        "best run, so they need not add up. Load average (1 min) at the start and the end: "
        f"{load_start:.1f}, {os.getloadavg()[0]:.1f}.",
        "",
        *table(rows),
        "",
    ]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / args.out_name).write_text("\n".join(lines))
    print(f"Table: {args.out_dir / args.out_name}")
    output = {"argv": argv, "quick": args.quick, "rows": rows}
    if args.json is not None:
        write_json(args.json, output)
    return output


if __name__ == "__main__":
    main()
