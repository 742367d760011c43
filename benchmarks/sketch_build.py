"""Build time of the Poly-TensorSketch feature map of the Gaussian kernel at scale.

``n`` points per side, uniform on ``[0, 1]^3``, ``gamma = 1`` (``reg = 1``), sketch dimension
``m = 20``, degree ``r = 3``, coreset size ``k = 10`` (the paper's Sinkhorn setting), rank
``1 + r m = 61``. Timed, best of ``--repeats``:

* ``GaussianPolySketch(...).fit(X, Y)``, ``transform_x(X)``, ``transform_y(Y)``;
* ``sketchot.make_kernel(X, Y, reg=1.0, backend='polyts')`` (float64 and float32);
* a breakdown from the public pieces: greedy k-center on each side, the coreset regression
  (``regression_coefficients`` minus its two k-centers), and for one side's features the
  CountSketches and the FFT convolutions (``convolve_count_sketches``) over the library's row
  blocks; the rest of ``transform_x`` is the coefficient and row scaling and the copy.

``--quick`` uses ``n = 10^5``; ``--n`` sets the size; ``--json PATH`` writes the numbers.
Data come from ``numpy.random.default_rng(seed)``, every sketch from ``default_rng(seed + 1)``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from _results import md_table, timed, write_json, write_text

import sketchot
from sketchot.kernels.polyts import DEFAULT_CORESET_SIZE
from sketchot.sketch import (
    Exponential,
    GaussianPolySketch,
    convolve_count_sketches,
    greedy_k_center,
    ridge_diagonal,
)
from sketchot.sketch.coefficients import regression_coefficients
from sketchot.sketch.tensorsketch import DEFAULT_BLOCK_ROWS

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The paper's Sinkhorn setting, from the polyts record (m = 20, r = 3; coreset k = 10).
PAPER = sketchot.comparable_parameters()["polyts"]


def best_of(repeats: int, step: Callable[[], float]) -> dict[str, Any]:
    """Run ``step`` (which returns its own elapsed seconds) ``repeats`` times."""
    return best_and_median([step() for _ in range(repeats)])


def best_and_median(times: list[float]) -> dict[str, Any]:
    return {"best": min(times), "median": float(np.median(times)), "all": times}


def run(args: argparse.Namespace) -> dict[str, Any]:
    data_rng = np.random.default_rng(args.seed)
    X, Y = (data_rng.random((args.n, args.dim)) for _ in range(2))
    # The paper's Coreset-TS, whose cost breakdown follows.
    params = {"degree": args.degree, "sketch_dim": args.sketch_dim,
              "coreset_size": args.coreset_size, "variant": "paper"}  # fmt: skip
    sketch_seed = args.seed + 1
    results: dict[str, dict[str, Any]] = {}

    def new_sketch() -> GaussianPolySketch:
        # fit_tolerance=None: a warning's advice refits would be timed as part of the fit
        return GaussianPolySketch(
            1.0, **params, fit_tolerance=None, rng=np.random.default_rng(sketch_seed)
        )

    fitted = new_sketch().fit(X, Y)
    results["fit"] = best_of(args.repeats, lambda: timed(lambda: new_sketch().fit(X, Y))[0])
    results["transform_x"] = best_of(args.repeats, lambda: timed(lambda: fitted.transform_x(X))[0])
    results["transform_y"] = best_of(args.repeats, lambda: timed(lambda: fitted.transform_y(Y))[0])
    for dtype in (np.float64, np.float32):
        # The build time the kernel records (factors and operator set-up).
        build = partial(sketchot.make_kernel, X, Y, 1.0, "polyts", dtype=dtype, **params)
        results[f"make_kernel polyts {np.dtype(dtype).name}"] = best_of(
            args.repeats,
            lambda build=build: build(rng=np.random.default_rng(sketch_seed)).info.build_time,
        )

    # ---- breakdown from the public pieces (same inputs as fit: centred, gamma = 1)
    U, V = X - fitted.center_, Y - fitted.center_
    half_width = fitted.half_width_
    f = Exponential(scale=2.0, offset=-2.0 * half_width)
    ridge = ridge_diagonal(
        np.einsum("ij,ij->i", U, U), np.einsum("ij,ij->i", V, V), args.degree, args.sketch_dim
    )

    def kcenter_both() -> float:
        rng = np.random.default_rng(sketch_seed)
        return sum(timed(lambda Z=Z: greedy_k_center(Z, args.coreset_size, rng))[0] for Z in (U, V))

    def coefficients() -> float:
        inputs = (U, V, f, args.degree, half_width, ridge)
        coreset = {"coreset_size": args.coreset_size, "rng": np.random.default_rng(sketch_seed)}
        return timed(lambda: regression_coefficients(*inputs, **coreset))[0]

    results["  k-center (both sides)"] = best_of(args.repeats, kcenter_both)
    results["  coreset coefficients (incl. k-center)"] = best_of(args.repeats, coefficients)

    tensor_sketch = fitted.sketch_.tensor_sketch_

    def count_and_fft() -> tuple[float, float]:
        count_seconds = fft_seconds = 0.0
        for start in range(0, args.n, DEFAULT_BLOCK_ROWS):
            block = U[start : start + DEFAULT_BLOCK_ROWS]
            elapsed, counts = timed(
                lambda block=block: np.stack(
                    [cs.transform(block) for cs in tensor_sketch.count_sketches], axis=1
                )
            )
            count_seconds += elapsed
            fft_seconds += timed(lambda counts=counts: convolve_count_sketches(counts))[0]
        return count_seconds, fft_seconds

    splits = [count_and_fft() for _ in range(args.repeats)]
    for index, name in enumerate(("  CountSketches, one side", "  FFT convolutions, one side")):
        results[name] = best_and_median([s[index] for s in splits])
    best = {name: entry["best"] for name, entry in results.items()}
    regression = best["  coreset coefficients (incl. k-center)"] - best["  k-center (both sides)"]
    derived = {
        "  coreset regression (coefficients - k-center)": regression,
        "  scaling + copy, one side (transform_x - CS - FFT)": best["transform_x"]
        - best["  CountSketches, one side"] - best["  FFT convolutions, one side"],
    }  # fmt: skip
    results.update({name: {"best": value, "derived": True} for name, value in derived.items()})
    return results


# Rows of the table: a step, then its breakdown (indented names).
ORDER = (
    "fit", "  k-center (both sides)", "  coreset regression (coefficients - k-center)",
    "transform_x", "  CountSketches, one side", "  FFT convolutions, one side",
    "  scaling + copy, one side (transform_x - CS - FFT)", "transform_y",
    "make_kernel polyts float64", "make_kernel polyts float32",
)  # fmt: skip


def markdown(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    total = results["make_kernel polyts float64"]["best"]
    rows = []
    for name in ORDER:
        entry = results[name]
        median = "-" if entry.get("derived") else f"{entry['median']:.3f}"
        points = 2 * args.n if name in ("fit",) or name.startswith("make_kernel") else args.n
        rate = points / entry["best"] / 1e6 if entry["best"] > 0 else float("inf")
        label = name.strip() if not name.startswith("  ") else "- " + name.strip()
        rows.append([label, f"{entry['best']:.3f}", median,
                     f"{100 * entry['best'] / total:.0f}%", f"{rate:.2f}"])  # fmt: skip
    return "\n".join([
        f"Poly-TensorSketch Gaussian feature map, n = {args.n:,} points per side in "
        f"[0,1]^{args.dim}, m = {args.sketch_dim}, r = {args.degree}, k = {args.coreset_size} "
        f"(rank {1 + args.degree * args.sketch_dim}); best of {args.repeats}; indented rows "
        "are the breakdown (derived rows are differences).", "",
        *md_table(["step", "best s", "median s", "% of make_kernel float64", "Mpoints/s"], rows),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10**6, help="points per side")
    parser.add_argument("--quick", action="store_true", help="n = 10^5")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dim", type=int, default=3)
    parser.add_argument("--sketch-dim", type=int, default=PAPER["sketch_dim"])
    parser.add_argument("--degree", type=int, default=PAPER["degree"])
    parser.add_argument("--coreset-size", type=int, default=DEFAULT_CORESET_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--out-md", type=Path, default=None,
                        help="also write the table here (default without --quick: "
                        "results/sketch_build.md)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.n = min(args.n, 10**5)
    elif args.out_md is None:
        args.out_md = RESULTS_DIR / "sketch_build.md"
    if args.n < args.coreset_size or args.repeats < 1:
        parser.error("--n must be at least --coreset-size and --repeats at least 1")

    started = time.perf_counter()
    results = run(args)
    table = markdown(results, args)
    print(table)
    print(f"\nWall time of the benchmark: {time.perf_counter() - started:.1f} s")
    if args.out_md is not None:
        command = "sketch_build.py" + (" --quick" if args.quick else f" --n {args.n}")
        write_text(args.out_md, f"# Sketch build time\n\nProduced by `python benchmarks/"
                   f"{command}`.\n\n{table}\n")  # fmt: skip
    config = {
        "n": args.n, "dim": args.dim, "sketch_dim": args.sketch_dim, "degree": args.degree,
        "coreset_size": args.coreset_size, "repeats": args.repeats, "data_seed": args.seed,
        "sketch_seed": args.seed + 1, "gamma": 1.0,
    }  # fmt: skip
    versions = {"sketchot": sketchot.__version__, "numpy": np.__version__}
    output = {"config": config, "seconds": results, "versions": versions}
    if args.json is not None:
        write_json(args.json, output)
    return output


if __name__ == "__main__":
    main()
