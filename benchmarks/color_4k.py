"""Colour transfer of a 4K image (3840 x 2160, 8.3e6 pixels), every pixel mapped.

The source is a real photograph's pixels resampled: ``images/default_source.png`` (1200 x 800)
resized to ``--width`` x ``--height`` with Pillow's Lanczos filter (which makes new,
interpolated colours: far more distinct colours than the original holds); the target is
``images/default_target.png`` as it is. ``sketchot.color.transfer_colors`` at ``--reg`` with
its defaults (``backend='auto'``, 10^4 sampled colours per image, ``compact=True``: uint8
in and out), timed step by step, with the true-kernel check's marginal errors and whether
they meet the accuracy (the certificate). The baseline of the same run: the same call on the
original 1200 x 800 source (its ratio shows how the time grows with the pixel count).

``--json`` / ``--md`` write the numbers (``benchmarks/results/color_4k.json`` and ``.md`` by
default).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
from _results import md_table, write_json, write_text
from PIL import Image

import sketchot
from sketchot.color import transfer_colors

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def run(source: np.ndarray, target: np.ndarray, reg: float, seed: int) -> dict:
    start = time.perf_counter()
    result = transfer_colors(source, target, reg=reg, rng=seed, compact=True)
    total = time.perf_counter() - start
    check = result.check
    errors = [float(check.relative_a), float(check.relative_b)]
    return {
        "pixels": int(source.shape[0] * source.shape[1]),
        "shape": list(source.shape[:2]),
        "seconds": total,
        "timings": {k: float(v) for k, v in result.timings.items()},
        "backend": result.backend,
        "distinct_colours_mapped": int(result.forward.n_colors),
        "fallbacks": int(result.forward.n_fallbacks),
        "clipped": int(result.forward.n_clipped),
        "true_kernel_marginal_errors": errors,
        "accuracy": float(result.result.options.get("accuracy")),
        "true_kernel_bound": float(check.bound),
        "certified": bool(result.result.accuracy_met),
    }


def markdown(data: dict) -> str:
    lines = [
        f"# Colour transfer at full resolution, reg = {data['reg']}, every pixel mapped",
        "",
        f"Machine: {data['machine']}; load average before -> after: {data['load'][0]:.2f} -> "
        f"{data['load'][1]:.2f}; sketchot {data['versions']['sketchot']}",
        "",
    ]
    base = data["runs"][0]["seconds"]
    rows = []
    for run_ in data["runs"]:
        t = run_["timings"]
        rows.append([
            f"{run_['shape'][1]} x {run_['shape'][0]}", f"{run_['pixels']:.2e}",
            run_["backend"], run_["distinct_colours_mapped"],
            f"{t.get('build', 0) + t.get('iterations', 0):.2f}", f"{t.get('map', 0):.2f}",
            f"{run_['seconds']:.2f}", f"{run_['seconds'] / base:.2f}",
            ", ".join(f"{e:.1e}" for e in run_["true_kernel_marginal_errors"]),
            "yes" if run_["certified"] else "NO",
        ])  # fmt: skip
    lines += md_table(
        ["image", "pixels", "backend", "distinct colours mapped", "solve s", "map s",
         "total s", "/ original", "true-kernel marginal errors", "certified"],
        rows, "rrlrrrrrrl",
    )  # fmt: skip
    return "\n".join(lines) + "\n"


def photographs(width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(source resized, source, target)``: the default pair, the source resized to
    ``width x height`` with Pillow's Lanczos filter (new, interpolated colours)."""
    with Image.open(REPO / "images" / "default_source.png") as image:
        original = image.convert("RGB")
        large = np.asarray(original.resize((width, height), Image.Resampling.LANCZOS))
        original = np.asarray(original)
    with Image.open(REPO / "images" / "default_target.png") as image:
        target = np.asarray(image.convert("RGB"))
    return large, original, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=3840)
    parser.add_argument("--height", type=int, default=2160)
    parser.add_argument("--reg", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=RESULTS / "color_4k.json")
    parser.add_argument("--md", type=Path, default=RESULTS / "color_4k.md")
    args = parser.parse_args()
    large, original, target = photographs(args.width, args.height)
    load = [os.getloadavg()[0]]
    runs = []
    for source in (original, large):
        runs.append(run(source, target, args.reg, args.seed))
        print(f"{runs[-1]['shape']}: {runs[-1]['seconds']:.1f} s", flush=True)
    load.append(os.getloadavg()[0])
    data = {
        "reg": args.reg, "runs": runs, "load": load,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "versions": {"sketchot": sketchot.__version__, "numpy": np.__version__},
    }  # fmt: skip
    write_json(args.json, data)
    write_text(args.md, markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
