"""Every pixel of an image held as a Dask array mapped through a fitted transport, chunk by
chunk on the workers: colour transfer for images too large for one machine's memory.

The fitted result (a solve between sampled colours, in memory) is sent once to each worker;
each chunk of pixels (rows x columns of the image, all channels) goes through the in-memory
mapping (:func:`sketchot.map_image`, passed in by :mod:`sketchot.api`: this layer does not
import the colour layer), which maps each distinct colour of the chunk once. A pixel's mapped
colour depends on its colour only, up to how colours are batched (rounding; within the
certified product error for the block-local kernel, whose expansion of new points depends on
the batch), so the chunking changes the image by no more than that. The output is a lazy
Dask array of the image's chunks (store it with ``dask.array.to_zarr`` or compute it); no
chunk is gathered on the client. Memory per task: the chunk, its output and the in-memory
mapping's tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np


def map_image_dask(
    result: Any, image: da.Array, *, mapper: Callable[..., Any], name: str = "image",
    **options: Any,
) -> tuple[da.Array, da.Array]:  # fmt: skip
    """``(mapped image, counts)``: the image mapped chunk by chunk (lazy, the input's row and
    column chunks, the channels in one chunk, ``options['dtype']``) and ``[colours mapped,
    fallbacks, clipped pixels]`` summed over the chunks (a lazy ``(3,)`` array: compute it
    with the image in one ``dask.compute``, or the chunks are mapped again).

    ``mapper(result, block, name=..., **options)`` is the in-memory mapping (its result has
    ``image``, ``n_colors``, ``n_fallbacks``, ``n_clipped``). It runs once here on one pixel
    of the image's dtype, so that a bad ``result`` or option is refused now, by name, and
    not on a worker."""
    if image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ValueError(
            f"{name} must be a Dask array of shape (height, width, 3) or (height, width, 4); "
            f"got shape {image.shape}"
        )
    probe = mapper(result, np.zeros((1, 1, image.shape[2]), dtype=image.dtype), name=name,
                   **options)  # fmt: skip
    out_dtype = probe.image.dtype
    shared = dask.delayed(result, pure=False)  # one key: sent once to each worker
    blocks = image.rechunk({2: -1}).to_delayed()
    task = dask.delayed(_map_block, nout=2, pure=True)
    rows, counts = [], []
    for i, height in enumerate(image.chunks[0]):
        row = []
        for j, width in enumerate(image.chunks[1]):
            mapped, stats = task(mapper, shared, blocks[i, j, 0], name, options)
            shape = (height, width, image.shape[2])
            # one list per axis for da.block: rows, columns, the channels' single chunk
            row.append([da.from_delayed(mapped, shape=shape, dtype=out_dtype)])
            counts.append(da.from_delayed(stats, shape=(3,), dtype=np.int64))
        rows.append(row)
    return da.block(rows), da.stack(counts).sum(axis=0)


def _map_block(mapper, result, block, name, options) -> tuple[np.ndarray, np.ndarray]:
    """One chunk through the in-memory mapping: its image and its three counts."""
    mapped = mapper(result, np.asarray(block), name=name, **options)
    return mapped.image, np.array([mapped.n_colors, mapped.n_fallbacks, mapped.n_clipped])


def sample_pixels_dask(
    image: da.Array, n_samples: int, generator: np.random.Generator, *, replace: bool,
    name: str = "image",
) -> tuple[np.ndarray, int]:  # fmt: skip
    """``(pixels, n_pixels)``: ``n_samples`` pixels of a Dask image drawn uniformly (the
    in-memory draw: ``generator.choice`` over the visible pixels in row-major order, so the
    same image as a NumPy array gives the same sample) and gathered to the client as stored
    (``(n_samples, 3)``, the image's dtype), and the count of visible pixels.

    Visible: alpha > 0 when the image has 4 channels. Their per-row counts are summed on the
    workers (``H`` integers come back); a drawn rank becomes its row by a search in their
    running sum and its column on the worker that holds the row's alpha. ``O(H W)`` work on
    the workers, ``O(H + n_samples)`` to the client."""
    if image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ValueError(
            f"{name} must be a Dask array of shape (height, width, 3) or (height, width, 4); "
            f"got shape {image.shape}"
        )
    height, width = image.shape[:2]
    if image.shape[2] == 3:
        n_pixels = height * width
        rank = _draw(generator, n_pixels, n_samples, replace, name, "pixels")
        rows, cols = np.divmod(rank, width)
    else:
        visible = image[..., 3].rechunk({1: -1}) > 0
        per_row = visible.sum(axis=1).compute().astype(np.int64)
        ends = np.cumsum(per_row)
        n_pixels = int(ends[-1]) if ends.size else 0
        if n_pixels == 0:
            raise ValueError(
                f"every pixel of {name} is fully transparent (alpha 0): it has no colours to sample"
            )
        rank = _draw(generator, n_pixels, n_samples, replace, name, "non-transparent pixels")
        rows = np.searchsorted(ends, rank, side="right")
        within = rank - (ends[rows] - per_row[rows])
        cols = _visible_columns(visible, rows, within)
    pixels = image.vindex[rows, cols].compute()
    return np.asarray(pixels)[:, :3], n_pixels


def _draw(generator, n_pixels: int, n_samples: int, replace: bool, name: str, which: str):
    if not replace and n_samples > n_pixels:
        raise ValueError(
            f"n_samples ({n_samples}) is larger than the number of {which} of {name} "
            f"({n_pixels}) and sampling is without replacement; lower n_samples or sample "
            "with replacement (replace=True, --replace)"
        )
    return generator.choice(n_pixels, size=n_samples, replace=bool(replace))


def _visible_columns(visible: da.Array, rows: np.ndarray, within: np.ndarray) -> np.ndarray:
    """The column of the ``within``-th visible pixel of each of ``rows``, found on the
    workers that hold those rows' alpha (one task per row chunk with drawn rows)."""
    cols = np.empty(rows.size, dtype=np.int64)
    starts = np.cumsum((0,) + visible.chunks[0])
    blocks = visible.to_delayed()[:, 0]
    task = dask.delayed(_columns_in_block, pure=True)
    chunk_of = np.searchsorted(starts, rows, side="right") - 1
    wanted, parts = [], []
    for chunk in np.unique(chunk_of):
        mine = np.flatnonzero(chunk_of == chunk)
        wanted.append(mine)
        parts.append(task(blocks[chunk], rows[mine] - starts[chunk], within[mine]))
    for mine, found in zip(wanted, dask.compute(*parts), strict=True):
        cols[mine] = found
    return cols


def _columns_in_block(visible: np.ndarray, rows: np.ndarray, within: np.ndarray) -> np.ndarray:
    out = np.empty(rows.size, dtype=np.int64)
    for row in np.unique(rows):
        here = rows == row
        out[here] = np.flatnonzero(visible[row])[within[here]]
    return out
