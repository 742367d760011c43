"""Jobs on histograms on grids: convolutional Wasserstein barycenters (POT's
``ot.bregman.convolutional_barycenter2d`` and its debiased form) and the Sinkhorn divergence
between two histograms on one grid with its gradient with respect to the weights (the loss
for images).

Both iterate in the log domain with the separable Gibbs kernel ``K = exp(-|x - y|^2 /
reg)`` applied axis by axis: a product costs ``O(N (n_1 + ... + n_d))`` and no ``N x N``
array exists. Each axis pass is a linear-domain BLAS product on rows shifted by their
maximum, and the rows where it could lose accuracy (an output sum below 1e-200) are
recomputed by :func:`sketchot.grid.log_convolve`, exact up to rounding at every ``reg``
(``_LogKernel``). Nothing underflows at small ``reg``; POT's multiplicative form
divides by kernel products that do.

**The grid.** Without ``grid=``, a histogram of shape ``(n_1, ..., n_d)`` lives on POT's grid
of :func:`ot.bregman.convolutional_barycenter2d`: axis ``k`` is ``linspace(0, 1, n_k)``, so
``reg`` is in units of the squared side of the unit square and the same call gives POT's
barycenter. Pass a :class:`~sketchot.grid.RegularGrid` for other units or spacings.

**Barycenters** (Solomon et al. 2015; Benamou et al. 2015). For histograms ``a_1 .. a_K``
and barycentric weights ``w`` on the simplex, the iterative Bregman projections with
log-scalings ``F_k = log u_k``, ``G_k = log v_k`` repeat::

    F_k = log a_k - log K exp(G_k)
    L_k = log K exp(F_k)                       (log K^T u_k; K is symmetric)
    log p = sum_k w_k L_k   [+ log d, debiased]
    G_k = log p - L_k

and stop, as POT does, when ``sum_pixels std_k exp(G_k + L_k)`` (the spread of the plans'
barycenter-side marginals across ``k``) is below ``stopThr``; this module tests it at every
iteration (POT every tenth). The debiased barycenter (Janati et al. 2020) multiplies ``p`` by
``d``, the fixed point of ``d * K d = p`` (the autocorrelation potential of ``p``), updated
by ten averaged steps ``log d <- (log d + log p - log K d) / 2`` per iteration, and never
stops before iteration 20 (the iteration is not monotone), as in POT. The result's
``marginal_errors`` are ``||u_k * K v_k - a_k||_1`` with ``v_k = p / K^T u_k`` (the plans'
barycenter side is then exact): what the returned barycenter misses.

**The divergence** ``S(a, b) = OT(a, b) - OT(a, a) / 2 - OT(b, b) / 2 [+ reg (m(a) -
m(b))^2 / 2]`` with :func:`sketchot.sinkhorn_divergence`'s conventions (``OT`` includes the
entropic term, ``reg_m`` the unbalanced KL penalty; see :mod:`sketchot.loss`), on the grid's
points with the squared Euclidean cost. Each problem is solved by log-domain Sinkhorn
(the symmetric ones by the averaged update of Feydy et al. 2019) after an epsilon schedule
from the grid's squared diameter down to ``reg`` (halving, one update per scale, as GeomLoss
anneals), and stops when the largest change of the log-scalings ``|f_new - f| / reg`` is at
most ``tol``. The value is the dual objective at the last potentials (after a final update
that makes the plan's ``b``-side marginal exact), and the gradients are those of
:mod:`sketchot.loss`: balanced ``grad_a = f_ab - f_aa`` (shifted so that ``<a, grad_a> = <b,
grad_b>``), unbalanced ``(reg_m + reg) (exp(-f_aa / reg_m) - exp(-f_ab / reg_m))``; zero
pixels get the potentials' continuous extension, which the log convolution computes.

References
----------
J. Solomon, F. de Goes, G. Peyre, M. Cuturi, A. Butscher, A. Nguyen, T. Du, L. Guibas,
"Convolutional Wasserstein distances", ACM TOG 34(4), 2015. J.-D. Benamou, G. Carlier,
M. Cuturi, L. Nenna, G. Peyre, "Iterative Bregman projections for regularized transportation
problems", SIAM J. Sci. Comput. 2015. H. Janati, M. Cuturi, A. Gramfort, "Debiased Sinkhorn
barycenters", ICML 2020. J. Feydy et al., "Interpolating between optimal transport and MMD
using Sinkhorn divergences", AISTATS 2019.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._validation import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    describe,
    user_stacklevel,
)
from .grid import RegularGrid, log_convolve
from .solver import AccuracyWarning

#: POT's methods of ``convolutional_barycenter2d``; both run the same log-domain iteration
#: here (exact at every ``reg``), the name is recorded in the log.
METHODS = ("sinkhorn", "sinkhorn_log")

#: Debiased barycenters: averaged steps of the autocorrelation potential per iteration, and
#: the last iteration index not allowed to stop (Janati et al.'s iteration is not monotone;
#: POT's values).
DEBIAS_STEPS = 10
DEBIAS_MIN_ITER = 20

#: Relative tolerance on the masses of the histograms (balanced problems need equal masses;
#: float32 images normalised to 1 sum to 1 within ~1e-6).
MASS_RTOL = 1e-5


# --------------------------------------------------------------------------- validation
def _histograms(A: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``A`` as float64, finite and non-negative, each histogram (first axis) with a positive
    mass, all masses equal within :data:`MASS_RTOL`."""
    try:
        array = np.array(A, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real array of histograms; got {describe(A)}") from exc
    if ndim is not None and array.ndim != ndim:
        raise ValueError(
            f"{name} must have shape (n_hists, width, height); got shape {array.shape}"
        )
    if array.ndim < 2 or array.shape[0] == 0 or 0 in array.shape:
        raise ValueError(
            f"{name} must have shape (n_hists, n_1, ..., n_d) with at least one histogram and "
            f"one grid point; got shape {array.shape}"
        )
    _check_values(array, name)
    masses = array.reshape(array.shape[0], -1).sum(axis=1)
    if np.any(masses <= 0):
        raise ValueError(f"{name} must have a positive mass in every histogram; got masses "
                         f"{masses}")  # fmt: skip
    if np.ptp(masses) > MASS_RTOL * masses.max():
        raise ValueError(
            f"{name} must hold histograms of equal mass (balanced barycenters); got masses "
            f"from {masses.min():.6g} to {masses.max():.6g}: normalise them, e.g. "
            f"{name} / {name}.sum(axis=tuple(range(1, {name}.ndim)), keepdims=True)"
        )
    # equal within MASS_RTOL (rounding): made exactly equal, or no barycenter meets every
    # marginal and POT's criterion stalls at the difference
    array *= (masses.mean() / masses).reshape(-1, *([1] * (array.ndim - 1)))
    return array


def _check_values(array: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must contain only finite values; got NaN or inf")
    if np.any(array < 0):
        raise ValueError(f"{name} must be non-negative; got minimum {array.min():.3g}")


def _simplex(weights: Any, n_hists: int) -> np.ndarray:
    if weights is None:
        return np.full(n_hists, 1.0 / n_hists)
    try:
        w = np.array(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"weights must be a 1-D array of {n_hists} reals; got "
                        f"{describe(weights)}") from exc  # fmt: skip
    if w.shape != (n_hists,):
        raise ValueError(f"weights must have shape ({n_hists},) (one per histogram of A); got "
                         f"shape {w.shape}")  # fmt: skip
    if not np.all(np.isfinite(w)) or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(
            f"weights must be barycentric coordinates (finite, non-negative, summing to 1); "
            f"got {w} (sum {w.sum():.8g})"
        )
    return w


def _grid_for(shape: tuple[int, ...], grid: Any, name: str) -> RegularGrid:
    if grid is None:
        return RegularGrid.from_shape(shape, extent=1.0)  # POT's linspace(0, 1, n) axes
    if not isinstance(grid, RegularGrid):
        raise TypeError(f"grid must be a sketchot.grid.RegularGrid; got {describe(grid)}")
    if grid.shape != tuple(shape):
        raise ValueError(f"{name} has grid shape {tuple(shape)} but grid has shape "
                         f"{grid.shape}")  # fmt: skip
    return grid


def _log(values: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(values)


# --------------------------------------------------------------------------- products
#: An output sum of the linear-domain axis pass at least this large (e^-460) is exact to
#: rounding: every term that underflowed is below 2.2e-308, so at most n * 1e-108 of it.
LINEAR_FLOOR = 1e-200

#: Largest 1-D kernel stored for the linear-domain pass (:data:`sketchot.grid.
#: MAX_AXIS_KERNEL_ENTRIES`'s 128 MiB); larger axes use :func:`log_convolve` directly.
MAX_LINEAR_ENTRIES = 1 << 24


class _LogKernel:
    """``log K exp(X)`` on one grid (``K`` symmetric, source = target), axis by axis.

    Each axis pass first runs in the linear domain: rows shifted by their maximum,
    exponentiated, one BLAS product with the plain 1-D kernel ``exp(-(t_i - t_j)^2 / reg)``,
    one ``log``: exact to rounding wherever the sum is at least :data:`LINEAR_FLOOR`. The
    rows with a smaller sum (mass far from an output at small ``reg``) are recomputed by
    :func:`log_convolve`, exact at every ``reg``. Measured on three 256 x 256 images (the
    first 15 barycenter iterations, ``benchmarks/grid_barycenter.py``'s): as fast as
    :func:`log_convolve` at ``reg = 3e-3``, 2.4 times faster at ``1e-3`` and 6.5 times at
    ``1e-4``, where its block-shifted pass needs several blocks per axis; same barycenter to
    3e-14 relative.
    """

    def __init__(self, grid: RegularGrid, reg: float):
        self.grid, self.reg = grid, reg
        self.lines = [RegularGrid([t]) for t in grid.axes]
        self.mats = [
            np.exp(-((t[:, None] - t[None, :]) ** 2) / reg) if t.size**2 <= MAX_LINEAR_ENTRIES
            else None
            for t in grid.axes
        ]  # fmt: skip
        self.fallback_rows = 0

    def __call__(self, X: np.ndarray) -> np.ndarray:
        d = self.grid.ndim
        out = X
        for k in range(d):
            axis = out.ndim - d + k
            moved = np.moveaxis(out, axis, -1)
            shape = moved.shape
            done = self._axis(np.ascontiguousarray(moved).reshape(-1, shape[-1]), k)
            out = np.moveaxis(done.reshape(shape), -1, axis)
        return np.ascontiguousarray(out)

    def _axis(self, X: np.ndarray, k: int) -> np.ndarray:
        line, mat = self.lines[k], self.mats[k]
        if mat is None:
            return log_convolve(X, line, line, self.reg)
        mu = X.max(axis=1)
        live = np.isfinite(mu)
        mu0 = np.where(live, mu, 0.0)
        S = np.exp(X - mu0[:, None]) @ mat
        with np.errstate(divide="ignore"):
            out = np.log(S)
        out += mu0[:, None]
        bad = np.flatnonzero(live & (S.min(axis=1) < LINEAR_FLOOR))
        if bad.size:
            self.fallback_rows += bad.size
            out[bad] = log_convolve(X[bad], line, line, self.reg)
        out[~live] = -np.inf
        return out


# --------------------------------------------------------------------------- barycenters
@dataclass
class GridBarycenterResult:
    """A convolutional barycenter and how it was reached.

    Attributes
    ----------
    barycenter : ndarray of the grid's shape
        The barycenter ``p``.
    grid : RegularGrid
        The grid of ``p`` and of the histograms.
    reg : float
        Entropic regularisation, in squared grid units.
    weights : ndarray, shape (n_hists,)
        Barycentric weights.
    debiased : bool
        Whether ``p`` is Janati et al.'s debiased barycenter.
    n_iter : int
        Iterations done.
    converged : bool
        Whether POT's criterion fell below ``tol`` (``stopThr``).
    err : list of float
        POT's criterion ``sum_pixels std_k exp(G_k + L_k)`` at every iteration.
    marginal_errors : ndarray, shape (n_hists,)
        ``||u_k * K v_k - a_k||_1`` of the plans to ``p`` (whose ``p`` side is exact).
    log_u, log_v : ndarray, shape (n_hists, n_1, ..., n_d)
        Log-scalings of the plans ``diag(u_k) K diag(v_k)`` from ``a_k`` to ``p``.
    log_d : ndarray or None
        Log of the debiasing potential ``d`` (``None`` unless debiased).
    debias_error : float
        ``||d * K d - p||_1``: how far ``d`` is from its fixed point (0 unless debiased).
        Neither it nor POT's criterion bounds the distance to the limit: on two random
        15 x 15 images at ``stopThr=1e-6`` (measured: criterion 1e-6, this 3e-7) the
        debiased barycenter still moves by 1% of its largest pixel in ten more iterations.
    seconds : float
        Wall-clock time of the iteration.
    """

    barycenter: np.ndarray
    grid: RegularGrid
    reg: float
    weights: np.ndarray
    debiased: bool
    n_iter: int
    converged: bool
    err: list[float]
    marginal_errors: np.ndarray
    log_u: np.ndarray = field(repr=False)
    log_v: np.ndarray = field(repr=False)
    log_d: np.ndarray | None = field(default=None, repr=False)
    debias_error: float = 0.0
    seconds: float = 0.0

    def __repr__(self) -> str:
        return (
            f"GridBarycenterResult(shape={self.grid.shape}, reg={self.reg:g}, "
            f"debiased={self.debiased}, n_iter={self.n_iter}, converged={self.converged}, "
            f"max marginal error={self.marginal_errors.max():.2e})"
        )


def convolutional_barycenter(
    A: Any,
    reg: float,
    weights: Any = None,
    *,
    grid: RegularGrid | None = None,
    debiased: bool = False,
    max_iter: int = 10000,
    tol: float = 1e-4,
    verbose: bool = False,
    warn: bool = True,
) -> GridBarycenterResult:
    """The entropic Wasserstein barycenter of histograms on a grid (1-D, 2-D, 3-D, ...).

    Minimises ``sum_k w_k OT_reg(p, a_k)`` over histograms ``p`` on the grid (debiased:
    Janati et al.'s barycenter, of ``sum_k w_k S_reg(p, a_k)``); the iteration and its
    stopping rule are described in :mod:`sketchot.convolutional`.

    Parameters
    ----------
    A : array-like, shape (n_hists, n_1, ..., n_d)
        Non-negative histograms of equal mass (within a relative 1e-5; each is rescaled to
        their mean mass).
    reg : float
        Entropic regularisation (> 0), in squared grid units (POT's unit square without
        ``grid``).
    weights : array-like, shape (n_hists,), optional
        Barycentric weights (non-negative, summing to 1; default uniform).
    grid : RegularGrid, optional
        The grid (default: POT's, axis ``k`` = ``linspace(0, 1, n_k)``).
    debiased : bool, default=False
        Janati et al.'s debiased barycenter.
    max_iter : int, default=10000
        Largest number of iterations.
    tol : float, default=1e-4
        Threshold of POT's criterion (``stopThr``).
    verbose : bool, default=False
        Print the criterion every ten iterations.
    warn : bool, default=True
        Warn (:class:`~sketchot.AccuracyWarning`, a ``UserWarning``) when ``max_iter``
        iterations do not meet ``tol``.

    Returns
    -------
    GridBarycenterResult

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> A = np.zeros((2, 1, 50))
    >>> A[0, 0, 10], A[1, 0, 40] = 1.0, 1.0
    >>> res = sketchot.convolutional_barycenter(A, reg=1e-3, debiased=True)
    >>> int(np.argmax(res.barycenter[0])), res.converged
    (25, True)
    """
    reg = check_float(reg, "reg", positive=True)
    A = _histograms(A, "A")
    w = _simplex(weights, A.shape[0])
    grid = _grid_for(A.shape[1:], grid, "A")
    debiased = check_bool(debiased, "debiased")
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_float(tol, "tol", positive=True)
    verbose, warn = check_bool(verbose, "verbose"), check_bool(warn, "warn")

    conv = _LogKernel(grid, reg)

    start = time.perf_counter()
    log_a = _log(A)
    G = np.zeros(A.shape)
    log_d = np.zeros(grid.shape) if debiased else None
    errs: list[float] = []
    converged = False
    for it in range(max_iter):
        F = log_a - conv(G)
        L = conv(F)
        log_p = np.tensordot(w, L, axes=1)
        if debiased:
            log_p += log_d
            for _ in range(DEBIAS_STEPS):
                log_d = 0.5 * (log_d + log_p - conv(log_d))
        # the plans' barycenter-side marginals v_k * K^T u_k, their spread across k
        err = float(np.exp(G + L).std(axis=0).sum())
        errs.append(err)
        if verbose and it % 10 == 0:
            print(f"{it:6d} | {err:.6e}")
        G = log_p[None] - L
        if err < tol and (not debiased or it > DEBIAS_MIN_ITER):
            converged = True
            break
    seconds = time.perf_counter() - start
    # G = log p - L makes each plan's p side exact: the a side is what p misses
    row = np.exp(F + conv(G))
    marginal = np.abs(row - A).reshape(A.shape[0], -1).sum(axis=1)
    debias_error = 0.0
    if debiased:
        debias_error = float(np.abs(np.exp(log_d + conv(log_d)) - np.exp(log_p)).sum())
    if not converged and warn:
        warnings.warn(
            f"convolutional_barycenter did not converge: POT's criterion is {errs[-1]:.3e} > "
            f"tol={tol:g} after max_iter={max_iter} iterations (largest marginal error "
            f"{marginal.max():.2e}); raise max_iter or reg",
            AccuracyWarning,
            stacklevel=user_stacklevel(),
        )
    return GridBarycenterResult(
        np.exp(log_p), grid, reg, w, debiased, it + 1, converged, errs, marginal,
        F, G, log_d, debias_error, seconds,
    )  # fmt: skip


def _pot_style(A, reg, weights, method, numItermax, stopThr, verbose, log, warn, debiased):
    method = check_choice(method.lower() if isinstance(method, str) else method, "method",
                          METHODS)  # fmt: skip
    res = convolutional_barycenter(
        _histograms(A, "A", ndim=3), reg, weights, debiased=debiased, max_iter=numItermax,
        tol=stopThr, verbose=verbose, warn=warn,
    )  # fmt: skip
    if not check_bool(log, "log"):
        return res.barycenter
    return res.barycenter, {
        "err": res.err[9::10],  # POT records every tenth iteration's
        "err_all": res.err,
        "niter": res.n_iter - 1,  # POT's last loop index
        "converged": res.converged,
        "marginal_errors": res.marginal_errors,
        "debias_error": res.debias_error,
        "log_u": res.log_u,
        "log_v": res.log_v,
        "method": method,
        "result": res,
    }


def convolutional_barycenter2d(
    A: Any,
    reg: float,
    weights: Any = None,
    method: str = "sinkhorn",
    numItermax: int = 10000,
    stopThr: float = 1e-4,
    verbose: bool = False,
    log: bool = False,
    warn: bool = True,
) -> Any:
    """POT's ``ot.bregman.convolutional_barycenter2d`` with its names and defaults, computed
    in the log domain on the separable grid kernel (exact at every ``reg``).

    Parameters
    ----------
    A : array-like, shape (n_hists, width, height)
        Images of equal mass (non-negative).
    reg : float
        Entropic regularisation (> 0); the images live on POT's grid, each axis
        ``linspace(0, 1, n)``.
    weights : array-like, shape (n_hists,), optional
        Barycentric weights (default uniform).
    method : {'sinkhorn', 'sinkhorn_log'}
        POT's names; both run the same log-domain iteration here (POT's ``'sinkhorn'`` is
        multiplicative and fails at small ``reg``).
    numItermax : int, default=10000
        Largest number of iterations.
    stopThr : float, default=1e-4
        Threshold of POT's criterion (tested at every iteration).
    verbose : bool
        Print the criterion every ten iterations.
    log : bool
        Also return a dict: POT's ``'err'`` (every tenth iteration) and ``'niter'``, plus
        ``'converged'``, ``'marginal_errors'``, the log-scalings ``'log_u'``, ``'log_v'``
        (POT's ``U`` and ``V`` overflow at small ``reg``), ``'method'`` and the full
        :class:`GridBarycenterResult` (``'result'``).
    warn : bool
        Warn when ``numItermax`` iterations do not meet ``stopThr``.

    Returns
    -------
    ndarray of shape (width, height), or ``(barycenter, log)``
    """
    return _pot_style(A, reg, weights, method, numItermax, stopThr, verbose, log, warn, False)


def convolutional_barycenter2d_debiased(
    A: Any,
    reg: float,
    weights: Any = None,
    method: str = "sinkhorn",
    numItermax: int = 10000,
    stopThr: float = 1e-3,
    verbose: bool = False,
    log: bool = False,
    warn: bool = True,
) -> Any:
    """POT's ``ot.bregman.convolutional_barycenter2d_debiased`` (Janati et al. 2020) with its
    names and defaults, computed in the log domain; parameters and returns as
    :func:`convolutional_barycenter2d`."""
    return _pot_style(A, reg, weights, method, numItermax, stopThr, verbose, log, warn, True)


# --------------------------------------------------------------------------- divergence
@dataclass
class GridDivergenceResult:
    """Value and weight gradients of :func:`sinkhorn_divergence_grid`.

    Attributes
    ----------
    value : float
        The divergence ``S(a, b)``.
    grad_a, grad_b : ndarray of the grid's shape
        ``dS / da`` and ``dS / db`` (balanced: shifted so that ``<a, grad_a> = <b,
        grad_b>``; exact along changes that keep ``sum(a) = sum(b)``).
    potentials : dict
        ``{'ab': (f, g), 'aa': f, 'bb': g}``: the dual potentials (cost units, grid shape).
    n_iter : dict
        Iterations of each problem at the final ``reg`` (after the schedule).
    converged : bool
        Whether every problem met ``tol``.
    marginal_error : float
        L1 error of the cross plan's ``a`` side (its ``b`` side is exact), relative to the
        mass; balanced only (``nan`` unbalanced, where the marginals are not constraints).
    grid : RegularGrid
    seconds : float
    """

    value: float
    grad_a: np.ndarray
    grad_b: np.ndarray
    potentials: dict[str, Any]
    n_iter: dict[str, int]
    converged: bool
    marginal_error: float
    grid: RegularGrid
    seconds: float = 0.0

    def __repr__(self) -> str:
        return (
            f"GridDivergenceResult(value={self.value:.6g}, converged={self.converged}, "
            f"marginal_error={self.marginal_error:.2e}, shape={self.grid.shape})"
        )


def _schedule(grid: RegularGrid, reg: float) -> list[float]:
    """Halving regs from the squared diameter down to (not including) ``reg``."""
    top = max(grid.squared_diameter, reg)
    count = max(0, math.ceil(math.log2(top / reg)))
    return [reg * 2.0**k for k in range(count, 0, -1)]


class _Problem:
    """Log-domain Sinkhorn on one grid: ``T(h, log_w)[i] = -tau eps log sum_j w_j exp((h_j -
    |x_i - x_j|^2) / eps)`` with ``tau = rho / (rho + eps)`` (1 balanced)."""

    def __init__(self, grid: RegularGrid, rho: float | None):
        self.grid, self.rho = grid, rho
        self.kernels: dict[float, _LogKernel] = {}

    def kernel(self, eps: float) -> _LogKernel:
        if self.kernels.get(eps) is None:
            self.kernels[eps] = _LogKernel(self.grid, eps)
        return self.kernels[eps]

    def update(self, h: np.ndarray, log_w: np.ndarray, eps: float) -> np.ndarray:
        tau = 1.0 if self.rho is None else self.rho / (self.rho + eps)
        return -tau * eps * self.kernel(eps)(log_w + h / eps)

    def cross(self, log_a, log_b, reg, max_iter, tol):
        f, g = np.zeros(log_a.shape), np.zeros(log_b.shape)
        for eps in _schedule(self.grid, reg):
            g = self.update(f, log_a, eps)
            f = self.update(g, log_b, eps)
        converged = False
        done = 0
        while done < max_iter:
            done += 1
            g = self.update(f, log_a, reg)
            f_new = self.update(g, log_b, reg)
            change = np.abs(f_new - f).max() / reg
            f = f_new
            if change <= tol:
                converged = True
                break
        g = self.update(f, log_a, reg)  # the b side exact
        return f, g, done, converged

    def symmetric(self, log_a, reg, max_iter, tol):
        f = np.zeros(log_a.shape)
        for eps in _schedule(self.grid, reg):
            f = 0.5 * (f + self.update(f, log_a, eps))
        converged = False
        done = 0
        while done < max_iter:
            done += 1
            f_new = 0.5 * (f + self.update(f, log_a, reg))
            change = np.abs(f_new - f).max() / reg
            f = f_new
            if change <= tol:
                converged = True
                break
        return f, done, converged

    def plan_mass(self, f, g, log_a, log_b, reg) -> tuple[float, np.ndarray]:
        """``(sum P, P 1)`` of ``P = a b^T exp((f + g - C) / reg)``."""
        log_row = log_a + f / reg + self.kernel(reg)(log_b + g / reg)
        row = np.exp(log_row)
        return float(row.sum()), row

    def value(self, f, g, a, b, log_a, log_b, reg) -> float:
        """The dual objective at ``(f, g)``: POT's entropic value at the optimum."""
        mass, _ = self.plan_mass(f, g, log_a, log_b, reg)
        entropic = -reg * (mass - a.sum() * b.sum())
        if self.rho is None:
            return float(np.vdot(a, f) + np.vdot(b, g) + entropic)
        rho = self.rho
        sides = -rho * (np.vdot(a, np.expm1(-f / rho)) + np.vdot(b, np.expm1(-g / rho)))
        return float(sides + entropic)


def sinkhorn_divergence_grid(
    a: Any,
    b: Any,
    reg: float,
    *,
    grid: RegularGrid | None = None,
    reg_m: float | None = None,
    max_iter: int = 10000,
    tol: float = 1e-9,
    warn: bool = True,
) -> GridDivergenceResult:
    """The Sinkhorn divergence between two histograms on one grid, with ``dS / da`` and
    ``dS / db``: the loss for images.

    ``S = OT(a, b) - OT(a, a) / 2 - OT(b, b) / 2 [+ reg (m(a) - m(b))^2 / 2]`` with the
    squared Euclidean cost between grid points, :func:`sketchot.sinkhorn_divergence`'s value
    on the grid's points (see :mod:`sketchot.loss` and :mod:`sketchot.convolutional`).

    Parameters
    ----------
    a, b : array-like of the grid's shape
        Non-negative histograms (equal masses unless ``reg_m`` is given: within a relative
        1e-5, and ``b`` is rescaled to ``a``'s mass).
    reg : float
        Entropic regularisation (> 0), in squared grid units.
    grid : RegularGrid, optional
        The grid (default: POT's, axis ``k`` = ``linspace(0, 1, n_k)``).
    reg_m : float, optional
        KL penalty of the marginals (unbalanced divergence of Sejourne et al.); ``None``:
        balanced.
    max_iter : int, default=10000
        Largest number of Sinkhorn iterations per problem at ``reg``.
    tol : float, default=1e-9
        Stop when the log-scalings change by at most ``tol`` (``max |f_new - f| / reg``).
    warn : bool, default=True
        Warn (:class:`~sketchot.AccuracyWarning`) when a problem misses ``tol``.

    Returns
    -------
    GridDivergenceResult
        For PyTorch tensors ``a`` or ``b`` (a NumPy array on the other side is taken as a
        constant): a differentiable 0-d tensor of the tensor's dtype and device instead,
        whose backward pass multiplies ``grad_a`` and ``grad_b`` by the incoming gradient
        (first order only: differentiating the gradient again raises). The iteration runs
        in NumPy float64 on the host.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> a = np.zeros((20, 20)); a[5, 5] = 1.0
    >>> b = np.zeros((20, 20)); b[5, 15] = 1.0
    >>> res = sketchot.sinkhorn_divergence_grid(a, b, reg=1e-3)
    >>> round(res.value, 4), res.grad_a.shape            # |x - y|^2 = (10 / 19)^2
    (0.277, (20, 20))
    """
    if any(type(value).__module__.split(".")[0] == "torch" for value in (a, b)):
        options = {"grid": grid, "reg_m": reg_m, "max_iter": max_iter, "tol": tol, "warn": warn}
        return _divergence_function().apply(a, b, reg, options)
    reg = check_float(reg, "reg", positive=True)
    a_arr, b_arr = _weights_on_grid(a, "a"), _weights_on_grid(b, "b")
    if b_arr.shape != a_arr.shape:
        raise ValueError(f"b must have a's shape {a_arr.shape} (one grid); got shape "
                         f"{b_arr.shape}")  # fmt: skip
    grid = _grid_for(a_arr.shape, grid, "a")
    rho = None if reg_m is None else check_float(reg_m, "reg_m", positive=True)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_float(tol, "tol", positive=True)
    warn = check_bool(warn, "warn")
    m_a, m_b = a_arr.sum(), b_arr.sum()
    if rho is None and abs(m_a - m_b) > MASS_RTOL * max(m_a, m_b):
        raise ValueError(
            f"a and b must have equal masses for the balanced divergence; got {m_a:.6g} and "
            f"{m_b:.6g} (pass reg_m for the unbalanced one)"
        )
    if rho is None and m_b != m_a:
        # equal within MASS_RTOL (rounding): exactly equal, or the balanced problem has no
        # solution and the potentials drift by a constant at every iteration
        b_arr = b_arr * (m_a / m_b)
        m_b = b_arr.sum()
    start = time.perf_counter()
    if np.array_equal(a_arr, b_arr):
        zeros = np.zeros(grid.shape)
        return GridDivergenceResult(0.0, zeros, zeros.copy(), {}, {}, True, 0.0, grid)
    problem = _Problem(grid, rho)
    log_a, log_b = _log(a_arr), _log(b_arr)
    f_ab, g_ab, n_ab, ok_ab = problem.cross(log_a, log_b, reg, max_iter, tol)
    f_aa, n_aa, ok_aa = problem.symmetric(log_a, reg, max_iter, tol)
    f_bb, n_bb, ok_bb = problem.symmetric(log_b, reg, max_iter, tol)
    value = (
        problem.value(f_ab, g_ab, a_arr, b_arr, log_a, log_b, reg)
        - 0.5 * problem.value(f_aa, f_aa, a_arr, a_arr, log_a, log_a, reg)
        - 0.5 * problem.value(f_bb, f_bb, b_arr, b_arr, log_b, log_b, reg)
    )
    if rho is None:
        grad_a, grad_b = f_ab - f_aa, g_ab - f_bb
        k = (np.vdot(b_arr, grad_b) - np.vdot(a_arr, grad_a)) / (m_a + m_b)
        grad_a, grad_b = grad_a + k, grad_b - k
        _, row = problem.plan_mass(f_ab, g_ab, log_a, log_b, reg)
        marginal = float(np.abs(row - a_arr).sum() / m_a)
    else:
        value += 0.5 * reg * (m_a - m_b) ** 2
        scale = rho + reg
        grad_a = scale * (np.exp(-f_aa / rho) - np.exp(-f_ab / rho))
        grad_b = scale * (np.exp(-f_bb / rho) - np.exp(-g_ab / rho))
        marginal = math.nan
    converged = ok_ab and ok_aa and ok_bb
    if not converged and warn:
        missed = [name for name, ok in (("ab", ok_ab), ("aa", ok_aa), ("bb", ok_bb)) if not ok]
        spacing = min(float(np.diff(axis).min()) for axis in grid.axes if axis.size > 1) ** 2
        why = (
            f" (reg is below the squared grid spacing {spacing:.3g}: the kernel is nearly "
            "diagonal and Sinkhorn slow)"
            if reg < spacing
            else ""
        )
        warnings.warn(
            f"sinkhorn_divergence_grid: problem(s) {missed} missed tol={tol:g} after "
            f"max_iter={max_iter} iterations (cross plan's L1 marginal error "
            f"{marginal:.2e}){why}; raise max_iter, tol or reg",
            AccuracyWarning,
            stacklevel=user_stacklevel(),
        )
    return GridDivergenceResult(
        float(value), grad_a, grad_b, {"ab": (f_ab, g_ab), "aa": f_aa, "bb": f_bb},
        {"ab": n_ab, "aa": n_aa, "bb": n_bb}, converged, marginal, grid,
        time.perf_counter() - start,
    )  # fmt: skip


def _weights_on_grid(value: Any, name: str) -> np.ndarray:
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real array of weights on the grid; got "
                        f"{describe(value)}") from exc  # fmt: skip
    if array.ndim == 0 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty array of the grid's shape; got shape "
                         f"{array.shape}")  # fmt: skip
    _check_values(array, name)
    if array.sum() <= 0:
        raise ValueError(f"{name} must have a positive total mass; got {array.sum():.3g}")
    return array


@functools.cache
def _divergence_function() -> Any:
    """The autograd function of :func:`sinkhorn_divergence_grid` on PyTorch tensors (built on
    first use: ``import sketchot`` never imports torch)."""
    import torch

    def host(value: Any) -> np.ndarray:
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().to(torch.float64).numpy()
        return np.asarray(value, dtype=np.float64)

    class GridDivergenceFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, reg, options):
            res = sinkhorn_divergence_grid(host(a), host(b), reg, **options)
            like = a if isinstance(a, torch.Tensor) else b
            ctx.grads = [torch.as_tensor(g, dtype=like.dtype, device=like.device)
                         for g in (res.grad_a, res.grad_b)]  # fmt: skip
            return torch.as_tensor(res.value, dtype=like.dtype, device=like.device)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_output):
            needs = ctx.needs_input_grad[:2]
            grads = [grad_output * g if need else None
                     for g, need in zip(ctx.grads, needs, strict=True)]  # fmt: skip
            return grads[0], grads[1], None, None

    return GridDivergenceFunction
