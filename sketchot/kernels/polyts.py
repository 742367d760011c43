"""The polyts family: polynomial expansions of the Gibbs kernel, global or block-local.

``exp(-||x - y||^2 / reg)`` is the Gaussian kernel with ``gamma = 1 / reg``. Variants:

* ``'paper'``: Coreset-TS, the Poly-TensorSketch of Han, Avron and Shin (2020), unchanged;
* ``'improved'``: exact monomial features for the low degrees that fit the rank budget,
  TensorSketches with calibrated per-degree sizes for the rest, coefficients fitted for
  relative error (:class:`~sketchot.sketch.GaussianPolySketch`): thin factors of rank
  ``rank``;
* ``'local'``: an alias of the backend ``'polyts_local'`` at its defaults, the block-local
  expansion around cluster centres (:class:`~sketchot.kernels.local.LocalPolyKernel`): every
  entry to a relative ``accuracy / 100`` at any reg, in dimension ``d <= 4``; its own parameters
  (``tau``, ``rtol``, ``max_features``, ``truncate``) are reachable as ``backend='polyts_local'``;
* ``'auto'`` (default): ``'improved'`` when its sampled product error meets ``accuracy``,
  otherwise ``'polyts_local'`` where its record's dimension bound allows it and it meets
  ``accuracy``, otherwise ``'improved'`` (the solver's true-kernel check then reports the
  miss): :func:`sketchot.kernels.judge.escalate` with the sampled check of
  ``backend='auto'``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import DeviceArrays
from .._defaults import DEFAULT_ACCURACY
from .._validation import check_choice, check_float, check_int, check_rng
from ..gibbs import GibbsGeometry
from ..sketch import GaussianPolySketch, VanishingFunctionError
from .base import KernelInfo, KernelOperator
from .judge import escalate, kernel_judge
from .local import MAX_DIMENSION, build_local
from .lowrank import FactorMaps, low_rank_from_maps
from .paper import PAPER_DEGREE, PAPER_SKETCH_DIM
from .registry import register_backend

#: The paper's coreset size (k = 10); clipped to the number of points when not given.
DEFAULT_CORESET_SIZE = 10

VARIANTS = ("auto", "improved", "paper", "local")

#: The backend ``variant='local'`` stands for, and ``variant='auto'`` falls back to.
LOCAL_BACKEND = "polyts_local"


def _memory(n: int, m: int, d: int, params: dict[str, Any], itemsize: int) -> float:
    """Factors of the global variants (the local one stores O((n + m) R) features, less)."""
    rank = params.get("rank") or 1 + (params.get("sketch_dim") or PAPER_SKETCH_DIM) * (
        params.get("degree") or PAPER_DEGREE
    )
    return (n + m) * rank * (8 + itemsize) * 2


def polyts_maps(
    geometry: GibbsGeometry,
    *,
    rng: Any,
    dtype: Any,
    sketch_dim: int | None,
    degree: int | None,
    coreset_size: int | None,
    coefficients: str,
    regularizer: str | None,
    nonnegative: bool,
    taylor_center: float | str,
    center: Any,
    variant: str,
    rank: int | None,
    accuracy: float,
) -> FactorMaps:
    """The fitted maps of a global variant of :func:`build_polyts` (every parameter explicit).

    ``variant='auto'`` gives the improved sketch as it is: the sampled check against the true
    kernel and the block-local fallback are :func:`build_polyts`'s. The block-local variant
    has no factor maps.
    """
    del accuracy
    check_choice(variant, "variant", VARIANTS)
    if variant == "local":
        raise NotImplementedError(
            "polyts variant='local' is a block-local expansion, not factor maps: it needs the "
            "clouds in memory (use variant='improved' or backend='nystrom')"
        )
    chosen = "improved" if variant == "auto" else variant
    return _global_maps(
        geometry, rng, dtype, sketch_dim, degree, coreset_size, coefficients, regularizer,
        nonnegative, taylor_center, center, chosen, rank,
    )  # fmt: skip


@register_backend(
    "polyts",
    rank_parameter="rank",
    sizing_parameters=("sketch_dim", "degree"),
    signed=True,
    memory=_memory,
    factor_maps=polyts_maps,
    advice="it only helps at large reg (>= the squared spread of the data); below it "
    "backend='polyts_local' (d <= 4) is accurate at any reg",
    summary="polynomial sketches: the paper's Coreset-TS, an improved sketch",
)
def build_polyts(
    geometry: GibbsGeometry,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    sketch_dim: int | None = None,
    degree: int | None = None,
    coreset_size: int | None = None,
    coefficients: str = "coreset",
    regularizer: str | None = "shifted",
    nonnegative: bool = False,
    taylor_center: float | str = 0.0,
    center: Any = "auto",
    variant: str = "auto",
    rank: int | None = None,
    accuracy: float = DEFAULT_ACCURACY,
) -> KernelOperator:
    """A polyts kernel (see the module notes for the variants).

    Parameters
    ----------
    sketch_dim : int, optional
        TensorSketch dimension ``m`` (default 20); exclusive with ``rank``.
    degree : int, optional
        Polynomial degree ``r`` (default 3) for ``variant='paper'``. For ``'improved'``
        ``(degree, sketch_dim)`` size the rank ``1 + r m`` when ``rank`` is not given (the
        degree is then searched up to 16); with ``rank``, ``degree`` caps the search.
    coreset_size : int, optional
        k-center clusters ``k`` for ``coefficients='coreset'``; default ``min(10, n, m)``.
        An explicit value must satisfy ``1 <= k <= min(n, m)``.
    coefficients : {'coreset', 'optimal', 'chebyshev', 'taylor'}, default='coreset'
    regularizer : {'shifted', 'theorem', 'none'}, default='shifted'
    nonnegative : bool, default=False
    taylor_center : float or 'mean', default=0.0
        Expansion point of ``coefficients='taylor'``.
    center : {'auto', 'mean', 'bbox'}, None or array, default='auto'
        Common translation of both clouds before sketching (``'auto'``: ``'mean'`` for
        ``'paper'``, ``'bbox'`` for ``'improved'``).
    variant : {'auto', 'improved', 'paper', 'local'}, default='auto'
    rank : int, optional
        Total number of features of a global variant (the constant included).
    accuracy : float, default=1e-3
        ``variant='auto'``: the sampled relative product error the global sketch must meet
        (the solver passes its own ``accuracy``); the block-local kernel sizes its entries'
        error from it (:func:`~sketchot.kernels.local.rtol_for`).

    Notes
    -----
    Global variants: build ``O((n + m) r (d + m log m) + (n + m) k (d + r^2))``, memory
    ``O((n + m) rank)``. Local: see :class:`~sketchot.kernels.local.LocalPolyKernel`.
    """
    check_choice(variant, "variant", VARIANTS)
    if variant == "local":
        return build_local(geometry, rng=rng, dtype=dtype, accuracy=accuracy)
    chosen = "improved" if variant == "auto" else variant

    def build_global() -> KernelOperator:
        try:
            maps = _global_maps(
                geometry, rng, dtype, sketch_dim, degree, coreset_size, coefficients,
                regularizer, nonnegative, taylor_center, center, chosen, rank,
            )  # fmt: skip
        except VanishingFunctionError as error:
            raise vanishing_kernel(geometry, chosen) from error
        return low_rank_from_maps(geometry, maps)

    if variant != "auto":
        return build_global()
    accuracy = check_float(accuracy, "accuracy", positive=True)
    candidates = [("polyts", build_global)]
    if geometry.X.shape[1] <= MAX_DIMENSION:  # where the block-local kernel builds
        candidates.append(
            (LOCAL_BACKEND, lambda: build_local(geometry, rng=rng, dtype=dtype, accuracy=accuracy))
        )
    choice = escalate(candidates, kernel_judge(accuracy, rng), skip=(VanishingFunctionError,))
    choice.kernel.info.reason = choice.reason
    return choice.kernel


def vanishing_kernel(geometry: GibbsGeometry, variant: str) -> VanishingFunctionError:
    """The sketch's :class:`~sketchot.sketch.VanishingFunctionError` (its ``f`` and ``U V^T``)
    in the terms of the call: the Gibbs kernel of the caller's points at their ``reg``."""
    reg, n, m = geometry.reg, *geometry.shape
    spread = geometry.max_cost() / reg
    local = geometry.X.shape[1] <= MAX_DIMENSION
    return VanishingFunctionError(
        f"backend='polyts' (variant={variant!r}) cannot fit its global polynomial to these "
        f"{n} x {m} points at reg={reg:g}: the sketch expands the Gibbs kernel "
        "exp(-||x - y||^2 / reg) around the clouds' centre, and with the points this far apart "
        f"for this reg (largest cost / reg up to {spread:.3g}: far outliers, or a small reg) "
        "the expansion underflows to 0 in float64 on every pair of points it samples. Pass a "
        "larger reg, "
        + ("backend='polyts_local', " if local else "")
        + "backend='exact' or backend='auto' (which checks the kernel against the true one)"
    )


def _global_maps(
    geometry, rng, dtype, sketch_dim, degree, coreset_size, coefficients, regularizer,
    nonnegative, taylor_center, center, variant, rank,
) -> FactorMaps:  # fmt: skip
    reg = geometry.reg
    n, m = geometry.shape
    if coreset_size is None:
        coreset_size = min(DEFAULT_CORESET_SIZE, n, m)
    else:
        check_int(coreset_size, "coreset_size", minimum=1)
    # In memory: every point. A chunked geometry: a sample drawn with the generator when a
    # side is larger than it fits on the client, with the centre of ALL points.
    generator = check_rng(rng)
    X, Y = geometry.fit_clouds(generator)
    if isinstance(center, str) and center == "mean":
        center = geometry.center  # the same formula as the sketch's own mean centre
    sketch = GaussianPolySketch(
        1.0 / reg,
        degree=degree,
        sketch_dim=sketch_dim,
        coefficients=coefficients,
        coreset_size=coreset_size,
        regularizer=regularizer,
        nonnegative=nonnegative,
        taylor_center=taylor_center,
        center=center,
        variant=variant,
        rank=rank,
        fit_tolerance=None,  # the solver checks against the true kernel, 'auto' samples its own
        rng=generator,
    ).fit(X, Y)

    def left_map(points: np.ndarray) -> np.ndarray:
        return sketch.transform_x(points, dtype=dtype)

    def right_map(points: np.ndarray) -> np.ndarray:
        return sketch.transform_y(points, dtype=dtype)

    info = KernelInfo(
        "polyts",
        {
            "sketch_dim": sketch.sketch_.sketch_dim_,
            "degree": sketch.sketch_.degree_,
            "coreset_size": coreset_size,
            "coefficients": coefficients,
            "variant": variant,
        },
    )

    def device_left(on: DeviceArrays, points: np.ndarray) -> Any:
        return sketch.transform_x(points, dtype=dtype, device=on)

    def device_right(on: DeviceArrays, points: np.ndarray) -> Any:
        return sketch.transform_y(points, dtype=dtype, device=on)

    return FactorMaps(
        info, left_map, right_map, left_map=left_map, right_map=right_map, dtype=dtype,
        attributes={"sketch": sketch}, device_left_factor=device_left,
        device_right_factor=device_right,
    )  # fmt: skip
