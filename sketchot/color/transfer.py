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
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validation import check_choice, check_float, check_int, check_rng, describe
from ..kernels import available_backends
from ..solver import SinkhornResult, TrueKernelCheck, sinkhorn
from .images import (
    PIXEL_CHUNK,
    ColorIndex,
    check_memory,
    distinct_colors,
    image_pixels,
    load_image,
    sample_pixels,
)

#: Entropic regularisation for colours in [0, 1]: POT's colour example uses 0.1. At reg = 1
#: the plan is so blurred that every colour maps close to the target's mean colour.
DEFAULT_REG = 0.1

#: Backend whose result is closest to the exact one at DEFAULT_REG for a small fraction of its
#: cost. Measured with 10^4 samples per image at reg = 0.1 (mean |RGB difference| to the exact
#: recolouring): Nystrom with 400 k-center landmarks 0.000-0.07/255 on five pairs (the three
#: project pairs, matplotlib's grace_hopper.jpg onto two of them; two seeds each) at 4-10 ms
#: per iteration against 86-190 ms for the exact kernel; RFF (D = 60-1000) and
#: Poly-TensorSketch (rank 61-400) are off by 10-60/255 at this reg (their kernel errors exceed
#: the small entries of K).
DEFAULT_BACKEND = "nystrom"

#: Samples drawn from each image.
DEFAULT_N_SAMPLES = 10_000

#: Backend parameters used when the caller does not set them. The library's Nystrom default
#: (8 landmarks, the paper's equal-cost setting at reg = 1) is far too coarse at reg = 0.1: on
#: the default pair K~ v turns non-positive for most rows, the solve stalls, and the
#: recolouring is off by 61/255. Measured at reg = 0.1, 10^4 samples, two landmark seeds:
#: 100 landmarks fail on some pairs (48/255 with k-center on the night-city pair, 40/255 with
#: uniform landmarks on grace_hopper.jpg onto the meadow); 400 uniform landmarks still fail
#: there for one seed of two (55/255); 400 k-center landmarks stay within 0.07/255 on every
#: pair and seed. At reg = 0.05 even 1131 landmarks fail on that pair: use backend='exact'
#: below reg = 0.1 (transfer_colors warns when the true-kernel check fails).
COLOR_BACKEND_DEFAULTS: dict[str, dict[str, Any]] = {
    "nystrom": {"n_landmarks": 400, "landmarks": "kcenter"}
}

#: transfer_colors warns when the scalings miss the TRUE kernel's marginals by more than this
#: relative L1 error (a good approximation gives 1e-4 or less, the failures above 1 or more).
TRUE_KERNEL_WARNING = 1e-2

#: Distinct colours mapped per call of the out-of-sample operator. Low-rank backends: large
#: calls amortise the per-call work on the fitted side (16384 was 20% slower than 65536 for
#: rff and polyts, measured). Exact backend: smaller calls, so that progress is reported every
#: few seconds (each colour costs O(n d) there).
MAP_CHUNK = 1 << 16
MAP_CHUNK_EXACT = 1 << 13

Progress = Callable[[str], None]


@dataclass(frozen=True)
class MappedImage:
    """An image whose every pixel went through a colour map.

    Attributes
    ----------
    image : ndarray, shape (H, W, 3)
        Mapped colours, clipped to ``[0, 1]`` (float64), or rounded to 8 bits (uint8, with
        ``map_image(..., dtype=numpy.uint8)``).
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
    image : path, array or PIL image
        Anything :func:`load_image` accepts.
    inverse : bool, default=False
        ``False``: the forward map onto the target palette
        (:meth:`~sketchot.SinkhornResult.barycentric_map`); ``True``: the inverse map onto
        the source palette (:meth:`~sketchot.SinkhornResult.inverse_barycentric_map`).
    chunk_size : int, optional
        Distinct colours per call (memory ``O(chunk_size x rank)`` inside the operator);
        default :data:`MAP_CHUNK` (low-rank backends) or :data:`MAP_CHUNK_EXACT` (exact).
    progress : callable, optional
        Called with a short text line after each chunk.
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

    Raises
    ------
    MemoryError
        The mapped image would not fit in the available memory (checked before allocating).

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
    if result.kernel.X.shape[1] != 3:
        raise ValueError(
            "result must come from a solve between RGB colours (3 columns); got points with "
            f"{result.kernel.X.shape[1]} columns"
        )
    if chunk_size is None:
        chunk_size = MAP_CHUNK_EXACT if result.kernel.is_exact else MAP_CHUNK
    chunk_size = check_int(chunk_size, "chunk_size", minimum=1)
    pixel_chunk = check_int(pixel_chunk, "pixel_chunk", minimum=1)
    out_dtype = np.dtype(dtype)
    if out_dtype not in (np.dtype(np.float64), np.dtype(np.uint8)):
        raise ValueError(f"dtype must be numpy.float64 or numpy.uint8; got {describe(dtype)}")
    picture = load_image(image, name=name, dtype=None)
    start = time.perf_counter()
    pixels = image_pixels(picture)
    n_pixels = pixels.shape[0]
    check_memory(n_pixels * 3 * out_dtype.itemsize, f"the mapped {name} ({n_pixels} pixels)")
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
    if table is None and gather is None:  # every pixel mapped on its own, in order
        output, n_clipped = mapped, int(np.count_nonzero(outside))
    else:
        output = np.empty((n_pixels, 3), dtype=out_dtype)
        n_clipped = 0
        for begin in range(0, n_pixels, pixel_chunk):
            block = slice(begin, min(begin + pixel_chunk, n_pixels))
            index = table.index(pixels[block]) if table is not None else gather[block]
            output[block] = mapped[index]
            n_clipped += int(np.count_nonzero(outside[index]))
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
        The source recoloured with the target's palette, in ``[0, 1]``.
    inverse_image : ndarray or None
        The target recoloured with the source's palette (``inverse=True``).
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
    """Backend parameters for colour transfer: the caller's, over :data:`COLOR_BACKEND_DEFAULTS`.

    A default landmark count is lowered to ``n_points`` (the size of both samples together)
    when the samples are smaller than it; a value the caller set is passed on unchanged.
    """
    check_choice(backend, "backend", available_backends())
    defaults = dict(COLOR_BACKEND_DEFAULTS.get(backend, {}))
    if n_points is not None and "n_landmarks" in defaults:
        defaults["n_landmarks"] = min(defaults["n_landmarks"], n_points)
    return {**defaults, **params}


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
    max_iter: int = 1000,
    tol: float = 1e-9,
    safeguard: str = "exact",
    verbose: bool = False,
    progress: Progress | None = None,
    warn: bool = True,
    compact: bool = False,
    **backend_params: Any,
) -> ColorTransferResult:
    """Colour transfer with every intermediate result and timing (see :func:`color_transfer`).

    Parameters
    ----------
    source, target, reg, backend, n_samples, rng, **backend_params
        As in :func:`color_transfer`.
    replace, weighted : bool, default=False
        Sampling options (see :func:`~sketchot.color.sample_pixels`).
    max_iter, tol, safeguard
        Solver options (see :func:`sketchot.sinkhorn`).
    inverse : bool, default=False
        Also recolour the target with the source's palette.
    verbose : bool, default=False
        Let the solver print its build, marginal error at every check and true-kernel check.
    progress : callable, optional
        Receives one text line per step (sampling, solve, mapping chunks, check).
    warn : bool, default=True
        Warn on non-convergence, safeguard repairs, and a failed true-kernel check
        (relative L1 marginal error above :data:`TRUE_KERNEL_WARNING`).
    compact : bool, default=False
        Full-resolution photographs in bounded memory: keep ``source`` and ``target`` as
        stored (uint8, or uint16 for 16-bit files) and return ``image`` and ``inverse_image``
        as uint8 (3 bytes per pixel each instead of 24 for float64).

    Returns
    -------
    ColorTransferResult
    """
    reg = check_float(reg, "reg", positive=True)
    n_samples = check_int(n_samples, "n_samples", minimum=1)
    resolve_backend_params(backend, backend_params)  # fail on a bad backend before any work
    generator = check_rng(rng)
    say = progress if progress is not None else (lambda text: None)
    timings: dict[str, float] = {}
    start = time.perf_counter()

    tick = time.perf_counter()
    stored = None if compact else np.float64
    source_image = load_image(source, name="source", dtype=stored)
    target_image = load_image(target, name="target", dtype=stored)
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
        max_iter=max_iter,
        tol=tol,
        rng=generator,
        verbose=verbose,
        safeguard=safeguard,
        warn=warn,
        true_kernel_samples=0,  # the larger check below replaces the solver's quick one
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

    tick = time.perf_counter()
    check = result.check_true_kernel(rng=generator)
    timings["check"] = time.perf_counter() - tick
    worst = max(check.relative_a, check.relative_b)
    if warn and worst > TRUE_KERNEL_WARNING:
        warnings.warn(
            f"backend {backend!r} at reg={reg:g}: the scalings miss the exact kernel's "
            f"marginals by {worst:.2g} (relative L1, sampled), so the recolouring can differ "
            f"visibly from the exact one; raise the backend's rank or use backend='exact'",
            UserWarning,
            stacklevel=2,
        )
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


def color_transfer(
    source: Any,
    target: Any,
    *,
    reg: float = DEFAULT_REG,
    backend: str = DEFAULT_BACKEND,
    n_samples: int = DEFAULT_N_SAMPLES,
    rng: Any = None,
    **kwargs: Any,
) -> np.ndarray:
    """Recolour ``source`` with the palette of ``target`` by entropic optimal transport.

    Parameters
    ----------
    source, target : str, os.PathLike or array-like
        Image files (anything Pillow reads) or arrays of shape ``(H, W, 3)`` (uint8, uint16,
        or float in ``[0, 1]``); see :func:`~sketchot.color.load_image`.
    reg : float, default=0.1
        Entropic regularisation for colours in ``[0, 1]`` (``K = exp(-||x - y||^2 / reg)``);
        smaller is sharper and slower to converge, larger blurs every colour towards the
        target's mean.
    backend : {'nystrom', 'exact', 'rff', 'polyts'}, default='nystrom'
        Kernel representation (see :func:`sketchot.make_kernel`). Nystrom defaults to 400
        k-center landmarks here (:data:`COLOR_BACKEND_DEFAULTS`). For ``reg < 0.1`` prefer
        ``'exact'`` (streamed, ``O(n^2)`` per iteration); a warning says when an approximate
        backend fails the true-kernel check.
    n_samples : int, default=10000
        Colours sampled from each image for the transport problem.
    rng : None, int or Generator
        The only source of randomness (pixel sampling and the backend's draws).
    **kwargs
        ``replace``, ``weighted`` (see :func:`~sketchot.color.sample_pixels`), ``max_iter``,
        ``tol``, ``safeguard``, ``verbose``, ``warn`` (see :func:`sketchot.sinkhorn`), and the
        backend's parameters (``n_landmarks``, ``landmarks``, ``n_features``, ``sketch_dim``,
        ``degree``, ``coreset_size``, ...).

    Returns
    -------
    ndarray, float64, shape of the source ``(H, W, 3)``
        The recoloured source, values in ``[0, 1]``.

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
    return transfer_colors(
        source, target, reg=reg, backend=backend, n_samples=n_samples, rng=rng, **kwargs
    ).image
