"""Recolour a photograph with the palette of another (entropic optimal transport, sketchot).

With no arguments it runs on the project's default pair (images/default_source.png, a sunset,
and images/default_target.png, a daylight coast). Every run writes into outputs/ next to
examples/ (created on demand, ignored by git) unless ``--out`` names another path, so a run
from a clone never leaves files in its tree::

    python examples/color_transfer.py
    python examples/color_transfer.py SOURCE TARGET   # outputs/SOURCE_recolored.png, ...
    python examples/color_transfer.py SOURCE TARGET --out recoloured.png
    python examples/color_transfer.py --out images/color_transfer.png   # the README's figure
    python examples/color_transfer.py --reg 0.01 --n-samples 20000
    python examples/color_transfer.py --backend nystrom --rank 500 --reg 1

``--backend auto`` (the default) picks the cheapest kernel that meets ``--accuracy`` against the
true kernel; a named backend is used as it is.

Steps (each printed with its timing): sample ``--n-samples`` colours from each image, build the
kernel ``exp(-||x - y||^2 / reg)`` of the chosen backend and run Sinkhorn (marginal error at
every check), map EVERY pixel of the source (and of the target, back) with the entropic map,
and check the scalings against the exact kernel. Writes the recoloured image(s) and a figure
(images and colour distributions side by side).

Images with an alpha channel keep it: fully transparent pixels are not sampled, and the
recoloured images are RGBA with the input's alpha unchanged (write them as .png, .tif or
.webp). Image files above Pillow's decompression-bomb threshold are refused before decoding
(``--max-pixels`` sets another limit, 0 none).

Outputs are checked before any work (folder exists and is writable, no output is an input or
another output) and written all together: a failure or Ctrl-C leaves every old output as it
was, and no temporary file. Images are mapped at full resolution as 8-bit integers (about
9 bytes per pixel in all). Bad input gets one ``error: ...`` line on stderr and exit code 2;
an image too large for the available memory exit code 1, an interruption exit code 130, and
a transfer whose scalings miss ``--accuracy`` against the true kernel exit code 3 with one
``error:`` line saying by how much (its outputs are written, the figure says it missed).
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
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import sketchot
from sketchot.color import (
    DEFAULT_BACKEND,
    DEFAULT_N_SAMPLES,
    DEFAULT_REG,
    OutputSet,
    transfer_colors,
)
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
from sketchot.color.figures import color_transfer_figure, figure_writer
from sketchot.color.images import image_writer
from sketchot.color.steps import Steps

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
DEFAULT_SOURCE = IMAGES / "default_source.png"
DEFAULT_TARGET = IMAGES / "default_target.png"
#: Untracked (.gitignore): running the demo never changes the files of a clone.
OUTPUTS = ROOT / "outputs"
DEFAULT_OUT = OUTPUTS / "color_transfer.png"

#: Exit code of a transfer that missed its accuracy target.
EXIT_ACCURACY_MISSED = 3


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="color_transfer.py",
        description="Recolour SOURCE with the palette of TARGET by entropic optimal transport.",
        epilog="With no SOURCE and TARGET: the embedded default pair. Outputs go to outputs/ "
        "(next to examples/, ignored by git) unless --out names another path.",
    )
    parser.add_argument("source", nargs="?", type=Path, help="image to recolour")
    parser.add_argument("target", nargs="?", type=Path, help="image whose palette to use")
    parser.add_argument(
        "--backend",
        choices=("auto", *sketchot.available_backends()),
        default=DEFAULT_BACKEND,
        help=f"kernel backend (default {DEFAULT_BACKEND}: the cheapest that meets --accuracy)",
    )
    parser.add_argument(
        "--reg", type=positive_float, default=DEFAULT_REG,
        help=f"entropic regularisation for colours in [0, 1] (default {DEFAULT_REG})",
    )  # fmt: skip
    parser.add_argument(
        "--n-samples", type=positive_int, default=DEFAULT_N_SAMPLES,
        help=f"colours sampled from each image (default {DEFAULT_N_SAMPLES})",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--replace", action="store_true", help="sample pixels with replacement (as POT's demo)"
    )
    parser.add_argument(
        "--weighted", action="store_true",
        help="sample distinct colours, weighted by their pixel counts",
    )  # fmt: skip
    add_max_pixels_option(parser)
    group = parser.add_argument_group("backend parameters")
    group.add_argument(
        "--rank", type=positive_int,
        help="low-rank backends: number of features (default 400, at most the sample size)",
    )  # fmt: skip
    group.add_argument(
        "--landmarks", choices=("uniform", "kcenter"), help="nystrom: landmark selection"
    )
    group.add_argument("-m", "--sketch-dim", type=positive_int, help="polyts: sketch dimension")
    group.add_argument("-r", "--degree", type=positive_int, help="polyts: polynomial degree")
    group.add_argument("-k", "--coreset-size", type=positive_int, help="polyts: coreset size")
    solver = parser.add_argument_group("solver")
    solver.add_argument("--max-iter", type=positive_int, default=1000, help="(default 1000)")
    solver.add_argument(
        "--tol", type=positive_float, default=None,
        help="POT's L2 stopping criterion (default: stop at the accuracy)",
    )  # fmt: skip
    solver.add_argument(
        "--accuracy", type=positive_float, default=sketchot.SolverOptions.accuracy,
        help="relative L1 marginal error against the true kernel that the scalings must meet "
        f"(default {sketchot.SolverOptions.accuracy:g})",
    )  # fmt: skip
    solver.add_argument(
        "--safeguard", choices=("exact", "clip", "raise"), default="exact",
        help="non-positive approximate denominators: recompute exactly (default), clip, raise",
    )  # fmt: skip
    outputs = parser.add_argument_group("outputs")
    outputs.add_argument(
        "--out", type=Path,
        help="recoloured source image (default: outputs/color_transfer.png for the "
        "default pair, outputs/SOURCE_recolored.png otherwise; outputs/ is git-ignored)",
    )  # fmt: skip
    outputs.add_argument(
        "--no-inverse", action="store_true",
        help="do not also recolour the target with the source palette (OUT_inverse.png)",
    )  # fmt: skip
    outputs.add_argument("--figure", type=Path, help="figure path (default OUT_figure.png)")
    outputs.add_argument("--no-figure", action="store_true", help="do not draw the figure")
    return parser


def backend_params(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """Backend parameters from the options, refusing options of another backend."""
    params: dict = {}
    if args.rank is not None:
        if args.backend == "auto" or sketchot.get_backend(args.backend).rank_parameter is None:
            parser.error(f"--rank applies to low-rank backends, not {args.backend}")
        params["rank"] = args.rank
    if args.landmarks is not None:
        if args.backend != "nystrom":
            parser.error(f"--landmarks applies to backend nystrom, not {args.backend}")
        params["landmarks"] = args.landmarks
    for option, name in (
        ("sketch_dim", "sketch_dim"), ("degree", "degree"), ("coreset_size", "coreset_size")
    ):  # fmt: skip
        value = getattr(args, option)
        if value is not None:
            if args.backend != "polyts":
                flag = "--" + option.replace("_", "-")
                parser.error(f"{flag} applies to backend polyts, not {args.backend}")
            params[name] = value
    return params


def output_paths(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """(recoloured, inverse or None, figure or None, OutputSet), all checked before any work."""
    if args.out is not None:
        out = args.out
    else:  # never the current folder: a run from a clone leaves its tree clean
        OUTPUTS.mkdir(exist_ok=True)
        out = DEFAULT_OUT if args.source is None else OUTPUTS / f"{args.source.stem}_recolored.png"
    outputs = OutputSet()
    outputs.add(out, "--out", "image")
    inverse = None
    if not args.no_inverse:
        inverse = out.with_name(f"{out.stem}_inverse{out.suffix}")
        outputs.add(inverse, "the inverse image (from --out)", "image")
    figure = None
    if not args.no_figure:
        if args.figure is not None:
            figure = outputs.add(args.figure, "--figure", "figure")
        else:
            figure = outputs.add(out.with_name(f"{out.stem}_figure.png"), "the figure (from --out)")
    source = args.source if args.source is not None else DEFAULT_SOURCE
    target = args.target if args.target is not None else DEFAULT_TARGET
    check_outputs(parser, outputs, [("SOURCE", source), ("TARGET", target)])
    return out, inverse, figure, outputs


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
    params = backend_params(args, parser)
    out, inverse_out, figure_out, outputs = output_paths(args, parser)
    source = args.source if args.source is not None else DEFAULT_SOURCE
    target = args.target if args.target is not None else DEFAULT_TARGET

    steps = Steps()  # each step (loading, sampling, ...) shown live once it runs a few seconds
    say = steps.say
    say(f"source {source}\n{' ' * 12}target {target}")
    try:
        steps.start("loading")
        with redirect_stdout(steps.lines()):  # the solver's lines go above the live step
            run = transfer_colors(
                source,
                target,
                reg=args.reg,
                backend=args.backend,
                n_samples=args.n_samples,
                rng=args.seed,
                replace=args.replace,
                weighted=args.weighted,
                inverse=inverse_out is not None,
                max_iter=args.max_iter,
                tol=args.tol,
                safeguard=args.safeguard,
                accuracy=args.accuracy,
                verbose=True,
                progress=say,
                compact=True,  # uint8 images: full-resolution photographs in bounded memory
                max_pixels=max_pixels_of(args),
                **params,
            )
        result = run.result
        if result.reason:
            say(f"backend {result.backend}: {result.reason}")
        say(f"true-kernel check: {run.check}")
        missed = not result.accuracy_met
        say(
            f"mapped {run.forward.n_pixels} pixels ({run.forward.n_colors} distinct colours) in "
            f"{run.forward.seconds:.2f} s; exact-kernel fallbacks: {run.forward.n_fallbacks} "
            f"colours; pixels clipped to [0, 1]: {run.forward.n_clipped}"
        )
        writers = [(out, image_writer(run.image, out, name="result"))]
        if inverse_out is not None:
            writers.append(
                (inverse_out, image_writer(run.inverse_image, inverse_out, name="inverse result"))
            )
        if figure_out is not None:
            say("drawing the figure")
            panels = [("source", run.source), ("target", run.target)]
            panels.append(("source with the target's palette", run.image))
            if run.inverse_image is not None:
                panels.append(("target with the source's palette", run.inverse_image))
            shown = ", ".join(f"{k}={v}" for k, v in run.backend_params.items())
            title = (
                f"sketchot colour transfer: backend={run.backend}"
                f"{' -> ' + result.backend if run.backend == 'auto' else ''}"
                f"{' (' + shown + ')' if shown else ''}, reg={run.reg:g}, "
                f"{len(run.source_sample)} samples; Sinkhorn {result.n_iter} it. x "
                f"{result.timings['per_iteration'] * 1e3:.1f} ms, mapping "
                f"{run.forward.n_pixels / 1e6:.2f} Mpx in {run.forward.seconds:.2f} s"
            )
            if missed:
                title += (
                    f"\nAPPROXIMATION MISSED accuracy={args.accuracy:g}: true-kernel error up "
                    f"to {run.check.bound:.2g}"
                )
            figure = color_transfer_figure(panels, title=title, rng=args.seed)
            writers.append((figure_out, figure_writer(figure, figure_out)))
        steps.start("writing")
        with outputs:  # all written, or (error, Ctrl-C) none: the old files stay
            for path, writer in writers:
                outputs.write(path, writer)
        steps.finish()
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

    timings = run.timings
    print()
    print("timings (s)")
    for key in ("load", "sample", "build", "iterations", "map", "inverse_map", "check", "total"):
        if key in timings:
            print(f"  {key:<12} {timings[key]:8.3f}")
    print(f"  per iteration {result.timings['per_iteration'] * 1e3:.2f} ms ({result.n_iter} it.)")
    for path, _ in writers:
        print(f"wrote {path}")
    if missed:
        print(
            f"error: backend {result.backend!r} missed accuracy={args.accuracy:g}: the scalings "
            f"miss the true kernel's marginals by up to {run.check.bound:.2g} (relative L1). "
            f"{result.advice}",
            file=sys.stderr,
        )
        return EXIT_ACCURACY_MISSED
    return 0


if __name__ == "__main__":
    raise SystemExit(run_program(main))
