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


class VisiblePixels:
    """The visible pixels of a Dask image (alpha > 0 when it has 4 channels) in row-major
    order, as the ``(n_pixels, 3)`` array that :func:`sketchot.sample_pixels` draws from in
    memory, gathered on demand: ``pixels[index]`` brings the indexed rows (stored values) to
    the client, so a draw over it is the in-memory draw.

    The per-row counts of visible pixels are summed on the workers when it is made (``H``
    integers come back); a rank becomes its row by a search in their running sum and its
    column on the worker that holds the row's alpha. ``O(H W)`` work on the workers,
    ``O(H + len(index))`` to the client."""

    def __init__(self, image: da.Array, name: str = "image") -> None:
        if image.ndim != 3 or image.shape[2] not in (3, 4):
            raise ValueError(
                f"{name} must be a Dask array of shape (height, width, 3) or (height, width, "
                f"4); got shape {image.shape}"
            )
        self.image, self.dtype = image, image.dtype
        self.visible = None
        if image.shape[2] == 4:
            self.visible = image[..., 3].rechunk({1: -1}) > 0
            self.per_row = self.visible.sum(axis=1).compute().astype(np.int64)
            self.ends = np.cumsum(self.per_row)
            n_pixels = int(self.ends[-1]) if self.ends.size else 0
        else:
            n_pixels = image.shape[0] * image.shape[1]
        self.shape = (n_pixels, 3)

    def __getitem__(self, index: Any) -> np.ndarray:
        rank = np.asarray(index, dtype=np.int64)
        if self.visible is None:
            rows, cols = np.divmod(rank, self.image.shape[1])
        else:
            rows = np.searchsorted(self.ends, rank, side="right")
            cols = _visible_columns(
                self.visible, rows, rank - (self.ends[rows] - self.per_row[rows])
            )
        return np.asarray(self.image.vindex[rows, cols].compute())[:, :3]

    def distinct_counts(self, pack: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, ...]:
        """``(codes, counts)``: the sorted distinct codes ``pack(rgb)`` of the visible pixels
        (an integer per colour: ``pack`` is the colour layer's packing, passed in) and the
        pixels of each, as int64. Each chunk counts its own colours on its worker
        (``np.unique``); the counts are merged in a tree of at most :data:`MERGE_FAN_IN`
        parts a task, so the client receives only the image's distinct colours. The same
        codes and counts as the whole image counted in memory."""
        if self.dtype.kind != "u":
            raise TypeError(f"distinct colours are counted for integer images; got {self.dtype}")
        blocks = self.image.rechunk({2: -1}).to_delayed().ravel()
        parts = [dask.delayed(_distinct_in_block, pure=True)(block, pack) for block in blocks]
        merge = dask.delayed(_merge_counts, pure=True)
        while len(parts) > 1:
            fan = MERGE_FAN_IN
            parts = [merge(*parts[i : i + fan]) for i in range(0, len(parts), fan)]
        codes, counts = parts[0].compute()
        return codes, counts


#: Parts of distinct colours merged by one task (:meth:`VisiblePixels.distinct_counts`).
MERGE_FAN_IN = 8


def _distinct_in_block(block: np.ndarray, pack: Callable[[np.ndarray], np.ndarray]):
    """The sorted distinct codes of a chunk's visible pixels and their counts."""
    pixels = np.asarray(block).reshape(-1, block.shape[-1])
    if pixels.shape[1] == 4:
        pixels = pixels[pixels[:, 3] > 0]
    codes, counts = np.unique(pack(pixels[:, :3]), return_counts=True)
    return codes, counts.astype(np.int64)


def _merge_counts(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct codes of several parts and their summed counts (exact integers)."""
    codes = np.concatenate([c for c, _ in parts])
    counts = np.concatenate([n for _, n in parts])
    if not codes.size:
        return codes, counts
    order = np.argsort(codes, kind="stable")
    codes, counts = codes[order], counts[order]
    first = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    return codes[first], np.add.reduceat(counts, first)


def visible_pixels_dask(image: da.Array, name: str = "image") -> VisiblePixels:
    """The visible pixels of a Dask image, gathered on demand (:class:`VisiblePixels`)."""
    return VisiblePixels(image, name)


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
