"""Colour transfer: recolour every pixel of an image with the palette of another.

Pipeline (Ferradans et al. 2014; POT's ``plot_otda_color_images`` example):

1. sample ``n`` colours of the source and of the target image (RGB in ``[0, 1]``);
2. solve entropic optimal transport between the two samples with :func:`sketchot.sinkhorn`
   (any backend), ``K = exp(-||x - y||^2 / reg)``;
3. map EVERY pixel ``x`` of the source with the entropic (barycentric) map

   .. math:: T(x) = \\frac{\\sum_j K(x, y_j) v_j y_j}{\\sum_j K(x, y_j) v_j},

   which extends the plan's barycentric projection ``(P Y) / (P 1)`` continuously to points
   outside the sample (Pooladian and Niles-Weed 2021), and clip to ``[0, 1]``.

Step 3 uses the kernel's out-of-sample operator through
:meth:`sketchot.SinkhornResult.barycentric_map`: features of the pixels for low-rank backends
(``O(pixels x rank)``), a streamed log-stable softmax for the exact one; never a
``pixels x n`` array. It maps each DISTINCT colour once (a colour map depends on the colour
only), which is exact and divides the work by 5-20 on photographs. Where an approximate
kernel gives a non-positive denominator ``sum_j K~(x, y_j) v_j`` for some colour, that colour
is recomputed with the exact kernel (the library's documented fallback) and counted.

References
----------
Ferradans, Papadakis, Peyre, Aujol. Regularized discrete optimal transport. SIAM J. Imaging
Sciences 7(3), 2014. Pooladian, Niles-Weed. Entropic estimation of optimal transport maps.
arXiv:2109.12004, 2021. Han, Avron, Shin. Polynomial Tensor Sketch for Element-wise Function
of Low-Rank Matrix. ICML 2020 (Section 4.3: Sinkhorn on random RGB pixels).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import api, policy
from .._validation import check_bool, check_float, check_int, check_rng, describe
from ..kernels import get_backend
from ..solver import (
    SinkhornResult,
    SolverOptions,
    TrueKernelCheck,
    check_backend_params,
    sinkhorn,
)
from .images import (
    PILLOW_LIMIT,
    PIXEL_CHUNK,
    ColorIndex,
    as_float,
    as_uint8,
    check_memory,
    distinct_colors,
    image_alpha,
    image_pixels,
    load_image,
    sample_pixels,
)

#: Entropic regularisation for colours in [0, 1], as POT's colour example (reg = 1 blurs
#: every colour towards the target's mean).
DEFAULT_REG = 0.1

#: Backend of the colour functions (see the README's "which backend when").
DEFAULT_BACKEND = "auto"

#: Samples drawn from each image.
DEFAULT_N_SAMPLES = 10_000

#: Rank given to a low-rank backend when the caller sets none: the library's equal-cost
#: defaults are far too coarse at reg = 0.1 (benchmarks/results/color_compare_backends.txt).
DEFAULT_COLOR_RANK = 400

#: Distinct colours per call of the out-of-sample map: large calls amortise the fitted side;
#: the exact kernel costs O(n d) per colour, so smaller calls keep progress lines frequent.
MAP_CHUNK = 1 << 16
MAP_CHUNK_EXACT = 1 << 13

Progress = Callable[[str], None]


@dataclass(frozen=True)
class MappedImage:
    """An image whose every pixel went through a colour map.

    Attributes
    ----------
    image : ndarray, shape (H, W, 3) or (H, W, 4)
        Mapped colours, clipped to ``[0, 1]`` (float64), or rounded to 8 bits (uint8, with
        ``map_image(..., dtype=numpy.uint8)``); the input's alpha channel, if any, unchanged
        (in the same scale).
    n_pixels : int
    n_colors : int
        Distinct colours actually mapped (``n_pixels`` when no duplicates were detected).
    n_fallbacks : int
        Distinct colours whose approximate denominator was not positive and which were
        recomputed with the exact kernel (always 0 for the exact backend).
    n_clipped : int
        Pixels with at least one channel outside ``[0, 1]`` before clipping (the barycentric
        map of an approximate kernel can overshoot; the exact one stays in the convex hull).
    seconds : float
        Wall time of the mapping.
    """

    image: np.ndarray
    n_pixels: int
    n_colors: int
    n_fallbacks: int
    n_clipped: int
    seconds: float


def map_image(
    result: SinkhornResult,
    image: Any,
    *,
    inverse: bool = False,
    chunk_size: int | None = None,
    progress: Progress | None = None,
    name: str = "image",
    dtype: Any = np.float64,
    pixel_chunk: int = PIXEL_CHUNK,
) -> MappedImage:
    """Apply the entropic map of a fitted transport to every pixel of an image.

    Parameters
    ----------
    result : SinkhornResult
        A solve between source colours ``X`` and target colours ``Y`` (3 columns).
    image : path, array, PIL image or dask.array
        Anything :func:`load_image` accepts, or a Dask array of shape ``(H, W, 3)`` or
        ``(H, W, 4)`` chunked by rows and columns: an image too large for one machine's
        memory, mapped chunk by chunk on the workers and never gathered
        (:mod:`sketchot.distributed.images`). An alpha channel is copied to the output as it
        is (RGBA in, RGBA out); the colours of every pixel are mapped, fully transparent ones
        included (they stay invisible).
    inverse : bool, default=False
        ``False``: the forward map onto the target palette
        (:meth:`~sketchot.SinkhornResult.barycentric_map`); ``True``: the inverse map onto
        the source palette (:meth:`~sketchot.SinkhornResult.inverse_barycentric_map`).
    chunk_size : int, optional
        Distinct colours per call (memory ``O(chunk_size x rank)`` inside the operator);
        default :data:`MAP_CHUNK` (low-rank backends) or :data:`MAP_CHUNK_EXACT` (exact).
    progress : callable, optional
        Called with a short text line after each chunk (in memory; a Dask image reports
        through Dask's own diagnostics).
    name : str
        Argument name for error messages.
    dtype : numpy.float64 or numpy.uint8, default=numpy.float64
        Type of the mapped image: float64 in ``[0, 1]`` (24 bytes per pixel), or uint8
        rounded to 8 bits (3 bytes per pixel) for full-resolution photographs.
    pixel_chunk : int
        Pixels per block in the passes over the whole image (finding the colours, gathering
        the mapped ones); the result does not depend on it.

    Returns
    -------
    MappedImage
        For a Dask image: ``image`` is a lazy Dask array with the input's row and column
        chunks, and ``n_colors`` (distinct colours within each chunk, summed),
        ``n_fallbacks`` and ``n_clipped`` are lazy 0-d Dask arrays made by the same tasks:
        compute them together (``dask.compute(mapped.image, mapped.n_clipped)``) or the
        chunks are mapped again; ``seconds`` is the time to build the graph.

    Raises
    ------
    MemoryError
        The mapped image would not fit in the available memory (checked before allocating;
        in memory).

    Notes
    -----
    ``O(C r)`` time for a rank-``r`` backend and ``O(C n d)`` for the exact one, with ``C`` the
    number of distinct colours (plus ``O(N)`` to find them among ``N`` pixels of an 8-bit
    image, ``O(N log N)`` for 16-bit or float data). Integer images are never copied to
    float: the colours are found on packed integer codes (:class:`ColorIndex`) and gathered a
    block at a time, so an 8-bit image needs its own 3 bytes per pixel, the output's 3 (uint8)
    and about 100 MB of tables.
    """
    if not isinstance(result, SinkhornResult):
        raise TypeError(f"result must be a sketchot SinkhornResult; got {describe(result)}")
    dimension = result.kernel.geometry.X.shape[1]
    if dimension != 3:
        raise ValueError(
            "result must come from a solve between RGB colours (3 columns); got points with "
            f"{dimension} columns"
        )
    inverse = check_bool(inverse, "inverse")
    if chunk_size is None:
        exact = "exact" in result.kernel.info.capabilities
        chunk_size = MAP_CHUNK_EXACT if exact else MAP_CHUNK
    chunk_size = check_int(chunk_size, "chunk_size", minimum=1)
    pixel_chunk = check_int(pixel_chunk, "pixel_chunk", minimum=1)
    out_dtype = np.dtype(dtype)
    if out_dtype not in (np.dtype(np.float64), np.dtype(np.uint8)):
        raise ValueError(f"dtype must be numpy.float64 or numpy.uint8; got {describe(dtype)}")
    if api.on_dask(image):
        start = time.perf_counter()
        options = {"inverse": inverse, "chunk_size": chunk_size, "dtype": out_dtype}
        mapped_image, counts = api.map_image_dask(
            result, image, mapper=map_image, name=name, pixel_chunk=pixel_chunk, **options
        )
        return MappedImage(
            image=mapped_image, n_pixels=image.shape[0] * image.shape[1], n_colors=counts[0],
            n_fallbacks=counts[1], n_clipped=counts[2], seconds=time.perf_counter() - start,
        )  # fmt: skip
    picture = load_image(image, name=name, dtype=None)
    start = time.perf_counter()
    pixels = image_pixels(picture)
    alpha = image_alpha(picture)
    n_pixels, channels = pixels.shape[0], picture.shape[2]
    check_memory(n_pixels * channels * out_dtype.itemsize, f"the mapped {name} ({n_pixels} pixels)")
    table, colors, gather = None, None, None
    if pixels.dtype.kind == "u":
        table = ColorIndex.build(pixels, chunk=pixel_chunk)
        n_colors = len(table)
    else:
        found = distinct_colors(pixels)
        colors, gather = found if found is not None else (pixels, None)
        n_colors = colors.shape[0]
    mapper = result.inverse_barycentric_map if inverse else result.barycentric_map
    mapped = np.empty((n_colors, 3), dtype=out_dtype)
    outside = np.empty(n_colors, dtype=bool)
    fallbacks = 0
    for begin in range(0, n_colors, chunk_size):
        rows = slice(begin, min(begin + chunk_size, n_colors))
        points = table.colors(rows) if table is not None else colors[rows]
        values, count = mapper(points, return_fallbacks=True)
        fallbacks += count
        outside[rows] = np.any((values < 0.0) | (values > 1.0), axis=1)
        np.clip(values, 0.0, 1.0, out=values)
        mapped[rows] = values if out_dtype.kind == "f" else np.round(values * 255.0)
        if progress is not None:
            done = rows.stop
            progress(
                f"mapped {done}/{n_colors} distinct colours "
                f"({100.0 * done / n_colors:.0f}%, {time.perf_counter() - start:.2f} s)"
            )
    if table is None and gather is None and alpha is None:  # every pixel mapped, in order
        output, n_clipped = mapped, int(np.count_nonzero(outside))
    elif table is None and gather is None:
        output = np.empty((n_pixels, channels), dtype=out_dtype)
        output[:, :3] = mapped
        n_clipped = int(np.count_nonzero(outside))
    else:
        output = np.empty((n_pixels, channels), dtype=out_dtype)
        n_clipped = 0
        for begin in range(0, n_pixels, pixel_chunk):
            block = slice(begin, min(begin + pixel_chunk, n_pixels))
            index = table.index(pixels[block]) if table is not None else gather[block]
            output[block, :3] = mapped[index]
            n_clipped += int(np.count_nonzero(outside[index]))
    if alpha is not None:
        output[:, 3] = as_float(alpha) if out_dtype.kind == "f" else as_uint8(alpha)
    return MappedImage(
        image=output.reshape(picture.shape),
        n_pixels=n_pixels,
        n_colors=n_colors,
        n_fallbacks=fallbacks,
        n_clipped=n_clipped,
        seconds=time.perf_counter() - start,
    )


@dataclass
class ColorTransferResult:
    """Everything :func:`transfer_colors` computed.

    Attributes
    ----------
    image : ndarray, shape of the source
        The source recoloured with the target's palette, in ``[0, 1]``; an RGBA source gives
        an RGBA image with the source's alpha channel unchanged.
    inverse_image : ndarray or None
        The target recoloured with the source's palette (``inverse=True``), with the target's
        alpha channel if it has one.
    source, target : ndarray
        The loaded images.
    source_sample, target_sample : PixelSample
    result : SinkhornResult
    forward, inverse : MappedImage or None
        Mapping statistics.
    check : TrueKernelCheck
        L1 marginal errors of the scalings against the exact kernel.
    backend : str
    reg : float
    backend_params : dict
        The parameters actually used (defaults included).
    timings : dict
        Seconds for ``load``, ``sample``, ``build``, ``iterations``, ``map``, ``inverse_map``,
        ``check`` and ``total``.
    """

    image: np.ndarray
    inverse_image: np.ndarray | None
    source: np.ndarray
    target: np.ndarray
    source_sample: Any
    target_sample: Any
    result: SinkhornResult
    forward: MappedImage
    inverse: MappedImage | None
    check: TrueKernelCheck
    backend: str
    reg: float
    backend_params: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def resolve_backend_params(
    backend: str, params: dict[str, Any], n_points: int | None = None
) -> dict[str, Any]:
    """Backend parameters for colour transfer: the caller's, plus ``rank=``
    :data:`DEFAULT_COLOR_RANK` (at most ``n_points``) for a low-rank backend (one with a rank
    parameter in its registry record) when the caller set neither ``rank`` nor that parameter.
    """
    if backend == "auto":
        return dict(params)
    record = get_backend(backend)
    sized = "rank" in params or any(name in params for name in record.sizing_parameters)
    if record.rank_parameter is None or sized:
        return dict(params)
    rank = DEFAULT_COLOR_RANK if n_points is None else min(DEFAULT_COLOR_RANK, n_points)
    return {**params, "rank": rank}


def transfer_colors(
    source: Any,
    target: Any,
    *,
    reg: float = DEFAULT_REG,
    backend: str = DEFAULT_BACKEND,
    n_samples: int = DEFAULT_N_SAMPLES,
    rng: Any = None,
    replace: bool = False,
    weighted: bool = False,
    inverse: bool = False,
    progress: Progress | None = None,
    compact: bool = False,
    max_pixels: int | str | None = PILLOW_LIMIT,
    **kwargs: Any,
) -> ColorTransferResult:
    """Colour transfer with every intermediate result and timing (:func:`color_transfer`
    returns only the image).

    Parameters
    ----------
    source, target : str, os.PathLike or array-like
        Image files (anything Pillow reads) or arrays of shape ``(H, W, 3)`` or ``(H, W, 4)``
        (uint8, uint16, or float in ``[0, 1]``); see :func:`~sketchot.color.load_image`. A
        Dask array is sampled and mapped on the workers (:func:`sample_pixels`,
        :func:`map_image`): the recoloured image comes back as a lazy Dask array.
        Fully transparent pixels (alpha 0) are not sampled; an alpha channel is kept
        unchanged in the recoloured image.
    reg : float, default=0.1
        Entropic regularisation for colours in ``[0, 1]`` (``K = exp(-||x - y||^2 / reg)``);
        smaller is sharper and slower to converge, larger blurs every colour towards the
        target's mean.
    backend : str, default='auto'
        Kernel representation: ``'auto'`` picks the cheapest one that meets the solver's
        ``accuracy`` against the true kernel (:func:`sketchot.sinkhorn`); a named backend is
        used as it is, with ``rank=400`` (:data:`DEFAULT_COLOR_RANK`, at most the sample
        size) when it is low rank and no rank is given. A backend that misses the accuracy
        warns; impossible results (negative costs, colours outside the target's range) raise.
    n_samples : int, default=10000
        Colours sampled from each image for the transport problem.
    rng : None, int or Generator
        The only source of randomness (pixel sampling and the backend's draws).
    replace, weighted : bool, default=False
        Sampling options (see :func:`~sketchot.color.sample_pixels`).
    inverse : bool, default=False
        Also recolour the target with the source's palette.
    progress : callable, optional
        Receives one text line per step (sampling, solve, mapping chunks, check).
    compact : bool, default=False
        Full-resolution photographs in bounded memory: keep ``source`` and ``target`` as
        stored (uint8, or uint16 for 16-bit files) and return ``image`` and ``inverse_image``
        as uint8 (3 bytes per pixel each instead of 24 for float64).
    max_pixels : int, None or 'pillow', default='pillow'
        Image files with more pixels are refused before decoding (see
        :func:`~sketchot.color.load_image`; ``None`` or ``0``: no limit).
    **kwargs
        Solver options (:class:`~sketchot.solver.SolverOptions`: ``max_iter``, ``tol``,
        ``safeguard``, ``accuracy``, ``verbose``, ``warn``, ...), ``dtype``, ``rank`` and the
        backend's parameters. Anything else is rejected with the list of what is accepted.

    Returns
    -------
    ColorTransferResult
    """
    reg = check_float(reg, "reg", positive=True)
    n_samples = check_int(n_samples, "n_samples", minimum=1)
    replace = check_bool(replace, "replace")
    weighted = check_bool(weighted, "weighted")
    inverse = check_bool(inverse, "inverse")
    compact = check_bool(compact, "compact")
    options, backend_params = SolverOptions.split(kwargs)
    check_backend_params("transfer_colors", backend, backend_params)
    generator = check_rng(rng)
    say = progress if progress is not None else (lambda text: None)
    timings: dict[str, float] = {}
    start = time.perf_counter()

    tick = time.perf_counter()
    stored = None if compact else np.float64
    # a Dask image stays on the cluster: sampled and mapped there (sample_pixels, map_image)
    source_image, target_image = (
        image if api.on_dask(image)
        else load_image(image, name=name, dtype=stored, max_pixels=max_pixels)
        for image, name in ((source, "source"), (target, "target"))
    )  # fmt: skip
    timings["load"] = time.perf_counter() - tick

    tick = time.perf_counter()
    mode = "distinct colours weighted by frequency" if weighted else "pixels"
    say(
        f"sampling {n_samples} {mode} from the source ({source_image.shape[1]} x "
        f"{source_image.shape[0]}) and the target ({target_image.shape[1]} x "
        f"{target_image.shape[0]})"
    )
    source_sample = sample_pixels(
        source_image, n_samples, rng=generator, replace=replace, weighted=weighted, name="source"
    )
    target_sample = sample_pixels(
        target_image, n_samples, rng=generator, replace=replace, weighted=weighted, name="target"
    )
    timings["sample"] = time.perf_counter() - tick

    params = resolve_backend_params(
        backend, backend_params, len(source_sample) + len(target_sample)
    )
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    say(
        f"solving entropic OT between {len(source_sample)} and {len(target_sample)} colours: "
        f"backend={backend!r}{', ' + shown if shown else ''}, reg={reg:g}"
    )
    result = sinkhorn(
        source_sample.weights,
        target_sample.weights,
        source_sample.colors,
        target_sample.colors,
        reg=reg,
        backend=backend,
        options=options,
        rng=generator,
        policy=policy,
        **params,
    )
    timings["build"] = result.timings["build"]
    timings["iterations"] = result.timings["iterations"]
    say(
        f"kernel built in {result.timings['build']:.3f} s; {result.status} after "
        f"{result.n_iter} iterations ({result.timings['per_iteration'] * 1e3:.2f} ms each)"
    )

    say(f"mapping all {source_image.shape[0] * source_image.shape[1]} source pixels")
    mapped = np.uint8 if compact else np.float64
    forward = map_image(result, source_image, progress=progress, name="source", dtype=mapped)
    timings["map"] = forward.seconds
    backward = None
    if inverse:
        say(f"mapping all {target_image.shape[0] * target_image.shape[1]} target pixels back")
        backward = map_image(
            result, target_image, inverse=True, progress=progress, name="target", dtype=mapped
        )
        timings["inverse_map"] = backward.seconds

    check = result.true_kernel
    timings["total"] = time.perf_counter() - start
    return ColorTransferResult(
        image=forward.image,
        inverse_image=None if backward is None else backward.image,
        source=source_image,
        target=target_image,
        source_sample=source_sample,
        target_sample=target_sample,
        result=result,
        forward=forward,
        inverse=backward,
        check=check,
        backend=backend,
        reg=reg,
        backend_params=params,
        timings=timings,
    )


def color_transfer(source: Any, target: Any, **kwargs: Any) -> np.ndarray:
    """Recolour ``source`` with the palette of ``target`` by entropic optimal transport.

    Parameters
    ----------
    source, target : str, os.PathLike or array-like
        Image files (anything Pillow reads) or arrays of shape ``(H, W, 3)`` or ``(H, W, 4)``
        (uint8, uint16, or float in ``[0, 1]``); fully transparent pixels are not sampled.
    **kwargs
        Everything :func:`transfer_colors` takes: ``reg`` (default 0.1), ``backend``
        (default ``'auto'``), ``n_samples`` (default 10000), ``rng``, the sampling options,
        ``max_pixels``, solver options (:class:`~sketchot.SolverOptions`) and the backend's
        parameters.

    Returns
    -------
    ndarray, float64, shape of the source ``(H, W, 3)`` or ``(H, W, 4)``
        The recoloured source, values in ``[0, 1]``; an RGBA source keeps its alpha channel
        unchanged.

    Notes
    -----
    Cost: the solve is ``O(n r)`` per iteration for a rank-``r`` backend (``O(n^2)`` exact);
    the mapping is ``O(C r)`` for ``C`` distinct source colours. Memory stays
    ``O((n + C) r)``: no ``pixels x n`` array is formed. :func:`transfer_colors` returns the
    plan, timings and the true-kernel check as well.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> warm = rng.uniform([0.6, 0.2, 0.0], [1.0, 0.6, 0.3], size=(24, 32, 3))
    >>> cool = rng.uniform([0.0, 0.3, 0.5], [0.3, 0.7, 1.0], size=(20, 20, 3))
    >>> out = sketchot.color_transfer(warm, cool, n_samples=200, rng=0)
    >>> out.shape, bool(out[..., 2].mean() > out[..., 0].mean())
    ((24, 32, 3), True)
    """
    return transfer_colors(source, target, **kwargs).image
