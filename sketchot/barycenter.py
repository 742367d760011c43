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

**Anderson acceleration** (``acceleration='anderson'``, the default for ``F``). The plain
fixed point creeps where the objective is flat (measured in ``benchmarks/barycenter.py``: a
contraction of 0.8-0.97 per step near the end). Each step instead mixes the last
:data:`ANDERSON_MEMORY` + 1 supports' images (type II Anderson, Walker and Ni 2011: the
combination of the images whose residuals ``T(Z_i) - Z_i`` combine to the smallest), and is
safeguarded by the objective: an extrapolated support whose ``F`` (its solves' values) exceeds
the last accepted one's by more than the two solves' primal-dual gaps is replaced by the plain
image of the last accepted support, and the history restarts. The plain step never raises
``F`` (it minimises the transport cost of the current plans over the support, after which the
plans are optimised again), so the safeguarded iteration decreases ``F`` up to the solves'
gaps. ``acceleration=None`` repeats POT's iterates step by step.

**Debiased barycenters** (``debiased=True``; Janati et al. 2020). ``F``'s minimiser is
blurred: at ``reg`` comparable to the clouds' variance its support shrinks towards a point.
The debiased objective ``F(Z) - OT_reg(mu_Z, mu_Z) / 2`` (``sum_k lambda_k`` Sinkhorn
divergences up to a constant) has the gradient ``2 c_i (S(z_i) - T(z_i))``, with ``S`` the
barycentric map of the support's transport to itself, and the step of the same size
``1 / (2 c_i)`` is

.. math:: Z \\leftarrow Z + \\sum_k \\lambda_k T_k(Z) - S(Z),

one more solve per step (the support to itself). It stops when ``||T(Z) - S(Z)||^2`` summed
is at most ``tol``. Unlike the plain step it need not decrease the objective at every step,
so the objective does not safeguard Anderson's mixing there: on two translated Gaussian
clouds at reg 1 the mixed iteration ends at a higher objective than the plain one after the
same number of steps (``tests/test_barycenter.py``), and ``acceleration='auto'`` takes the
plain step for ``debiased=True``.

Every transport is solved by :mod:`sketchot.solver` (any backend, ``'auto'`` included) and
warm-started between outer iterations from the previous potentials and, with
``backend='auto'``, from the previous kernel choice (the strategy runs again only when the
true-kernel check of a reused choice fails). The column potentials carry over (they belong to
the fixed cloud); the support's row potentials are moved with it to first order
(:func:`moved_potentials`: from the last solve's potentials and barycentric map, no pass over
the new kernel) while their error bound stays below :data:`WARM_SHIFT_LIMIT`, and come from one
half-step on the new kernel otherwise (:func:`warm_potentials`). The start decides only where
each solve begins; each stops by its own rule. The maps are taken from each result's
:meth:`~sketchot.SinkhornResult.barycentric_map` (from the plan's moments, which the summary
computes; no ``n x m`` array on an approximate path), and the outer steps' solves leave out
the column side's moments they do not read (``solve(..., column_moments=False)``). The
returned result holds the transports from the returned support, each with its true-kernel
check.

References
----------
M. Cuturi, A. Doucet, "Fast computation of Wasserstein barycenters", ICML 2014.
H. F. Walker, P. Ni, "Anderson acceleration for fixed-point iterations", SIAM J. Numer.
Anal. 49(4), 2011.
H. Janati, M. Cuturi, A. Gramfort, "Debiased Sinkhorn barycenters", ICML 2020.
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
from ._arrays import NUMPY, ArrayContext, in_user_arrays
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
    LinearRangeError,
    SinkhornResult,
    SolverOptions,
    check_backend_params,
    check_problem,
    make_problem,
    solve,
)

#: Supports (and fixed-point images) the Anderson step mixes.
ANDERSON_MEMORY = 5
#: The values of :func:`barycenter`'s ``acceleration``.
ACCELERATIONS = ("auto", "anderson", None)
#: An extrapolated support is kept when its objective exceeds the last accepted one by at most
#: the two solves' primal-dual gaps and this relative rounding.
OBJECTIVE_RTOL = 1e-12
#: Tikhonov weight of the Anderson least-squares problem, relative to its largest diagonal.
ANDERSON_RIDGE = 1e-10

#: A moved support starts from its first-order row log-scalings (:func:`moved_potentials`)
#: while their error bound stays below this (natural-log units: row sums of the first
#: absorbed kernel within ``e^20`` of their marginal, far inside its ``e^100`` bounds); beyond
#: it, from one half-step on the new kernel (:func:`warm_potentials`).
WARM_SHIFT_LIMIT = 20.0

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
        ``sum_i ||z_i^new - z_i||^2`` after each update (POT's ``displacement_square_norms``):
        the residual ``||T(Z) - Z||^2`` of the support each step solved at.
    objectives : list of float
        The objective ``F(Z)`` of the support each step solved at (its solves' ``value``
        weighted by ``lambdas``).
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
    self_result : SinkhornResult or None
        ``debiased=True``: the transport from the returned support to itself.
    """

    X: np.ndarray
    support_weights: np.ndarray
    lambdas: np.ndarray
    results: list[SinkhornResult]
    n_iter: int
    displacements: list[float]
    converged: bool
    inner_iterations: list[list[int]] = field(default_factory=list)
    objectives: list[float] = field(default_factory=list)
    tol: float = POT_OUTER_TOL
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    self_result: SinkhornResult | None = None

    @property
    def support(self) -> np.ndarray:
        """The support ``X``."""
        return self.X

    @property
    def objective(self) -> float:
        """``sum_k lambda_k OT_reg(mu_X, nu_k)``: the results' ``value`` (entropic objective,
        module notes) weighted by ``lambdas``; debiased, minus ``OT_reg(mu_X, mu_X) / 2``
        (the debiased objective without its constant ``sum_k lambda_k OT_reg(nu_k, nu_k) /
        2``)."""
        value = sum(lam * res.value for lam, res in zip(self.lambdas, self.results, strict=True))
        if self.self_result is not None:
            value -= 0.5 * self.self_result.value
        return float(value)

    @property
    def backends(self) -> list[str]:
        """The backend of each final transport."""
        return [res.backend for res in self.results]

    @property
    def accuracy_met(self) -> bool | None:
        """Whether every final transport met its accuracy against the true kernel (``None``
        when not checked)."""
        met = [res.accuracy_met for res in self.results]
        if self.self_result is not None:
            met.append(self.self_result.accuracy_met)
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
    debiased: bool = False,
    acceleration: str | None = "auto",
    verbose: bool = False,
    _arrays: ArrayContext = NUMPY,
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
    debiased : bool, default=False
        Minimise the debiased objective ``sum_k lambda_k S_reg(mu_Z, nu_k)`` (Sinkhorn
        divergences, Janati et al. 2020) instead of ``F``: one more solve per step (the
        support to itself), and a support free of the entropic blur that shrinks ``F``'s
        minimiser towards the clouds' means (module notes).
    acceleration : {'auto', 'anderson', None}, default='auto'
        ``'anderson'``: the next support mixes the last :data:`ANDERSON_MEMORY` supports'
        fixed-point images (Anderson acceleration, module notes), an extrapolated support
        kept only when it does not raise the objective beyond the solves' own primal-dual
        gaps; ``None``: the plain fixed point ``Z <- T(Z)`` (POT's iterates, step by step).
        ``'auto'``: ``'anderson'``, except for ``debiased=True``, where the plain step is
        taken (module notes: the objective is not monotone there, so the safeguard does not
        hold the mixing back).
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
    ((100, 2), True, 26, ['exact', 'exact'])
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
    debiased = check_bool(debiased, "debiased")
    if acceleration not in ACCELERATIONS:
        raise ValueError(
            f"acceleration must be one of {ACCELERATIONS}; got {describe(acceleration)}"
        )
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
    solver = _Solver(backend, backend_params, generator, notes, _arrays)

    K = len(clouds)
    # the transports each step solves: (cloud index, its weight in the support's image and in
    # the objective); debiased, one more: the support to itself, with -1 and -1/2
    terms = [(k, lambdas[k], lambdas[k]) for k in range(K)] + ([(K, -1.0, -0.5)] * debiased)
    warm: list[Any] = [None] * len(terms)
    displacements: list[float] = []
    objectives: list[float] = []
    inner: list[list[int]] = []
    if acceleration == "auto":
        acceleration = None if debiased else "anderson"
    mixing = _Anderson(ANDERSON_MEMORY) if acceleration == "anderson" else None
    # the last accepted support's objective, its gap and its plain fixed-point image
    accepted: tuple[float, float, np.ndarray] | None = None
    extrapolated, rejected = False, 0
    converged, n_iter, solving = False, 0, 0.0
    while n_iter < max_iter and not converged:
        begin = time.perf_counter()
        # debiased, the image is Z + sum_k lambda_k T_k(Z) - S(Z) (module notes)
        T = Z.copy() if debiased else np.zeros_like(Z)
        counts, objective, gap = [], 0.0, 0.0
        for k, mapped, scored in terms:
            target, target_weights = (clouds[k], weights[k]) if k < K else (Z, c)
            res = solver.solve(Z, k, target, c, target_weights, reg, quiet, warm[k], False)
            image = res.barycentric_map()
            if warm_start:
                warm[k] = _Warm(Z, *res.potentials, image if k < K else None)
            counts.append(res.n_iter)
            T += mapped * image
            objective += scored * res.value
            gap += abs(scored) * abs(res.value - res.value_dual)
        solving += time.perf_counter() - begin
        displacement = float(np.sum((T - Z) ** 2))
        n_iter += 1
        displacements.append(displacement)
        objectives.append(objective)
        inner.append(counts)
        converged = displacement <= tol
        if (
            not converged
            and extrapolated
            and accepted is not None
            and objective > accepted[0] + accepted[1] + gap + OBJECTIVE_RTOL * abs(accepted[0])
        ):
            # the extrapolated support raised the objective beyond the solves' own gaps:
            # back to the plain fixed-point step from the last accepted support
            mixing.clear()
            Z, extrapolated, rejected = accepted[2], False, rejected + 1
        else:
            accepted = (objective, gap, T)
            Z, extrapolated = (T, False) if mixing is None or converged else mixing.step(Z, T)
        if verbose:
            print(
                f"sketchot.barycenter: step {n_iter:3d}  displacement {displacement:.3e}  "
                f"objective {objective:.8g}  inner iterations {counts}  "
                f"{time.perf_counter() - begin:.2f} s"
            )
    if rejected:
        notes.append(
            f"acceleration: {rejected} extrapolated support(s) raised the objective and were "
            "replaced by the plain fixed-point step"
        )
    if not converged and options.warn:
        warnings.warn(_not_converged(displacements, tol), UserWarning, stacklevel=user_stacklevel())
    begin = time.perf_counter()
    results = [
        solver.solve(Z, k, *((clouds[k], c, weights[k]) if k < K else (Z, c, c)), reg, options,
                     warm[k])
        for k, _, _ in terms
    ]  # fmt: skip
    solving += time.perf_counter() - begin
    inner.append([res.n_iter for res in results])
    self_result = results.pop() if debiased else None
    return BarycenterResult(
        X=Z, support_weights=c, lambdas=lambdas, results=results, n_iter=n_iter,
        displacements=displacements, converged=converged, inner_iterations=inner,
        objectives=objectives, tol=tol, self_result=self_result,
        timings={"total": time.perf_counter() - start, "solves": solving}, notes=notes,
    )  # fmt: skip


class _Anderson:
    """Anderson acceleration (type II, Walker and Ni 2011) of the support fixed point
    ``Z <- T(Z)``: with the residuals ``r_i = T(Z_i) - Z_i`` of the last ``memory + 1``
    supports, ``gamma = argmin ||r_k - dR gamma||`` (differences of consecutive residuals,
    a ridge of :data:`ANDERSON_RIDGE` for conditioning) and the next support
    ``T(Z_k) - dT gamma``. Cost ``O(memory^2 n d)`` per step, memory ``O(memory n d)``."""

    def __init__(self, memory: int):
        self.memory = memory
        self.supports: list[np.ndarray] = []
        self.images: list[np.ndarray] = []

    def clear(self) -> None:
        self.supports.clear()
        self.images.clear()

    def step(self, Z: np.ndarray, T: np.ndarray) -> tuple[np.ndarray, bool]:
        """The next support after ``Z`` with image ``T``, and whether it was extrapolated
        (``False``: ``T`` itself, the first step after a reset)."""
        self.supports.append(Z)
        self.images.append(T)
        del self.supports[: -self.memory - 1], self.images[: -self.memory - 1]
        if len(self.supports) < 2:
            return T, False
        residuals = np.stack(
            [(t - z).ravel() for z, t in zip(self.supports, self.images, strict=True)]
        )
        images = np.stack([t.ravel() for t in self.images])
        dR, dT = np.diff(residuals, axis=0).T, np.diff(images, axis=0).T
        gram = dR.T @ dR
        ridge = ANDERSON_RIDGE * float(np.max(np.diag(gram)))
        if not ridge > 0.0:
            return T, False
        gamma = np.linalg.solve(gram + ridge * np.eye(len(gram)), dR.T @ residuals[-1])
        extrapolated = images[-1] - dT @ gamma
        if not np.all(np.isfinite(extrapolated)):
            self.clear()
            return T, False
        return extrapolated.reshape(T.shape), True


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

    def __init__(
        self, backend: str, params: dict[str, Any], generator, notes: list[str], context
    ) -> None:
        self.backend, self.params, self.generator, self.notes = backend, params, generator, notes
        self.context = context  # where the caller's clouds live: the kernels run there
        self.choices: dict[int, tuple[str, dict[str, Any]]] = {}

    def solve(self, Z, k, Y, c, b, reg, options, warm, final=True) -> SinkhornResult:
        """The transport from ``Z`` to cloud ``k`` (``Y``, ``b``); ``final=False`` (the outer
        steps, which read the row side only) lets the summary leave out ``P^T Xc``."""
        geometry = check_problem(Z, Y, reg, context=self.context)
        accuracy = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
        reused = self.backend != "auto" or k in self.choices
        if reused:
            name, params = (self.backend, {}) if self.backend != "auto" else self.choices[k]
            kernel = build_kernel(
                geometry, name, rng=self.generator, accuracy=accuracy, policy=policy,
                **self.params, **params,
            )  # fmt: skip
            start = (None, None) if warm is None else warm.start(kernel, Z, Y, c, reg)
            problem = make_problem(c, b, geometry.shape, reg, log_u0=start[0], log_v0=start[1])
            try:
                result = solve(problem, kernel, options, rng=self.generator, column_moments=final)
            except LinearRangeError:  # this kernel's plain iteration cannot: choose again
                if self.backend != "auto":
                    raise
                result = None
            if result is not None and (self.backend != "auto" or result.accuracy_met is not False):
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


@dataclass
class _Warm:
    """What a solve leaves for the next outer step's solve of the same transport: the
    support it was at, its log-scalings and (a cloud's transport) its barycentric map."""

    support: np.ndarray
    log_u: np.ndarray
    log_v: np.ndarray
    image: np.ndarray | None

    def start(self, kernel: Any, Z: np.ndarray, Y: np.ndarray, c: np.ndarray, reg: float):
        """``(log_u0, log_v0)`` on the support ``Z``: :func:`moved_potentials` where its
        error bound allows, else :func:`warm_potentials` (one pass over the new kernel)."""
        if self.image is not None:
            moved = moved_potentials(self.support, Z, self.log_u, self.image, Y, reg)
            if moved is not None:
                return moved, self.log_v
        return warm_potentials(kernel, c, self.log_v)


def moved_potentials(
    support: np.ndarray,
    Z: np.ndarray,
    log_u: np.ndarray,
    image: np.ndarray,
    Y: np.ndarray,
    reg: float,
    limit: float | None = None,
) -> np.ndarray | None:
    """The row log-scalings ``log u`` of the support moved from ``support`` to ``Z`` against
    the fixed cloud ``Y``, to first order in the move ``delta = Z - support``: no pass over
    the kernel.

    With ``u = c / K v`` at the old support and ``T`` its barycentric map (the means of
    ``y`` under the plan's rows ``p_i``), ``K_ij`` at ``z_i + delta_i`` is ``K_ij``
    times ``exp(-(2 delta_i.(z_i - y_j) + |delta_i|^2) / reg)``, so that exactly

    .. math:: \\log u_i^{new} = \\log u_i + \\frac{2 \\delta_i \\cdot (z_i - T_i)
        + |\\delta_i|^2}{\\mathrm{reg}} - \\log \\mathbb{E}_{p_i}
        e^{2 \\delta_i \\cdot (y - T_i) / \\mathrm{reg}};

    the last term (left out) lies in ``[0, 2 |delta_i| max_j |y_j - T_i| / reg]`` (Jensen;
    the mean of ``y - T_i`` under ``p_i`` is 0). Returns ``None`` when that bound exceeds
    ``limit`` (default :data:`WARM_SHIFT_LIMIT`) for some point, or the result is not
    finite. The start only decides where the solve begins; it stops by its own rule.
    """
    limit = WARM_SHIFT_LIMIT if limit is None else limit
    delta = Z - support
    centre = Y.mean(axis=0)
    radius = float(np.sqrt(np.max(np.sum((Y - centre) ** 2, axis=1))))
    # max_j |y_j - T_i| <= |T_i - centre| + radius
    spread = np.sqrt(np.sum((image - centre) ** 2, axis=1)) + radius
    bound = 2.0 * np.sqrt(np.sum(delta**2, axis=1)) * spread / reg
    if not float(np.max(bound, initial=0.0)) <= limit:
        return None
    moved = (
        log_u + (2.0 * np.sum(delta * (support - image), axis=1) + np.sum(delta**2, axis=1)) / reg
    )
    return moved if np.all(np.isfinite(moved)) else None


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
