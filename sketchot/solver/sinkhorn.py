"""The in-memory solves: point clouds or a prebuilt kernel in, a checked result out.

:func:`sinkhorn` and :func:`sinkhorn_kernel` are the bodies of the public entries of
:mod:`sketchot.api` (which owns their signatures and documentation and sends Dask inputs
elsewhere): they validate the problem once (:mod:`~sketchot.solver.problem`), build the
kernel (or let ``backend='auto'`` choose it: :mod:`~sketchot.policy.solve`), run the one
iteration (:mod:`~sketchot.solver.engine`), then evaluate the plan without its ``n x m``
array, check the scalings against the TRUE kernel (the ``accuracy`` contract) and refuse
impossible results."""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from typing import Any

import numpy as np

from .._arrays import NUMPY, ArrayContext
from .._defaults import DEFAULT_ACCURACY
from .._validation import (
    RenamableTypeError,
    check_dtype,
    check_float,
    check_int,
    check_matrix,
    check_rng,
    describe,
    unknown_names,
    user_stacklevel,
)
from ..cost_matrix import has_points, lowest_cost
from ..gibbs import GibbsGeometry, dual_lower_bound, make_cost
from ..grid import grid_clouds
from ..kernels import KernelOperator, build_kernel, get_backend, require_policy
from ..kernels.registry import POINTS_SUPPORT
from . import newton
from .advice import advise
from .engine import STALL_CHECKS, annealing_kernels, choose_strategy, is_symmetric, iterate
from .errors import AccuracyWarning, InvalidResultError, InvalidResultWarning
from .grid_start import grid_coarse_start
from .multiscale import cluster_count, coarse_to_fine_start, coarse_wanted
from .options import DEFAULT_ANDERSON_MEMORY, SolverOptions
from .plans import (
    check_from_masses,
    plan_summary,
    sampled_true_kernel_check,
)
from .problem import Problem, make_problem
from .progress import IterationTable, Progress
from .result import SinkhornResult
from .safeguard import Safeguard

#: ``epsilon_scaling='auto'`` anneals exact solves whose largest cost over ``reg`` exceeds this:
#: measured on colour-like clouds (n = 200-500), a cold start converged in 341-931 iterations
#: at a spread of 1.7e3-5.8e3 and missed the accuracy after 1000 at 2.2e4.
EPSILON_SCALING_SPREAD = 5e3

# The true-kernel check uses every row and column up to this many kernel entries (it is then
# exact), this many sampled rows and columns otherwise.
EXHAUSTIVE_CHECK_ENTRIES = 4_000_000
SAMPLED_CHECK_SIZE = 256


def sinkhorn(
    a: Any,
    b: Any,
    X: Any,
    Y: Any,
    reg: float,
    backend: str,
    *,
    options: SolverOptions,
    reg_m: Any = None,
    unbalanced_type: Any = "KL",
    metric: Any = "sqeuclidean",
    p: float = 2.0,
    warmstart: Any = None,
    rng: Any = None,
    policy: Any = None,
    context: ArrayContext = NUMPY,
    **backend_params: Any,
) -> SinkhornResult:
    """The in-memory body of :func:`sketchot.sinkhorn` (whose signature and documentation
    are the public ones): validate the problem, build the kernel (or let ``'auto'`` choose
    it: ``policy.solve_auto``, the policy passed in by a layer above, see
    :func:`~sketchot.kernels.require_policy`) on the caller's arrays' placement ``context``
    and solve. ``backend_params`` holds ``dtype``,
    ``rank`` and the backend's own parameters; anything else is rejected, naming what is
    accepted."""
    check_backend_params("sinkhorn", backend, backend_params)
    geometry = check_problem(X, Y, reg, metric, p, context=context)
    if backend_params.get("dtype") is None and options.accuracy is None:
        backend_params["dtype"] = np.float64  # no accuracy to hold float32 to: float64
    problem = make_problem(
        a, b, geometry.shape, geometry.reg, reg_m, unbalanced_type=unbalanced_type,
        **warm_start(warmstart),
    )  # fmt: skip
    problem, coarse = coarse_start(problem, geometry, options, rng)
    if backend == "auto":
        result = require_policy(policy, "backend='auto'").solve_auto(
            problem, geometry, options, rng=rng, solve=solve, **backend_params
        )
    else:
        accuracy = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
        kernel = build_kernel(
            geometry, backend, rng=rng, accuracy=accuracy, policy=policy, **backend_params
        )
        if options.verbose:
            print(f"sketchot.sinkhorn: built {kernel!r} in {kernel.info.build_time:.3f} s")
        result = solve(problem, kernel, options, rng=rng)
    if coarse is not None:
        result.iteration_info["coarse_to_fine"] = coarse
    return result


def coarse_start(
    problem: Problem, geometry: GibbsGeometry, options: SolverOptions, rng: Any
) -> tuple[Problem, dict[str, Any] | None]:
    """The problem warm-started from a coarse solve when ``options.coarse_to_fine`` asks
    for it (:mod:`~sketchot.solver.multiscale`), and the stage's ``info`` (``None``: cold).

    A caller's warm start wins; the start needs a named (symmetric) metric."""
    wanted = options.coarse_to_fine
    if not coarse_wanted(wanted, problem.log_u0 is not None, geometry):
        return problem, None
    # grids: the clusters' start costs O(N x clusters) exact log products, more than the
    # axis-by-axis solve it would shorten; a pyramid of halved grids instead (grid_start)
    on_grid = grid_clouds(getattr(geometry, "X", None), getattr(geometry, "Y", None))
    grids = on_grid and geometry.cost.sqeuclidean
    if on_grid and not grids and wanted == "auto":
        return problem, None
    if grids:
        start = grid_coarse_start(problem, geometry, anderson=DEFAULT_ANDERSON_MEMORY)
        if start is None:  # grids too small to halve
            return problem, None
    else:
        # a child stream: the kernel's own draws stay those of rng
        start = coarse_to_fine_start(
            problem, geometry, clusters=cluster_count(geometry.shape),
            anderson=DEFAULT_ANDERSON_MEMORY, rng=check_rng(rng).spawn(1)[0],
        )  # fmt: skip
    info = start.info
    finite = np.all(np.isfinite(start.log_u0[problem.a > 0])) and np.all(
        np.isfinite(start.log_v0[problem.b > 0])
    )
    if not finite:  # a failed coarse solve is no start: the fine iteration starts cold
        note = f"the coarse solve ended {info['coarse_status']}: started cold"
        return replace(problem, notes=(*problem.notes, note)), {**info, "used": False}
    info["used"] = True
    if options.verbose:
        print(
            f"sketchot.sinkhorn: coarse-to-fine start from {info['clusters']} clusters "
            f"({info['coarse_iter']} coarse iterations, {info['seconds']:.2f} s)"
        )
    support = (
        f"grids of shapes {info['grids'][0][0]} and {info['grids'][0][1]}"
        if grids
        else f"{info['clusters'][0]} x {info['clusters'][1]} cluster centres"
    )
    note = f"started from a coarse solve on {support} ({info['seconds']:.2f} s)"
    warm = replace(problem, log_u0=start.log_u0, log_v0=start.log_v0, notes=(*problem.notes, note))
    return warm, info


def warm_start(warmstart: Any) -> dict[str, Any]:
    """``make_problem``'s ``log_u0``, ``log_v0`` from POT's ``warmstart=(log u, log v)``."""
    if warmstart is None:
        return {}
    if not isinstance(warmstart, (tuple, list)) or len(warmstart) != 2:
        raise TypeError(
            "warmstart must be None or a pair (log_u, log_v) of arrays of shapes (n,) and "
            f"(m,) (a result's potentials); got {describe(warmstart)}"
        )
    return {"log_u0": warmstart[0], "log_v0": warmstart[1]}


#: The public solves' named parameters besides the options, for did-you-mean suggestions.
PROBLEM_NAMES = (
    "reg_m", "unbalanced_type", "metric", "p", "warmstart", "rng", "rank", "dtype",
)  # fmt: skip


def check_backend_params(caller: str, backend: str, params: dict[str, Any]) -> None:
    """Reject keyword arguments that are neither solver options nor the backend's parameters,
    naming everything the caller accepts."""
    known = [*SolverOptions.names(), *PROBLEM_NAMES]
    if params.get("dtype") is not None:
        check_dtype(params["dtype"])  # named here, not by NumPy inside the kernel's choice
    if backend == "auto":
        unknown = sorted(set(params) - {"dtype"})
        if unknown:
            # {caller}: the public function the caller called (RenamableError)
            raise RenamableTypeError(
                "{caller}() got unexpected keyword argument(s) "
                f"{unknown_names(unknown, known)}"
                f"; backend='auto' chooses its own parameters (it accepts dtype); solver "
                f"options: {', '.join(SolverOptions.names())}",
                caller=caller,
            )
        return
    record = get_backend(backend)
    accepted = set(record.defaults) | {"dtype"} | ({"rank"} if record.params_for_rank else set())
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise RenamableTypeError(
            "{caller}() got unexpected keyword argument(s) "
            f"{unknown_names(unknown, [*known, *accepted])}; solver options: "
            f"{', '.join(SolverOptions.names())}; backend {backend!r} "
            f"parameters: {', '.join(sorted(accepted))}",
            caller=caller,
        )


def check_problem(
    X: Any,
    Y: Any,
    reg: Any,
    metric: Any = "sqeuclidean",
    p: Any = 2.0,
    *,
    context: ArrayContext = NUMPY,
) -> GibbsGeometry:
    """Validate the clouds, ``reg`` and the cost once; return their geometry.

    Parameters
    ----------
    X, Y : array_like, shape (n, d) and (m, d)
        The point clouds (same ``d``).
    reg : float
        The entropic regularisation, > 0.
    metric, p
        The cost, as :func:`sketchot.sinkhorn` takes it.
    context : ArrayContext, default=NUMPY
        Where the caller's points live (the geometry's kernels run there).

    Returns
    -------
    GibbsGeometry
        The checked clouds, ``reg`` and cost, for :func:`make_problem` and a kernel.

    Raises
    ------
    TypeError, ValueError
        Naming the argument, what was expected and what was received.
    """
    if Y is None or np.ndim(Y) == 0:
        shape = getattr(X, "shape", None)
        raise TypeError(
            "sketchot.sinkhorn(a, b, X, Y, reg) takes two point clouds X (n, d) and Y (m, d); "
            f"got X={describe(X) if shape is None else f'shape {shape}'} and "
            f"Y={describe(Y)}. For a precomputed cost matrix M use POT: ot.sinkhorn(a, b, M, reg)"
        )
    X = check_matrix(X, "X")
    Y = check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
    reg = check_float(reg, "reg", positive=True)
    return GibbsGeometry(X, Y, reg, make_cost(metric, p), context=context)


def sinkhorn_kernel(
    a: Any,
    b: Any,
    kernel: KernelOperator,
    *,
    options: SolverOptions,
    reg_m: Any = None,
    unbalanced_type: Any = "KL",
    metric: Any = None,
    p: Any = None,
    warmstart: Any = None,
    rng: Any = None,
) -> SinkhornResult:
    """The in-memory body of :func:`sketchot.sinkhorn_kernel` (whose signature and
    documentation are the public ones): Sinkhorn on a prebuilt operator."""
    if not isinstance(kernel, KernelOperator):
        raise TypeError(f"kernel must be a sketchot KernelOperator; got {describe(kernel)}")
    check_kernel_metric(kernel, metric, p)
    problem = make_problem(
        a, b, kernel.shape, kernel.geometry.reg, reg_m, unbalanced_type=unbalanced_type,
        **warm_start(warmstart),
    )  # fmt: skip
    problem, coarse = coarse_start(problem, kernel.geometry, options, rng)
    result = solve(problem, kernel, options, rng=rng)
    if coarse is not None:
        result.iteration_info["coarse_to_fine"] = coarse
    return result


def check_kernel_metric(kernel: KernelOperator, metric: Any, p: Any) -> None:
    """Refuse ``metric=`` / ``p=`` that differ from the cost the kernel was built with."""
    if metric is None and p is None:
        return
    own = kernel.geometry.cost
    asked = make_cost(own.metric if metric is None else metric, own.p if p is None else p)
    if asked != own:
        raise ValueError(
            f"the kernel was built with {own}; got {asked}: build the kernel with that cost "
            "(make_kernel(..., metric=, p=))"
        )


def solve(
    problem: Problem,
    kernel: KernelOperator,
    options: SolverOptions,
    *,
    rng: Any = None,
    column_moments: bool = True,
) -> SinkhornResult:
    """Solve a validated problem on a built kernel: iterate, summarise, certify.

    Parameters
    ----------
    problem : Problem
        Weights, ``reg``, penalty and warm start (:func:`make_problem`).
    kernel : KernelOperator
        The operator, built for ``problem``'s shape and ``reg``.
    options : SolverOptions
        The solver's options.
    rng : int, Generator or None
        Draws of the sampled true-kernel check.
    column_moments : bool, default=True
        ``False``: the summary may leave out ``P^T Xc`` (the result's ``plan_moments[1]``,
        computed when first asked for) where that saves a product (a stored absorbed kernel:
        :func:`~sketchot.solver.plans.plan_summary`); for callers that read the row side
        only, such as the support updates of :func:`sketchot.barycenter`.

    Returns
    -------
    SinkhornResult
        Potentials, plan summary and value, with the true-kernel check and whether
        ``options.accuracy`` was met (impossible results are refused:
        :func:`finish_solve`).
    """
    strategy = choose_strategy(kernel, options.log_domain)
    # a schedule needs the kernel at every intermediate reg: the exact kernel rebuilds itself
    exact = "exact" in kernel.info.capabilities and hasattr(kernel, "at_reg")
    if options.epsilon_scaling is True and not exact:
        raise ValueError(
            "epsilon_scaling=True needs a kernel with the 'exact' capability (the kernel must "
            f"represent every intermediate reg); backend {kernel.info.backend!r} does not"
        )
    tol, norm = options.stopping(
        kernel.dtype == np.float32, lambda: _norm(problem.b) / float(problem.b.sum())
    )
    # kernels that bound their own error stop first nearer the accuracy, then certify
    first = options.first_target(tol, norm, kernel.info.product_rtol)
    printer = IterationTable(options.verbose)
    _announce_long_run(kernel, options, printer)
    guard = Safeguard(kernel, options.safeguard)
    g = kernel.geometry
    # 'auto' anneals the log-stable (absorbed) iteration only: log_domain=False asks for the
    # plain one
    # (and the log-domain iteration of an exact kernel without absorption: the grid kernel)
    automatic = options.epsilon_scaling == "auto" and exact and strategy in ("absorb", "log")
    # a warm start (potentials of a nearby problem) is a better start than a schedule
    cold = problem.log_u0 is None
    wanted = options.epsilon_scaling is True or (
        automatic and cold and g.max_cost() / g.reg > EPSILON_SCALING_SPREAD
    )
    schedule = annealing_kernels(kernel) if wanted else None
    every = options.check_interval(kernel.shape)
    # the same cloud and weights on both sides (OT(a, a) of a divergence): one product per
    # iteration (engine notes)
    symmetric = is_symmetric(kernel, problem)
    notes = list(problem.notes)
    start = time.perf_counter()
    with Progress(
        f"sinkhorn ({kernel.info.backend})", total=options.max_iter, show=options.warn
        and "auto",
    ) as live:  # fmt: skip

        def run(schedule: list[KernelOperator] | None, target: float, begin=problem, done=0):
            return iterate(
                kernel, begin, tol=target, norm=norm, max_iter=options.max_iter - done,
                check_every=every, strategy=strategy,
                anderson=options.anderson_memory(strategy != "multiplicative"), guard=guard,
                progress=_Monitor(printer, live, every, done), schedule=schedule,
                symmetric=symmetric,
            )  # fmt: skip

        state = run(schedule, first)
        if state.status in ("stalled", "breakdown") and schedule is None and automatic:
            # the iteration cannot resolve this reg from a cold start (the scalings' range
            # outgrows rounding): an epsilon schedule brings the potentials close first
            notes.append(
                f"the iteration {state.status} at residual "
                f"{state.history[-1][1] if state.history else float('nan'):.2g} after "
                f"{state.n_iter} iterations; solved again with an epsilon schedule"
            )
            state = run(annealing_kernels(kernel), first)
        if newton.wanted(state, options.max_iter) and newton.applies(kernel, problem, strategy):
            state = _newton(kernel, problem, state, first, norm, notes, live)
        target, check = first, None
        elapsed = time.perf_counter() - start
        if first > tol and state.converged:
            summary, check = _summary_and_check(
                kernel, problem, state, options, rng, column_moments
            )
            if check.bound > options.accuracy:
                # the check's margin missed: on to the full stopping fraction, warm
                notes.append(
                    f"stopped first at residual {first:.2g}, where the true-kernel check "
                    f"gave {check.bound:.2g} > accuracy {options.accuracy:g}; went on to "
                    f"{tol:.2g}"
                )
                warm = replace(problem, log_u0=state.log_u, log_v0=state.log_v)
                resumed = time.perf_counter()
                more = run(None, tol, warm, state.n_iter)
                elapsed += time.perf_counter() - resumed
                state = join_runs(state, more)
                target, check = tol, None
        live.close(state.status)
    if check is None:
        summary, check = _summary_and_check(kernel, problem, state, options, rng, column_moments)
    state.absorbed = None  # its stored entries are O(n m): not kept past the summary
    result = SinkhornResult(
        kernel=kernel,
        problem=problem,
        potentials=(state.log_u, state.log_v),
        n_iter=state.n_iter,
        stop=state.status,
        tol=target,
        marginals=(summary.row_marginal, summary.col_marginal),
        value_linear=summary.cost,
        mass=summary.mass,
        log_domain=strategy != "multiplicative",
        safeguard={"policy": options.safeguard, **guard.counts, "faults": guard.faults},
        timings={
            "build": kernel.info.build_time,
            "iterations": elapsed,
            "per_iteration": elapsed / max(state.n_iter, 1),
        },
        error_history=state.history,
        options=options.as_dict(),
        notes=notes,
        iteration_info={"strategy": state.strategy, "norm": norm, **state.info},
        plan_moments=(summary.row_moments, summary.col_moments),
        true_kernel=check,
    )
    return finish_solve(result, options, guard, printer)


def _newton(kernel, problem, state, tol, norm, notes, live):
    """The Newton stage after a first-order run that did not converge (:mod:`.newton`):
    its iterate when it reached ``problem.reg`` with a smaller residual, else ``state``."""

    def report(error: float) -> None:
        live.update(state.n_iter, error=error, target=tol)

    polished = newton.newton_stage(kernel, problem, state, tol=tol, norm=norm, report=report)
    stages = state.info.get("stages") or []
    at_target = not stages or stages[-1]["reg"] == problem.reg
    before = state.history[-1][1] if state.history and at_target else float("inf")
    if polished is None or not polished.history[-1][1] < before:
        return state
    notes.append(
        f"the first-order iteration stopped ({state.status}) after {state.n_iter} iterations"
        + (
            f" at residual {before:.2g}"
            if np.isfinite(before)
            else f" at reg={stages[-1]['reg']:.3g} of its epsilon schedule"
        )
        + f"; {polished.info['newton_steps']} Sinkhorn-Newton steps over "
        f"{len(polished.info['newton'])} reg(s) reached residual {polished.history[-1][1]:.2g}"
    )
    return polished


def _summary_and_check(kernel, problem, state, options, rng, column_moments=True):
    """The plan's summary and, with an ``accuracy``, its true-kernel check (else ``None``)."""
    summary = plan_summary(
        kernel, state.log_u, state.log_v, absorbed=state.absorbed,
        log_products=state.log_products, symmetric=bool(state.info.get("symmetric")),
        absorbed_products=state.absorbed_products, column_moments=column_moments,
    )  # fmt: skip
    if options.accuracy is None:
        return summary, None
    marginals = (summary.row_marginal, summary.col_marginal)
    return summary, _check_true_kernel(
        kernel, problem, (state.log_u, state.log_v), marginals, options, rng
    )


def join_runs(first: Any, more: Any) -> Any:
    """The iterate of a run resumed from ``first``'s potentials (``more``), with the
    iterations and checks of both."""
    more.n_iter += first.n_iter
    more.history = first.history + [(i + first.n_iter, e) for i, e in more.history]
    more.info = {**first.info, **more.info, "resumed_at": first.n_iter}
    for key in ("absorptions", "resets"):
        more.info[key] = first.info.get(key, 0) + more.info.get(key, 0)
    return more


def finish_solve(result, options, guard, printer):
    """What every solve ends with: refuse impossible results, then the warnings (repairs,
    missed accuracy, non-convergence: the advice once) and the verbose summary. Returns
    ``result``."""
    _zero_within_rounding(result)
    _refuse_impossible(result, options)
    if options.warn:
        guard.warn(result.n_iter)
        advised = _warn_accuracy(result, options)
        if not result.converged:
            final = result.error_history[-1][1] if result.error_history else float("nan")
            checks = f"no progress over the last {STALL_CHECKS} checks"
            what = (
                f"stalled after {result.n_iter} iterations ({checks})"
                if result.stop == "stalled"
                else f"stopped ({result.status}) after {result.n_iter} iterations"
            )
            warnings.warn(
                f"Sinkhorn {what}; {criterion(result)} {final:.3e} > {result.tol:g}."
                + ("" if advised else f" {advise(result)}"),
                UserWarning,
                stacklevel=user_stacklevel(),
            )
    if options.verbose:
        printer.summary(result)
    return result


def criterion(result: Any) -> str:
    """The stopping criterion of a result, in words (for its warnings)."""
    if result.iteration_info.get("norm") == "l1":
        return "L1 residual / sum(a) (tol=None: the accuracy's share)"
    return "L2 column residual / sum(b) (tol)"


def _norm(x: np.ndarray) -> float:
    """L2 norm that does not overflow for huge masses (scaled by the largest entry)."""
    scale = float(np.max(np.abs(x))) if x.size else 0.0
    if not np.isfinite(scale):
        return scale
    if scale == 0.0:
        return 0.0
    return scale * float(np.linalg.norm(x / scale))


def _check_true_kernel(kernel, problem, potentials, marginals, options, rng):
    """The true-kernel check of a solve's potentials (:class:`TrueKernelCheck`)."""
    n, m = kernel.shape
    single = problem.balanced and min(n, m) == 1
    log_u, log_v = potentials
    pen_a, pen_b = problem.penalties
    a, b = problem.a, problem.b
    if "exact" in kernel.info.capabilities or single:
        # The plan's own marginals are the true-kernel check, exactly and at no cost: for
        # the exact kernel, and when one side is a single point (every coupling is then
        # a b^T, whatever the kernel's values).
        row, col = marginals
        with np.errstate(divide="ignore", invalid="ignore"):
            log_kv = np.log(row) - log_u
            log_ktu = np.log(col) - log_v
        return check_from_masses(
            np.where(a > 0, row, 0.0),
            np.where(b > 0, col, 0.0),
            pen_a.fixed_point_marginal(a, log_kv, problem.reg),
            pen_b.fixed_point_marginal(b, log_ktu, problem.reg),
            (n, m),
            float(a.sum()),
        )
    samples = options.true_kernel_samples
    if samples == "auto":
        samples = max(n, m) if n * m <= EXHAUSTIVE_CHECK_ENTRIES else SAMPLED_CHECK_SIZE
    samples = check_int(samples, "true_kernel_samples", minimum=1)
    return sampled_true_kernel_check(
        kernel, a, b, log_u, log_v, samples, check_rng(rng), (pen_a, pen_b)
    )


def _zero_within_rounding(result: SinkhornResult) -> None:
    """A transport cost below 0 by no more than float64's rounding of the costs (identical
    clouds: ``||x||^2 + ||y||^2 - 2 x.y`` of equal points) is 0."""
    cost = result.value_linear
    g = result.kernel.geometry
    if not (np.isfinite(cost) and cost < 0) or lowest_cost(g) < 0:
        return
    rounding = LOWER_BOUND_RTOL * g.max_cost() * abs(float(result.mass))
    if -cost <= rounding:
        result.value_linear = 0.0


def _refuse_impossible(result: SinkhornResult, options: SolverOptions) -> None:
    """Negative or non-finite cost or mass, or (balanced transport) a cost below the exact OT
    lower bound, is never returned as an ordinary number."""
    problems = []
    # negative costs solved as they are (an unbalanced cost matrix): <P, M> >= min(M) mass
    floor = lowest_cost(result.kernel.geometry) * abs(float(result.mass))
    if not np.isfinite(result.value_linear) or result.value_linear < floor * (1 + 1e-12):
        problems.append(f"transport cost <P, M> = {result.value_linear:.6g}")
    elif (bound := _lower_bound(result)) is not None and result.value_linear < bound:
        problems.append(
            f"transport cost <P, M> = {result.value_linear:.6g} below {bound:.6g}, a lower "
            "bound of the exact OT cost (weak duality with the returned potential): the plan "
            "is far from a coupling of a and b"
        )
    if not np.isfinite(result.mass) or result.mass <= 0:
        problems.append(f"plan mass = {result.mass:.6g}")
    for name, marginal in zip(("row", "column"), result.marginals, strict=True):
        if not np.all(np.isfinite(marginal)) or marginal.min() < 0:
            problems.append(f"{name} marginals with negative or non-finite entries")
    if not problems:
        return
    message = (
        f"backend {result.backend!r} at reg={result.reg:g} gave an impossible result: "
        f"{'; '.join(problems)}. {advise(result)}"
    )
    if options.errors == "raise":
        raise InvalidResultError(message + " Pass errors='warn' to get the result anyway.")
    warnings.warn(message, InvalidResultWarning, stacklevel=user_stacklevel())


#: Rounding slack of the lower-bound test, relative to the bound's size.
LOWER_BOUND_RTOL = 1e-9


def _on_grids(kernel: KernelOperator) -> bool:
    """Whether the kernel's backend builds on grids only (its record's ``support``)."""
    try:
        return get_backend(kernel.info.backend).support != POINTS_SUPPORT
    except ValueError:  # an operator built outside the registry
        return False


def _lower_bound(result: SinkhornResult) -> float | None:
    """The weak-duality bound of :func:`~sketchot.gibbs.dual_lower_bound` (minus rounding
    slack) for a balanced solve that missed its accuracy, when one exact pass is cheap: the
    exact kernel's own cost or at most ``EXHAUSTIVE_CHECK_ENTRIES`` entries."""
    n, m = result.kernel.shape
    exact = "exact" in result.kernel.info.capabilities
    if not result.problem.balanced or result.accuracy_met is not False:
        return None
    if not (exact or n * m <= EXHAUSTIVE_CHECK_ENTRIES):
        return None
    # a kernel applied axis by axis on grids: its exact pass is not the O(n m) bound's cost
    if n * m > EXHAUSTIVE_CHECK_ENTRIES and _on_grids(result.kernel):
        return None
    f = result.reg * result.potentials[0]
    if not np.all(np.isfinite(f[result.a > 0])):
        return None
    g = result.kernel.geometry
    if not has_points(g):  # a cost matrix: its own c-transform
        bound = g.dual_lower_bound(f, result.a, result.b)
        return bound - LOWER_BOUND_RTOL * (abs(bound) + g.max_cost() * float(result.a.sum()))
    # at most EXHAUSTIVE_CHECK_ENTRIES entries: chunked (Dask) clouds come to the host whole
    Xc, Yc, f, a, b = (np.asarray(v) for v in (g.Xc, g.Yc, f, result.a, result.b))
    bound = dual_lower_bound(Xc, Yc, f, a, b, g.cost)
    return bound - LOWER_BOUND_RTOL * (abs(bound) + g.max_cost() * float(result.a.sum()))


def _warn_accuracy(result: SinkhornResult, options: SolverOptions) -> bool:
    """Warn when the true-kernel check misses ``accuracy`` (with advice); whether it did."""
    check = result.true_kernel
    if check is None or result.accuracy_met:
        return False
    warnings.warn(
        f"backend {result.backend!r}: against the exact kernel the scalings miss the "
        f"marginals by {_relative(check.relative_a)} (a) and {_relative(check.relative_b)} (b) "
        f"of the mass (upper bound {check.bound:.2g} > accuracy={options.accuracy:g}; "
        f"{'exact' if check.exhaustive else f'{check.n_rows} sampled rows and columns'}), "
        f"whatever the solver reports for its own kernel. {advise(result)}",
        AccuracyWarning,
        stacklevel=user_stacklevel(),
    )
    return True


#: A run estimated to take longer than this warns before it starts.
LONG_RUN_SECONDS = 600.0


def _announce_long_run(
    kernel: KernelOperator, options: SolverOptions, printer: IterationTable
) -> None:
    """Say how long an iteration will take when the builder estimated a slow pass."""
    per_pass = kernel.info.seconds_per_pass
    if per_pass is None:
        return
    per_iteration = 2.0 * per_pass
    printer.log(
        f"estimated {per_iteration:.3g} s per iteration, up to "
        f"{per_iteration * options.max_iter / 60:.3g} min for max_iter={options.max_iter}"
    )
    if options.warn and per_iteration * min(options.max_iter, 100) > LONG_RUN_SECONDS:
        warnings.warn(
            f"backend {kernel.info.backend!r}: one iteration on {kernel.shape[0]} x "
            f"{kernel.shape[1]} points is estimated at {per_iteration:.3g} s, so 100 "
            f"iterations take about {per_iteration * 100 / 3600:.2g} h; a larger reg"
            + (
                " or fewer points cost less"
                if kernel.info.reason
                else ", fewer points, or backend='auto' cost less"
            ),
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _relative(value: float) -> str:
    """A relative error as a percentage, or in scientific notation when it is huge."""
    return f"{value:.1%}" if value < 10 else f"{value:.2g}x"


class _Monitor:
    """What the iteration reports to: the live progress line and the verbose table."""

    def __init__(
        self, printer: IterationTable, live: Progress, check_every: int, done: int = 0
    ) -> None:
        self.printer, self.live, self.check_every = printer, live, check_every
        self.done = done  # iterations of an earlier run this one resumes

    def update(self, iteration: int, *, error: float, target: float | None = None) -> None:
        iteration += self.done
        # the stages of an epsilon schedule check every iteration: the table keeps its pace
        if (iteration - 1) % self.check_every == 0:
            self.printer.update(iteration, error=error, target=target)
        self.live.update(iteration, error=error, target=target)

    def log(self, text: str) -> None:
        self.printer.log(text)
