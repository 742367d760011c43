"""Batches of small problems: :func:`sinkhorn_batch` (:mod:`sketchot.solver.batch`, the one
engine on a stacked kernel), POT's name for it, :func:`solve_sample_batch`, and the matrix
of divergences between many small clouds built on it, :func:`pairwise_divergences`."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._arrays import in_user_arrays
from ._validation import user_stacklevel
from .solver import (
    MASS_RTOL,
    AccuracyWarning,
    BatchResult,
    check_batch_keywords,
    sinkhorn_batch,
    solve_batch,
    stack_clouds,
    stack_weights,
    value_error_estimate,
)


@in_user_arrays("X_a", "X_b", "a", "b", refuse_gradients=True)
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
    return solve_batch(
        X_a, X_b, a, b, reg, caller="solve_sample_batch", names=("X_a", "X_b", "a", "b"), **kwargs
    )


#: Pairs of clouds handed to one :func:`sinkhorn_batch` call by :func:`pairwise_divergences`:
#: their clouds and potentials are held at once (``O(pairs n)``), not all ``K^2 / 2`` pairs'.
PAIRS_PER_CALL = 4096


@dataclass
class PairwiseDivergences:
    """Output of :func:`pairwise_divergences`: ``(K, K)`` symmetric arrays.

    Attributes
    ----------
    matrix : ndarray, shape (K, K)
        The debiased Sinkhorn divergences ``S_ij = OT(i, j) - OT(i, i) / 2 - OT(j, j) / 2``
        (zero diagonal, exactly 0 between identical clouds of identical weights; negatives
        within ``value_error`` clipped to 0, see ``clipped``).
    value_error : ndarray, shape (K, K)
        Estimated error of each entry: the first-order primal-dual gaps of its three plans
        on the exact kernel (:class:`~sketchot.DivergenceResult`'s ``value_error``).
    ot : ndarray, shape (K, K)
        The transport values ``OT(i, j)`` (diagonal: the symmetric problems).
    true_kernel_error : ndarray, shape (K, K)
        The largest relative L1 marginal error of the plans an entry uses (exact kernels:
        the accuracy contract's measure).
    n_iter : ndarray of int, shape (K, K)
        Iterations of each problem (diagonal: the symmetric ones).
    converged : ndarray of bool, shape (K, K)
        Whether the problems an entry uses all stopped on their tolerance.
    clipped : ndarray of bool, shape (K, K)
        Entries whose small negative value (within ``value_error``) was set to 0.
    accuracy : float or None
        The accuracy target the checks are judged against.
    timings : dict
        ``self`` and ``cross`` seconds.
    notes : list of str
    """

    matrix: np.ndarray
    value_error: np.ndarray
    ot: np.ndarray
    true_kernel_error: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray
    clipped: np.ndarray
    accuracy: float | None
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def accuracy_met(self) -> np.ndarray | None:
        """``true_kernel_error <= accuracy`` per entry (``None`` when ``accuracy=None``)."""
        return None if self.accuracy is None else self.true_kernel_error <= self.accuracy

    def __repr__(self) -> str:
        K = self.matrix.shape[0]
        return (
            f"PairwiseDivergences(clouds={K}, converged={bool(self.converged.all())}, "
            f"max error={self.true_kernel_error.max():.2e})"
        )


@in_user_arrays("clouds", "weights", refuse_gradients=True)
def pairwise_divergences(
    clouds: Any, weights: Any = None, reg: float = 1.0, **kwargs: Any
) -> PairwiseDivergences:
    """Debiased Sinkhorn divergences between every two of ``K`` clouds, as a matrix.

    ``S_ij = OT(i, j) - OT(i, i) / 2 - OT(j, j) / 2`` with ``OT`` the value of
    :func:`sketchot.sinkhorn` (``<P, M> + reg KL(P | a b^T)``, squared Euclidean cost;
    :func:`sketchot.sinkhorn_divergence`'s balanced divergence, Feydy et al. 2019). The
    ``K`` symmetric problems and the ``K (K - 1) / 2`` cross problems are solved by
    :func:`sinkhorn_batch` (exact kernels, solved together), the cross ones in calls of at
    most :data:`PAIRS_PER_CALL` pairs.

    Parameters
    ----------
    clouds : array-like, shape (K, n, d), or sequence of K arrays of shapes (n_k, d)
        The clouds; clouds of different sizes are padded with points of zero weight
        (:func:`sinkhorn_batch`).
    weights : array-like of shape (K, n) or sequence of K arrays of lengths n_k, optional
        Their weights (default uniform), all of the same mass (balanced transport).
    reg : float, default=1.0
        Entropic regularisation.
    **kwargs
        Options of :func:`sinkhorn_batch` (solver options, ``max_bytes``, ``round_iter``).

    Returns
    -------
    PairwiseDivergences

    Warns
    -----
    AccuracyWarning
        When entries are negative beyond their estimated error, naming the problems that
        did not converge (raise ``max_iter``).

    Notes
    -----
    ``O(K^2 n^2 d)`` time per iteration; memory that of :func:`sinkhorn_batch` on at most
    :data:`PAIRS_PER_CALL` pairs. The symmetric problems run the same iteration as the cross
    ones (not the averaged symmetric one), as :func:`sketchot.sinkhorn_divergence` does.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> clouds = rng.random((5, 40, 2)) + rng.random((5, 1, 2))
    >>> res = sketchot.pairwise_divergences(clouds, reg=0.05)
    >>> res.matrix.shape, bool(np.all(res.matrix == res.matrix.T)), bool(res.accuracy_met.all())
    ((5, 5), True, True)
    """
    check_batch_keywords("pairwise_divergences", kwargs)
    X, sizes = stack_clouds(clouds, "clouds", "weights")
    K, n = X.shape[:2]
    w = stack_weights(weights, "weights", (K, n), "clouds", sizes)
    mass = w.sum(axis=1)
    off = ~np.isclose(mass, mass[0], rtol=MASS_RTOL, atol=0.0)
    if off.any():
        k = int(np.flatnonzero(off)[0])
        raise ValueError(
            f"weights must give every cloud the same mass (balanced transport); cloud 0 has "
            f"mass {mass[0]:.8g} and cloud {k} has {mass[k]:.8g}"
        )
    begin = time.perf_counter()
    own = sinkhorn_batch(X, X, w, w, reg, **kwargs)
    own_error = batch_value_errors(own)
    timings = {"self": time.perf_counter() - begin}
    ot = np.diag(own.value)
    error = np.diag(own_error)
    true_error = np.diag(own.true_kernel_error)
    n_iter = np.diag(own.n_iter)
    converged = np.diag(own.converged)
    rows, cols = np.triu_indices(K, 1)
    same = np.zeros((K, K), dtype=bool)
    begin = time.perf_counter()
    for first in range(0, rows.size, PAIRS_PER_CALL):
        i, j = rows[first : first + PAIRS_PER_CALL], cols[first : first + PAIRS_PER_CALL]
        cross = sinkhorn_batch(X[i], X[j], w[i], w[j], reg, **kwargs)
        equal = np.all(X[i] == X[j], axis=(1, 2)) & np.all(w[i] == w[j], axis=1)
        same[i[equal], j[equal]] = same[j[equal], i[equal]] = True
        for array, values in (
            (ot, cross.value), (error, batch_value_errors(cross)),
            (true_error, cross.true_kernel_error), (n_iter, cross.n_iter),
            (converged, cross.converged),
        ):  # fmt: skip
            array[i, j] = array[j, i] = values
    timings["cross"] = time.perf_counter() - begin
    diagonal = np.diag(ot)
    matrix = ot - 0.5 * (diagonal[:, None] + diagonal[None, :])
    np.fill_diagonal(matrix, 0.0)
    value_error = error + 0.5 * (np.diag(error)[:, None] + np.diag(error)[None, :])
    np.fill_diagonal(value_error, 0.0)
    true_error = np.maximum(true_error, np.maximum.outer(np.diag(true_error), np.diag(true_error)))
    converged = converged & np.logical_and.outer(np.diag(converged), np.diag(converged))
    matrix[same] = 0.0  # identical clouds: their two solves differ by rounding
    negative = matrix < 0
    clipped = negative & (-matrix <= value_error)
    matrix[clipped] = 0.0
    notes = []
    if clipped.any():
        notes.append(
            f"{int(clipped.sum()) // 2} small negative entries within their error set to 0"
        )
    beyond = np.argwhere(np.triu(negative & ~clipped, 1))
    if beyond.size:
        stuck = [(int(i), int(j)) for i, j in beyond if not converged[i, j]]
        why = (
            f"{len(stuck)} of them use problems that stopped at max_iter before their tolerance "
            f"(e.g. clouds {stuck[0]}, after {int(n_iter[stuck[0]])} iterations): raise "
            "max_iter"
            if stuck
            else "their problems converged: the first-order error estimate is below the "
            "actual error; lower tol"
        )
        warnings.warn(
            f"pairwise_divergences: {len(beyond)} entries are negative beyond their estimated "
            f"error; {why}",
            AccuracyWarning,
            stacklevel=user_stacklevel(),
        )
    return PairwiseDivergences(
        matrix=matrix, value_error=value_error, ot=ot, true_kernel_error=true_error,
        n_iter=n_iter, converged=converged, clipped=clipped, accuracy=own.accuracy,
        timings=timings, notes=notes,
    )  # fmt: skip


def batch_value_errors(result: BatchResult) -> np.ndarray:
    """Estimated error of each pair's ``value``
    (:func:`~sketchot.solver.plans.value_error_estimate` of its potentials
    ``f = reg (log u - log a)``, ``g = reg (log v - log b)`` and its plan's L1 marginal
    errors: :class:`~sketchot.DivergenceResult`'s ``value_error``, pair by pair)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(result.a > 0, result.reg * (result.potentials[0] - np.log(result.a)), np.nan)
        g = np.where(result.b > 0, result.reg * (result.potentials[1] - np.log(result.b)), np.nan)
    errors = result.marginal_errors
    return value_error_estimate(f, g, errors[:, 0], errors[:, 1])


__all__ = [
    "BatchResult",
    "PairwiseDivergences",
    "pairwise_divergences",
    "sinkhorn_batch",
    "solve_sample_batch",
]
