"""float32 on a GPU: where a float32 solve of the exact kernel's fused passes stops, against
the rule of ``dtype=None`` (:func:`sketchot.kernels.device.default_dtype`).

For each cloud and ``reg`` (a fraction of the mean squared distance): the spread ``S =
max_cost / reg``, float32's rounding of a pass's exponents ``eps32 * S``, the smallest
accuracy for which the rule takes float32 (``FLOAT32_MARGIN`` times that), and the true-kernel
error (every row and column: exact at these sizes) of the float64 solution and of float32
passes started from it (``--iterations`` of them, tolerance far below either floor: the
error float32's rounding holds the iteration at). ``floor / (eps32 S)`` says how the floor
follows the rounding; the rule is sound where the float32 floor is below its threshold.

The passes are :mod:`sketchot.fused`'s program on CPU tensors under Triton's interpreter
(NumPy's float32 arithmetic, one program at a time: small clouds only), compiled on a CUDA
device where there is one. Each cell in this process, one after the other.

    python benchmarks/float32.py --markdown benchmarks/results/float32.md \\
        --json benchmarks/results/float32.json
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():  # Triton reads it when first imported: its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from _peers import certified
from _results import md_table, write_json, write_text
from small_reg import clouds as small_reg_clouds

import sketchot
import sketchot._arrays
import sketchot.fused
from sketchot.kernels.device import FLOAT32_MARGIN

DATA = ("colours", "uniform", "gauss16")
RELATIVE_REGS = (1.0, 0.1, 0.01, 0.003)
EPS32 = float(np.finfo(np.float32).eps)
DEVICE = "compiled on CUDA" if torch.cuda.is_available() else "Triton's interpreter on the CPU"


def clouds(data: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Photo colours and uniform points (``small_reg.py``'s), Gaussian clouds in d = 16 (the
    norms' form of the program: d > 8) with the target shifted by one standard deviation."""
    if data == "gauss16":
        rng = np.random.default_rng(seed)
        return rng.standard_normal((n, 16)), rng.standard_normal((n, 16)) + 1.0
    return small_reg_clouds("uniform" if data == "uniform" else "photo", n, seed)


def cell(data: str, n: int, relative_reg: float, iterations: int, seed: int) -> dict[str, Any]:
    X, Y = clouds(data, n, seed)
    msd = float((X**2).sum(1).mean() + (Y**2).sum(1).mean() - 2 * X.mean(0) @ Y.mean(0))
    reg = relative_reg * msd
    warnings.simplefilter("ignore")
    reference = sketchot.sinkhorn(None, None, X, Y, reg, backend="exact", accuracy=None,
                                  tol=1e-13, max_iter=20_000, rng=seed)  # fmt: skip
    spread = reference.kernel.geometry.max_cost() / reg
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = (torch.as_tensor(X, device=device), torch.as_tensor(Y, device=device))
    start = time.perf_counter()
    single = sketchot.sinkhorn(None, None, *tensors, reg, backend="exact", dtype=np.float32,
                               max_dense_bytes=0, warmstart=reference.potentials,
                               accuracy=None, tol=1e-12, max_iter=iterations, anderson=0,
                               errors="warn", warn=False, rng=seed)  # fmt: skip
    seconds = time.perf_counter() - start
    host = single.host
    assert host.kernel.fused, "the float32 passes did not run the fused program"
    rounding = EPS32 * max(1.0, spread)
    return {
        "spread": spread,
        "rounding": rounding,
        "threshold": FLOAT32_MARGIN * rounding,
        "error64": certified(X, Y, reg, *reference.potentials, seed, max(X.shape[0], 256)),
        "error32": certified(X, Y, reg, *host.potentials, seed, max(X.shape[0], 256)),
        "iterations": host.n_iter,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[300])
    parser.add_argument("--data", nargs="+", default=list(DATA))
    parser.add_argument("--regs", nargs="+", type=float, default=list(RELATIVE_REGS))
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    sketchot._arrays.HOST_ARRAYS_ON_DEVICE = True  # CPU tensors take the device kernel
    sketchot.fused.CPU_INTERPRETER = True
    rows = []
    for data in args.data:
        for n in args.sizes:
            for reg in args.regs:
                row = {"data": data, "n": n, "reg": reg, **cell(data, n, reg, args.iterations,
                                                                 args.seed)}  # fmt: skip
                rows.append(row)
                print(f"{data} n={n} reg={reg:g}: S={row['spread']:.3g} "
                      f"error64={row['error64']:.2g} error32={row['error32']:.2g} "
                      f"threshold={row['threshold']:.2g} ({row['seconds']:.1f} s)",
                      flush=True)  # fmt: skip
    table = [
        [r["data"], r["n"], f"{r['reg']:g}", f"{r['spread']:.3g}", f"{r['rounding']:.2g}",
         f"{r['threshold']:.2g}", f"{r['error64']:.2g}", f"{r['error32']:.2g}",
         f"{r['error32'] / r['rounding']:.2g}",
         "yes" if r["error32"] <= r["threshold"] else "NO"]
        for r in rows
    ]  # fmt: skip
    header = ["data", "n", "reg", "S = max cost / reg", "eps32 S", "float32 from accuracy",
              "float64 error", "float32 error", "floor / (eps32 S)",
              "floor below rule"]  # fmt: skip
    lines = [
        "# float32 passes: where they stop, against the rule of dtype=None",
        "",
        f"Written by `benchmarks/float32.py` ({DEVICE}). "
        "`reg` is relative to the mean squared distance; errors are the exact true-kernel "
        f"L1 marginal errors (every row and column); float32: {args.iterations} fused passes "
        "started from the float64 solution. The rule takes float32 for accuracies at or above "
        f"`float32 from accuracy` ({FLOAT32_MARGIN:g} x eps32 S).",
        "",
        *md_table(header, table, align="llrrrrrrrl"),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown is not None:
        write_text(args.markdown, text)
    if args.json is not None:
        write_json(args.json, {"seed": args.seed, "iterations": args.iterations, "rows": rows})


if __name__ == "__main__":
    main()
