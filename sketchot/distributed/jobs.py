"""Jobs on Dask arrays: the Sinkhorn divergence with its gradients, and free-support barycentres.

:func:`sketchot.sinkhorn_divergence` and :func:`sketchot.barycenter` send Dask inputs here
(through :mod:`sketchot.api`, the one place that tells Dask inputs apart). The formulas are
the in-memory ones (:mod:`sketchot.loss`, :mod:`sketchot.barycenter`); what changes is where
the ``n``-sized arrays live: every solve is :func:`~.solver.sinkhorn_dask` (potentials and
marginals persisted on the workers), and the gradients are Dask arrays computed on the
workers from those potentials through the kernels' products (``K (v Y)``, ``K^T (u X)``:
``O((n + m) r d)`` for a rank-``r`` kernel, never an ``n x m`` array). Only scalars (the
value, its error estimate, a balance shift) and ``k``-sized pieces (the ``k`` zero weights'
points, a barycentre's support of ``n_support`` points) come to the client.

Differences from memory, and why:

* the symmetric problems ``(a, a)`` and ``(b, b)`` run the two-sided iteration (the engine's
  averaged symmetric update needs immediate passes; Dask's are deferred): both stop at the
  same ``tol`` on the same fixed point, so the value and gradients agree to the solves'
  tolerance, not to rounding;
* identical inputs are not detected by value (that would be a pass over both clouds): ``X is
  Y`` (and ``a is b``) returns 0 without a solve, as in memory;
* the squared Euclidean cost only (the gradients and the support update are its own; the
  Dask solves take every metric).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np

from .._validation import (
    check_bool,
    check_float,
    check_int,
    check_rng,
    describe,
    user_stacklevel,
)
from ..solver import AccuracyWarning, check_reg_m, value_error_estimate
from .geometry import SPLIT_EVERY, as_dask_cloud
from .local import is_block_local
from .solver import DaskSinkhornResult, _log_matvec, sinkhorn_dask

#: Pairs of the divergence with their sign (as :data:`sketchot.loss.TERMS`).
TERMS = (("ab", 1.0), ("aa", -0.5), ("bb", -0.5))


@dataclass
class DaskDivergenceResult:
    """:class:`sketchot.DivergenceResult` of Dask clouds: ``value``, ``value_error`` and
    ``accuracy`` are numbers; ``grad_a``, ``grad_b`` (persisted) and ``grad_X``, ``grad_Y``
    (built and persisted when first read) are Dask arrays on the workers; ``results`` holds the
    three :class:`~sketchot.distributed.DaskSinkhornResult`. ``warm``: for each problem,
    whether it was solved from ``warm_start``'s potentials."""

    value: float
    grad_a: Any
    grad_b: Any
    value_error: float = 0.0
    accuracy: float = 0.0
    results: dict[str, DaskSinkhornResult] = field(default_factory=dict)
    warm: dict[str, bool] = field(default_factory=dict)
    clipped: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: ``debias`` and the gradients once built (``'X'``, ``'Y'``)
    _positions: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def grad_X(self) -> da.Array:  # noqa: N802 (the cloud's name)
        """``dS / dX``, shape (n, d): a persisted Dask array, built on first read."""
        return self._position_gradient("X")

    @property
    def grad_Y(self) -> da.Array:  # noqa: N802
        """``dS / dY``, shape (m, d): a persisted Dask array, built on first read."""
        return self._position_gradient("Y")

    def _position_gradient(self, side: str) -> da.Array:
        if side not in self._positions:
            start = time.perf_counter()
            grad = _position_gradient(self.results, side, self._positions["debias"])
            self._positions[side] = grad.persist()
            self.timings[f"grad_{side}"] = time.perf_counter() - start
        return self._positions[side]

    @property
    def converged(self) -> bool:
        """Whether every solve stopped on its tolerance."""
        return all(result.converged for result in self.results.values())

    @property
    def backend(self) -> str:
        """The cross problem's backend (``'none'`` for identical inputs)."""
        result = self.results.get("ab")
        return result.backend if result is not None else "none"

    def __repr__(self) -> str:
        return (
            f"DaskDivergenceResult(value={self.value:.6g}, value_error={self.value_error:.2e}, "
            f"accuracy={self.accuracy:.2e}, backend={self.backend!r})"
        )


def sinkhorn_divergence_dask(
    X: Any,
    Y: Any,
    a: Any = None,
    b: Any = None,
    reg: float = 1.0,
    reg_m: Any = None,
    backend: str = "auto",
    *,
    debias: bool = True,
    rng: Any = None,
    warm_start: DaskDivergenceResult | None = None,
    policy: Any = None,
    **kwargs: Any,
) -> DaskDivergenceResult:
    """:func:`sketchot.sinkhorn_divergence` of Dask clouds (module notes): three Dask solves
    (one with ``debias=False``) from one seed drawn from ``rng``, the value as a number, the
    gradients as Dask arrays.

    ``warm_start``: a previous :class:`DaskDivergenceResult` on clouds of the same sizes; each
    problem starts from its potentials in cost units (``log u = log a + f / reg``, so the
    weights may change) and is solved again cold when the warm solve does not converge or
    misses ``accuracy``. ``policy``: :mod:`sketchot.policy`, passed in by the caller.
    """
    debias = check_bool(debias, "debias")
    reg = check_float(reg, "reg", positive=True)
    rho = _one_penalty(reg_m, reg)
    if warm_start is not None and not isinstance(warm_start, DaskDivergenceResult):
        raise TypeError(
            "warm_start must be a previous sinkhorn_divergence result on Dask arrays "
            f"(DaskDivergenceResult) or None; got {describe(warm_start)}"
        )
    X = as_dask_cloud(X, "X", getattr(Y, "chunks", (None,))[0])
    Y = as_dask_cloud(Y, "Y", X.chunks[0])
    if X.shape[1] != Y.shape[1]:
        raise ValueError(
            f"Y must have the same number of features as X ({X.shape[1]}); got {Y.shape[1]}"
        )
    if debias and X is Y and a is b:
        return DaskDivergenceResult(
            0.0, da.zeros(X.shape[0], chunks=X.chunks[0]), da.zeros(Y.shape[0], chunks=Y.chunks[0]),
            notes=["identical inputs (the same arrays): S = 0 exactly, no solve"],
            _positions={"debias": debias, "X": da.zeros_like(X), "Y": da.zeros_like(Y)},
        )  # fmt: skip
    seed = int(check_rng(rng).integers(2**63))
    # the gradients come from the potentials: the full stopping fraction unless asked
    kwargs = {"certify_first": False, **kwargs}
    clouds = {"ab": (X, Y, a, b), "aa": (X, X, a, a), "bb": (Y, Y, b, b)}
    terms = TERMS if debias else TERMS[:1]
    results, warm, notes = {}, {}, []
    start = time.perf_counter()
    for name, _ in terms:
        P, Q, wp, wq = clouds[name]
        previous = warm_start.results.get(name) if warm_start is not None else None
        results[name], warm[name], note = _solve(
            P, Q, wp, wq, reg, reg_m, backend, seed, previous, policy, kwargs
        )
        if note:
            notes.append(f"{name}: {note}")
    solved = time.perf_counter()
    ab = results["ab"]
    value = sum(weight * results[name].value for name, weight in terms)
    if debias and rho is not None:
        value += 0.5 * reg * (ab.scalars["mass_a"] - ab.scalars["mass_b"]) ** 2
    value_error = sum(abs(weight) * _value_error(results[name]) for name, weight in terms)
    grad_a, grad_b = _weight_gradients(results, reg, rho, debias)
    out = DaskDivergenceResult(
        float(value), grad_a, grad_b, value_error=float(value_error),
        accuracy=max(_accuracy(results[name]) for name, _ in terms), results=results, warm=warm,
        timings={"solve": solved - start, "gradient": time.perf_counter() - solved},
        notes=notes, _positions={"debias": debias},
    )  # fmt: skip
    if out.value < 0:
        if -out.value <= out.value_error:
            out.notes.append(f"S = {out.value:.3e} < 0 within its error: clipped to 0")
            out.value, out.clipped = 0.0, True
        else:
            warnings.warn(
                f"sinkhorn_divergence: S = {out.value:.3e} < 0 beyond its estimated error "
                f"{out.value_error:.2e} (true-kernel marginal error {out.accuracy:.2e}); lower "
                "accuracy= or tol=",
                AccuracyWarning,
                stacklevel=user_stacklevel(),
            )
    return out


def _one_penalty(reg_m: Any, reg: float) -> float | None:
    """``None`` (balanced) or one finite penalty for both sides (as :mod:`sketchot.loss`)."""
    if reg_m is None:
        return None
    pair = check_reg_m(reg_m, reg)
    if pair[0] != pair[1]:
        raise ValueError(
            f"reg_m must be None or one penalty for both sides (the unbalanced divergence of "
            f"Sejourne et al. is symmetric); got reg_m = {reg_m!r}"
        )
    return None if math.isinf(pair[0]) else pair[0]


def _solve(P, Q, wp, wq, reg, reg_m, backend, seed, previous, policy, kwargs):
    """One problem: warm from ``previous``'s potentials (moved to the new weights) when that
    converges and meets the accuracy, else cold. Returns ``(result, warm_used, note)``."""
    solve = {"reg_m": reg_m, "rng": seed, "policy": policy, **kwargs}
    note = ""
    if previous is not None and previous.kernel.shape == (P.shape[0], Q.shape[0]):
        start = warm_scalings(previous, wp, wq)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # judged below: a miss is solved again cold
            result = sinkhorn_dask(wp, wq, P, Q, reg, backend, warmstart=start, **solve)
        if result.converged and result.accuracy_met is not False:
            return result, True, ""
        note = f"warm start {result.status}: solved cold"
    return sinkhorn_dask(wp, wq, P, Q, reg, backend, **solve), False, note


def warm_scalings(previous: DaskSinkhornResult, a: Any, b: Any) -> tuple[da.Array, da.Array]:
    """``previous``'s log-scalings carried to the weights ``a``, ``b`` (``None``: uniform) in
    cost units: ``log u = log a + (log u_prev - log a_prev)`` (0 where a weight is 0), on the
    previous solve's chunks."""
    starts = []
    for weights, log_scaling, old in zip(
        (a, b), previous.potentials, (previous.a, previous.b), strict=True
    ):
        if weights is None:
            weights = da.full(old.shape[0], 1.0 / old.shape[0], chunks=old.chunks)
        elif not hasattr(weights, "chunks"):
            weights = da.from_array(np.asarray(weights, dtype=np.float64), chunks=old.chunks)
        weights = weights.astype(np.float64).rechunk(old.chunks)
        shift = da.where(old > 0, log_scaling - da.log(da.where(old > 0, old, 1.0)), 0.0)
        logs = da.log(da.where(weights > 0, weights, 1.0))
        starts.append(da.where(weights > 0, logs + da.where(da.isfinite(shift), shift, 0.0), 0.0))
    return starts[0], starts[1]


# --------------------------------------------------------------------- accuracy
def _accuracy(result: DaskSinkhornResult) -> float:
    check = result.true_kernel
    return float(check.bound) if check is not None else float("nan")


def _value_error(result: DaskSinkhornResult) -> float:
    """:func:`sketchot.loss`'s first-order gap: it reads only the potentials' extremes, which
    are computed on the workers (the midpoint and the largest deviations are those of the
    smallest and largest entries)."""
    check = result.true_kernel
    if check is None:
        return float("nan")
    f, g = _potentials(result)
    ends = dask.compute(da.nanmin(f), da.nanmax(f), da.nanmin(g), da.nanmax(g))
    mass = result.scalars["mass_a"]
    gap = value_error_estimate(
        np.array(ends[:2]), np.array(ends[2:]), mass * check.bound_a, mass * check.bound_b,
        balanced=result.problem.balanced,
    )  # fmt: skip
    return float(gap[0])


# -------------------------------------------------------------------- gradients
def _potentials(result: DaskSinkhornResult) -> tuple[da.Array, da.Array]:
    """``f = reg (log u - log a)``, ``g = reg (log v - log b)`` (NaN at zero weights)."""
    out = []
    for log_scaling, weights in zip(result.potentials, (result.a, result.b), strict=True):
        positive = weights > 0
        logs = da.log(da.where(positive, weights, 1.0))
        out.append(da.where(positive, result.reg * (log_scaling - logs), np.nan))
    return out[0], out[1]


def _full_potentials(result: DaskSinkhornResult, rho: float | None) -> tuple[da.Array, da.Array]:
    """The potentials with zero weights filled by their continuous extension ``-reg rho' log
    sum_j exp(log v_j - ||x - y_j||^2 / reg)`` (``rho' = rho / (rho + reg)``, 1 balanced):
    the ``k`` zero-weight points are gathered and their log-sum-exp reduced over the other
    side's chunks on the workers (``O(k m d)``)."""
    f, g = _potentials(result)
    geometry = result.kernel.geometry
    exponent = 1.0 if rho is None else rho / (rho + result.reg)
    filled = []
    for potential, weights, side, other, log_other, cost in (
        (f, result.a, "x", geometry.Yc, result.potentials[1], geometry.cost),
        (g, result.b, "y", geometry.Xc, result.potentials[0], geometry.cost.transposed()),
    ):
        missing = da.flatnonzero(weights == 0).compute()
        if missing.size:
            lse = _log_matvec(geometry.rows(side, missing), other, log_other, result.reg, cost)
            potential = _scatter(potential, missing, -result.reg * exponent * lse)
        filled.append(potential)
    return filled[0], filled[1]


def _scatter(vector: da.Array, index: np.ndarray, values: np.ndarray) -> da.Array:
    """``vector`` with ``vector[index] = values`` (few entries), chunk by chunk."""

    def place(block, block_info=None):
        lo, hi = block_info[0]["array-location"][0]
        inside = (index >= lo) & (index < hi)
        out = block.copy()
        out[index[inside] - lo] = values[inside]
        return out

    return vector.map_blocks(place, dtype=vector.dtype)


def _weight_gradients(results, reg, rho, debias):
    """``dS / da`` and ``dS / db`` as persisted Dask arrays (:mod:`sketchot.loss`'s
    formulas, its balance shift computed as one scalar on the workers)."""
    ab = results["ab"]
    f_ab, g_ab = _full_potentials(ab, rho)
    a, b = ab.a, ab.b
    if not debias:
        if rho is not None:
            grad_a = rho * (1 - da.exp(-f_ab / rho)) - reg * (da.exp(-f_ab / rho) - b.sum())
            grad_b = rho * (1 - da.exp(-g_ab / rho)) - reg * (da.exp(-g_ab / rho) - a.sum())
            return dask.persist(grad_a, grad_b)
        return _balance_shift(f_ab, g_ab, a, b)
    sym = {}
    for name in ("aa", "bb"):
        f, g = _full_potentials(results[name], rho)
        sym[name] = 0.5 * (f + g.rechunk(f.chunks))
    if rho is None:
        return _balance_shift(f_ab - sym["aa"], g_ab - sym["bb"], a, b)
    scale = rho + reg
    grad_a = scale * (da.exp(-sym["aa"] / rho) - da.exp(-f_ab / rho))
    grad_b = scale * (da.exp(-sym["bb"] / rho) - da.exp(-g_ab / rho))
    return dask.persist(grad_a, grad_b)


def _balance_shift(grad_a, grad_b, a, b):
    """``(grad_a + k, grad_b - k)`` with ``<a, grad_a + k> = <b, grad_b - k>``, persisted."""
    grad_a, grad_b = dask.persist(grad_a, grad_b)
    dots = dask.compute(
        (b * grad_b).sum(split_every=SPLIT_EVERY),
        (a * grad_a).sum(split_every=SPLIT_EVERY),
        a.sum(split_every=SPLIT_EVERY),
        b.sum(split_every=SPLIT_EVERY),
    )
    k = (dots[0] - dots[1]) / (dots[2] + dots[3])
    return dask.persist(grad_a + k, grad_b - k)


def _plan_moments(result: DaskSinkhornResult, side: int) -> tuple[da.Array, da.Array, da.Array]:
    """``(marginal, P Yc, points)`` (``side`` 0: rows, with the row points ``Xc``) or
    ``(P^T 1, P^T Xc, Yc)`` (1), in the solve's geometry's centring, by one kernel product
    with ``d`` columns on the workers."""
    g = result.kernel.geometry
    if is_block_local(result.kernel):
        # its linear products take non-negative values only: P Y = diag(P 1) times the
        # means of one log pass with means (finite at any reg)
        log_u, log_v = result.potentials
        marginal = result.marginals[side]
        if side == 0:
            _, means = result.kernel.log_means("rows", log_v.compute())
            return marginal, marginal[:, None] * means.rechunk(g.Xc.chunks), g.Xc
        _, means = result.kernel.log_means("cols", log_u)
        means = da.from_array(means, chunks=g.Yc.chunks)
        return marginal, marginal.rechunk(g.Yc.chunks[0])[:, None] * means, g.Yc
    u, v = result.u, result.v
    if side == 0:
        product = result.kernel.matmat(v[:, None] * g.Yc).rechunk(g.Xc.chunks)
        return result.marginals[0], u[:, None] * product, g.Xc
    product = result.kernel.rmatmat(u[:, None] * g.Xc)
    if product.ndim == 1:  # the exact operator's K^T U comes back flat, (m k,) in row order
        product = product.reshape(g.Yc.shape)
    product = product.rechunk(g.Yc.chunks)
    return result.marginals[1], v[:, None] * product, g.Yc


def _position_gradient(results, side: str, debias: bool) -> da.Array:
    """``dS / dX`` (``side`` 'X') or ``dS / dY``: :mod:`sketchot.loss`'s formula, each plan's
    term in its own geometry's centring (``r x - P y`` is invariant under a common shift)."""
    index, symmetric = (0, "aa") if side == "X" else (1, "bb")
    marginal, moment, points = _plan_moments(results["ab"], index)
    grad = 2.0 * (marginal[:, None] * points - moment)
    if debias:
        r, Pp, centred = _plan_moments(results[symmetric], 0)
        c, Ptp, _ = _plan_moments(results[symmetric], 1)
        # d/dx_i of OT(a, a) / 2: (r_i + c_i) x_i - (P x)_i - (P^T x)_i
        chunks = grad.chunks
        term = (r + c.rechunk(r.chunks))[:, None] * centred - Pp - Ptp.rechunk(Pp.chunks)
        grad = grad - term.rechunk(chunks)
    return grad


# -------------------------------------------------------------------- barycentres
#: Supports the Anderson step mixes, the objective's relative rounding and the ridge of the
#: least-squares problem: :mod:`sketchot.barycenter`'s constants.
ANDERSON_MEMORY = 5
OBJECTIVE_RTOL = 1e-12
ANDERSON_RIDGE = 1e-10
#: :func:`sketchot.barycenter`'s defaults (POT's).
POT_OUTER_TOL = 1e-7
LAMBDA_RTOL = 1e-6


@dataclass
class DaskBarycenterResult:
    """:class:`sketchot.BarycenterResult` of Dask clouds: the support ``X`` is a persisted
    Dask array (as large as the smallest cloud by default), ``results`` the final
    :class:`~sketchot.distributed.DaskSinkhornResult` of each cloud; the rest are numbers."""

    X: da.Array
    support_weights: np.ndarray
    lambdas: np.ndarray
    results: list[DaskSinkhornResult]
    n_iter: int
    displacements: list[float]
    converged: bool
    inner_iterations: list[list[int]] = field(default_factory=list)
    objectives: list[float] = field(default_factory=list)
    tol: float = POT_OUTER_TOL
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    self_result: DaskSinkhornResult | None = None

    @property
    def support(self) -> da.Array:
        """The support ``X``."""
        return self.X

    @property
    def objective(self) -> float:
        """``sum_k lambda_k OT_reg(mu_X, nu_k)`` (debiased: minus ``OT_reg(mu_X, mu_X) / 2``)."""
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
        """Whether every final transport met its accuracy (``None`` when not checked)."""
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
            f"DaskBarycenterResult(n_support={self.X.shape[0]}, d={self.X.shape[1]}, "
            f"K={len(self.results)}, n_iter={self.n_iter}, converged={self.converged}, "
            f"displacement={last:.3g}, backends={self.backends})"
        )


def barycenter_dask(
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
    policy: Any = None,
    **kwargs: Any,
) -> DaskBarycenterResult:
    """:func:`sketchot.barycenter` of Dask clouds: the same fixed point (plain or Anderson,
    safeguarded by the objective; debiased with the support's transport to itself), each
    transport a Dask solve, the support a persisted Dask array chunked by rows.

    The default support is drawn as in memory (``n_support`` distinct points with
    probability ``lambda_k b_kj``, the same ``rng`` draw), which gathers the pooled weights
    (8 bytes a point) to the client for the draw; ``X_init`` (NumPy or Dask) gathers
    nothing. ``warm_start``: each solve starts from the previous step's log-scalings of the
    same transport (the cloud's ``log v`` and the support's ``log u``); a warm solve that does
    not converge is solved again cold. Same seed, same answer as in memory up to the inner
    solves' tolerance (the Dask solves run the plain multiplicative iteration).
    """
    start = time.perf_counter()
    for name in sorted(set(kwargs) & {"reg_m", "warmstart", "p"}):
        raise TypeError(f"barycenter() does not take {name} (got {name}={describe(kwargs[name])})")
    reg = check_float(reg, "reg", positive=True)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_float(tol, "tol", minimum=0.0)
    inner_max_iter = check_int(inner_max_iter, "inner_max_iter", minimum=1)
    if inner_tol is not None:
        inner_tol = check_float(inner_tol, "inner_tol", positive=True)
    warm_start = check_bool(warm_start, "warm_start")
    debiased = check_bool(debiased, "debiased")
    if acceleration not in ("auto", "anderson", None):
        raise ValueError(
            f"acceleration must be one of ('auto', 'anderson', None); got {describe(acceleration)}"
        )
    verbose = check_bool(verbose, "verbose")
    generator = check_rng(rng)
    clouds, weights, lambdas, notes = _check_measures(clouds, weights, lambdas)
    Z = _initial_support(X_init, n_support, clouds, weights, lambdas, generator)
    n = Z.shape[0]
    c = da.full(n, 1.0 / n, chunks=Z.chunks[0])
    solve = {**kwargs, "backend": backend, "max_iter": inner_max_iter, "tol": inner_tol,
             "policy": policy}  # fmt: skip
    quiet = {**solve, "warn": False, "verbose": False}
    K = len(clouds)
    terms = [(k, lambdas[k], lambdas[k]) for k in range(K)] + ([(K, -1.0, -0.5)] * debiased)
    warm: list[Any] = [None] * len(terms)
    displacements, objectives, inner = [], [], []
    if acceleration == "auto":
        acceleration = None if debiased else "anderson"
    mixing = _DaskAnderson(ANDERSON_MEMORY) if acceleration == "anderson" else None
    accepted = None
    extrapolated, rejected = False, 0
    converged, n_iter, solving = False, 0, 0.0
    while n_iter < max_iter and not converged:
        begin = time.perf_counter()
        T = Z if debiased else da.zeros_like(Z)
        counts, objective, gap = [], 0.0, 0.0
        for k, mapped, scored in terms:
            target, target_weights = (clouds[k], weights[k]) if k < K else (Z, c)
            res = _transport(Z, target, c, target_weights, reg, generator, quiet, warm[k])
            if warm_start:
                warm[k] = res.potentials
            counts.append(res.n_iter)
            T = T + mapped * res.barycentric_map().rechunk(Z.chunks)
            objective += scored * res.value
            gap += abs(scored) * abs(res.value - res.value_dual)
        T = T.persist()
        solving += time.perf_counter() - begin
        displacement = float(((T - Z) ** 2).sum(split_every=SPLIT_EVERY).compute())
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
            mixing.clear()
            Z, extrapolated, rejected = accepted[2], False, rejected + 1
        else:
            accepted = (objective, gap, T)
            Z, extrapolated = (T, False) if mixing is None or converged else mixing.step(Z, T)
        if verbose:
            print(
                f"sketchot.barycenter (Dask): step {n_iter:3d}  displacement "
                f"{displacement:.3e}  objective {objective:.8g}  inner iterations {counts}  "
                f"{time.perf_counter() - begin:.2f} s"
            )
    if rejected:
        notes.append(
            f"acceleration: {rejected} extrapolated support(s) raised the objective and were "
            "replaced by the plain fixed-point step"
        )
    if not converged and solve.get("warn", True):
        warnings.warn(
            f"sketchot.barycenter stopped after {n_iter} outer steps (max_iter) with a "
            f"displacement ||Z_new - Z||^2 = {displacements[-1]:.3g} > tol = {tol:g}; continue "
            "with X_init=result.X, or pass a larger max_iter or tol",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    begin = time.perf_counter()
    results = [
        _transport(Z, *((clouds[k], c, weights[k]) if k < K else (Z, c, c)), reg, generator,
                   {**solve, "verbose": False}, warm[k])
        for k, _, _ in terms
    ]  # fmt: skip
    solving += time.perf_counter() - begin
    inner.append([res.n_iter for res in results])
    self_result = results.pop() if debiased else None
    return DaskBarycenterResult(
        X=Z, support_weights=np.full(n, 1.0 / n), lambdas=lambdas, results=results,
        n_iter=n_iter, displacements=displacements, converged=converged,
        inner_iterations=inner, objectives=objectives, tol=tol, self_result=self_result,
        timings={"total": time.perf_counter() - start, "solves": solving}, notes=notes,
    )  # fmt: skip


def _transport(Z, Y, c, b, reg, generator, options, warm) -> DaskSinkhornResult:
    """The transport from the support ``Z`` to ``Y``: warm from ``warm`` (the previous step's
    log-scalings) when that converges, else cold; the rng is the barycentre's generator, drawn
    in the order the in-memory solves draw it (kernel, then check)."""
    if warm is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # judged below: a miss is solved again cold
            result = sinkhorn_dask(c, b, Z, Y, reg, rng=generator, warmstart=warm, **options)
        if result.converged and result.accuracy_met is not False:
            return result
    return sinkhorn_dask(c, b, Z, Y, reg, rng=generator, **options)


class _DaskAnderson:
    """:mod:`sketchot.barycenter`'s Anderson step (type II, Walker and Ni 2011) on Dask
    supports: the Gram matrix of the residuals' differences computed in one ``dask.compute``
    (``memory^2`` sums), the mixed support a persisted combination of the images."""

    def __init__(self, memory: int):
        self.memory = memory
        self.supports: list[da.Array] = []
        self.images: list[da.Array] = []

    def clear(self) -> None:
        self.supports.clear()
        self.images.clear()

    def step(self, Z: da.Array, T: da.Array) -> tuple[da.Array, bool]:
        self.supports.append(Z)
        self.images.append(T)
        del self.supports[: -self.memory - 1], self.images[: -self.memory - 1]
        if len(self.supports) < 2:
            return T, False
        residuals = [t - z for z, t in zip(self.supports, self.images, strict=True)]
        dR = [r1 - r0 for r0, r1 in itertools.pairwise(residuals)]
        dT = [t1 - t0 for t0, t1 in itertools.pairwise(self.images)]
        size = len(dR)
        pairs = [(i, j) for i in range(size) for j in range(i, size)]
        sums = dask.compute(
            [(dR[i] * dR[j]).sum(split_every=SPLIT_EVERY) for i, j in pairs],
            [(d * residuals[-1]).sum(split_every=SPLIT_EVERY) for d in dR],
        )
        gram = np.empty((size, size))
        for (i, j), value in zip(pairs, sums[0], strict=True):
            gram[i, j] = gram[j, i] = value
        ridge = ANDERSON_RIDGE * float(np.max(np.diag(gram)))
        if not ridge > 0.0:
            return T, False
        gamma = np.linalg.solve(gram + ridge * np.eye(size), np.asarray(sums[1]))
        extrapolated = self.images[-1]
        for coefficient, step in zip(gamma, dT, strict=True):
            extrapolated = extrapolated - coefficient * step
        extrapolated = extrapolated.persist()
        if not bool(da.isfinite(extrapolated).all().compute()):
            self.clear()
            return T, False
        return extrapolated, True


def _check_measures(clouds: Any, weights: Any, lambdas: Any):
    """Dask clouds (row-chunked float64; a NumPy cloud is wrapped), their weights as Dask
    vectors of mass 1 (one computation for the masses) and the coefficients."""
    try:
        clouds = list(clouds)
    except TypeError:
        raise TypeError(
            f"clouds must be a sequence of (n_k, d) arrays; got {describe(clouds)}"
        ) from None
    if not clouds:
        raise ValueError("clouds must hold at least one point cloud; got an empty sequence")
    clouds = [as_dask_cloud(Y, f"clouds[{k}]") for k, Y in enumerate(clouds)]
    d = clouds[0].shape[1]
    for k, Y in enumerate(clouds):
        if Y.shape[1] != d:
            raise ValueError(
                f"clouds[{k}] must have the same number of features as clouds[0] ({d}); got "
                f"{Y.shape[1]}"
            )
    K = len(clouds)
    weights = [None] * K if weights is None else list(weights)
    if len(weights) != K:
        raise ValueError(
            f"weights must hold one weight vector (or None) per cloud ({K}); got {len(weights)}"
        )
    vectors = []
    for k, (Y, w) in enumerate(zip(clouds, weights, strict=True)):
        size = Y.shape[0]
        if w is None:
            w = da.full(size, 1.0 / size, chunks=Y.chunks[0])
        elif not hasattr(w, "chunks"):
            w = da.from_array(np.asarray(w, dtype=np.float64), chunks=Y.chunks[0])
        if w.shape != (size,):
            raise ValueError(
                f"weights[{k}] must have one weight per row of clouds[{k}] ({size}); got shape "
                f"{w.shape}"
            )
        vectors.append(w.astype(np.float64).rechunk(Y.chunks[0]))
    facts = dask.compute([(w.sum(), w.min(), da.isfinite(w).all()) for w in vectors])[0]
    notes, checked = [], []
    for k, (w, (total, smallest, finite)) in enumerate(zip(vectors, facts, strict=True)):
        if not finite or smallest < 0 or not total > 0:
            raise ValueError(
                f"weights[{k}] must be finite and non-negative with a positive mass; got "
                f"minimum {smallest:.3g}, mass {total:.3g}"
            )
        if not np.isclose(total, 1.0, rtol=1e-12, atol=0.0):
            notes.append(f"weights[{k}] was normalised from mass {total:.8g} to 1")
        checked.append((w / total).persist())
    return clouds, checked, _check_lambdas(lambdas, K), notes


def _check_lambdas(lambdas: Any, K: int) -> np.ndarray:
    """As :func:`sketchot.barycenter.check_lambdas`."""
    if lambdas is None:
        return np.full(K, 1.0 / K)
    array = np.asarray(lambdas, dtype=np.float64)
    if array.shape != (K,) or not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(
            f"lambdas must be {K} finite, non-negative coefficients (one per cloud); got "
            f"{describe(lambdas)}"
        )
    if not np.isclose(array.sum(), 1.0, rtol=LAMBDA_RTOL, atol=0.0):
        raise ValueError(
            f"lambdas must sum to 1 (barycentric coefficients); got sum {array.sum():.8g}"
        )
    return array


def _initial_support(X_init, n_support, clouds, weights, lambdas, generator) -> da.Array:
    """``X_init`` (NumPy or Dask) or the in-memory default draw (the same ``rng`` call)."""
    d = clouds[0].shape[1]
    if X_init is not None:
        Z = as_dask_cloud(X_init, "X_init", clouds[0].chunks[0])
        if Z.shape[1] != d:
            raise ValueError(f"X_init must have {d} features (the clouds'); got {Z.shape[1]}")
        if n_support is not None and check_int(n_support, "n_support", minimum=1) != Z.shape[0]:
            raise ValueError(
                f"n_support must match X_init's {Z.shape[0]} points; got n_support={n_support}"
            )
        return Z.persist()
    if n_support is None:
        n_support = min(Y.shape[0] for Y in clouds)
    n_support = check_int(n_support, "n_support", minimum=1)
    # the draw needs the pooled probabilities on the client (one float per point)
    probabilities = np.concatenate(
        dask.compute(*[lam * w for lam, w in zip(lambdas, weights, strict=True)])
    )
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
    pooled = da.concatenate(clouds)
    return pooled[index].rechunk((clouds[0].chunks[0][0], -1)).persist()
