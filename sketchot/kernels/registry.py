"""Backends registered by name, and :func:`make_kernel`, the one way to build an operator."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._validation import check_dtype, check_float, check_int, check_matrix, describe

_BUILDERS: dict[str, Callable[..., Any]] = {}

#: The paper's Sinkhorn setting (Han et al. 2020, Section 4.3): sketch dimension and degree.
PAPER_SKETCH_DIM = 20
PAPER_DEGREE = 3


def register_backend(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``builder(X, Y, reg, *, rng, dtype, **params) -> KernelOperator``."""

    def decorator(builder: Callable[..., Any]) -> Callable[..., Any]:
        if name in _BUILDERS:
            raise ValueError(f"backend {name!r} is already registered")
        _BUILDERS[name] = builder
        return builder

    return decorator


def available_backends() -> tuple[str, ...]:
    """Names of the registered backends."""
    return tuple(sorted(_BUILDERS))


def backend_parameters(backend: str) -> tuple[str, ...]:
    """Keyword parameters a backend accepts besides ``rng`` and ``dtype``."""
    builder = _get_builder(backend)
    return tuple(
        name
        for name, p in inspect.signature(builder).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("rng", "dtype")
    )


def comparable_parameters(
    sketch_dim: int = PAPER_SKETCH_DIM, degree: int = PAPER_DEGREE
) -> dict[str, dict[str, int]]:
    """The paper's "comparable cost" settings for every backend.

    For a Poly-TensorSketch of sketch dimension ``m`` and degree ``r``: RFF with ``D = m r``
    features and Nystrom with ``s = ceil(max(sqrt(r m), r))`` landmarks (Han et al. 2020,
    Section 4.3 and Appendix C). With the paper's ``m = 20, r = 3``: ``D = 60``, ``s = 8``.
    """
    sketch_dim = check_int(sketch_dim, "sketch_dim", minimum=1)
    degree = check_int(degree, "degree", minimum=0)
    return {
        "polyts": {"sketch_dim": sketch_dim, "degree": degree},
        "rff": {"n_features": max(1, sketch_dim * degree)},
        "nystrom": {"n_landmarks": max(1, math.ceil(max(math.sqrt(degree * sketch_dim), degree)))},
    }


def make_kernel(
    X: Any,
    Y: Any,
    reg: float,
    backend: str = "polyts",
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    **params: Any,
):
    """Build the Gibbs-kernel operator ``exp(-||x - y||^2 / reg)`` of a backend.

    Parameters
    ----------
    X : array-like, shape (n, d)
        Source points (integer arrays, e.g. pixels, are converted to float).
    Y : array-like, shape (m, d)
        Target points.
    reg : float
        Entropic regularisation (> 0); ``K = exp(-M / reg)`` as in POT.
    backend : str, default='polyts'
        One of :func:`available_backends`: ``'exact'``, ``'rff'``, ``'nystrom'``, ``'polyts'``.
    rng : None, int, Generator, ...
        Randomness of the approximation (``numpy.random.default_rng`` semantics).
    dtype : numpy.float64 or numpy.float32
        Precision of the stored kernel or factors.
    **params
        Backend parameters: ``rff``: ``n_features``; ``nystrom``: ``n_landmarks``,
        ``landmarks``; ``polyts``: ``sketch_dim``, ``degree``, ``coreset_size``,
        ``coefficients``, ``regularizer``, ``center``; ``exact``: ``max_dense_bytes``.

    Returns
    -------
    KernelOperator
        With ``build_time`` set to the seconds the build took.
    """
    X = check_matrix(X, "X")
    Y = check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
    reg = check_float(reg, "reg", positive=True)
    dtype = check_dtype(dtype)
    builder = _get_builder(backend)
    accepted = backend_parameters(backend)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise TypeError(
            f"backend {backend!r} got unexpected parameter(s) {', '.join(map(repr, unknown))}; "
            f"it accepts: {', '.join(accepted) if accepted else 'no parameters'}"
        )
    start = time.perf_counter()
    operator = builder(X, Y, reg, rng=rng, dtype=dtype, **params)
    operator.build_time = time.perf_counter() - start
    return operator


def _get_builder(backend: Any) -> Callable[..., Any]:
    if not isinstance(backend, str) or backend not in _BUILDERS:
        raise ValueError(
            f"backend must be one of {', '.join(map(repr, available_backends()))}; "
            f"got {describe(backend)}"
        )
    return _BUILDERS[backend]
