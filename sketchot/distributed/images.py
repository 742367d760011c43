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
