"""Sinkhorn on Dask arrays: the solver's one iteration on deferred operators.

The solve validates the problem on the cluster (weights as Dask vectors, masses computed
once), builds the kernel on the workers (:mod:`.builders`), and runs
:func:`sketchot.solver.engine.iterate`, the iteration every in-memory solve runs: the Dask
operators' passes are deferred, so the iterations between two convergence checks are built
lazily and computed in ONE scheduler call for low-rank kernels (:class:`~.kernels.PassGraph`).
The scalings stay lazy (a chunk-local function of the last rank-sized vector); at the end
they, the potentials and the marginals are persisted on the cluster and the scalars (cost,
mass, objective, errors) computed in one ``dask.compute``. No ``n``-sized array is ever
gathered on the client.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._validation import check_bool, check_int, check_rng, describe, unknown_names
from ..kernels import MIN_DENOMINATOR_RATIO, ExactKernel, KernelOperator
from ..solver import (
    EPSILON_SCALING_SPREAD,
    MASS_RTOL,
    SAMPLED_CHECK_SIZE,
    IterationTable,
    Problem,
    Safeguard,
    SinkhornResult,
    SolverOptions,
    TrueKernelCheck,
    annealing_kernels,
    check_backend_params,
    check_from_masses,
    check_reg_m,
    choose_strategy,
    finish_solve,
    iterate,
    join_runs,
    sample_indices,
)
from .builders import build_dask_kernel, choose_dask_kernel
from .geometry import SPLIT_EVERY, check_reg_and_clouds
from .kernels import (
    DaskExact,
    DaskStableExact,
    DaskStreamedExact,
    dask_exact_placement,
    log_plan_summary,
    log_stable_kernel,
    per_chunk,
)
from .local import is_block_local, local_barycentric, local_plan_summary
from .multiscale import coarse_start_dask


def sinkhorn_dask(
    a: Any,
    b: Any,
    X: Any,
    Y: Any,
    reg: float = 1.0,
    backend: str = "auto",
    *,
    reg_m: Any = None,
    rng: Any = None,
    policy: Any = None,
    warmstart: Any = None,
    metric: Any = "sqeuclidean",
    p: Any = 2.0,
    **kwargs: Any,
) -> DaskSinkhornResult:
    """:func:`sketchot.sinkhorn` on Dask arrays (it dispatches here for any Dask input).

    Parameters
    ----------
    a, b : dask.array, ndarray or None
        Weights (rechunked to the rows of ``X`` and ``Y``).
    X, Y : dask.array, shape (n, d) and (m, d)
        Clouds chunked by rows (a NumPy cloud is wrapped with the other's row chunks).
    reg, backend, reg_m, rng, metric, p, **kwargs
        As :func:`sketchot.sinkhorn` (every metric; a backend that does not declare it is
        refused by name, and ``'auto'`` chooses among those that do). ``backend='auto'``
        builds Nystrom at a doubling rank checked against the true kernel on the cluster, else
        the exact kernel
        (:func:`~.builders.choose_dask_kernel`; ``policy``, :mod:`sketchot.policy` passed in
        by :func:`sketchot.sinkhorn`, makes the choice). ``safeguard`` must be ``'raise'`` or
        ``'none'`` for a problem with non-positive approximate denominators (the repairs of
        ``'exact'`` and ``'clip'`` need the passes' values: such a solve raises and says so).
        The exact backend runs the in-memory log-stable solve (absorption, epsilon schedule,
        Anderson mixing) on the workers unless ``log_domain=False``
        (:func:`solve_log_stable`); ``'polyts_local'`` its log-domain iteration on the
        clouds in blocks of whole clusters (:mod:`.local`).

    Returns
    -------
    DaskSinkhornResult
        ``potentials``, ``marginals``, ``u``, ``v`` and barycentric maps are persisted Dask
        arrays; ``value_linear``, ``value``, ``mass``, ``marginal_errors``, ``n_iter``, ... are
        numbers.

    Notes
    -----
    Per iteration ``O((n + m) r)`` work over the workers, moving ``O(r)`` floats per chunk;
    one synchronisation per ``check_every`` iterations (at most
    :data:`~.kernels.MAX_CHAINED_PASSES` half-steps; ``'auto'``: the in-memory solver's rule,
    so that both stop at the same iteration). The exact backend: ``O(n m d)`` work and
    ``O(m)`` floats per chunk per pass.
    """
    options, backend_params = SolverOptions.split(kwargs)
    check_backend_params("sinkhorn", backend, backend_params)
    geometry = check_reg_and_clouds(X, Y, reg, metric, p)
    problem = warm_problem(dask_problem(a, b, geometry, reg_m), warmstart)
    problem, coarse = coarse_start_dask(problem, geometry, options, rng)
    accuracy = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
    reason, attempts = "", []
    if backend == "auto":
        kernel, reason, attempts = choose_dask_kernel(
            geometry, accuracy=accuracy, rng=rng, verbose=options.verbose, policy=policy,
            **backend_params,
        )  # fmt: skip
    else:
        kernel = build_dask_kernel(
            geometry, backend, rng=rng, accuracy=accuracy, policy=policy, **backend_params
        )
    if options.verbose:
        print(f"sketchot.sinkhorn: built {kernel!r} in {kernel.info.build_time:.3f} s")
    result = solve_dask(problem, kernel, options, rng=rng, reason=reason, attempts=attempts)
    if coarse is not None:
        result.iteration_info["coarse_to_fine"] = coarse
    return result


def sinkhorn_kernel_dask(
    a: Any,
    b: Any,
    kernel: KernelOperator,
    *,
    reg_m: Any = None,
    rng: Any = None,
    warmstart: Any = None,
    **kwargs: Any,
) -> DaskSinkhornResult:
    """:func:`sketchot.sinkhorn_kernel` on a Dask operator (from ``make_kernel`` on Dask
    arrays): several solves with one persisted kernel."""
    caps = getattr(getattr(kernel, "info", None), "capabilities", ())
    if "deferred" not in caps and not is_block_local(kernel):
        raise TypeError(
            f"kernel must be built on Dask arrays (make_kernel with Dask X, Y); got "
            f"{describe(kernel) if not isinstance(kernel, KernelOperator) else repr(kernel)}"
        )
    unknown = sorted(set(kwargs) - set(SolverOptions.names()))
    if unknown:
        raise TypeError(
            f"sinkhorn_kernel() got unexpected keyword argument(s) "
            f"{unknown_names(unknown, SolverOptions.names())}; the kernel already fixes reg "
            f"and the backend's parameters; solver options: {', '.join(SolverOptions.names())}"
        )
    options = SolverOptions(**kwargs)
    problem = warm_problem(dask_problem(a, b, kernel.geometry, reg_m), warmstart)
    problem, coarse = coarse_start_dask(problem, kernel.geometry, options, rng)
    result = solve_dask(problem, kernel, options, rng=rng)
    if coarse is not None:
        result.iteration_info["coarse_to_fine"] = coarse
    return result


def dask_problem(a: Any, b: Any, geometry: Any, reg_m: Any = None) -> Problem:
    """The :class:`~sketchot.solver.problem.Problem` of Dask weights on the clouds' row
    chunks, validated in one computation (as :func:`~sketchot.solver.problem.make_problem`:
    balanced transport needs equal masses, ``b`` is then rescaled to ``a``'s)."""
    pair = check_reg_m(reg_m, geometry.reg)
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
    if math.isinf(pair[0]) and math.isinf(pair[1]):
        if not np.isclose(mass_a, mass_b, rtol=MASS_RTOL, atol=0.0):
            raise ValueError(
                f"a and b must have the same total mass for balanced transport; got sum(a) = "
                f"{mass_a:.8g} and sum(b) = {mass_b:.8g}. Pass reg_m (a KL penalty on the "
                "marginals) for unbalanced transport."
            )
        if mass_a != mass_b:
            b = (b * (mass_a / mass_b)).persist()
            notes.append(f"b was rescaled by {mass_a / mass_b:.12g} to the mass of a")
    return Problem(a, b, geometry.reg, pair, notes=tuple(notes))


def warm_problem(problem: Problem, warmstart: Any) -> Problem:
    """``problem`` started from ``warmstart = (log_u, log_v)`` (Dask or NumPy vectors, e.g. a
    previous result's ``potentials``), rechunked to the weights' chunks and checked in one
    computation as :func:`~sketchot.solver.make_problem` checks them (shape, real, finite
    where the weight is positive); ``None``: the cold start."""
    if warmstart is None:
        return problem
    if not isinstance(warmstart, (tuple, list)) or len(warmstart) != 2:
        raise ValueError(
            f"warmstart must be None or a pair (log_u, log_v) of arrays; got {describe(warmstart)}"
        )
    starts = []
    for index, (value, weights, points) in enumerate(
        zip(warmstart, (problem.a, problem.b), ("X", "Y"), strict=True)
    ):
        side = "log u" if index == 0 else "log v"
        if value is None or getattr(value, "shape", np.shape(value)) != weights.shape:
            raise ValueError(
                f"warmstart[{index}] ({side}) must have shape {weights.shape} (one entry per row "
                f"of {points}); got {describe(value)}"
            )
        if not hasattr(value, "chunks"):
            value = da.from_array(np.asarray(value), chunks=weights.chunks)
        if np.dtype(value.dtype).kind not in "biuf":
            raise TypeError(
                f"warmstart[{index}] ({side}) must be a real array; got dtype {value.dtype}"
            )
        starts.append(value.astype(np.float64).rechunk(weights.chunks).persist())
    weights = (problem.a, problem.b)
    bad = dask.compute(
        *[((~da.isfinite(s)) & (w > 0)).sum() for s, w in zip(starts, weights, strict=True)]
    )
    for index, count in enumerate(bad):
        if count:
            raise ValueError(
                f"warmstart[{index}] must be finite where the weight is positive; got "
                f"{int(count)} NaN or inf entries"
            )
    return dataclasses.replace(problem, log_u0=starts[0], log_v0=starts[1])


def _l2(x: da.Array) -> da.Array:
    return da.sqrt((x * x).sum(split_every=SPLIT_EVERY))


def _masked_dot(weights: da.Array, logs: da.Array) -> da.Array:
    """``sum_i w_i log_i`` over ``w_i != 0`` (``0 * -inf`` counts as 0)."""
    return da.where(weights != 0, weights * da.where(weights != 0, logs, 0.0), 0.0).sum(
        split_every=SPLIT_EVERY
    )


def _kl_terms(p: da.Array, log_q: da.Array) -> da.Array:
    """``sum p (log p - log q)`` over ``p > 0``: with ``- sum p + sum q``, the generalised KL
    (``p`` vanishes where ``q`` does: the scalings of zero weights are 0)."""
    return da.where(p > 0, p * (da.log(da.where(p > 0, p, 1.0)) - log_q), 0.0).sum(
        split_every=SPLIT_EVERY
    )


def _on(kernel: KernelOperator, placement: type) -> bool:
    """Whether ``kernel`` is the exact kernel (not an absorbed form) on a Dask placement of
    that kind."""
    return isinstance(dask_exact_placement(kernel), placement)


def solve_dask(
    problem: Problem,
    kernel: KernelOperator,
    options: SolverOptions,
    *,
    rng: Any = None,
    reason: str = "",
    attempts: Any = (),
) -> DaskSinkhornResult:
    """The Dask solve of a validated problem on a Dask operator: the engine's iteration,
    persisted results, scalar summary, sampled true-kernel check."""
    exact = _on(kernel, DaskStreamedExact)
    # the in-memory exact kernel's default, the stabilised path: far fewer iterations (Anderson);
    # the block-local kernel's passes run on logarithms only
    stable = options.log_domain in ("auto", True) or options.epsilon_scaling is True
    if is_block_local(kernel) or (exact and stable):
        return solve_log_stable(problem, kernel, options, rng=rng, reason=reason, attempts=attempts)
    if options.log_domain is True:
        raise NotImplementedError(
            f"log_domain=True needs the exact kernel on Dask arrays (backend='exact'); "
            f"backend {kernel.info.backend!r} runs the plain iteration"
        )
    if options.anderson not in ("auto", 0):
        raise ValueError(
            f"anderson={options.anderson}: Anderson mixing needs the scalings in memory; a "
            "Dask solve runs the plain iteration (pass anderson=0 or 'auto')"
        )
    if options.epsilon_scaling is True:
        raise ValueError(
            "epsilon_scaling=True needs the exact kernel at every intermediate reg in memory; "
            "it is not available on Dask arrays"
        )
    tol, norm = options.stopping(
        kernel.dtype == np.float32,
        lambda: float((_l2(problem.b) / problem.b.sum()).compute()),
    )
    printer = IterationTable(options.verbose, " on Dask")
    guard = Safeguard(kernel, options.safeguard)
    strategy = choose_strategy(kernel, False)
    start = time.perf_counter()
    state = iterate(
        kernel, problem, tol=tol, norm=norm, max_iter=options.max_iter,
        # the in-memory solver's own rule: both check, and so stop, at the same iterations
        # (every 10 here against every one there gave 11 iterations against 2, 4e-6 apart)
        check_every=options.check_interval(kernel.shape), strategy=strategy,
        guard=guard, progress=printer,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    result = _dask_result(
        problem, kernel, options, state, guard, tol, elapsed, log_domain=False,
        build_time=kernel.info.build_time, notes=problem.notes,
        info={"strategy": state.strategy, "norm": norm, **state.info},
    )  # fmt: skip
    result.reason, result.attempts = reason, list(attempts)
    if options.accuracy is not None:
        result.true_kernel = result.check_true_kernel(_samples(options), rng)
    return finish_solve(result, options, guard, printer)


def solve_log_stable(
    problem: Problem,
    kernel: ExactKernel,
    options: SolverOptions,
    *,
    rng: Any = None,
    reason: str = "",
    attempts: Any = (),
) -> DaskSinkhornResult:
    """The exact kernel's log-stable solve on Dask: the in-memory solver's choices
    (:func:`~sketchot.solver.sinkhorn.solve_kernel`: :func:`choose_strategy`, the automatic
    epsilon schedule and its retry after a stall, Anderson mixing, the certified first stop
    and its resumption) on the kernel's log-stable form (:func:`~.kernels.log_stable_kernel`:
    a :class:`~.kernels.DaskStableExact` placement), whose passes stream the
    true kernel per row chunk on the workers. The row scalings stay on the cluster; the
    ``m``-sized column side (weights ``b``, scalings, projections) is on the client. The
    block-local kernel (:class:`~.local.DaskBlockLocal`) runs here as it is: its log-domain
    passes, without an epsilon schedule (it would need the kernel at other ``reg``)."""
    local = is_block_local(kernel)
    if local and (options.log_domain is False or options.epsilon_scaling is True):
        raise ValueError(
            "the block-local kernel on Dask arrays runs the log-domain iteration without an "
            f"epsilon schedule; got log_domain={options.log_domain!r}, epsilon_scaling="
            f"{options.epsilon_scaling!r} (pass 'auto')"
        )
    stable = kernel if local else log_stable_kernel(kernel)
    g = kernel.geometry
    strategy = choose_strategy(stable, options.log_domain)
    b_host = np.asarray(problem.b.compute(), dtype=np.float64)
    log_v0 = problem.log_v0
    columns = dataclasses.replace(
        problem,
        b=b_host,
        log_v0=None if log_v0 is None else np.asarray(da.asarray(log_v0).compute()),
    )
    tol, norm = options.stopping(
        kernel.dtype == np.float32, lambda: float(np.linalg.norm(b_host) / b_host.sum())
    )
    first = options.first_target(tol, norm, stable.info.product_rtol)
    printer = IterationTable(options.verbose, " on Dask")
    guard = Safeguard(stable, options.safeguard)
    # an epsilon schedule needs the kernel at other reg (the exact kernel's at_reg)
    automatic = not local and options.epsilon_scaling == "auto" and strategy in ("absorb", "log")
    wanted = options.epsilon_scaling is True or (
        automatic and problem.log_u0 is None and g.max_cost() / g.reg > EPSILON_SCALING_SPREAD
    )
    every = options.check_interval(stable.shape)
    notes = list(problem.notes)

    def run(schedule, target, begin=columns, done=0):
        return iterate(
            stable, begin, tol=target, norm=norm, max_iter=options.max_iter - done,
            check_every=every, strategy=strategy,
            anderson=options.anderson_memory(strategy != "multiplicative"), guard=guard,
            progress=printer, schedule=schedule,
        )  # fmt: skip

    start = time.perf_counter()
    state = run(annealing_kernels(stable) if wanted else None, first)
    if state.status in ("stalled", "breakdown") and not wanted and automatic:
        notes.append(
            f"the iteration {state.status} at residual "
            f"{state.history[-1][1] if state.history else float('nan'):.2g} after "
            f"{state.n_iter} iterations; solved again with an epsilon schedule"
        )
        state = run(annealing_kernels(stable), first)
    elapsed = time.perf_counter() - start
    target = first
    result = _stable_result(problem, stable, options, state, guard, target, elapsed, notes)
    if first > tol and state.converged:
        check = result.check_true_kernel(_samples(options), rng)
        if check.bound > options.accuracy:
            notes.append(
                f"stopped first at residual {first:.2g}, where the true-kernel check gave "
                f"{check.bound:.2g} > accuracy {options.accuracy:g}; went on to {tol:.2g}"
            )
            warm = dataclasses.replace(columns, log_u0=state.log_u, log_v0=state.log_v)
            resumed = time.perf_counter()
            more = run(None, tol, warm, state.n_iter)
            elapsed += time.perf_counter() - resumed
            state, target = join_runs(state, more), tol
            result = _stable_result(problem, stable, options, state, guard, target, elapsed, notes)
        else:
            result.true_kernel = check
    result.reason, result.attempts = reason, list(attempts)
    if options.accuracy is not None and result.true_kernel is None:
        result.true_kernel = result.check_true_kernel(_samples(options), rng)
    return finish_solve(result, options, guard, printer)


def _low_rank_cost_chunk(Xc, left, u, Yc, right, v, cost) -> np.ndarray:
    """``sum_{i in chunk} u_i sum_j (A_i . B_j) v_j c(x_i, y_j)`` over row blocks: (1, 1)."""
    from ..gibbs import block_rows, row_slices

    total = 0.0
    for rows in row_slices(Xc.shape[0], block_rows(Yc.shape[0])):
        block = (left[rows] @ right.T).astype(np.float64)
        block *= cost.block(Xc[rows], Yc)
        total += float(u[rows] @ (block @ v))
    return np.array([[total]])


def _low_rank_plan_cost(kernel, u: da.Array, v: da.Array) -> Any:
    """``<diag(u) A B^T diag(v), C>`` of a low-rank Dask kernel for any metric (a lazy
    scalar): each row chunk of ``X`` receives the whole of ``B``, ``Y`` and ``v``."""
    g = kernel.geometry
    whole = [x.rechunk({0: -1, 1: -1} if x.ndim == 2 else -1) for x in (g.Yc, kernel.right, v)]
    left = kernel.left.rechunk({1: -1})
    parts = per_chunk(_low_rank_cost_chunk, [g.Xc, left, u], (*whole, g.cost), 1, partial=True)
    return parts.sum()


def _samples(options: SolverOptions) -> int:
    samples = options.true_kernel_samples
    return SAMPLED_CHECK_SIZE if samples == "auto" else samples


def _stable_result(problem, kernel, options, state, guard, target, elapsed, notes):
    """The :class:`DaskSinkhornResult` of a log-stable run (persisted, scalars computed)."""
    return _dask_result(
        problem, kernel, options, state, guard, target, elapsed, log_domain=True,
        build_time=kernel.info.build_time, notes=notes,
        info={"strategy": state.strategy, **state.info},
    )  # fmt: skip


def _dask_result(
    problem, kernel, options, state, guard, tol, elapsed, *, log_domain, build_time, notes, info
) -> DaskSinkhornResult:
    """The :class:`DaskSinkhornResult` of a finished iteration: potentials and marginals
    persisted, every scalar computed at once (:func:`_summary`)."""
    summary = _summary(kernel, problem, state.log_u, state.log_v)
    return DaskSinkhornResult(
        kernel=kernel,
        problem=problem,
        potentials=summary["potentials"],
        n_iter=state.n_iter,
        stop=state.status,
        tol=tol,
        marginals=summary["marginals"],
        value_linear=summary["cost"],
        mass=summary["mass"],
        log_domain=log_domain,
        safeguard={"policy": options.safeguard, **guard.counts, "faults": guard.faults},
        timings={
            "build": build_time,
            "iterations": elapsed,
            "per_iteration": elapsed / max(state.n_iter, 1),
        },
        error_history=state.history,
        options=options.as_dict(),
        notes=list(notes),
        iteration_info=info,
        scalars=summary["scalars"],
    )


def _summary(kernel, problem, log_u, log_v) -> dict[str, Any]:
    """Persisted potentials and marginals, and every scalar in one ``dask.compute``.

    ``<P, M> = <row, ||x||^2> + <col, ||y||^2> - 2 sum_i u_i x_i . (K (v * Y))_i`` in centred
    coordinates, from one ``matmat`` with ``d + 1`` columns and one ``rmatvec``; for another
    metric the exact kernel's plan is streamed in the log domain with its cost
    (:func:`~.kernels.log_plan_summary`) and a low-rank plan's cost summed per row chunk
    against the metric's cost blocks (:func:`_low_rank_plan_cost`, ``O(n m (r + d))`` as in
    memory); the objective and the dual as :class:`~sketchot.SinkhornResult` defines them.
    """
    g = kernel.geometry
    a, b = problem.a, problem.b
    if not hasattr(log_v, "chunks"):  # the log-stable path's columns live on the client
        log_v = da.from_array(np.asarray(log_v, dtype=np.float64), chunks=(g.Yc.chunks[0],))
    # Persisted step by step: later graphs then only reference finished keys (never two
    # different task specs for one key on the scheduler).
    log_u, log_v = dask.persist(log_u, log_v)
    exact = _on(kernel, DaskStreamedExact) and not g.cost.sqeuclidean
    if is_block_local(kernel):
        row, col, cost = local_plan_summary(kernel, log_u, log_v.compute())
    elif _on(kernel, DaskStableExact) or exact:
        # streamed in the log domain: e^log_u and e^log_v may each leave float64 at small reg
        row, col, cost = log_plan_summary(kernel, log_u, log_v.compute())
    elif not g.cost.sqeuclidean:
        u, v = dask.persist(da.exp(log_u), da.exp(log_v))
        products, Ktu = dask.persist(kernel.matvec(v), kernel.rmatvec(u))
        row, col = dask.persist(u * products, v * Ktu.rechunk((g.Yc.chunks[0],)))
        cost = _low_rank_plan_cost(kernel, u, v)
    else:
        u, v = dask.persist(da.exp(log_u), da.exp(log_v))
        stacked = da.concatenate([v[:, None], v[:, None] * g.Yc], axis=1)
        products, Ktu = dask.persist(kernel.matmat(stacked), kernel.rmatmat(u))
        row, col = dask.persist(u * products[:, 0], v * Ktu.rechunk((g.Yc.chunks[0],)))
        cross = (u[:, None] * g.Xc * products[:, 1:]).sum(split_every=SPLIT_EVERY)
        cost = (
            (row * g.x_sq).sum(split_every=SPLIT_EVERY)
            + (col * g.y_sq).sum(split_every=SPLIT_EVERY)
            - 2.0 * cross
        )
    log_a, log_b = da.log(da.where(a > 0, a, 1.0)), da.log(da.where(b > 0, b, 1.0))
    scalars = dask.compute(
        {
            "cost": cost,
            "mass": row.sum(split_every=SPLIT_EVERY),
            "mass_col": col.sum(split_every=SPLIT_EVERY),
            "error_a": abs(row - a).sum(split_every=SPLIT_EVERY),
            "error_b": abs(col - b).sum(split_every=SPLIT_EVERY),
            "entropic_u": _masked_dot(row, log_u - log_a),
            "entropic_v": _masked_dot(col, log_v - log_b),
            "kl_a": _kl_terms(row, log_a),
            "kl_b": _kl_terms(col, log_b),
            "dual_u": _masked_dot(a, log_u),
            "dual_v": _masked_dot(b, log_v),
            "constant": _masked_dot(a, log_a) + _masked_dot(b, log_b),
            "mass_a": a.sum(split_every=SPLIT_EVERY),
            "mass_b": b.sum(split_every=SPLIT_EVERY),
        }
    )[0]
    scalars = {key: float(value) for key, value in scalars.items()}
    return {
        "potentials": (log_u, log_v),
        "marginals": (row, col),
        "cost": scalars["cost"],
        "mass": scalars["mass"],
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
        s = self.scalars
        entropic = s["entropic_u"] + s["entropic_v"]
        value = self.reg * (entropic - self.mass + s["mass_a"] * s["mass_b"])
        for penalty, side in zip(self.reg_m, "ab", strict=True):
            if np.isfinite(penalty):
                marginal = self.mass if side == "a" else s["mass_col"]
                value += penalty * (s[f"kl_{side}"] - marginal + s[f"mass_{side}"])
        return float(value)

    @property
    def value_dual(self) -> float:
        s = self.scalars
        dual = s["dual_u"] + s["dual_v"]
        return self.reg * (dual - s["constant"] - self.mass + s["mass_a"] * s["mass_b"])

    @property
    def lazy_plan(self):
        raise NotImplementedError(
            "the lazy plan is not available for a Dask solve; use barycentric_map(), "
            "potentials, or the kernel's products"
        )

    @property
    def plan(self):
        return self.lazy_plan

    def moments(self):
        raise NotImplementedError(
            "the plan's moments are not available for a Dask solve; use barycentric_map() or "
            "the kernel's products"
        )

    # ------------------------------------------------------- barycentric maps
    def barycentric_map(self, X_new: Any = None, *, return_fallbacks: bool = False):
        """Barycentric projection of the source points onto ``Y`` as a persisted Dask array
        (``X_new``: new points, NumPy or Dask, for the low-rank backends)."""
        return_fallbacks = check_bool(return_fallbacks, "return_fallbacks")
        g = self.kernel.geometry
        mapped, fallbacks = _barycentric(self.kernel, X_new, self.potentials[1], g.Yc + g.center)
        return (mapped, fallbacks) if return_fallbacks else mapped

    def inverse_barycentric_map(self, Y_new: Any = None, *, return_fallbacks: bool = False):
        """Barycentric projection of the target points onto ``X`` as a persisted Dask array
        (``Y_new``: new points, NumPy or Dask, for the low-rank backends)."""
        return_fallbacks = check_bool(return_fallbacks, "return_fallbacks")
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
def _lse_chunk(points: np.ndarray, other: np.ndarray, log_w: np.ndarray, reg: float, cost):
    """Per chunk of the other side: ``[max_j logit_ij, sum_j exp(logit_ij - max)]``."""
    from ..gibbs import neg_cost_over_reg

    logits = neg_cost_over_reg(points, other, reg, cost=cost)
    logits += log_w[None, :]
    top = logits.max(axis=1)
    finite = np.isfinite(top)
    safe = np.where(finite, top, 0.0)
    total = np.exp(logits - safe[:, None]).sum(axis=1)
    return np.stack([top, total], axis=1).reshape(1, -1)


def _log_matvec(points: np.ndarray, other: da.Array, log_w: da.Array, reg: float, cost):
    """``log sum_j exp(log_w_j - c(p, o_j) / reg)`` for a few centred points ``p``, reduced
    over the chunks of ``other`` (per-chunk maxima and sums combined on the client)."""
    k = points.shape[0]
    parts = (
        per_chunk(
            lambda o, lw: _lse_chunk(points, o, lw, reg, cost),
            [other, log_w],
            (),
            2 * k,
            partial=True,
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
        log_kv = _log_matvec(g.rows("x", rows), g.Yc, log_v, g.reg, g.cost)
        log_ktu = _log_matvec(g.rows("y", cols), g.Xc, log_u, g.reg, g.cost.transposed())
        row_mass = np.exp(u_rows + log_kv)
        col_mass = np.exp(v_cols + log_ktu)
    pen_a, pen_b = result.problem.penalties
    return check_from_masses(
        row_mass,
        col_mass,
        pen_a.fixed_point_marginal(a_rows, log_kv, g.reg),
        pen_b.fixed_point_marginal(b_cols, log_ktu, g.reg),
        (n, m),
        result.scalars["mass_a"],
    )


def _barycentric(kernel, points, log_w, values, *, transpose=False) -> tuple[da.Array, int]:
    """Dask form of :func:`sketchot.solver.plans.barycentric` (fitted or new points).

    Exact kernel: a streamed softmax per row chunk. Low rank: two products with ``d + 1``
    columns; rows with a non-positive approximate denominator are NaN and counted (the
    in-memory path recomputes them with the true kernel; not done on Dask yet).
    """
    if is_block_local(kernel):
        if points is not None:
            raise NotImplementedError(
                "barycentric maps of new points are not available for the block-local kernel "
                "on Dask arrays"
            )
        return local_barycentric(kernel, log_w, transpose=transpose), 0
    if _on(kernel, DaskExact):
        if points is not None:
            raise NotImplementedError("barycentric maps of new points need a low-rank backend")
        return kernel.softmax_average(log_w, values, transpose=transpose).persist(), 0
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
