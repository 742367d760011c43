"""Colour mapping of a 4K image held as a Dask array, chunk by chunk on a LocalCluster.

The source is ``images/default_source.png`` (1200 x 800) resized to ``--width`` x
``--height`` with Pillow's Lanczos filter (new, interpolated colours); the target is
``images/default_target.png``. One fit on sampled colours in memory
(``sketchot.color.transfer_colors``, its defaults at ``--reg``), then every pixel mapped two
ways in the same run:

* in memory: ``sketchot.map_image(result, image, dtype=uint8)`` on the NumPy image;
* on Dask: the image as a Dask array of ``--chunk`` x ``--chunk`` pixel tiles on a
  ``distributed.LocalCluster`` of ``--workers`` single-threaded worker processes,
  ``sketchot.map_image`` of it and the image and counts computed in one ``dask.compute``
  (the cluster's start is not timed; the result is sent to the workers within the timing).

Then the whole transfer both ways (``transfer_colors`` with its defaults, ``compact=True``):
the NumPy image in memory, and the Dask image (pixels sampled on the workers, the same draw;
the solve in memory; every pixel mapped on the workers, computed).

Both images are compared pixel by pixel (uint8: at most one 8-bit step apart where a colour's
map lands on a rounding edge). The ratio of the two times is the price of chunking on these
two cores (the Dask path's point is memory: no process holds the whole image).
``--json`` / ``--md`` write the numbers (``benchmarks/results/dask_images.json`` and ``.md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
from _results import md_table, write_json, write_text
from color_4k import photographs

import sketchot
from sketchot.color import transfer_colors

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=3840)
    parser.add_argument("--height", type=int, default=2160)
    parser.add_argument("--reg", type=float, default=0.01)
    parser.add_argument("--chunk", type=int, default=540)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=RESULTS / "dask_images.json")
    parser.add_argument("--md", type=Path, default=RESULTS / "dask_images.md")
    args = parser.parse_args()

    import dask
    import dask.array as da
    import distributed

    source, _, target = photographs(args.width, args.height)
    start = time.perf_counter()
    run = transfer_colors(source[::8, ::8], target, reg=args.reg, rng=args.seed, compact=True)
    fit_seconds = time.perf_counter() - start
    print(f"fit on sampled colours: {fit_seconds:.1f} s ({run.result.backend})", flush=True)

    start = time.perf_counter()
    memory = sketchot.map_image(run.result, source, dtype=np.uint8)
    memory_seconds = time.perf_counter() - start
    print(f"in memory: {memory_seconds:.1f} s, {memory.n_colors} distinct colours", flush=True)

    cluster = distributed.LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster):
        image = da.from_array(source, chunks=(args.chunk, args.chunk, 3))
        start = time.perf_counter()
        mapped = sketchot.map_image(run.result, image, dtype=np.uint8)
        out, n_colors, n_clipped = dask.compute(mapped.image, mapped.n_colors, mapped.n_clipped)
        dask_seconds = time.perf_counter() - start
        start = time.perf_counter()
        whole = transfer_colors(source, target, reg=args.reg, rng=args.seed, compact=True)
        whole_seconds = time.perf_counter() - start
        start = time.perf_counter()
        on_dask = transfer_colors(image, target, reg=args.reg, rng=args.seed, compact=True)
        dask_image = on_dask.image.compute()
        whole_dask_seconds = time.perf_counter() - start
    cluster.close()
    whole_steps = np.abs(dask_image.astype(np.int16) - whole.image.astype(np.int16))
    print(f"transfer: {whole_seconds:.1f} s in memory, {whole_dask_seconds:.1f} s on Dask")
    print(f"on Dask: {dask_seconds:.1f} s, {int(n_colors)} colours mapped over chunks", flush=True)
    steps = np.abs(out.astype(np.int16) - memory.image.astype(np.int16))
    data = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "sketchot": sketchot.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "pixels": args.width * args.height,
        "shape": [args.height, args.width],
        "chunk": args.chunk,
        "chunks": int(np.prod(image.numblocks)),
        "workers": args.workers,
        "reg": args.reg,
        "backend": run.result.backend,
        "fit_seconds": fit_seconds,
        "memory_seconds": memory_seconds,
        "memory_distinct_colours": int(memory.n_colors),
        "dask_seconds": dask_seconds,
        "dask_colours_mapped": int(n_colors),
        "dask_over_memory": dask_seconds / memory_seconds,
        "clipped_memory": int(memory.n_clipped),
        "clipped_dask": int(n_clipped),
        "max_step": int(steps.max()),
        "pixels_differing": int(np.count_nonzero(steps.any(axis=2))),
        "transfer_memory_seconds": whole_seconds,
        "transfer_dask_seconds": whole_dask_seconds,
        "transfer_same_sample": bool(
            np.array_equal(whole.source_sample.colors, on_dask.source_sample.colors)
        ),
        "transfer_max_step": int(whole_steps.max()),
    }
    write_json(args.json, data)
    rows = [
        ["in memory (NumPy image)", f"{memory_seconds:.1f}", "1.00", f"{memory.n_colors}", ""],
        [f"Dask, {data['chunks']} tiles of {args.chunk} px, {args.workers} workers",
         f"{dask_seconds:.1f}", f"{data['dask_over_memory']:.2f}", f"{int(n_colors)}",
         f"max step {data['max_step']}, {data['pixels_differing']} pixels differ"],
        ["transfer_colors, NumPy image (sample, solve, map)", f"{whole_seconds:.1f}", "1.00",
         "", ""],
        ["transfer_colors, Dask image (sample and map on the workers)",
         f"{whole_dask_seconds:.1f}", f"{whole_dask_seconds / whole_seconds:.2f}", "",
         f"same sample: {data['transfer_same_sample']}, max step {data['transfer_max_step']}"],
    ]  # fmt: skip
    header = ["mapping", "seconds", "ratio", "colours mapped", "against memory"]
    text = [
        "# Colour mapping of a Dask image against the in-memory mapping (same run)",
        "",
        f"{ {k: data[k] for k in ('python', 'numpy', 'dask', 'sketchot', 'cpus', 'load')} }",
        "",
        f"{args.width} x {args.height} pixels (images/default_source.png resized), fit "
        f"({data['backend']}, reg {args.reg}) on sampled colours in {fit_seconds:.1f} s.",
        "",
        *md_table(header, rows),
    ]
    write_text(args.md, "\n".join(text) + "\n")


if __name__ == "__main__":
    main()
