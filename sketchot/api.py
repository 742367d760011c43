"""The public entries, and the one place where Dask inputs part from in-memory ones.

``sketchot.sinkhorn``, ``sinkhorn2``, ``sinkhorn_unbalanced``, ``solve_sample``,
``sinkhorn_kernel`` and ``make_kernel`` send Dask arrays
(and kernels built on them) to :mod:`sketchot.distributed`, imported only then (Dask is an
optional dependency), and everything else to :mod:`sketchot.solver` and
:mod:`sketchot.kernels`, which never see a Dask array. The top layer: nothing in the package
imports it but ``sketchot/__init__.py``.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

import numpy as np

from ._dask import any_dask, require_dask
from .kernels import make_kernel as make_kernel_in_memory
from .solver import sinkhorn as sinkhorn_in_memory
from .solver import sinkhorn2 as sinkhorn2_in_memory
from .solver import sinkhorn_kernel as sinkhorn_kernel_in_memory
from .solver import sinkhorn_unbalanced as sinkhorn_unbalanced_in_memory
from .solver import solve_sample as solve_sample_in_memory


def _distributed():
    """:mod:`sketchot.distributed`, with a clear error when Dask is not installed."""
    require_dask()
    from . import distributed

    return distributed


def _refuse_metric(metric: Any, p: Any) -> None:
    """Dask solves and kernels use the squared-Euclidean cost only."""
    if not (isinstance(metric, str) and metric == "sqeuclidean"):
        name = metric if isinstance(metric, str) else "a callable"
        raise NotImplementedError(
            f"metric={name!r} is not implemented on Dask arrays (squared Euclidean only); "
            "compute the clouds (numpy arrays) to solve with another metric"
        )
    del p


def _on_dask(kernel: Any, *weights: Any) -> bool:
    """Whether a solve on ``kernel`` runs with Dask: a kernel built on Dask clouds, or Dask
    weights."""
    geometry = getattr(kernel, "geometry", None)
    return any_dask(getattr(geometry, "X", None), *weights)


@wraps(sinkhorn_in_memory)
def sinkhorn(
    a: Any,
    b: Any,
    X: Any,
    Y: Any = None,
    reg: float = 1.0,
    backend: str = "auto",
    *,
    reg_m: Any = None,
    rng: Any = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    **kwargs: Any,
):
    if any_dask(a, b, X, Y):
        _refuse_metric(metric, p)
        return _distributed().sinkhorn_dask(
            a, b, X, Y, reg, backend, reg_m=reg_m, rng=rng, **kwargs
        )
    return sinkhorn_in_memory(
        a, b, X, Y, reg, backend, reg_m=reg_m, rng=rng, metric=metric, p=p, **kwargs
    )


@wraps(sinkhorn2_in_memory)
def sinkhorn2(
    a: Any,
    b: Any,
    X: Any,
    Y: Any = None,
    reg: float = 1.0,
    backend: str = "auto",
    *,
    reg_m: Any = None,
    rng: Any = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    **kwargs: Any,
) -> float:
    return sinkhorn(
        a, b, X, Y, reg, backend, reg_m=reg_m, rng=rng, metric=metric, p=p, **kwargs
    ).value_linear


@wraps(sinkhorn_unbalanced_in_memory)
def sinkhorn_unbalanced(
    a: Any,
    b: Any,
    X: Any,
    Y: Any,
    reg: float,
    reg_m: Any,
    backend: str = "auto",
    *,
    rng: Any = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    **kwargs: Any,
):
    return sinkhorn(a, b, X, Y, reg, backend, reg_m=reg_m, rng=rng, metric=metric, p=p, **kwargs)


@wraps(solve_sample_in_memory)
def solve_sample(
    X_a: Any,
    X_b: Any,
    a: Any = None,
    b: Any = None,
    reg: float = 1.0,
    unbalanced: Any = None,
    backend: str = "auto",
    *,
    max_iter: int | None = None,
    tol: float | None = None,
    rng: Any = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    **kwargs: Any,
):
    if max_iter is not None:
        kwargs["max_iter"] = max_iter
    if tol is not None:
        kwargs["tol"] = tol
    return sinkhorn(
        a, b, X_a, X_b, reg, backend, reg_m=unbalanced, rng=rng, metric=metric, p=p, **kwargs
    )


@wraps(sinkhorn_kernel_in_memory)
def sinkhorn_kernel(
    a: Any, b: Any, kernel: Any, *, reg_m: Any = None, rng: Any = None, **kwargs: Any
):
    if _on_dask(kernel, a, b):
        metric, p = kwargs.pop("metric", None), kwargs.pop("p", None)
        _refuse_metric("sqeuclidean" if metric is None else metric, p)
        return _distributed().sinkhorn_kernel_dask(a, b, kernel, reg_m=reg_m, rng=rng, **kwargs)
    return sinkhorn_kernel_in_memory(a, b, kernel, reg_m=reg_m, rng=rng, **kwargs)


@wraps(make_kernel_in_memory)
def make_kernel(
    X: Any,
    Y: Any,
    reg: float,
    backend: str = "auto",
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    rank: Any = None,
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    **params: Any,
):
    if any_dask(X, Y):
        _refuse_metric(metric, p)
        return _distributed().make_kernel_dask(
            X, Y, reg, backend, rng=rng, dtype=dtype, rank=rank, **params
        )
    return make_kernel_in_memory(
        X, Y, reg, backend, rng=rng, dtype=dtype, rank=rank, metric=metric, p=p, **params
    )
