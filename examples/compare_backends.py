"""The same colour transfer through every kernel backend, next to the exact result.

Three settings, each run on the same pixel samples (same ``--seed``):

1. ``reg = 1`` at the paper's equal cost (Han et al. 2020, Section 4.3): Poly-TensorSketch with
   sketch dimension m = 20 and degree r = 3, random Fourier features with D = m r = 60,
   Nystrom with s = ceil(max(sqrt(r m), r)) = 8 landmarks;
2. ``reg = 0.1`` (``--small-reg``), POT's colour-transfer setting, at the same equal cost;
3. ``reg = 0.1`` at rank about 400 (``--small-rank``), the colour-transfer default of
   Nystrom: Nystrom s = 400, RFF D = 400, Poly-TensorSketch m = 133, r = 3 (1 + r m = 400
   features).

For each backend it prints the time per Sinkhorn iteration, the solve and mapping times, the
true-kernel marginal error, and the mean absolute RGB difference to the exact backend's
recoloured image over ALL pixels, and draws one figure (one row per setting).

The solver's safeguard defaults to ``clip`` here (``--safeguard``): with the library default
``exact``, every non-positive approximate denominator is recomputed with an exact kernel row
at every iteration, so a broken approximation (RFF at reg = 0.1) then costs more per iteration
than the exact backend itself, and the time per iteration no longer measures the backend.
The colour map still uses the exact kernel for the colours whose approximate denominator is
not positive (counted as "fallbacks").

Usage::

    python examples/compare_backends.py                 # default pair, writes outputs/
    python examples/compare_backends.py SOURCE TARGET --out comparison.png --json results.json
    python examples/compare_backends.py --out images/compare_backends.png   # README's figure

Outputs are checked before any work and written all together (see examples/color_transfer.py).
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":
    # Ctrl-C while the libraries below load: the program's one line and exit code 130, no
    # traceback (sketchot.color.cli.run_program takes over once they are loaded).
    def interrupted_while_loading(number, frame):
        sys.stderr.write("error: interrupted; every output keeps its previous content\n")
        sys.stderr.flush()
        os._exit(130)

    signal.signal(signal.SIGINT, interrupted_while_loading)

import argparse
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np

import sketchot
from sketchot.color import OutputSet, load_image, transfer_colors
from sketchot.color.cli import (
    EXIT_INTERRUPTED,
    INTERRUPTED,
    OneLineParser,
    add_max_pixels_option,
    check_outputs,
    max_pixels_of,
    one_line_warnings,
    positive_float,
    positive_int,
    run_program,
)
from sketchot.color.figures import comparison_figure, figure_writer
from sketchot.color.steps import Steps

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
DEFAULT_SOURCE = IMAGES / "default_source.png"
DEFAULT_TARGET = IMAGES / "default_target.png"
#: Untracked (.gitignore): running the program never changes the files of a clone.
OUTPUTS = ROOT / "outputs"
DEFAULT_OUT = OUTPUTS / "compare_backends.png"

#: The approximate backends compared (every registered one with the paper's cost setting).
PAPER_PARAMS = sketchot.comparable_parameters()
BACKENDS = tuple(PAPER_PARAMS)


def rank_params(rank: int) -> dict[str, dict[str, int]]:
    """Every backend at ``rank`` features (``rank=``, read by each backend's registry record)."""
    return {backend: {"rank": rank} for backend in BACKENDS}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="compare_backends.py",
        description="Colour transfer through every backend, compared with the exact kernel.",
    )
    parser.add_argument("source", nargs="?", type=Path, help="image to recolour")
    parser.add_argument("target", nargs="?", type=Path, help="image whose palette to use")
    parser.add_argument("--n-samples", type=positive_int, default=10_000, help="(default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--replace", action="store_true", help="sample pixels with replacement (small images)"
    )
    parser.add_argument("--large-reg", type=positive_float, default=1.0, help="(default 1)")
    parser.add_argument("--small-reg", type=positive_float, default=0.1, help="(default 0.1)")
    parser.add_argument(
        "--small-rank",
        type=positive_int,
        default=400,
        help="rank of the third setting (default 400)",
    )
    parser.add_argument("--max-iter", type=positive_int, default=1000, help="(default 1000)")
    parser.add_argument(
        "--safeguard",
        choices=("clip", "exact", "raise"),
        default="clip",
        help="solver safeguard (default clip, see the module docstring)",
    )
    add_max_pixels_option(parser)
    parser.add_argument("--out", type=Path, help="figure (default outputs/compare_backends.png)")
    parser.add_argument("--json", type=Path, help="also write the measurements as JSON")
    return parser


def run_one(
    source: np.ndarray, target: np.ndarray, reg: float, backend: str, params: dict, args
) -> dict[str, Any]:
    """One colour transfer; returns its image, timings and diagnostics."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = transfer_colors(
            source,
            target,
            reg=reg,
            backend=backend,
            n_samples=args.n_samples,
            rng=args.seed,
            replace=args.replace,
            max_iter=args.max_iter,
            safeguard=args.safeguard,
            errors="warn",  # a comparison shows impossible results too, flagged in the table
            **params,
        )
    result = run.result
    return {
        "backend": backend,
        "params": dict(run.backend_params),
        "reg": reg,
        "image": run.image,
        "n_iter": result.n_iter,
        "converged": bool(result.converged),
        "per_iteration_ms": result.timings["per_iteration"] * 1e3,
        "build_s": result.timings["build"],
        "solve_s": result.timings["build"] + result.timings["iterations"],
        "map_s": run.forward.seconds,
        "total_s": result.timings["build"] + result.timings["iterations"] + run.forward.seconds,
        "true_kernel_relative_error": max(run.check.relative_a, run.check.relative_b),
        "accuracy_met": bool(result.accuracy_met),
        "impossible": not (result.value_linear >= 0 and result.mass > 0),
        "map_fallback_colors": run.forward.n_fallbacks,
        "n_colors": run.forward.n_colors,
        "safeguard_repairs": result.safeguard["rows_repaired"] + result.safeguard["cols_repaired"],
        "warnings": [str(w.message).split(";")[0] for w in caught],
    }


def describe_params(params: dict) -> str:
    short = {"n_landmarks": "s", "n_features": "D", "sketch_dim": "m", "degree": "r"}
    short["rank"] = "rank"
    return ", ".join(f"{short.get(k, k)}={v}" for k, v in params.items() if k in short)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the program; returns the exit code (2 for bad input, 1 for other failures)."""
    with one_line_warnings():
        try:
            return _main(argv)
        except KeyboardInterrupt:
            print(INTERRUPTED, file=sys.stderr)
            return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.source is None) != (args.target is None):
        parser.error("give both SOURCE and TARGET, or neither for the default pair")
    if args.out is None:
        OUTPUTS.mkdir(exist_ok=True)
    outputs = OutputSet()
    out = outputs.add(args.out if args.out is not None else DEFAULT_OUT, "--out", "figure")
    if args.json is not None:
        outputs.add(args.json, "--json", "json")
    inputs = [("SOURCE", args.source or DEFAULT_SOURCE), ("TARGET", args.target or DEFAULT_TARGET)]
    check_outputs(parser, outputs, inputs)
    settings = [
        (f"reg = {args.large_reg:g}, paper's equal cost", args.large_reg, PAPER_PARAMS),
        (f"reg = {args.small_reg:g}, paper's equal cost", args.small_reg, PAPER_PARAMS),
        (
            f"reg = {args.small_reg:g}, rank {args.small_rank}",
            args.small_reg,
            rank_params(args.small_rank),
        ),
    ]
    steps = Steps()  # each step shown live once it runs a couple of seconds
    try:
        steps.start("loading")
        limit = max_pixels_of(args)
        source = load_image(args.source or DEFAULT_SOURCE, name="source", max_pixels=limit)
        target = load_image(args.target or DEFAULT_TARGET, name="target", max_pixels=limit)
        steps.finish()
        print(
            f"source {source.shape[1]} x {source.shape[0]}, target {target.shape[1]} x "
            f"{target.shape[0]}, {args.n_samples} samples each, seed {args.seed}, "
            f"safeguard {args.safeguard!r}",
            flush=True,
        )
        exact_runs: dict[float, dict[str, Any]] = {}
        rows, records = [], []
        for label, reg, table in settings:
            if reg not in exact_runs:
                print(f"[{label}] exact ...", flush=True)
                steps.start(f"exact, {label}")
                exact_runs[reg] = run_one(source, target, reg, "exact", {}, args)
                steps.finish()
            exact = exact_runs[reg]
            exact["diff_mean"] = 0.0
            panels = [(f"exact: {exact['per_iteration_ms']:.0f} ms/it", exact["image"])]
            setting_records = [exact]
            for backend in BACKENDS:
                print(f"[{label}] {backend} {describe_params(table[backend])} ...", flush=True)
                steps.start(f"{backend}, {label}")
                record = run_one(source, target, reg, backend, table[backend], args)
                steps.finish()
                difference = record["image"][..., :3] - exact["image"][..., :3]  # alpha: equal
                record["diff_mean"] = float(np.abs(difference).mean())
                record["speedup_per_iteration"] = (
                    exact["per_iteration_ms"] / record["per_iteration_ms"]
                )
                record["speedup_total"] = exact["total_s"] / record["total_s"]
                setting_records.append(record)
                panels.append(
                    (
                        f"{backend} {describe_params(record['params'])}: "
                        f"{record['per_iteration_ms']:.1f} ms/it\n"
                        f"|diff| = {record['diff_mean'] * 255:.2f}/255",
                        record["image"],
                    )
                )
            rows.append((label, panels))
            for record in setting_records:
                records.append({"setting": label, **record})
            print_table(label, setting_records)
        steps.start("drawing the figure")
        figure = comparison_figure(
            [("source", source), ("target", target)],
            rows,
            title=(
                f"sketchot backends on {args.n_samples} samples; mean |RGB difference| to the "
                "exact recolouring over all pixels"
            ),
        )
        payload = [{k: v for k, v in r.items() if k != "image"} for r in records]
        text = json.dumps(payload, indent=2, default=float)
        steps.start("writing")
        with outputs:  # all written, or (error, Ctrl-C) none: the old files stay
            outputs.write(out, figure_writer(figure, out))
            if args.json is not None:
                outputs.write(args.json, lambda stream: stream.write(text.encode()))
        steps.finish()
        for path in outputs.paths:
            print(f"wrote {path}")
    except KeyboardInterrupt:
        steps.finish("interrupted")
        raise
    except (ValueError, TypeError, FileNotFoundError, IsADirectoryError) as exc:
        steps.finish()  # its line ended before the error's
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:
        steps.finish()
        print(f"error: {exc or 'out of memory'}", file=sys.stderr)
        return 1
    except (OSError, FloatingPointError) as exc:
        steps.finish()
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def verdict(record: dict[str, Any]) -> str:
    """Whether a run met the accuracy, missed it, or gave an impossible result."""
    if record["impossible"]:
        return "IMPOSSIBLE (negative cost or mass)"
    return "accuracy met" if record["accuracy_met"] else "accuracy missed"


def print_table(label: str, records: list[dict[str, Any]]) -> None:
    print()
    print(f"setting: {label}")
    header = (
        f"{'backend':<9}{'params':<12}{'iters':>6}{'ms/iter':>10}{'x exact':>9}{'solve s':>9}"
        f"{'map s':>8}{'total s':>9}{'|diff|/255':>12}{'|diff|':>10}{'true-K err':>12}"
        f"{'fallbk':>8}{'repairs':>9}  verdict"
    )
    print(header)
    print("-" * len(header))
    for r in records:
        speed = r.get("speedup_per_iteration")
        print(
            f"{r['backend']:<9}{describe_params(r['params']) or '-':<12}{r['n_iter']:>6d}"
            f"{r['per_iteration_ms']:>10.2f}{(f'{speed:.1f}' if speed else '1.0'):>9}"
            f"{r['solve_s']:>9.2f}{r['map_s']:>8.2f}{r['total_s']:>9.2f}"
            f"{r['diff_mean'] * 255:>12.3f}{r['diff_mean']:>10.2e}"
            f"{r['true_kernel_relative_error']:>12.2e}{r['map_fallback_colors']:>8d}"
            f"{r['safeguard_repairs']:>9d}  {verdict(r)}"
        )
    for r in records:
        for message in sorted(set(r["warnings"])):
            print(f"  note ({r['backend']}): {message}")
    print(flush=True)


if __name__ == "__main__":
    raise SystemExit(run_program(main))
