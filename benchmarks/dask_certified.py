"""Sinkhorn on Dask at small reg, to a certified accuracy: the cells of issue 45.

Data made on the workers, chunk by chunk, from a seed:

* ``uniform``: points uniform in ``[0, 1]^3`` (``dask.array.random.default_rng``);
* ``colours``: the pixels of a real photograph resampled: each chunk draws rows of
  ``images/default_source.png`` (X) or ``images/default_target.png`` (Y) with replacement and
  adds a uniform dither within their 8-bit quantisation cell (``+-0.5 / 255``), so that
  ``n`` may exceed the photograph's pixel count. The pixels reach the workers once
  (``client.scatter(..., broadcast=True)``).

Each cell (data, ``reg``, ``n``) runs ``sketchot.sinkhorn(None, None, X, Y, reg,
backend=--backend, accuracy=--accuracy, rng=seed)`` on a fresh ``LocalCluster(n_workers=
--workers, threads_per_worker=1)`` and reports: the wall time, the backend used, iterations,
whether the true-kernel check certifies the accuracy (and its bound), the peak resident
memory of each worker (sampled every 10 ms, the worker's baseline included), the bytes the
workers sent (to each other and to the client: ``transfer_outgoing_bytes_total``) per
iteration, and the number of graph submissions (``Client.compute``/``persist``/``gather``
and ``dask.compute`` calls from this process) with the wall time not spent in tasks per
submission (wall time minus the busiest worker's task time, over the submissions: the
scheduler's and client's overhead). ``--memory-baseline`` also runs the same call on the
same data in memory (NumPy, this process, as many threads as workers) at sizes up to
``--memory-max-n``, and reports Dask / memory.

The workers start with the allocator settings the docs advise (:data:`WORKER_MALLOC`;
``--dask-malloc``: Dask's own). ``--block-points P1 P2 ...`` runs each Dask cell once per
value with the block-local kernel's points per block set to it
(``sketchot.distributed.local.BLOCK_POINTS``; 0: the library's default); the table gives
the blocks per cloud beside the backend, and the memory baseline runs after the last.

``--json`` / ``--md`` write the numbers (``benchmarks/results/dask_certified.json`` / ``.md``
by default). Ctrl-C stops the run; cells that finished are written.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from _results import md_table, write_json, write_text
from dask_scale import PeakMonitor, _rss, _worker_peak, _worker_setup
from PIL import Image

import sketchot

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
IMAGES = {"X": "default_source.png", "Y": "default_target.png"}


def photo_pixels(side: str) -> np.ndarray:
    """The photograph's pixels of ``side`` as float32 in ``[0, 1]``, shape ``(H W, 3)``."""
    with Image.open(REPO / "images" / IMAGES[side]) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32).reshape(-1, 3)
    return pixels / 255.0


def _resampled_chunk(pixels: np.ndarray, rows: int, seed: int, block: int) -> np.ndarray:
    """``rows`` colours drawn from ``pixels`` with replacement, dithered in their 8-bit cell
    (the generator of chunk ``block`` of seed ``seed``: any chunking of the same seed gives
    each chunk its own stream)."""
    rng = np.random.default_rng([seed, block])
    chosen = pixels[rng.integers(0, pixels.shape[0], size=rows)].astype(np.float64)
    chosen += rng.uniform(-0.5 / 255.0, 0.5 / 255.0, size=chosen.shape)
    return np.clip(chosen, 0.0, 1.0)


def _uniform_chunk(rows: int, seed: int, block: int) -> np.ndarray:
    """``rows`` points uniform in ``[0, 1]^3`` (chunk ``block`` of seed ``seed``)."""
    return np.random.default_rng([seed, block]).random((rows, 3))


def make_data(kind: str, n: int, chunk: int, seed: int, client: Any = None):
    """``(X, Y)``: Dask arrays made on the workers (``client`` given, persisted) or NumPy
    arrays made in this process by the same chunk functions (``client=None``): the same
    numbers either way."""
    sizes = [min(chunk, n - start) for start in range(0, n, chunk)]
    out = []
    for index, side in enumerate(("X", "Y")):
        side_seed = seed * 2 + index
        source = None if kind == "uniform" else photo_pixels(side)

        def block(rows: int, b: int, pixels: Any = source, s: int = side_seed) -> Any:
            if kind == "uniform":
                return (_uniform_chunk, rows, s, b)
            return (_resampled_chunk, pixels, rows, s, b)

        if client is None:
            parts = [f(*rest) for f, *rest in (block(rows, b) for b, rows in enumerate(sizes))]
            out.append(np.concatenate(parts))
            continue
        import dask
        import dask.array as da

        if source is not None:
            source = client.scatter(source, broadcast=True)
        parts = []
        for b, rows in enumerate(sizes):
            f, *rest = block(rows, b, source)
            parts.append(da.from_delayed(dask.delayed(f)(*rest), (rows, 3), dtype=np.float64))
        out.append(da.concatenate(parts).persist())
    return out[0], out[1]


class Submissions:
    """Counts the graph submissions this process makes while it is entered."""

    def __init__(self) -> None:
        self.count = 0
        self._patched: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Submissions:
        import dask
        from dask.distributed import Client

        for owner, name in ((Client, "compute"), (Client, "persist"), (Client, "gather"),
                            (dask, "compute"), (dask, "persist")):  # fmt: skip
            original = getattr(owner, name)
            self._patched.append((owner, name, original))
            setattr(owner, name, self._counted(original))
        return self

    def _counted(self, original):
        def counted(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)

        return counted

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)


def _sent_bytes(dask_worker: Any) -> int:
    return int(dask_worker.transfer_outgoing_bytes_total)


#: The workers' allocator settings the docs advise (Dask's nanny sets
#: ``MALLOC_TRIM_THRESHOLD_=65536``, which returns every freed block to the system at once):
#: ``--dask-malloc`` keeps Dask's.
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": 2**30, "MALLOC_MMAP_THRESHOLD_": 2**25}


def solve_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    log_domain = {"auto": "auto", "true": True, "false": False}[args.log_domain]
    return {"accuracy": args.accuracy, "rng": args.seed, "errors": "warn", "log_domain": log_domain}


def summary(result: Any, seconds: float) -> dict[str, Any]:
    check = getattr(result, "true_kernel", None)
    return {
        "seconds": seconds,
        "backend": result.backend,
        "n_iter": int(result.n_iter),
        "certified": result.accuracy_met,
        "bound": None if check is None else float(check.bound),
        "value_linear": float(result.value_linear),
        "status": result.status,
        "blocks": result.kernel.info.params.get("blocks"),
    }


def on_cluster(kind, n, reg, args, block_points=None) -> dict[str, Any]:
    """The Dask cell; ``block_points`` (if given) replaces the block-local kernel's points
    per block for this run (read on the client when the blocks are cut)."""
    from sketchot.distributed import local

    default = local.BLOCK_POINTS
    local.BLOCK_POINTS = block_points or default
    try:
        return _on_cluster(kind, n, reg, args)
    finally:
        local.BLOCK_POINTS = default


def _on_cluster(kind, n, reg, args) -> dict[str, Any]:
    from dask.distributed import Client, LocalCluster, get_task_stream

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    import dask

    chunk = min(args.chunk, max(1, n // (2 * args.workers)))
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    if not args.dask_malloc:  # the docs' advice (docs/user_guide/dask.rst)
        environ.update(WORKER_MALLOC)
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": environ}),
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                     dashboard_address=None, memory_limit=0) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        X, Y = make_data(kind, n, chunk, args.seed, client)
        client.run(_worker_setup)
        sent_before = client.run(_sent_bytes)
        with get_task_stream(client) as stream, Submissions() as submissions:
            start = time.perf_counter()
            result = sketchot.sinkhorn(
                None, None, X, Y, reg, args.backend, dtype=args.dtype, **solve_kwargs(args)
            )
            seconds = time.perf_counter() - start
        peaks = client.run(_worker_peak)
        sent = sum(client.run(_sent_bytes).values()) - sum(sent_before.values())
    busy: dict[str, float] = {}
    for task in stream.data:
        for part in task.get("startstops", ()):
            if part.get("action") == "compute":
                worker = task.get("worker", "?")
                busy[worker] = busy.get(worker, 0.0) + part["stop"] - part["start"]
    out = summary(result, seconds)
    calls = max(1, submissions.count)
    out.update(
        chunk_rows=chunk,
        worker_peak_gb=[peaks[w] / 2**30 for w in sorted(peaks)],
        sent_mb_per_iteration=sent / 2**20 / max(1, out["n_iter"]),
        submissions=submissions.count,
        overhead_s_per_submission=max(0.0, seconds - max(busy.values(), default=0.0)) / calls,
    )
    return out


def in_memory(kind, n, reg, args) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    chunk = min(args.chunk, max(1, n // (2 * args.workers)))
    X, Y = make_data(kind, n, chunk, args.seed)
    monitor = PeakMonitor()
    start = time.perf_counter()
    with sketchot.thread_limit(args.workers), threadpool_limits(args.workers):
        result = sketchot.sinkhorn(
            None, None, X, Y, reg, args.backend, dtype=args.dtype, **solve_kwargs(args)
        )
    out = summary(result, time.perf_counter() - start)
    out["peak_gb"] = monitor.stop() / 2**30
    return out


def _backend(run: dict[str, Any]) -> str:
    """The backend, with the block-local kernel's blocks per cloud."""
    blocks = run.get("blocks")
    return run["backend"] + (f" ({blocks[0]} + {blocks[1]} blocks)" if blocks else "")


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# Dask at small reg, certified to {data['accuracy']}: backend={data['backend']!r}, "
        f"{data['workers']} workers x 1 thread, dtype {data['dtype']}",
        "",
        f"Machine: {data['machine']}; sketchot {data['versions']['sketchot']}, dask "
        f"{data['versions']['dask']}; workers' allocator: "
        f"`{data.get('worker_malloc', 'dask default')}`",
        "",
    ]
    rows = []
    for cell in data["cells"]:
        d, m = cell.get("dask"), cell.get("memory")
        head = [cell["data"], f"{cell['reg']:g}", f"{cell['n']:.0e}"]
        if d:
            ratio = f"{d['seconds'] / m['seconds']:.2f}" if m else ""
            rows.append([*head,
                "Dask", _backend(d), f"{d['seconds']:.1f}", d["n_iter"],
                _certificate(d), ", ".join(f"{p:.2f}" for p in d["worker_peak_gb"]),
                f"{d['sent_mb_per_iteration']:.2f}", d["submissions"],
                f"{d['overhead_s_per_submission']:.3f}", ratio,
                f"{cell['load'][0]:.1f} -> {cell['load'][1]:.1f}",
            ])  # fmt: skip
        if m:
            rows.append([*head,
                "memory", m["backend"], f"{m['seconds']:.1f}", m["n_iter"], _certificate(m),
                f"{m['peak_gb']:.2f} (process)", "", "", "", "", "",
            ])  # fmt: skip
        if cell.get("error"):
            rows.append([*head, "Dask", "", "", "", cell["error"], "", "", "", "", "", ""])
    lines += md_table(
        ["data", "reg", "n", "where", "backend", "seconds", "iterations", "certified (bound)",
         "peak GB per worker", "MB sent / iteration", "submissions", "overhead s / submission",
         "Dask / memory", "load"],
        rows, "lrrllrrlrrrrrl",
    )  # fmt: skip
    return "\n".join(lines) + "\n"


def _certificate(run: dict[str, Any]) -> str:
    bound = "" if run["bound"] is None else f" ({run['bound']:.1e})"
    return ("yes" if run["certified"] else "NO") + bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="*", default=["colours", "uniform"],
                        choices=["colours", "uniform"])  # fmt: skip
    parser.add_argument("--regs", type=float, nargs="*", default=[0.01, 0.001])
    parser.add_argument("--sizes", type=float, nargs="*", default=[1e6])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--accuracy", type=float, default=1e-3)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float32")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=250_000)
    parser.add_argument(
        "--log-domain",
        choices=("auto", "true", "false"),
        default="auto",
        help="sinkhorn's log_domain, in memory and on Dask",
    )
    parser.add_argument("--memory-baseline", action="store_true")
    parser.add_argument(
        "--dask-malloc",
        action="store_true",
        help="start the workers with Dask's allocator settings, not WORKER_MALLOC",
    )
    parser.add_argument("--memory-max-n", type=float, default=1e6)
    parser.add_argument(
        "--block-points",
        type=int,
        nargs="*",
        default=[None],
        help="points per block of the block-local kernel on Dask, one run per value "
        "(sketchot.distributed.local.BLOCK_POINTS; default: the library's)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=RESULTS / "dask_certified.json")
    parser.add_argument("--md", type=Path, default=RESULTS / "dask_certified.md")
    args = parser.parse_args()
    import dask

    data: dict[str, Any] = {
        "accuracy": args.accuracy, "backend": args.backend, "dtype": args.dtype,
        "workers": args.workers, "cells": [],
        "worker_malloc": "dask's default" if args.dask_malloc else WORKER_MALLOC,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GB",
        "versions": {"sketchot": sketchot.__version__, "dask": dask.__version__},
        "client_rss_gb_at_start": _rss() / 2**30,
    }  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):
        for kind in args.data:
            for reg in args.regs:
                for n, points in itertools.product((int(s) for s in args.sizes), args.block_points):
                    cell: dict[str, Any] = {"data": kind, "reg": reg, "n": n,
                                            "block_points": points}  # fmt: skip
                    load = [os.getloadavg()[0]]
                    try:
                        cell["dask"] = on_cluster(kind, n, reg, args, points)
                        print(f"{kind} reg={reg:g} n={n:.0e} Dask: {cell['dask']}", flush=True)
                        last = points == args.block_points[-1]
                        if args.memory_baseline and n <= args.memory_max_n and last:
                            cell["memory"] = in_memory(kind, n, reg, args)
                            print(f"  memory: {cell['memory']}", flush=True)
                    except (MemoryError, ValueError, NotImplementedError) as error:
                        cell["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                        print(f"{kind} reg={reg:g} n={n:.0e}: {cell['error']}", flush=True)
                    load.append(os.getloadavg()[0])
                    cell["load"] = load
                    data["cells"].append(cell)
    write_json(args.json, data)
    write_text(args.md, markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
