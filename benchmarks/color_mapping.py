"""Benchmark: map every pixel of a ~1-megapixel image after fitting on 10^4 samples.

For each backend, fit the colour transport between ``--n-samples`` pixels of the default source
(images/default_source.png, 1200 x 800 = 960,000 pixels) and of the default target at
``--reg`` (``safeguard='clip'``, at most ``--max-iter`` iterations, ``errors='warn'``: the fit
is not what is timed, and exact repairs of a broken approximation such as RFF at reg = 0.1
would take minutes), then time

* ``map_image``: the library path, which maps each DISTINCT colour once through the
  out-of-sample operator and gathers (exact, since the map depends on the colour only);
* ``per-pixel``: ``SinkhornResult.barycentric_map(X_new=pixels)`` on every pixel without
  de-duplication, the worst case of an image whose colours are all different.

Colours whose approximate denominator is not positive are mapped with the exact kernel (column
"fallbacks", inside the timed mapping). The exact backend (the baseline, POT's continuous
out-of-sample map) streams an ``N x n`` softmax, linear in the rows mapped: its per-pixel time
is measured on ``--exact-pixels`` random pixels and extrapolated to all (marked ``*``).

Usage::

    python benchmarks/color_mapping.py                 # full run (a few minutes on 2 cores)
    python benchmarks/color_mapping.py --quick         # downscaled image, 2000 samples
    python benchmarks/color_mapping.py --json benchmarks/results/color_mapping.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _results import timed

import sketchot
from sketchot.color import (
    OutputSet,
    atomic_write_with,
    image_pixels,
    load_image,
    map_image,
    sample_pixels,
)
from sketchot.color.cli import OneLineParser, check_outputs, positive_float, positive_int
from sketchot.color.transfer import resolve_backend_params

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT / "images" / "default_source.png"
DEFAULT_TARGET = ROOT / "images" / "default_target.png"
BACKENDS = ("exact", "nystrom", "rff", "polyts")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="color_mapping.py", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--source", type=Path, default=DEFAULT_SOURCE)
    add("--target", type=Path, default=DEFAULT_TARGET)
    add("--n-samples", type=positive_int, default=10_000)
    add("--reg", type=positive_float, default=0.1)
    add("--seed", type=int, default=0)
    add("--max-iter", type=positive_int, default=1000)
    add("--exact-pixels", type=positive_int, default=100_000,
        help="pixels timed for the exact per-pixel map, extrapolated to all "
        "(default 1e5)")  # fmt: skip
    add("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS), metavar="BACKEND")
    add("--quick", action="store_true", help="source downscaled 4x per side, 2000 samples")
    add("--json", type=Path, help="write the results as JSON")
    return parser


def fit(source_pixels: np.ndarray, target_pixels: np.ndarray, backend: str, args) -> tuple:
    rng = np.random.default_rng(args.seed)
    xs = sample_pixels(source_pixels, args.n_samples, rng=rng, name="source")
    xt = sample_pixels(target_pixels, args.n_samples, rng=rng, name="target")
    params = resolve_backend_params(backend, {}, len(xs) + len(xt))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = sketchot.sinkhorn(
            xs.weights, xt.weights, xs.colors, xt.colors, reg=args.reg, backend=backend,
            max_iter=args.max_iter, rng=rng, safeguard="clip", errors="warn", **params,
        )  # fmt: skip
    return result, params


def bench_backend(source: np.ndarray, target: np.ndarray, backend: str, args) -> dict[str, Any]:
    fit_seconds, (result, params) = timed(lambda: fit(source, target, backend, args))

    mapped = map_image(result, source, name="source")

    pixels = subset = image_pixels(source)
    n_pixels = pixels.shape[0]
    if backend == "exact" and args.exact_pixels < n_pixels:
        pick = np.random.default_rng(args.seed).choice(n_pixels, args.exact_pixels, replace=False)
        subset = pixels[pick]
    tick = time.perf_counter()
    _, raw_fallbacks = result.barycentric_map(X_new=subset, return_fallbacks=True)
    raw_seconds = (time.perf_counter() - tick) * n_pixels / subset.shape[0]
    return {
        "backend": backend, "params": params, "n_iter": result.n_iter, "fit_s": fit_seconds,
        "n_pixels": n_pixels, "n_colors": mapped.n_colors, "map_image_s": mapped.seconds,
        "map_image_fallbacks": mapped.n_fallbacks, "per_pixel_s": raw_seconds,
        "per_pixel_extrapolated_from": int(subset.shape[0]) if subset is not pixels else None,
        "per_pixel_fallbacks": raw_fallbacks,
    }  # fmt: skip


def print_table(records: list[dict[str, Any]]) -> None:
    header = (
        f"{'backend':<9}{'params':<24}{'fit s':>8}{'iters':>6}{'map_image s':>13}"
        f"{'colours':>9}{'fallbk':>8}{'per-pixel s':>13}{'Mpx/s':>8}{'fallbk':>8}"
        f"{'vs exact':>10}"
    )
    print(header + "\n" + "-" * len(header))
    exact = next((r for r in records if r["backend"] == "exact"), None)
    for r in records:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-"
        star = "*" if r["per_pixel_extrapolated_from"] else " "
        ratio = f"{exact['map_image_s'] / r['map_image_s']:.0f}x" if exact else "-"
        print(
            f"{r['backend']:<9}{params:<24}{r['fit_s']:>8.2f}{r['n_iter']:>6d}"
            f"{r['map_image_s']:>13.2f}{r['n_colors']:>9d}{r['map_image_fallbacks']:>8d}"
            f"{r['per_pixel_s']:>12.2f}{star}{r['n_pixels'] / r['per_pixel_s'] / 1e6:>8.2f}"
            f"{r['per_pixel_fallbacks']:>8d}{ratio:>10}"
        )
    sample = next((r for r in records if r["per_pixel_extrapolated_from"]), None)
    if sample is not None:
        print(
            f"* timed on {sample['per_pixel_extrapolated_from']} random pixels and extrapolated "
            "linearly (the exact map streams row blocks: cost linear in the rows)"
        )
    print("'vs exact': map_image time of the exact backend / this backend's")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.json is not None:
        planned = OutputSet()
        planned.add(args.json, "--json", "json")
        check_outputs(parser, planned, [("--source", args.source), ("--target", args.target)])
    if args.quick:
        args.n_samples = min(args.n_samples, 2000)
    try:
        source = load_image(args.source, name="--source")
        target = load_image(args.target, name="--target")
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.quick:
        source = source[::4, ::4]
    note = (
        f"source {source.shape[1]} x {source.shape[0]} = {source.shape[0] * source.shape[1]} "
        f"pixels; fit on {args.n_samples} samples per image, reg = {args.reg:g}; "
        f"{platform.processor() or platform.machine()}, numpy {np.__version__}"
    )
    print(note, flush=True)
    records = []
    for backend in args.backends:
        print(f"{backend} ...", flush=True)
        records.append(bench_backend(source, target, backend, args))
    print("\n" + note)
    print_table(records)
    if args.json is not None:
        text = json.dumps({"setting": note, "results": records}, indent=2)
        atomic_write_with(args.json, lambda stream: stream.write(text.encode()))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
