"""Batches of small problems: :func:`sinkhorn_batch` (:mod:`sketchot.solver.batch`, the one
engine on a stacked kernel) and POT's name for it, :func:`solve_sample_batch`."""

from __future__ import annotations

from typing import Any

from .solver.batch import BatchResult, sinkhorn_batch


def solve_sample_batch(
    X_a: Any,
    X_b: Any,
    reg: float = 1.0,
    a: Any = None,
    b: Any = None,
    *,
    max_iter: int | None = None,
    tol: float | None = None,
    **kwargs: Any,
) -> BatchResult:
    """:func:`sinkhorn_batch` with the argument order of POT's ``ot.solve_sample_batch``
    (entropic, squared Euclidean; ``max_iter`` and ``tol`` default to
    :class:`~sketchot.SolverOptions`'s).

    Parameters
    ----------
    X_a : array-like, shape (B, n, d)
        Source clouds.
    X_b : array-like, shape (B, m, d)
        Target clouds.
    reg : float, default=1.0
        Entropic regularisation (> 0).
    a, b : array-like of shape (B, n), (B, m), optional
        Weights per pair (default uniform).
    max_iter, tol : optional
        Solver options.
    **kwargs
        Further options of :func:`sinkhorn_batch`.

    Returns
    -------
    BatchResult
        ``value`` is :func:`sketchot.sinkhorn`'s (``<P, M> + reg KL(P | a b^T)``, POT's
        ``ot.solve_sample`` convention); ``value_linear`` is ``<P, M>``.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> res = sketchot.solve_sample_batch(rng.random((8, 20, 2)), rng.random((8, 25, 2)), 0.1)
    >>> res.potentials[0].shape, res.value_linear.shape
    ((8, 20), (8,))
    """
    if max_iter is not None:
        kwargs["max_iter"] = max_iter
    if tol is not None:
        kwargs["tol"] = tol
    return sinkhorn_batch(X_a, X_b, a, b, reg, **kwargs)


__all__ = ["BatchResult", "sinkhorn_batch", "solve_sample_batch"]
