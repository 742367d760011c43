"""Free-support entropic Wasserstein barycenters of point clouds.

For clouds ``nu_k = sum_j b_kj delta(y_kj)`` (``k = 1..K``) and coefficients ``lambda_k >= 0``
summing to 1, :func:`barycenter` looks for the support ``Z = (z_1, ..., z_n)`` of a measure
``mu_Z = sum_i c_i delta(z_i)`` with fixed uniform weights ``c_i = 1 / n`` minimising

.. math::

    F(Z) = \\sum_k \\lambda_k \\, \\mathrm{OT}_\\mathrm{reg}(\\mu_Z, \\nu_k), \\qquad
    \\mathrm{OT}_\\mathrm{reg}(\\mu, \\nu) = \\min_{P 1 = c,\\ P^\\top 1 = b}
    \\langle P, M \\rangle + \\mathrm{reg}\\, \\mathrm{KL}(P \\,|\\, c\\, b^\\top),
    \\quad M_{ij} = \\|z_i - y_j\\|^2,

POT's ``ot.bregman.free_support_sinkhorn_barycenter`` (Cuturi and Doucet 2014, Algorithm 2
with step ``theta = 1``; the fixed point of Alvarez-Esteban et al. 2016). By the envelope
theorem ``grad_{z_i} F = 2 c_i (z_i - sum_k lambda_k T_k(z_i))``, where
``T_k(z_i) = sum_j P^k_ij y_kj / c_i`` is the barycentric map of the optimal entropic plan
``P^k`` from ``mu_Z`` to ``nu_k``; the iteration is the fixed point

.. math:: Z \\leftarrow \\sum_k \\lambda_k T_k(Z),

a gradient step of size ``1 / (2 c_i)`` per support point. It stops, as POT's, when the
squared displacement ``sum_i ||z_i^new - z_i||^2`` (absolute, not relative) is at most
``tol``, or after ``max_iter`` updates.

Every transport is solved by :mod:`sketchot.solver` (any backend, ``'auto'`` included) and
warm-started between outer iterations from the previous potentials (the support points keep
their identity, so ``log u`` carries over) and, with ``backend='auto'``, from the previous
kernel choice (the strategy runs again only when the true-kernel check of a reused choice
fails). The maps are taken from each result's :meth:`~sketchot.SinkhornResult.barycentric_map`
(products with the operator; no ``n x m`` array on an approximate path). The returned result
holds the transports from the returned support, each with its true-kernel check.

References
----------
M. Cuturi, A. Doucet, "Fast computation of Wasserstein barycenters", ICML 2014.
P. C. Alvarez-Esteban, E. del Barrio, J. A. Cuesta-Albertos, C. Matran, "A fixed-point
approach to barycenters in Wasserstein space", J. Math. Anal. Appl. 441(2), 2016.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import policy
from ._arrays import in_user_arrays
from ._defaults import DEFAULT_ACCURACY
from ._validation import (
    check_bool,
    check_dtype,
    check_float,
    check_int,
    check_matrix,
    check_rng,
    check_weights,
    describe,
    user_stacklevel,
)
from .kernels import build_kernel, rebuild_parameters
from .solver import (
    SinkhornResult,
    SolverOptions,
    check_backend_params,
    check_problem,
    make_problem,
    solve,
)

#: ``lambdas`` must sum to 1 up to this (relative) rounding.
LAMBDA_RTOL = 1e-6

#: POT's defaults of ``free_support_sinkhorn_barycenter`` (outer) and ``ot.sinkhorn`` (inner).
POT_OUTER_TOL = 1e-7
POT_INNER_TOL = 1e-9


@dataclass
class BarycenterResult:
    """Output of :func:`barycenter`.

    Attributes
    ----------
    X : ndarray, shape (n_support, d)
        The barycenter's support ``Z`` (POT's returned ``X``).
    support_weights : ndarray, shape (n_support,)
        Its weights ``c`` (uniform ``1 / n_support``).
    lambdas : ndarray, shape (K,)
        The barycentric coefficients.
    results : list of SinkhornResult
        The K transports from the returned support ``X`` to each cloud (their
        ``true_kernel`` checks are the accuracy contract of the barycenter).
    n_iter : int
        Outer (fixed-point) updates run.
    displacements : list of float
        ``sum_i ||z_i^new - z_i||^2`` after each update (POT's ``displacement_square_norms``).
    converged : bool
        Whether the last displacement was at most ``tol``.
    inner_iterations : list of list of int
        Sinkhorn iterations of each transport at each outer step (the final solves last).
    tol : float
        The outer threshold used.
    timings : dict
        ``total`` seconds and ``solves`` (seconds in the inner solves).
    notes : list of str
        What validation changed (e.g. weights normalised) and kernel re-choices.
    """

    X: np.ndarray
    support_weights: np.ndarray
    lambdas: np.ndarray
    results: list[SinkhornResult]
    n_iter: int
    displacements: list[float]
    converged: bool
    inner_iterations: list[list[int]] = field(default_factory=list)
    tol: float = POT_OUTER_TOL
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def support(self) -> np.ndarray:
        """The support ``X``."""
        return self.X

    @property
    def objective(self) -> float:
        """``sum_k lambda_k OT_reg(mu_X, nu_k)``: the results' ``value`` (entropic objective,
        module notes) weighted by ``lambdas``."""
        return float(
            sum(lam * res.value for lam, res in zip(self.lambdas, self.results, strict=True))
        )

    @property
    def backends(self) -> list[str]:
        """The backend of each final transport."""
        return [res.backend for res in self.results]

    @property
    def accuracy_met(self) -> bool | None:
        """Whether every final transport met its accuracy against the true kernel (``None``
        when not checked)."""
        met = [res.accuracy_met for res in self.results]
        return None if any(m is None for m in met) else all(met)

    @property
    def total_inner_iterations(self) -> int:
        """Sinkhorn iterations over every solve."""
        return int(sum(map(sum, self.inner_iterations)))

    def __repr__(self) -> str:
        last = self.displacements[-1] if self.displacements else float("nan")
        return (
            f"BarycenterResult(n_support={self.X.shape[0]}, d={self.X.shape[1]}, "
            f"K={len(self.results)}, n_iter={self.n_iter}, converged={self.converged}, "
            f"displacement={last:.3g}, backends={self.backends})"
        )


#: Arguments of :func:`sketchot.sinkhorn` that :func:`barycenter` does not take, and why.
NOT_IN_BARYCENTER = {
    "metric": "the support update (each point moved to its barycentric map) is the minimiser "
    "of the squared Euclidean cost only",
    "p": "the support update is the minimiser of the squared Euclidean cost only",
    "reg_m": "the barycenter is of balanced measures (each cloud's weights are normalised)",
    "warmstart": "each solve is warm-started from the previous outer step (warm_start=True)",
}


@in_user_arrays("clouds", "weights", "X_init", refuse_gradients=True)
def barycenter(
    clouds: Any,
    weights: Any = None,
    lambdas: Any = None,
    reg: float = 1.0,
    n_support: int | None = None,
    X_init: Any = None,
    *,
    max_iter: int = 100,
    tol: float = POT_OUTER_TOL,
    backend: str = "auto",
    rng: Any = None,
    inner_max_iter: int = 1000,
    inner_tol: float | None = None,
    warm_start: bool = True,
    verbose: bool = False,
    **kwargs: Any,
) -> BarycenterResult:
    """Free-support entropic Wasserstein barycenter of point clouds (module notes).

    Parameters
    ----------
    clouds : sequence of array-like, each of shape (n_k, d)
        The K clouds (K >= 1), same dimension ``d``.
    weights : None or sequence of (None or array-like of shape (n_k,))
        Each cloud's point weights (``None``: uniform); each is normalised to total mass 1.
    lambdas : array-like of shape (K,), optional
        Barycentric coefficients (POT's ``weights``): non-negative, summing to 1; default
        uniform ``1 / K``.
    reg : float, default=1.0
        Entropic regularisation of every transport (``K = exp(-||z - y||^2 / reg)``).
    n_support : int, optional
        Number of support points; default ``len(X_init)``, else the smallest cloud's size.
    X_init : array-like of shape (n_support, d), optional
        Initial support (POT's ``X_init``). Default: ``n_support`` distinct points drawn
        without replacement from the pooled clouds with probability ``lambda_k b_kj``
        (``rng``); distinct points matter, as coincident support points stay coincident.
    max_iter : int, default=100
        Outer updates at most (POT's ``numItermax``).
    tol : float, default=1e-7
        Stop when ``sum_i ||z_i^new - z_i||^2 <= tol`` (POT's ``stopThr``, absolute); 0 runs
        ``max_iter`` updates.
    backend : str, default='auto'
        Backend of every transport (:func:`sketchot.sinkhorn`'s); with ``'auto'`` the choice
        of the first step is reused (re-chosen when its true-kernel check fails).
    rng : None, int, Generator, ...
        Randomness of the initial support, the approximate kernels and the checks.
    inner_max_iter : int, default=1000
        ``max_iter`` of each Sinkhorn solve (POT's ``numInnerItermax``).
    inner_tol : float or None, default=None
        ``tol`` of each solve. ``None``: stop each solve at the accuracy asked for (the rule of
        :class:`~sketchot.SolverOptions`); a float: POT's inner ``stopThr`` (the L2
        column-marginal error; POT's default is :data:`POT_INNER_TOL`), e.g. to reproduce
        POT's iterates.
    warm_start : bool, default=True
        Start each solve from the previous outer step's potentials (and kernel choice).
    verbose : bool, default=False
        Print one line per outer step (displacement, inner iterations, seconds).
    **kwargs
        Other solver options (``accuracy``, ``check_every``, ``anderson``, ...), ``dtype``,
        ``rank`` and the backend's parameters, passed to every solve.

    Returns
    -------
    BarycenterResult

    Notes
    -----
    Each outer step costs K Sinkhorn solves: ``O(n n_k)`` per iteration with the exact
    kernel, ``O((n + n_k) r)`` with rank-``r`` backends; memory as one solve. Warm starts
    cut the inner iterations as the support settles (``benchmarks/barycenter.py``).

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> clouds = [rng.normal(size=(200, 2)), rng.normal(size=(150, 2)) + [4.0, 0.0]]
    >>> res = sketchot.barycenter(clouds, reg=0.1, n_support=100, tol=1e-3, rng=0)
    >>> res.X.shape, res.converged, res.n_iter, res.backends
    ((100, 2), True, 27, ['exact', 'exact'])
    >>> print(np.round(res.X.mean(axis=0), 1))    # halfway between the two means
    [1.9 0. ]
    """
    start = time.perf_counter()
    clouds, weights, lambdas, notes = _check_measures(clouds, weights, lambdas)
    reg = check_float(reg, "reg", positive=True)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_float(tol, "tol", minimum=0.0)
    # named as the caller passed them (SolverOptions would call them max_iter and tol)
    inner_max_iter = check_int(inner_max_iter, "inner_max_iter", minimum=1)
    if inner_tol is not None:
        inner_tol = check_float(inner_tol, "inner_tol", positive=True)
    warm_start = check_bool(warm_start, "warm_start")
    verbose = check_bool(verbose, "verbose")
    generator = check_rng(rng)
    for name in sorted(set(kwargs) & set(NOT_IN_BARYCENTER)):
        raise TypeError(
            f"barycenter() does not take {name} (got {name}={describe(kwargs[name])}): "
            f"{NOT_IN_BARYCENTER[name]}"
        )
    if kwargs.get("dtype") is not None:
        check_dtype(kwargs["dtype"])  # named here, not by NumPy inside the kernel's choice
    options, backend_params = SolverOptions.split(
        {**kwargs, "max_iter": inner_max_iter, "tol": inner_tol}
    )
    check_backend_params("barycenter", backend, backend_params)
    Z = _initial_support(X_init, n_support, clouds, weights, lambdas, generator)
    c = np.full(Z.shape[0], 1.0 / Z.shape[0])
    quiet = dataclasses.replace(options, warn=False, verbose=False)
    solver = _Solver(backend, backend_params, generator, notes)

    K = len(clouds)
    warm: list[Any] = [None] * K
    displacements: list[float] = []
    inner: list[list[int]] = []
    converged, n_iter, solving = False, 0, 0.0
    while n_iter < max_iter and not converged:
        begin = time.perf_counter()
        T = np.zeros_like(Z)
        counts = []
        for k in range(K):
            res = solver.solve(Z, k, clouds[k], c, weights[k], reg, quiet, warm[k])
            if warm_start:
                warm[k] = res.potentials
            counts.append(res.n_iter)
            T += lambdas[k] * res.barycentric_map()
        solving += time.perf_counter() - begin
        displacement = float(np.sum((T - Z) ** 2))
        Z = T
        n_iter += 1
        displacements.append(displacement)
        inner.append(counts)
        converged = displacement <= tol
        if verbose:
            print(
                f"sketchot.barycenter: step {n_iter:3d}  displacement {displacement:.3e}  "
                f"inner iterations {counts}  {time.perf_counter() - begin:.2f} s"
            )
    if not converged and options.warn:
        warnings.warn(_not_converged(displacements, tol), UserWarning, stacklevel=user_stacklevel())
    begin = time.perf_counter()
    results = [
        solver.solve(Z, k, clouds[k], c, weights[k], reg, options, warm[k]) for k in range(K)
    ]
    solving += time.perf_counter() - begin
    inner.append([res.n_iter for res in results])
    return BarycenterResult(
        X=Z, support_weights=c, lambdas=lambdas, results=results, n_iter=n_iter,
        displacements=displacements, converged=converged, inner_iterations=inner, tol=tol,
        timings={"total": time.perf_counter() - start, "solves": solving}, notes=notes,
    )  # fmt: skip


def _not_converged(displacements: list[float], tol: float) -> str:
    """The warning of a fixed point stopped at ``max_iter``: where it stopped and the ratio of
    its last two displacements (its rate slows down near the fixed point, so no number of
    further steps is promised)."""
    last = displacements[-1]
    rate = displacements[-1] / displacements[-2] if len(displacements) > 1 else math.nan
    return (
        f"sketchot.barycenter stopped after {len(displacements)} outer steps (max_iter) with a "
        f"displacement ||Z_new - Z||^2 = {last:.3g} > tol = {tol:g} (the last step's ratio "
        f"{rate:.3g}); continue from where it stopped with X_init=result.X, or pass a larger "
        "max_iter or tol"
    )


class _Solver:
    """Solves the transport from the support to cloud ``k`` through the one solver, reusing
    the kernel choice of ``backend='auto'`` per cloud while its true-kernel check holds."""

    def __init__(self, backend: str, params: dict[str, Any], generator, notes: list[str]):
        self.backend, self.params, self.generator, self.notes = backend, params, generator, notes
        self.choices: dict[int, tuple[str, dict[str, Any]]] = {}

    def solve(self, Z, k, Y, c, b, reg, options, warm) -> SinkhornResult:
        geometry = check_problem(Z, Y, reg)
        accuracy = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
        reused = self.backend != "auto" or k in self.choices
        if reused:
            name, params = (self.backend, {}) if self.backend != "auto" else self.choices[k]
            kernel = build_kernel(
                geometry, name, rng=self.generator, accuracy=accuracy, policy=policy,
                **self.params, **params,
            )  # fmt: skip
            start = (None, None) if warm is None else warm_potentials(kernel, c, warm[1])
            problem = make_problem(c, b, geometry.shape, reg, log_u0=start[0], log_v0=start[1])
            result = solve(problem, kernel, options, rng=self.generator)
            if self.backend != "auto" or result.accuracy_met is not False:
                return result
            self.notes.append(
                f"cloud {k}: the reused kernel {name!r} missed the accuracy; chosen again"
            )
        problem = make_problem(c, b, geometry.shape, reg)
        result = policy.solve_auto(
            problem, geometry, options, rng=self.generator, solve=solve, **self.params
        )
        self.choices[k] = (
            result.backend,
            rebuild_parameters(result.backend, result.kernel.info.params),
        )
        return result


def warm_potentials(kernel: Any, c: np.ndarray, log_v: np.ndarray) -> tuple[Any, Any]:
    """A warm start on a new support: the previous column log-scalings ``log v`` (attached to
    the fixed cloud) and the row log-scalings they give on the new kernel, one half-step
    ``u = c / K v``, so that the plan starts with row sums ``c`` (reusing the old ``log u``
    on moved points can overflow the absorbed kernel). Through the operator contract: a
    log-domain pass where the kernel has one, a linear pass otherwise; ``(None, None)`` (a
    cold start) when a product is not positive and finite."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if "log_products" in kernel.info.capabilities:
            w = kernel.project("cols", log_v, log=True)
            step = kernel.fused_pass("rows", w, np.log(c), log=True)
            log_u = step.ratios
        else:
            shift = float(np.max(log_v))
            log_v = log_v - shift
            step = kernel.fused_pass("rows", kernel.project("cols", np.exp(log_v)), c)
            log_u = np.log(step.ratios)
    if step.n_bad or not (np.all(np.isfinite(log_u)) and np.isfinite(log_v).any()):
        return None, None
    return log_u, log_v


def _check_measures(clouds: Any, weights: Any, lambdas: Any):
    """``(clouds, weights, lambdas, notes)`` validated: float64 clouds of one dimension,
    weights of mass 1, coefficients on the simplex."""
    if isinstance(clouds, np.ndarray) and clouds.ndim == 2:
        raise TypeError(
            "clouds must be a sequence of point clouds (a list of (n_k, d) arrays); got one "
            f"2-D array of shape {clouds.shape}: pass [X] for a single cloud"
        )
    try:
        clouds = list(clouds)
    except TypeError:
        raise TypeError(
            f"clouds must be a sequence of (n_k, d) arrays; got {describe(clouds)}"
        ) from None
    if not clouds:
        raise ValueError("clouds must hold at least one point cloud; got an empty sequence")
    first = check_matrix(clouds[0], "clouds[0]")
    clouds = [first] + [
        check_matrix(Y, f"clouds[{k}]", n_features=first.shape[1], feature_name="clouds[0]")
        for k, Y in enumerate(clouds[1:], start=1)
    ]
    K = len(clouds)
    if weights is None:
        weights = [None] * K
    elif isinstance(weights, np.ndarray) and weights.ndim == 1 and K > 1:
        raise TypeError(
            f"weights must be a sequence of {K} weight vectors (one per cloud) or None; got one "
            f"array of shape {weights.shape} (the barycentric coefficients are lambdas=)"
        )
    weights = list(weights)
    if len(weights) != K:
        raise ValueError(
            f"weights must hold one weight vector (or None) per cloud ({K}); got {len(weights)}"
        )
    notes: list[str] = []
    checked = []
    for k, (Y, w) in enumerate(zip(clouds, weights, strict=True)):
        w = check_weights(w, f"weights[{k}]", Y.shape[0], f"clouds[{k}]")
        total = float(w.sum())
        if not np.isclose(total, 1.0, rtol=1e-12, atol=0.0):
            notes.append(f"weights[{k}] was normalised from mass {total:.8g} to 1")
        checked.append(w / total)
    lambdas = check_lambdas(lambdas, K)
    return clouds, checked, lambdas, notes


def check_lambdas(lambdas: Any, K: int) -> np.ndarray:
    """Barycentric coefficients: ``None`` is uniform ``1 / K``; otherwise K finite,
    non-negative numbers summing to 1 (up to :data:`LAMBDA_RTOL`)."""
    if lambdas is None:
        return np.full(K, 1.0 / K)
    array = np.asarray(lambdas)
    if array.dtype.kind not in "biuf" or array.ndim != 1:
        raise TypeError(
            f"lambdas must be a 1-D array of {K} real coefficients (one per cloud); got "
            f"{describe(lambdas)}"
        )
    if array.shape[0] != K:
        raise ValueError(f"lambdas must have one coefficient per cloud ({K}); got {array.shape[0]}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"lambdas must be finite and non-negative; got {array.tolist()}")
    if not np.isclose(array.sum(), 1.0, rtol=LAMBDA_RTOL, atol=0.0):
        raise ValueError(
            f"lambdas must sum to 1 (barycentric coefficients); got sum {array.sum():.8g}: "
            "divide them by their sum"
        )
    return array


def _initial_support(X_init, n_support, clouds, weights, lambdas, generator) -> np.ndarray:
    d = clouds[0].shape[1]
    if X_init is not None:
        Z = check_matrix(X_init, "X_init", n_features=d, feature_name="the clouds")
        if n_support is not None and check_int(n_support, "n_support", minimum=1) != len(Z):
            raise ValueError(
                f"n_support must match X_init's {len(Z)} points; got n_support={n_support}"
            )
        return Z.copy()
    if n_support is None:
        n_support = min(len(Y) for Y in clouds)
    n_support = check_int(n_support, "n_support", minimum=1)
    probabilities = np.concatenate([lam * w for lam, w in zip(lambdas, weights, strict=True)])
    available = int(np.count_nonzero(probabilities > 0))
    if n_support > available:
        raise ValueError(
            f"n_support must be at most the {available} points of positive weight (and "
            f"coefficient) in the clouds to draw a default support; got {n_support}: pass "
            "X_init"
        )
    index = generator.choice(
        len(probabilities), size=n_support, replace=False, p=probabilities / probabilities.sum()
    )
    return np.concatenate(clouds)[index]
