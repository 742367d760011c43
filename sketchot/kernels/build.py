"""Building operators: :func:`make_kernel` from point clouds, :func:`build_kernel` from a
validated geometry; ``backend='auto'`` and ``rank='auto'`` go to :mod:`.auto`'s strategy,
fixed parameters to :func:`~sketchot.kernels.registry.build_backend`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._validation import check_dtype, check_float, check_matrix, check_rng
from ..gibbs import GibbsGeometry, make_cost
from .auto import adaptive_rank, choose, kernel_judge
from .registry import build_backend, resolve_parameters


def make_kernel(
    X: Any,
    Y: Any,
    reg: float,
    backend: str = "auto",
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | None = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    **params: Any,
):
    """Build the Gibbs-kernel operator ``exp(-c(x, y) / reg)`` of a backend, ``c(x, y) =
    ||x - y||^2`` by default.

    Parameters
    ----------
    X : array-like, shape (n, d)
        Source points (integer arrays, e.g. pixels, are converted to float). A Dask array
        (chunked by rows) builds the operator on the cluster
        (:mod:`sketchot.distributed`; needs ``pip install "sketchot[dask]"``).
    Y : array-like, shape (m, d)
        Target points (a Dask array likewise).
    reg : float
        Entropic regularisation (> 0); ``K = exp(-M / reg)`` as in POT.
    backend : str, default='auto'
        One of :func:`available_backends`, or ``'auto'``: the cheapest representation whose
        sampled product error meets ``accuracy`` (keyword, default 1e-3): the exact kernel
        stored when ``n x m`` is small, else the low-rank backends at a doubling rank, else
        the block-local kernel when an iteration of it is cheaper than an exact one, else
        the exact kernel, stored when it fits 1 GiB, streamed otherwise
        (:func:`sketchot.kernels.auto.choose`; ``info.reason`` says which and why).
    rng : None, int, Generator, ...
        Randomness of the approximation (``numpy.random.default_rng`` semantics).
    dtype : numpy.float64 or numpy.float32
        Precision of the stored kernel or factors.
    rank : int or 'auto', optional
        Number of features, for every low-rank backend (it sets the backend's own rank
        parameter: ``n_features``, ``n_landmarks``, ...); not with an explicit value of that
        parameter. ``'auto'`` doubles it from 64 until a sampled relative error of ``K~ v``
        against the true kernel meets ``accuracy`` (keyword, default 1e-3), or until an
        iteration would cost more than the exact kernel's
        (:func:`sketchot.kernels.auto.adaptive_rank`).
    metric : str or callable, default='sqeuclidean'
        The cost ``c`` (:func:`sketchot.sinkhorn`'s ``metric``; POT's ``ot.dist`` names or a
        callable ``metric(A, B) -> (len(A), len(B))`` block); the kernel's geometry carries
        it. A backend whose record does not declare it is refused (``'exact'`` and
        ``'nystrom'`` take any). Not with Dask arrays.
    p : float, default=2
        The order of ``metric='minkowski'``.
    **params
        Backend parameters (see ``sketchot.get_backend(name).defaults``).

    Returns
    -------
    KernelOperator
        With ``info.build_time`` set.
    """
    X = check_matrix(X, "X")
    Y = check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
    reg = check_float(reg, "reg", positive=True)
    geometry = GibbsGeometry(X, Y, reg, make_cost(metric, p))
    accuracy = check_float(params.pop("accuracy", DEFAULT_ACCURACY), "accuracy", positive=True)
    if backend == "auto":
        if params or rank is not None:
            raise TypeError(
                "backend='auto' chooses its own parameters; it accepts only accuracy= "
                f"(got {', '.join(sorted(params)) or 'rank'})"
            )
        generator = check_rng(rng)
        choice = choose(
            geometry, kernel_judge(accuracy, generator), accuracy=accuracy, rng=generator,
            dtype=check_dtype(dtype),
        )  # fmt: skip
        choice.kernel.info.reason = choice.reason
        return choice.kernel
    return build_kernel(
        geometry, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, **params
    )


def build_kernel(
    geometry: GibbsGeometry,
    backend: str,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: int | str | None = None,
    accuracy: float = DEFAULT_ACCURACY,
    **params: Any,
):
    """:func:`make_kernel` on an already validated geometry (``accuracy`` is the target of
    ``rank='auto'``)."""
    if isinstance(rank, str) and rank == "auto":
        dtype = check_dtype(dtype)
        resolve_parameters(backend, params, rank=rank)
        return adaptive_rank(geometry, backend, accuracy=accuracy, rng=rng, dtype=dtype, **params)
    return build_backend(
        geometry, backend, rng=rng, dtype=dtype, rank=rank, accuracy=accuracy, **params
    )
