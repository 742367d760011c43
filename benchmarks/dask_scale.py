"""Sinkhorn on a Dask LocalCluster against the same solve in memory, as n grows.

``n`` points per side, uniform on ``[0, 1]^3``, ``reg = 1``, Nystrom with 61 landmarks
(k-center on a 50,000-point pool), a fixed number of iterations (``tol = 0``, no true-kernel
check). In memory: ``sketchot.sinkhorn`` on NumPy arrays in this process (its own thread
pool). Dask: the same call on Dask arrays generated on the workers
(``dask.array.random.default_rng(seed)``; chunks of ``--chunk`` rows), on a fresh
``LocalCluster(n_workers=--workers, threads_per_worker=1)`` per size. Reported per size:
build time (geometry + factors, persisted), seconds per iteration, peak resident memory of
each worker process (``getrusage`` high-water mark, so it includes the worker's baseline),
and the Dask / in-memory ratio of seconds per iteration.

``--quick``: n = 10^5 and 10^6, 20 iterations. Full: also 10^7 (skipped with a note when
the factors, ``2 n r itemsize`` bytes, would not fit ``--max-gb`` of this machine), 100
iterations. ``--json PATH`` writes the numbers; ``--md PATH`` a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json

import sketchot

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent

RANK = 61

# Iterations between convergence checks (set by --check-every). float32 kernels raise tol to
# 1e-6 ||b||: a large value keeps the float32 solve from stopping before --iterations.
CHECK_EVERY = [10]
REG = 1.0
D = 3


def _rss() -> int:
    """Resident memory of this process now, in bytes (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMonitor:
    """Samples this process's resident memory every 10 ms in a daemon thread; ``peak``.

    ``getrusage``'s high-water mark is not used: a worker process forked from this one
    would start with this process's peak.
    """

    def __init__(self) -> None:
        self.peak = _rss()
        self.running = True
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.running:
            self.peak = max(self.peak, _rss())
            time.sleep(0.01)

    def stop(self) -> int:
        self.running = False
        return max(self.peak, _rss())


def _worker_setup(dask_worker: Any) -> int:
    """On a worker: one sketchot thread per worker thread, and a memory monitor."""
    sketchot.set_num_threads(1)
    dask_worker.sketchot_monitor = PeakMonitor()
    return _rss()


def _worker_peak(dask_worker: Any) -> int:
    return dask_worker.sketchot_monitor.stop()


def solve_options(iterations: int, dtype: Any, check_every: int = 10) -> dict[str, Any]:
    return {
        "max_iter": iterations,
        "check_every": check_every,
        "tol": 1e-300,  # never met: every run does exactly `iterations` iterations
        "accuracy": None,
        "warn": False,
        "n_landmarks": RANK,
        "dtype": dtype,
    }


def in_memory(n: int, iterations: int, seed: int, dtype: Any, threads: int) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, D)), rng.random((n, D))
    monitor = PeakMonitor()
    start = time.perf_counter()
    # The same cores as the cluster: `threads` sketchot threads and BLAS threads.
    with sketchot.thread_limit(threads), threadpool_limits(threads):
        result = sketchot.sinkhorn(
            None,
            None,
            X,
            Y,
            REG,
            "nystrom",
            rng=seed + 1,
            **solve_options(iterations, dtype, CHECK_EVERY[0]),
        )
    total = time.perf_counter() - start
    return {
        "threads": threads,
        "peak_gb": monitor.stop() / 2**30,
        "build_s": result.timings["build"],
        "per_iteration_s": result.timings["per_iteration"],
        "total_s": total,
        "cost": result.value_linear,
        "n_iter": result.n_iter,
    }


def on_cluster(
    n: int, iterations: int, seed: int, dtype: Any, workers: int, chunk: int
) -> dict[str, Any]:
    import dask.array as da
    from dask.distributed import Client, LocalCluster

    # Worker processes import sketchot from this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit=0,  # measure, do not spill or pause
        ) as cluster,
        Client(cluster) as client,
    ):
        generator = da.random.default_rng(seed)
        X = generator.random((n, D), chunks=(chunk, D))
        Y = generator.random((n, D), chunks=(chunk, D))
        baseline = client.run(_worker_setup)
        start = time.perf_counter()
        result = sketchot.sinkhorn(
            None, None, X, Y, REG, "nystrom", rng=seed + 1,
            **solve_options(iterations, dtype, CHECK_EVERY[0]),
        )  # fmt: skip
        total = time.perf_counter() - start
        peaks = client.run(_worker_peak)
    return {
        "build_s": result.timings["build"],
        "per_iteration_s": result.timings["per_iteration"],
        "total_s": total,
        "cost": result.value_linear,
        "n_iter": result.n_iter,
        "workers": workers,
        "chunk_rows": chunk,
        "worker_peak_gb": [peaks[w] / 2**30 for w in sorted(peaks)],
        "worker_baseline_gb": [baseline[w] / 2**30 for w in sorted(baseline)],
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# Dask scale: Nystrom rank {RANK}, reg {REG:g}, d = {D}, "
        f"{data['workers']} workers x 1 thread, chunks of at most {data['chunk']} rows, "
        f"{data['iterations']} iterations (check_every {data.get('check_every', 10)}), "
        f"dtype {data['dtype']}",
        "",
        f"Machine: {data['machine']}",
        "",
        "| n per side | mode | build s | s / iteration | peak GB per worker | Dask / memory |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        mem, dask_run = row.get("memory"), row.get("dask")
        if mem:
            lines.append(
                f"| {row['n']:.0e} | in memory ({mem['threads']} threads) | {mem['build_s']:.2f} | "
                f"{mem['per_iteration_s']:.4f} | {mem['peak_gb']:.2f} (process) | |"
            )
        if dask_run:
            ratio = row.get("overhead_ratio")
            peaks = ", ".join(f"{p:.2f}" for p in dask_run["worker_peak_gb"])
            lines.append(
                f"| {row['n']:.0e} | Dask | {dask_run['build_s']:.2f} | "
                f"{dask_run['per_iteration_s']:.4f} | {peaks} | "
                f"{'' if ratio is None else f'{ratio:.2f}x'} |"
            )
        if row.get("skipped"):
            lines.append(f"| {row['n']:.0e} | skipped | | | | {row['skipped']} |")
    loads = [
        f"{row['n']:.0e}: {row['load_before']:.2f} -> {row['load_after']:.2f}"
        for row in data["rows"]
        if "load_before" in row
    ]
    if loads:
        # other jobs share the machine: timings mean little without its load
        lines += ["", f"Load average (1 min) before -> after each size: {'; '.join(loads)}"]
    lines += [""] + [f"- {note}" for note in data["notes"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e5, 1e6; 20 iterations")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=250_000, help="rows per chunk")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--sizes", type=float, nargs="*", default=None)
    parser.add_argument("--max-gb", type=float, default=None, help="memory this run may use")
    parser.add_argument("--no-memory-run", action="store_true", help="skip in-memory at 1e7")
    parser.add_argument("--check-every", type=int, default=10, help="solver check_every")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args()

    CHECK_EVERY[0] = args.check_every
    sizes = [int(s) for s in (args.sizes or ([1e5, 1e6] if args.quick else [1e5, 1e6, 1e7]))]
    iterations = args.iterations or (20 if args.quick else 100)
    itemsize = np.dtype(args.dtype).itemsize
    max_gb = args.max_gb
    if max_gb is None:
        max_gb = 0.6 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    data: dict[str, Any] = {
        "iterations": iterations,
        "workers": args.workers,
        "chunk": args.chunk,
        "dtype": args.dtype,
        "check_every": args.check_every,
        "rank": RANK,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GB",
        "rows": [],
        "notes": [],
    }
    for n in sizes:
        row: dict[str, Any] = {"n": n}
        factors_gb = 2 * n * RANK * itemsize / 2**30
        if factors_gb * 1.5 > max_gb:
            row["skipped"] = (
                f"factors need {factors_gb:.1f} GB (x1.5 working set) > {max_gb:.1f} GB here"
            )
            print(f"n = {n:.0e}: skipped ({row['skipped']})", flush=True)
            data["rows"].append(row)
            continue
        run_memory = not (args.no_memory_run and n >= 10**7)
        row["load_before"] = os.getloadavg()[0]
        if run_memory:
            row["memory"] = in_memory(n, iterations, args.seed, args.dtype, args.workers)
            print(f"n = {n:.0e} in memory: {row['memory']}", flush=True)
        # at least two chunks per worker, so that every worker has work
        chunk = min(args.chunk, max(1, n // (2 * args.workers)))
        row["dask"] = on_cluster(n, iterations, args.seed, args.dtype, args.workers, chunk)
        print(f"n = {n:.0e} Dask: {row['dask']}", flush=True)
        if run_memory:
            row["overhead_ratio"] = (
                row["dask"]["per_iteration_s"] / row["memory"]["per_iteration_s"]
            )
        row["load_after"] = os.getloadavg()[0]
        data["rows"].append(row)
    timed = {r["n"]: r["dask"]["per_iteration_s"] for r in data["rows"] if "dask" in r}
    if 10**6 in timed and 10**7 in timed:
        data["linearity_1e7_over_1e6"] = timed[10**7] / timed[10**6]
        data["notes"].append(
            f"Dask s/iteration 1e7 / 1e6 = {data['linearity_1e7_over_1e6']:.2f} (target <= 12)"
        )
    data["notes"].append(
        "in-memory and Dask data differ (NumPy vs Dask generators): timings, not values, "
        "are compared; peak GB per worker (sampled every 10 ms) includes the worker's baseline "
        "(worker_baseline_gb in the JSON); in memory runs with as many threads as workers"
    )
    print(markdown(data))
    if args.json:
        write_json(args.json, data)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown(data))
        print(f"Markdown: {args.md}")


if __name__ == "__main__":
    main()
