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
from .solver import sinkhorn_kernel as sinkhorn_kernel_in_memory


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
    """``<P, M>`` of :func:`sinkhorn`'s plan (POT's ``sinkhorn2`` convention, the linear cost
    without the entropic term); same parameters as :func:`sinkhorn`.

    Returns
    -------
    float
        ``value_linear`` of the result: ``sum_ij P_ij M_ij`` (the problem's cost).

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((300, 2)), rng.random((200, 2)) + 1.0
    >>> round(sketchot.sinkhorn2(None, None, X, Y, reg=0.5, rng=0), 3)
    2.141
    """
    return sinkhorn(
        a, b, X, Y, reg, backend, reg_m=reg_m, rng=rng, metric=metric, p=p, **kwargs
    ).value_linear


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
    """Unbalanced entropic transport between point clouds (POT's name and argument order):
    :func:`sinkhorn` with ``reg_m`` (a number, a pair, ``inf`` for a hard side); ``metric``
    and ``p`` as in :func:`sinkhorn`.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((300, 2)), rng.random((200, 2))
    >>> a, b = np.full(300, 1 / 300), np.full(200, 2 / 200)   # masses 1 and 2
    >>> res = sketchot.sinkhorn_unbalanced(a, b, X, Y, reg=0.1, reg_m=1.0, rng=0)
    >>> bool(1.0 < res.mass < 2.0)
    True
    """
    return sinkhorn(a, b, X, Y, reg, backend, reg_m=reg_m, rng=rng, metric=metric, p=p, **kwargs)


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
    """Entropic transport between samples with the names of POT's ``ot.solve_sample``.

    ``solve_sample(X_a, X_b, a, b, reg=..., unbalanced=...)`` is :func:`sinkhorn` with
    ``reg_m=unbalanced`` (KL penalty); the result has ``ot.solve_sample``'s fields
    (``value``, ``value_linear``, ``potentials``, ``plan``, ``lazy_plan``, ``marginals``,
    ``status``). ``max_iter`` and ``tol`` default to :class:`SolverOptions`'s; ``metric``
    (``ot.solve_sample``'s name) and ``p`` are :func:`sinkhorn`'s.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> res = sketchot.solve_sample(rng.random((200, 2)), rng.random((150, 2)), reg=0.1, rng=0)
    >>> res.status, res.plan.shape
    ('converged', (200, 150))
    """
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
