"""Sinkhorn on Dask arrays: the in-memory solver's iteration, driven from the client.

Low-rank kernels: the iterates of :func:`sketchot.solver.sinkhorn._multiplicative`, with
every fused pass (one pass over the row chunks and a tree reduction to a rank-sized sum
and a count) of the iterations up to the next column-marginal check, and that check, in one
graph: ONE scheduler call per ``check_every`` iterations (:func:`_chained_iterations`).
The exact kernel runs ``_multiplicative`` itself (one call per half-step). The scalings
``u``, ``v`` stay lazy during the loop (a chunk-local function of the last rank-sized
vector); at the end they, the potentials and the marginals are persisted on the cluster and
the scalars (cost, mass, errors) computed in one ``dask.compute``. No ``n``-sized array is
ever gathered on the client.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np

from .._validation import check_bool, check_int, check_rng
from ..kernels import KernelOperator, build_kernel
from ..kernels.base import MIN_DENOMINATOR_RATIO
from ..solver.errors import NonPositiveKernelError
from ..solver.options import SolverOptions
from ..solver.plans import TrueKernelCheck, check_from_masses, sample_indices
from ..solver.result import SinkhornResult
from ..solver.sinkhorn import (
    FLOAT32_RELATIVE_TOL,
    MASS_RTOL,
    SAMPLED_CHECK_SIZE,
    _log_scaling,
    _multiplicative,
    _Printer,
    check_backend_params,
    finish_solve,
    iteration_fields,
)
from .geometry import SPLIT_EVERY, check_reg_and_clouds
from .kernels import DaskExactKernel, DaskLowRankKernel, PassGraph, per_chunk

# The exact kernel's plain iteration stays within float64 range while max cost / reg is below
# this (e^+-500); beyond, the in-memory solver's stabilised path is needed (not on Dask).
LOG_DOMAIN_THRESHOLD = 500.0

#: Most iterations in one graph when checks are rarer: a graph then holds about
#: ``2 (chunks + 1)`` tasks per iteration times this; each cut costs one scheduler call.
MAX_BLOCK_ITERATIONS = 50


def sinkhorn_dask(
    a: Any,
    b: Any,
    X: Any,
    Y: Any,
    reg: float = 1.0,
    backend: str = "polyts",
    *,
    rng: Any = None,
    **kwargs: Any,
) -> DaskSinkhornResult:
    """:func:`sketchot.sinkhorn` on Dask arrays (it dispatches here for any Dask input).

    Parameters
    ----------
    a, b : dask.array, ndarray or None
        Weights (rechunked to the rows of ``X`` and ``Y``).
    X, Y : dask.array, shape (n, d) and (m, d)
        Clouds chunked by rows (a NumPy cloud is wrapped with the other's row chunks).
    reg, backend, rng, **kwargs
        As :func:`sketchot.sinkhorn`. ``safeguard`` must be ``'raise'`` or ``'none'`` for a
        problem with non-positive approximate denominators (the repairs of ``'exact'`` and
        ``'clip'`` are not distributed yet: such a solve raises and says so).

    Returns
    -------
    DaskSinkhornResult
        ``potentials``, ``marginals``, ``u``, ``v`` and barycentric maps are persisted Dask
        arrays; ``value_linear``, ``mass``, ``marginal_errors``, ``n_iter``, ... are numbers.

    Notes
    -----
    Per iteration ``O((n + m) r)`` work over the workers, moving ``O(r)`` floats per chunk;
    one synchronisation per ``check_every`` iterations (at most
    :data:`MAX_BLOCK_ITERATIONS`). The exact backend: ``O(n m d)`` work and ``O(m)`` floats
    per chunk, two synchronisations per iteration.
    """
    options, backend_params = SolverOptions.split(kwargs)
    check_backend_params("sinkhorn", backend, backend_params)
    geometry = check_reg_and_clouds(X, Y, reg)
    a, b, notes = check_dask_marginals(a, b, geometry)
    kernel = build_kernel(geometry, backend, rng=rng, **backend_params)
    if options.verbose:
        print(f"sketchot.sinkhorn: built {kernel!r} in {kernel.info.build_time:.3f} s")
    return solve_dask(a, b, kernel, options, rng=rng, notes=notes)


def sinkhorn_kernel_dask(a: Any, b: Any, kernel: KernelOperator, **kwargs: Any):
    """:func:`sketchot.sinkhorn_kernel` on a Dask operator (from ``make_kernel`` on Dask
    arrays): several solves with one persisted kernel."""
    if not getattr(kernel.geometry, "distributed", False):
        raise TypeError(
            f"kernel must be built on Dask arrays (make_kernel with Dask X, Y); got {kernel!r}"
        )
    rng = kwargs.pop("rng", None)
    options = SolverOptions(**kwargs)
    a, b, notes = check_dask_marginals(a, b, kernel.geometry)
    return solve_dask(a, b, kernel, options, rng=rng, notes=notes)


def check_dask_marginals(a: Any, b: Any, geometry: Any) -> tuple[da.Array, da.Array, list[str]]:
    """Weights as Dask vectors on the clouds' row chunks, validated in one computation."""
    chunks_x, chunks_y = geometry.row_chunks
    weights = []
    for value, name, chunks, points in ((a, "a", chunks_x, "X"), (b, "b", chunks_y, "Y")):
        size = sum(chunks)
        if value is None:
            weights.append(da.full(size, 1.0 / size, chunks=(chunks,)))
            continue
        if getattr(value, "ndim", np.ndim(value)) != 1:
            raise ValueError(f"{name} must be a 1-D array of weights; got shape {np.shape(value)}")
        if value.shape[0] != size:
            raise ValueError(
                f"{name} must have one weight per row of {points} ({size}); "
                f"got {value.shape[0]} weights"
            )
        if not hasattr(value, "chunks"):
            value = da.from_array(np.asarray(value), chunks=(chunks,))
        if np.dtype(value.dtype).kind not in "biuf":
            raise TypeError(f"{name} must be a 1-D array of real weights; got dtype {value.dtype}")
        weights.append(value.astype(np.float64).rechunk((chunks,)).persist())
    a, b = weights
    facts = dask.compute(
        *[(da.isfinite(w).all(), w.min(), w.sum(split_every=SPLIT_EVERY)) for w in weights]
    )
    for name, (finite, smallest, total) in zip("ab", facts, strict=True):
        if not finite:
            raise ValueError(f"{name} must contain only finite weights; got NaN or inf")
        if smallest < 0:
            raise ValueError(f"{name} must be non-negative; got minimum {smallest:.3g}")
        if total <= 0:
            raise ValueError(f"{name} must have a positive total mass; got {total:.3g}")
    mass_a, mass_b = float(facts[0][2]), float(facts[1][2])
    notes = []
    if not np.isclose(mass_a, mass_b, rtol=MASS_RTOL, atol=0.0):
        raise ValueError(
            f"a and b must have the same total mass (balanced transport); got sum(a) = "
            f"{mass_a:.8g} and sum(b) = {mass_b:.8g}"
        )
    if mass_a != mass_b:
        b = (b * (mass_a / mass_b)).persist()
        notes.append(f"b was rescaled by {mass_a / mass_b:.12g} to the mass of a")
    return a, b, notes


class DaskSafeguard:
    """The safeguard policies that need no true-kernel rows: ``'none'`` keeps the zero
    scalings of bad entries, ``'raise'`` raises; ``'exact'`` and ``'clip'`` are refused with
    a clear error when a pass has bad entries (their repairs are not distributed)."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.counts = {"rows_repaired": 0, "cols_repaired": 0, "clipped": 0, "zeroed": 0}
        self.repaired = False

    def apply(self, side: str, result: Any, numerator: Any, other: Any):
        self.count(side, result.n_bad)
        return result.ratios, result.projection

    def count(self, side: str, count: int) -> None:
        """Record ``count`` bad entries of a ``side`` pass (their scalings are already 0),
        or raise as the policy says."""
        if self.policy == "none":
            self.counts["zeroed"] += count
            return
        if self.policy == "raise":
            raise NonPositiveKernelError(
                f"{count} non-positive or non-finite denominators in a {side} pass"
            )
        raise NonPositiveKernelError(
            f"{count} non-positive or non-finite denominators in a {side} pass of a Dask "
            f"solve: safeguard={self.policy!r} repairs are not available on Dask arrays. "
            "Pass safeguard='none' (their scalings are set to 0) or 'raise', raise the rank "
            "or reg, or use backend='exact'"
        )

    def warn(self, n_iter: int) -> None:
        if self.counts["zeroed"]:
            warnings.warn(
                f"{self.counts['zeroed']} bad denominators had their scalings set to 0 "
                f"over {n_iter} iterations (safeguard='none')",
                UserWarning,
                stacklevel=4,
            )


class _UnderflowGuard(DaskSafeguard):
    """For the exact kernel, a bad denominator is an underflow: the stabilised iteration it
    needs runs in memory only."""

    def apply(self, side: str, result: Any, numerator: Any, other: Any):
        raise NotImplementedError(
            "the exact kernel underflowed and the log-stable iteration is not available on "
            "Dask arrays; raise reg or solve in memory"
        )


def _l2(x: da.Array) -> da.Array:
    return da.sqrt((x * x).sum(split_every=SPLIT_EVERY))


def _masked_dot(weights: da.Array, logs: da.Array) -> da.Array:
    """``sum_i w_i log_i`` over ``w_i != 0`` (``0 * -inf`` counts as 0)."""
    return da.where(weights != 0, weights * da.where(weights != 0, logs, 0.0), 0.0).sum(
        split_every=SPLIT_EVERY
    )


def solve_dask(
    a: da.Array,
    b: da.Array,
    kernel: KernelOperator,
    options: SolverOptions,
    *,
    rng: Any = None,
    notes: list[str] | None = None,
) -> DaskSinkhornResult:
    """The Dask solve on validated inputs: iterations, persisted results, scalar summary."""
    exact = "exact" in kernel.info.capabilities
    geometry = kernel.geometry
    if options.log_domain is True or (
        exact
        and options.log_domain == "auto"
        and geometry.max_cost() / geometry.reg > LOG_DOMAIN_THRESHOLD
    ):
        raise NotImplementedError(
            f"the log-domain iteration is not available on Dask arrays (max cost / reg = "
            f"{geometry.max_cost() / geometry.reg:.3g} > {LOG_DOMAIN_THRESHOLD:g} needs it "
            "with the exact kernel); raise reg or solve in memory"
        )
    if options.anderson not in ("auto", 0):
        raise ValueError(
            f"anderson={options.anderson}: Anderson mixing needs the scalings in memory; a "
            "Dask solve runs the plain iteration (pass anderson=0 or 'auto')"
        )
    tol = options.tol
    if kernel.dtype == np.float32:
        tol = max(tol, FLOAT32_RELATIVE_TOL * float((_l2(b) / b.sum()).compute()))
    printer = _Printer(options.verbose)
    guard = _UnderflowGuard(options.safeguard) if exact else DaskSafeguard(options.safeguard)
    start = time.perf_counter()
    if isinstance(kernel, DaskLowRankKernel):
        state = _chained_iterations(kernel, a, b, options, tol, guard, printer)
    else:
        state = _multiplicative(kernel, a, b, options, tol, guard, printer)
    elapsed = time.perf_counter() - start
    summary = _summary(kernel, a, b, state[0], state[1])
    state = (*summary["potentials"], *state[2:])  # persisted on the cluster
    result = DaskSinkhornResult(
        **iteration_fields(
            kernel, a, b, options, guard, state, tol, elapsed, summary["final_error"]
        ),
        marginals=summary["marginals"],
        value_linear=summary["cost"],
        mass=summary["mass"],
        log_domain=False,
        notes=list(notes or []),
        scalars=summary["scalars"],
    )
    if options.accuracy is not None:
        samples = options.true_kernel_samples
        result.true_kernel = result.check_true_kernel(
            SAMPLED_CHECK_SIZE if samples == "auto" else samples, rng
        )
    return finish_solve(result, options, guard, printer, summary["final_error"])


def _check_block(done: int, max_iter: int, check_every: int) -> tuple[int, bool]:
    """``(last, check)``: the next block runs iterations ``done + 1 .. last``; ``check`` when
    it ends with the convergence check of iterate ``last``.

    :func:`~sketchot.solver.sinkhorn._multiplicative` checks iterate ``j`` (at iteration
    ``j + 1``) when ``(j - 1) % check_every == 0`` and ``j < max_iter``; a block also ends
    after :data:`MAX_BLOCK_ITERATIONS` iterations.
    """
    next_check = done + 1 + (-done) % check_every
    last = min(max_iter, done + MAX_BLOCK_ITERATIONS)
    if next_check < max_iter and next_check <= last:
        return next_check, True
    return last, False


def _chunk_sum(values: np.ndarray) -> np.ndarray:
    return np.array([values.sum()])


def _chained_iterations(kernel, a, b, options, tol, guard, printer):
    """:func:`~sketchot.solver.sinkhorn._multiplicative` on a low-rank Dask kernel with ONE
    scheduler call per block of iterations between two convergence checks.

    Between half-steps the state is rank-sized (``z = A^T u``, ``y = B^T v``), so every pass
    of a block, and the check that ends it, are tasks of one graph, each pass taking the
    previous pass's partial sums by key. The client gets back the counts of bad entries (the
    safeguard runs on them in order, after the block), the last projections, and the error.
    Same iterates, checks, ``n_iter`` and history as the in-memory loop.
    """
    n, _ = kernel.shape
    graph = PassGraph()
    # (total, partial sums) of z = A^T u, then of the passes: keys until a block is computed
    z = kernel.first_projection(graph, "rows", da.full_like(a, 1.0 / n))
    # sum(b) comes back with the first block (raw keys: no clash with b.sum() elsewhere)
    mass = graph.sum_over_chunks(_chunk_sum, [b], ())
    history: list[tuple[int, float]] = []
    converged = False
    done = 0
    y = z_before = None
    while done < options.max_iter:
        last, check = _check_block(done, options.max_iter, options.check_every)
        sides = []
        for _ in range(done + 1, last + 1):
            y = kernel.chained_pass(graph, "cols", z[1], b)
            z_before, z = z, kernel.chained_pass(graph, "rows", y[1], a)
            sides += [("cols", y[0]), ("rows", z[0])]
        keys = [key for _, key in sides] + [y[0], z_before[0], z[0], mass]
        if check:
            keys.append(kernel.marginal_error(graph, "cols", b, z_before[0], z[0]))
        values = graph.compute(keys)
        for (side, _), total in zip(sides, values, strict=False):
            if total[0, -1]:
                guard.count(side, int(total[0, -1]))
        # the next block starts from the NumPy totals (each its own single partial sum)
        y, z_before, z = ((total, [total]) for total in values[len(sides) : len(sides) + 3])
        mass = float(np.sum(values[len(sides) + 3]))
        done = last
        graph = PassGraph()
        if check:
            error = values[-1] / mass
            history.append((done, error))
            printer.iteration(done, error)
            if error < tol:
                converged = True
                break
    u = kernel.scalings("rows", y[0], a)
    v = kernel.scalings("cols", z_before[0], b)
    return _log_scaling(u), _log_scaling(v), done, converged, history


def _summary(kernel, a, b, log_u, log_v) -> dict[str, Any]:
    """Persisted potentials and marginals, and every scalar in one ``dask.compute``.

    ``<P, M> = <row, ||x||^2> + <col, ||y||^2> - 2 sum_i u_i x_i . (K (v * Y))_i`` in centred
    coordinates, from one ``matmat`` with ``d + 1`` columns and one ``rmatvec``.
    """
    g = kernel.geometry
    # Persisted step by step: later graphs then only reference finished keys (never two
    # different task specs for one key on the scheduler).
    log_u, log_v = dask.persist(log_u, log_v)
    u, v = dask.persist(da.exp(log_u), da.exp(log_v))
    stacked = da.concatenate([v[:, None], v[:, None] * g.Yc], axis=1)
    products, Ktu = dask.persist(kernel.matmat(stacked), kernel.rmatmat(u))
    row, col = dask.persist(u * products[:, 0], v * Ktu.rechunk((g.Yc.chunks[0],)))
    cross = (u[:, None] * g.Xc * products[:, 1:]).sum(split_every=SPLIT_EVERY)
    scalars = dask.compute(
        {
            "cost": (row * g.x_sq).sum(split_every=SPLIT_EVERY)
            + (col * g.y_sq).sum(split_every=SPLIT_EVERY)
            - 2.0 * cross,
            "mass": row.sum(split_every=SPLIT_EVERY),
            "error_a": abs(row - a).sum(split_every=SPLIT_EVERY),
            "error_b": abs(col - b).sum(split_every=SPLIT_EVERY),
            "final_error": _l2(col - b) / b.sum(split_every=SPLIT_EVERY),
            "entropy_u": _masked_dot(row, log_u),
            "entropy_v": _masked_dot(col, log_v),
            "dual_u": _masked_dot(a, log_u),
            "dual_v": _masked_dot(b, log_v),
            "mass_a": a.sum(split_every=SPLIT_EVERY),
        }
    )[0]
    scalars = {key: float(value) for key, value in scalars.items()}
    return {
        "potentials": (log_u, log_v),
        "marginals": (row, col),
        "cost": scalars["cost"],
        "mass": scalars["mass"],
        "final_error": scalars["final_error"],
        "scalars": scalars,
    }


@dataclass(repr=False)
class DaskSinkhornResult(SinkhornResult):
    """:class:`~sketchot.SinkhornResult` of a Dask solve.

    ``potentials``, ``marginals``, ``u``, ``v``, ``a``, ``b`` and the barycentric maps are
    Dask arrays on the cluster (persisted); the scalars are numbers computed once at the end.
    The dense and lazy plans are not available (use the maps or the kernel's products).
    """

    scalars: dict[str, float] = field(default_factory=dict)

    @property
    def u(self) -> da.Array:
        return da.exp(self.potentials[0])

    @property
    def v(self) -> da.Array:
        return da.exp(self.potentials[1])

    @property
    def marginal_errors(self) -> tuple[float, float]:
        return (self.scalars["error_a"], self.scalars["error_b"])

    @property
    def value(self) -> float:
        return self.reg * (self.scalars["entropy_u"] + self.scalars["entropy_v"])

    @property
    def value_dual(self) -> float:
        dual = self.scalars["dual_u"] + self.scalars["dual_v"]
        return self.reg * (dual - (self.mass - self.scalars["mass_a"]))

    @property
    def lazy_plan(self):
        raise NotImplementedError(
            "the lazy plan is not available for a Dask solve; use barycentric_map(), "
            "potentials, or the kernel's products"
        )

    @property
    def plan(self):
        return self.lazy_plan

    # ------------------------------------------------------- barycentric maps
    def barycentric_map(self, X_new: Any = None, *, return_fallbacks: bool = False):
        """Barycentric projection of the source points onto ``Y`` as a persisted Dask array
        (``X_new``: new points, NumPy or Dask, for the low-rank backends)."""
        return_fallbacks = check_bool(return_fallbacks, "return_fallbacks")
        g = self.kernel.geometry
        mapped, fallbacks = _barycentric(self.kernel, X_new, self.potentials[1], g.Yc + g.center)
        return (mapped, fallbacks) if return_fallbacks else mapped

    def inverse_barycentric_map(self, Y_new: Any = None, *, return_fallbacks: bool = False):
        """Barycentric projection of the target points onto ``X`` (low-rank backends)."""
        return_fallbacks = check_bool(return_fallbacks, "return_fallbacks")
        if isinstance(self.kernel, DaskExactKernel):
            raise NotImplementedError(
                "inverse_barycentric_map of the exact backend is not available on Dask arrays"
            )
        g = self.kernel.geometry
        mapped, fallbacks = _barycentric(
            self.kernel, Y_new, self.potentials[0], g.Xc + g.center, transpose=True
        )
        return (mapped, fallbacks) if return_fallbacks else mapped

    def check_true_kernel(self, n_samples: int = 1000, rng: Any = None) -> TrueKernelCheck:
        """The sampled true-kernel check (:meth:`SinkhornResult.check_true_kernel`): the
        sampled rows and columns are gathered (``n_samples`` of each), the log-sum-exp over
        the other side runs chunk by chunk on the workers."""
        n_samples = check_int(n_samples, "n_samples", minimum=1)
        generator = check_rng(rng)
        n, m = self.kernel.shape
        rows = sample_indices(n, n_samples, generator)
        cols = sample_indices(m, n_samples, generator)
        return _true_kernel_check(self, rows, cols)

    def __repr__(self) -> str:
        return "Dask" + super().__repr__()


# -------------------------------------------------------------- exact values on samples
def _lse_chunk(points: np.ndarray, other: np.ndarray, log_w: np.ndarray, reg: float):
    """Per chunk of the other side: ``[max_j logit_ij, sum_j exp(logit_ij - max)]``."""
    from ..gibbs import neg_cost_over_reg

    logits = neg_cost_over_reg(points, other, reg)
    logits += log_w[None, :]
    top = logits.max(axis=1)
    finite = np.isfinite(top)
    safe = np.where(finite, top, 0.0)
    total = np.exp(logits - safe[:, None]).sum(axis=1)
    return np.stack([top, total], axis=1).reshape(1, -1)


def _log_matvec(points: np.ndarray, other: da.Array, log_w: da.Array, reg: float) -> np.ndarray:
    """``log sum_j exp(log_w_j - ||p - o_j||^2 / reg)`` for a few centred points ``p``,
    reduced over the chunks of ``other`` (per-chunk maxima and sums combined on the client)."""
    k = points.shape[0]
    parts = (
        per_chunk(
            lambda o, lw: _lse_chunk(points, o, lw, reg), [other, log_w], (), 2 * k, partial=True
        )
        .compute()
        .reshape(-1, k, 2)
    )
    tops, sums = parts[..., 0], parts[..., 1]
    top = tops.max(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        scaled = np.where(np.isfinite(tops), sums * np.exp(tops - top), 0.0).sum(axis=0)
        return top + np.log(scaled)


def _true_kernel_check(result: DaskSinkhornResult, rows: np.ndarray, cols: np.ndarray):
    g = result.kernel.geometry
    n, m = g.shape
    log_u, log_v = result.potentials
    a_rows, u_rows, b_cols, v_cols = dask.compute(
        result.a[rows], log_u[rows], result.b[cols], log_v[cols]
    )
    with np.errstate(over="ignore", invalid="ignore"):
        row_mass = np.exp(u_rows + _log_matvec(g.rows("x", rows), g.Yc, log_v, g.reg))
        col_mass = np.exp(v_cols + _log_matvec(g.rows("y", cols), g.Xc, log_u, g.reg))
    return check_from_masses(row_mass, col_mass, a_rows, b_cols, (n, m), result.scalars["mass_a"])


def _barycentric(kernel, points, log_w, values, *, transpose=False) -> tuple[da.Array, int]:
    """Dask form of :func:`sketchot.solver.plans.barycentric` (fitted or new points).

    Exact kernel: a streamed softmax per row chunk. Low rank: two products with ``d + 1``
    columns; rows with a non-positive approximate denominator are NaN and counted (the
    in-memory path recomputes them with the true kernel; not done on Dask yet).
    """
    if isinstance(kernel, DaskExactKernel):
        if points is not None:
            raise NotImplementedError("barycentric maps of new points need a low-rank backend")
        return kernel.softmax_average(log_w, values).persist(), 0
    top = float(da.where(da.isfinite(log_w), log_w, -np.inf).max().compute())
    weights = da.exp(log_w - top)
    stacked = da.concatenate([weights[:, None] * values, weights[:, None]], axis=1)
    if points is None:
        products = kernel.rmatmat(stacked) if transpose else kernel.matmat(stacked)
    else:
        products = kernel.apply_new(points, stacked, side="target" if transpose else "source")
    if not hasattr(products, "chunks"):
        products = da.from_array(products)
    numerator, denominator = products[:, :-1], products[:, -1]
    scale = float(abs(denominator).max().compute())
    good = (denominator > MIN_DENOMINATOR_RATIO * scale) & da.isfinite(numerator).all(axis=1)
    mapped = da.where(good[:, None], numerator / da.where(good, denominator, 1.0)[:, None], np.nan)
    mapped, n_bad = dask.persist(mapped, (~good).sum())
    return mapped, int(n_bad.compute())
