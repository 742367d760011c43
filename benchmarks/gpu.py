"""Arrays where the users' data lives: sketchot on PyTorch tensors against NumPy, GeomLoss and
POT's torch backend, on the device the tensors are on (``cuda`` when there is one, else the
CPU).

Data: photo pixels of ``images/`` (3-D colours), uniform points in ``[0, 1]^3`` and Gaussian
clouds in d = 64 (the target shifted by one standard deviation along every axis), n points per
side, ``reg`` a fraction of the mean squared distance between the clouds. Methods, each in a
fresh process (its own peak memory), each error certified against the TRUE kernel (the
relative L1 marginal error of the returned potentials, sampled rows and columns with an upper
confidence bound, :meth:`sketchot.SinkhornResult.check_true_kernel`):

``default call``
    ``sketchot.sinkhorn(None, None, X, Y, reg)`` (``backend='auto'``, ``accuracy=1e-3``), on
    NumPy arrays and on tensors; the tensors' row says its time as a ratio to NumPy's.
``default call 1e-6``
    The same at ``accuracy=1e-6`` (the issue's certified-to-1e-6 target), on tensors.
``exact, 100 iterations``
    The streamed exact kernel (``max_dense_bytes=0``), 100 iterations, no check: the cost of
    the kernel's products where the points live (``f32``: its passes in float32); on NumPy,
    on tensors and POT's ``ot.sinkhorn(method='sinkhorn_log')`` on tensors (its dense cost
    matrix, where it fits).
``GeomLoss online / multiscale``
    ``SamplesLoss('sinkhorn', p=2, blur=sqrt(reg / 2), debias=False, potentials=True)`` (its
    cost ``||x - y||^2 / 2`` at ``eps = blur^2``: the same kernel) at ``scaling`` 0.5 and 0.9,
    with KeOps; its error from its potentials, certified the same way.

With ``--passes`` it first times one iteration's two passes of the streamed exact kernel
on the device (:mod:`sketchot.fused`'s one-launch passes in float64 and float32, against the
unfused blocks of the same kernel: ``vs blocks``), each the best of 3 after a warm-up (of 1
at n = 10^6), and one log-domain iteration of the block-local kernel (``polyts_local``, the
small-reg kernel) with its products on NumPy arrays and on the tensors' device (on a CPU,
through the device code: ``sketchot._arrays.HOST_ARRAYS_ON_DEVICE``): ``vs numpy``.

    python benchmarks/gpu.py --quick                  # n = 10^4, 3-D, both regs
    python benchmarks/gpu.py --targets --budget 120   # the issue's GPU target cells only
    python benchmarks/gpu.py --local-passes           # the block-local kernel's iterations only
    python benchmarks/gpu.py --json out.json          # n = 10^4 and 10^5 (cells over --budget skip)
"""

from __future__ import annotations

import argparse
import math
import resource
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _peers import CHECK_SAMPLES, certified, geomloss_potentials
from _results import md_table, write_json, write_text
from _running import CellRunner
from small_reg import clouds as small_reg_clouds

import sketchot
import sketchot._arrays
import sketchot.fused

DATA = ("colours", "uniform", "gauss64")
RELATIVE_REGS = (0.1, 0.01)
METHODS = (
    "default call, numpy",
    "default call, torch",
    "default call 1e-6, torch",
    "exact 100 its, numpy",
    "exact 100 its, torch",
    "exact 100 its f32, torch",
    "POT torch log, 100 its",
    "GeomLoss online 0.5",
    "GeomLoss online 0.9",
    "GeomLoss multiscale 0.5",
    "GeomLoss multiscale 0.9",
)


def clouds(data: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``small_reg.py``'s photo colours and uniform points, and Gaussian clouds in d = 64."""
    if data == "gauss64":
        rng = np.random.default_rng(seed)
        return rng.standard_normal((n, 64)), rng.standard_normal((n, 64)) + 1.0
    return small_reg_clouds("uniform" if data == "uniform" else "photo", n, seed)


def mean_sq_distance(X: np.ndarray, Y: np.ndarray) -> float:
    """``mean_ij ||x_i - y_j||^2``, in closed form (no ``n x m`` array)."""
    return float((X**2).sum(1).mean() + (Y**2).sum(1).mean() - 2 * X.mean(0) @ Y.mean(0))


def device_name() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cell(data: str, n: int, relative_reg: float, method: str, seed: int) -> dict[str, Any]:
    """One method on one problem (run in a fresh process)."""
    import torch

    X, Y = clouds(data, n, seed)
    reg = relative_reg * mean_sq_distance(X, Y)
    device = device_name()
    tensors = (torch.as_tensor(X, device=device), torch.as_tensor(Y, device=device))
    warnings.simplefilter("ignore")
    out: dict[str, Any] = {"n_iter": None, "detail": ""}
    if method.startswith(("default call", "exact 100")):
        points = tensors if method.endswith("torch") else (X, Y)
        accuracy = 1e-6 if "1e-6" in method else 1e-3
        params: dict[str, Any] = {"accuracy": accuracy, "true_kernel_samples": CHECK_SAMPLES}
        if method.startswith("exact"):
            params = {"backend": "exact", "max_dense_bytes": 0, "max_iter": 100, "tol": 1e-300,
                      "accuracy": None, "anderson": 0, "coarse_to_fine": False,
                      "epsilon_scaling": False,
                      "dtype": np.float32 if "f32" in method else np.float64}  # fmt: skip
        synchronize()
        start = time.perf_counter()
        res = sketchot.sinkhorn(None, None, *points, reg, rng=seed, errors="warn", **params)
        synchronize()
        out["seconds"] = time.perf_counter() - start
        out["n_iter"] = res.n_iter
        host = getattr(res, "host", res)
        out["error"] = (
            certified(X, Y, reg, *host.potentials, seed, CHECK_SAMPLES)
            if host.true_kernel is None
            else float(host.true_kernel.bound)
        )
        device_kernel = type(host.kernel).__name__.startswith("Device")
        where = f"products on {host.kernel.geometry.context.device}" if device_kernel else "host"
        out["detail"] = f"{host.backend} ({where})"
        out["result_type"] = type(res.potentials[0]).__module__.split(".")[0]
    elif method.startswith("POT"):
        import ot

        a = torch.full((n,), 1.0 / n, dtype=torch.float64, device=device)
        synchronize()
        start = time.perf_counter()
        M = ot.dist(*tensors)
        _, log = ot.sinkhorn(a, a, M, reg, method="sinkhorn_log", numItermax=100,
                             stopThr=0.0, log=True)  # fmt: skip
        synchronize()
        out["seconds"] = time.perf_counter() - start
        out["n_iter"] = 100
        log_u = (log["log_u"]).cpu().numpy()
        log_v = (log["log_v"]).cpu().numpy()
        out["error"] = certified(X, Y, reg, log_u, log_v, seed, CHECK_SAMPLES)
    else:
        _, backend, scaling = method.split()
        peer = geomloss_potentials(X, Y, reg, float(scaling), backend, device)
        if peer is None:
            return {"failed": "geomloss, pykeops or torch not installed"}
        out["seconds"], log_u, log_v = peer
        out["error"] = certified(X, Y, reg, log_u, log_v, seed, CHECK_SAMPLES)
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def pass_cell(data: str, n: int, relative_reg: float, variant: str, seed: int) -> dict:
    """Seconds of one iteration's two passes (``K^T exp(.)`` after ``K exp(.)``, log domain)
    of the streamed exact kernel on the device: the best of 3 after a warm-up (of 1 at
    n = 10^6)."""
    import torch

    if variant.startswith("blocks"):  # the device kernel as it was before the fused passes
        sketchot.fused.ENABLED = False
    X, Y = clouds(data, n, seed)
    reg = relative_reg * mean_sq_distance(X, Y)
    device = device_name()
    dtype = np.float32 if variant.endswith("float32") else np.float64
    view = sketchot.make_kernel(torch.as_tensor(X, device=device),
                                torch.as_tensor(Y, device=device), reg, "exact",
                                max_dense_bytes=0, dtype=dtype)  # fmt: skip
    kernel = view.host
    log_w = np.full(n, -math.log(n))
    numerator = np.full(n, -math.log(n))
    times = []
    for _ in range(2 if n >= 1_000_000 else 4):  # a warm-up, then the best of the others
        synchronize()
        start = time.perf_counter()
        one = kernel.fused_pass("rows", log_w, numerator, log=True)
        one.projection  # noqa: B018 (the second pass runs when its projection is read)
        synchronize()
        times.append(time.perf_counter() - start)
    tiles = "; ".join("x".join(map(str, tile)) for tile in sketchot.fused.chosen_tiles().values())
    return {"seconds": min(times[1:]), "fused": kernel.fused, "tile": tiles if kernel.fused else ""}


def local_pass_cell(data: str, n: int, relative_reg: float, tau: float, where: str,
                    seed: int) -> dict:  # fmt: skip
    """Seconds of one log-domain iteration of the block-local kernel (``K^T exp(.)`` after
    ``K exp(.)``, uniform weights) built at ``tau`` on NumPy arrays (``where='numpy'``) or
    on tensors whose products run on their device: the best of 3 after a warm-up (of 1 at
    n = 10^6)."""
    import torch

    X, Y = clouds(data, n, seed)
    reg = relative_reg * mean_sq_distance(X, Y)
    points: tuple[Any, Any] = (X, Y)
    if where == "device":
        device = device_name()
        sketchot._arrays.HOST_ARRAYS_ON_DEVICE = True  # on a CPU: the code a GPU runs
        points = (torch.as_tensor(X, device=device), torch.as_tensor(Y, device=device))
    view = sketchot.make_kernel(*points, reg, "polyts_local", rng=seed, tau=tau)
    kernel = getattr(view, "host", view)
    log_w = np.full(n, -math.log(n))
    times = []
    for _ in range(2 if n >= 1_000_000 else 4):  # a warm-up, then the best of the others
        synchronize()
        start = time.perf_counter()
        kernel.fused_pass("rows", log_w, log_w, log=True).projection  # noqa: B018
        synchronize()
        times.append(time.perf_counter() - start)
    products = "numpy" if where == "numpy" else f"torch {device}"
    return {"seconds": min(times[1:]), "clusters": kernel.info.params["clusters"],
            "products": products}  # fmt: skip


#: ``--passes``: the block-local kernel's cells (data, n, reg, tau: the ``tau`` its
#: ``'auto'`` takes there on two CPU cores, fixed so that both sides run the same kernel).
LOCAL_PASS_GRID = (("colours", 100_000, 0.01, 1.0), ("uniform", 100_000, 0.01, 4.0),
                   ("colours", 1_000_000, 0.01, 1.0))  # fmt: skip


def local_passes(runner: Any, seed: int) -> list[dict[str, Any]]:
    """The block-local rows of the ``--passes`` table (NumPy first: the baseline)."""
    rows = []
    print("| data | n | reg | tau | products | iteration s | vs numpy | clusters |")
    print("|---|---:|---:|---:|---|---:|---:|---|")
    for data, n, reg, tau in LOCAL_PASS_GRID:
        base = None
        for where in ("numpy", "device"):
            row: dict[str, Any] = {"data": data, "n": n, "reg": reg, "tau": tau, "where": where}
            row.update(runner(local_pass_cell, data, n, reg, tau, where, seed)
                       or {"skipped": "stopped at the budget"})  # fmt: skip
            if where == "numpy":
                base = row.get("seconds")
            ratio = f"{row['seconds'] / base:.2f}x" if base and "seconds" in row else ""
            row["vs_numpy"] = ratio
            rows.append(row)
            shown = row.get("skipped") or f"{row['seconds']:.3f}"
            print(f"| {data} | {n} | {reg:g} | {tau:g} | {row.get('products', where)} | {shown} "
                  f"| {ratio} | {row.get('clusters', '')} |", flush=True)  # fmt: skip
    return rows


#: ``--targets``: the issue's GPU targets (one H100: 1e5 colours at reg 0.01 certified to 1e-6
#: under 2 s; 1e6 under 30 s; d = 64 exact streamed at 5e4, 100 iterations, against
#: FlashSinkhorn's 1.45 s) and GeomLoss multiscale on the first, in one short run.
TARGET_CELLS = (
    ("colours", 100_000, 0.01, "default call 1e-6, torch"),
    ("colours", 100_000, 0.01, "default call, torch"),
    ("colours", 100_000, 0.01, "GeomLoss multiscale 0.9"),
    ("gauss64", 50_000, 0.1, "exact 100 its f32, torch"),
    ("colours", 1_000_000, 0.01, "default call, torch"),
)

PASS_GRID = (("colours", 10_000), ("colours", 100_000), ("gauss64", 50_000),
             ("uniform", 1_000_000))  # fmt: skip
PASS_VARIANTS = ("fused float64", "fused float32", "blocks float64")


def passes(runner: Any, seed: int, budget_entries: float) -> list[dict[str, Any]]:
    """The ``--passes`` table: each cell of :data:`PASS_GRID` in each variant (the blocks
    skipped past ``budget_entries`` kernel entries: a pass writes every entry several
    times)."""
    rows = []
    print("| data | n | variant | iteration s | vs blocks | tile |")
    print("|---|---:|---|---:|---:|---|")
    for data, n in PASS_GRID:
        base = None
        for variant in reversed(PASS_VARIANTS):  # the baseline first
            row: dict[str, Any] = {"data": data, "n": n, "variant": variant}
            if variant.startswith("blocks") and n * n > budget_entries:
                row["skipped"] = f"n^2 over {budget_entries:.0e} entries"
            else:
                out = runner(pass_cell, data, n, 0.1, variant, seed)
                row.update(out or {"skipped": "stopped at the budget"})
            if variant.startswith("blocks"):
                base = row.get("seconds")
            ratio = f"{base / row['seconds']:.0f}x" if base and "seconds" in row else ""
            row["vs_blocks"] = ratio
            rows.append(row)
            shown = row.get("skipped") or f"{row['seconds']:.4f}"
            print(f"| {data} | {n} | {variant} | {shown} | {ratio} | {row.get('tile', '')} |",
                  flush=True)  # fmt: skip
    return rows


def estimated_seconds(method: str, data: str, n: int) -> float:
    """A rough cost model (two CPU cores) to skip cells past the budget; on a CUDA device
    only the NumPy cells are estimated (the CellRunner stops the others at the budget)."""
    if device_name() == "cuda" and not method.endswith("numpy"):
        return 0.0
    d = 64 if data == "gauss64" else 3
    if method.startswith("exact") or method.startswith("POT"):
        return 200 * n * n * 2e-9 * (d / 3) ** 0.5
    if "online" in method:
        return 30.0 * (n / 1e4) ** 2 * (d / 3) ** 0.5
    if "multiscale" in method:
        return 1.5 * (n / 1e4) ** 1.2 if d <= 3 else 30.0 * (n / 1e4) ** 2
    # the default call: 0.7-2.9 s at 10^4 and 3.8-47 s at 10^5 (gpu_cpu_tensors.md)
    return 3.0 * (n / 1e4) ** 1.2 * (d / 3)


def report(rows: list[dict[str, Any]], device: str, pass_rows: list[dict[str, Any]],
           local_rows: list[dict[str, Any]]) -> str:  # fmt: skip
    lines = [
        f"# sketchot on PyTorch tensors ({device}) against NumPy and peers",
        "",
        "Written by `benchmarks/gpu.py`. Time of each method on the same problem in the same run "
        "(each in a fresh process); `vs numpy` is the time over the same call on NumPy arrays. "
        f"Error: certified true-kernel L1 marginal error (upper bound, {CHECK_SAMPLES} sampled "
        "rows and columns). `reg` is relative to the mean squared distance.",
        "",
    ]
    base = {
        (r["data"], r["n"], r["reg"], r["method"].rsplit(",", 1)[0]): r.get("seconds")
        for r in rows
        if r["method"].endswith("numpy")
    }
    table = []
    for r in rows:
        key = (r["data"], r["n"], r["reg"], r["method"].rsplit(",", 1)[0])
        ratio = ""
        if r["method"].endswith("torch") and base.get(key) and r.get("seconds"):
            ratio = f"{r['seconds'] / base[key]:.2f}x"
        if "skipped" in r:
            table.append([r["data"], r["n"], r["reg"], r["method"], r["skipped"], "", "", "", ""])
            continue
        table.append([
            r["data"], r["n"], r["reg"], r["method"], f"{r['seconds']:.2f}", ratio,
            r["n_iter"] if r["n_iter"] is not None else "-", f"{r['error']:.2g}", r["detail"],
        ])  # fmt: skip
    header = ["data", "n", "reg", "method", "time s", "vs numpy", "its", "error", "kernel"]
    if table:  # --local-passes runs no cells
        lines += md_table(header, table, align="lllllrrrl")
    if pass_rows:
        lines += ["", "One iteration's two passes of the streamed exact kernel (reg 0.1 of the "
                  "mean squared distance), best of 3 (1 at n = 1e6):", ""]  # fmt: skip
        lines += md_table(
            ["data", "n", "variant", "iteration s", "vs blocks", "tile (M x N x warps x dot)"],
            [[r["data"], r["n"], r["variant"], r.get("skipped") or f"{r['seconds']:.4f}",
              r["vs_blocks"], r.get("tile", "")] for r in pass_rows],
            align="lllrrl",
        )  # fmt: skip
    if local_rows:
        lines += ["", "One log-domain iteration of the block-local kernel (`polyts_local`, "
                  "uniform weights, `tau` fixed) with its products on NumPy arrays and on "
                  "the tensors' device, best of 3 (1 at n = 1e6):", ""]  # fmt: skip
        lines += md_table(
            ["data", "n", "reg", "tau", "products", "iteration s", "vs numpy", "clusters"],
            [[r["data"], r["n"], r["reg"], r["tau"], r.get("products", r["where"]),
              r.get("skipped") or f"{r['seconds']:.3f}", r["vs_numpy"], r.get("clusters", "")]
             for r in local_rows],
            align="lllllrrl",
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--targets", action="store_true",
                        help="only the issue's GPU target cells (TARGET_CELLS)")  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=300.0, help="skip or stop slower cells (s)")
    parser.add_argument("--data", nargs="+", default=list(DATA))
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000])
    parser.add_argument("--regs", nargs="+", type=float, default=list(RELATIVE_REGS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--passes", action="store_true", help="time the exact kernel's passes")
    parser.add_argument("--local-passes", action="store_true",
                        help="only the block-local kernel's iterations (of --passes)")  # fmt: skip
    parser.add_argument("--pass-block-entries", type=float, default=2e10,
                        help="the unfused blocks' largest n^2 in --passes")  # fmt: skip
    args = parser.parse_args()
    cells = None  # (data, n, reg, method), when a preset names its cells one by one
    if args.targets:
        cells = TARGET_CELLS
        grid = []
    elif args.local_passes:
        cells, grid = [], []
    elif args.quick:
        grid = [("colours", 10_000, reg) for reg in RELATIVE_REGS]
    else:
        grid = [
            (data, n, reg)
            for data in args.data
            for n in args.sizes
            for reg in args.regs
            if not (data == "gauss64" and reg != 0.1)  # the d = 64 cell: reg 0.1 only
        ]
    device = device_name()
    print(f"device: {device}")
    print("| data | n | reg | method | time s | iterations | error | kernel |")
    print("|---|---:|---:|---|---:|---:|---:|---|")
    rows = []
    runner = CellRunner(args.budget, fresh=True)
    pass_rows = passes(runner, args.seed, args.pass_block_entries) if args.passes else []
    local_rows = local_passes(runner, args.seed) if args.passes or args.local_passes else []
    if cells is None:
        cells = [(data, n, reg, method) for data, n, reg in grid for method in args.methods]
    for data, n, reg, method in cells:
        row: dict[str, Any] = {"data": data, "n": n, "reg": reg, "method": method}
        estimate = estimated_seconds(method, data, n)
        if method.startswith("POT") and n * n * 8 > (2 << 30):
            row["skipped"] = "dense cost over 2 GiB"
        elif estimate > args.budget:
            row["skipped"] = f"estimated {estimate:.0f} s > budget {args.budget:g} s"
        else:
            try:
                out = runner(cell, data, n, reg, method, args.seed)
            except Exception as exc:  # a peer that cannot run this cell says why
                out = {"failed": f"{type(exc).__name__}: {str(exc)[:80]}"}
            if out is None:
                row["skipped"] = f"stopped at the budget {args.budget:g} s"
            elif "failed" in out:
                row["skipped"] = out["failed"]
            else:
                row.update(out)
        rows.append(row)
        if "skipped" in row:
            print(f"| {data} | {n} | {reg:g} | {method} | {row['skipped']} | | | |", flush=True)
        else:
            print(f"| {data} | {n} | {reg:g} | {method} | {row['seconds']:.2f} | "
                  f"{row['n_iter'] or '-'} | {row['error']:.2g} | {row['detail']} |",
                  flush=True)  # fmt: skip
    runner.close()
    text = report(rows, device, pass_rows, local_rows)
    print(text)
    if args.markdown is not None:
        write_text(args.markdown, text)
    if args.json is not None:
        write_json(args.json, {"device": device, "seed": args.seed, "rows": rows,
                               "passes": pass_rows, "local_passes": local_rows})  # fmt: skip


if __name__ == "__main__":
    main()
