"""Sinkhorn-Knopp on any kernel operator (Cuturi 2013), POT's conventions.

For weights ``a`` (n) and ``b`` (m) and the Gibbs kernel ``K = exp(-M / reg)``,
``M_ij = ||x_i - y_j||^2``, the iteration

.. math:: v \\leftarrow b \\oslash K^\\top u, \\qquad u \\leftarrow a \\oslash K v

(POT's order and start ``u = 1/n``, ``v = 1/m``) converges to the scalings of the entropic plan
``P = diag(u) K diag(v)``. The solver owns the iteration: each half-step is one fused pass of
the operator (``K = L R^T``; the pass returns the denominators, the ratios and the next
projection, plus a mask of bad denominators), the solver repairs, clips or raises on bad
entries (:mod:`~sketchot.solver.safeguard`), switches an exact kernel to log-stable iterations
when it underflows, checks convergence every ``check_every`` iterations (L2 column-marginal
error, as POT), and finally checks the scalings against the TRUE kernel (the ``accuracy``
contract) and refuses impossible results.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from .._dask import any_dask, require_dask
from .._validation import check_float, check_matrix, check_weights, describe
from ..gibbs import GibbsGeometry
from ..kernels import KernelOperator, build_kernel, get_backend
from .acceleration import AndersonMixer
from .advice import advise
from .auto import solve_auto
from .errors import AccuracyWarning, InvalidResultError, InvalidResultWarning
from .exact_paths import exact_sinkhorn
from .options import SolverOptions
from .plans import TrueKernelCheck, plan_summary
from .result import SinkhornResult
from .safeguard import Safeguard

# float32 products carry relative errors ~1e-7 per entry: a column-marginal error below this
# fraction of ||b||_2 is unreachable.
FLOAT32_RELATIVE_TOL = 1e-6

# Masses that differ by less than this (relative) are treated as equal; b is then rescaled to
# a's mass so that tol stays reachable.
MASS_RTOL = 1e-6

# The true-kernel check uses every row and column up to this many kernel entries (it is then
# exact), this many sampled rows and columns otherwise.
EXHAUSTIVE_CHECK_ENTRIES = 4_000_000
SAMPLED_CHECK_SIZE = 256


def sinkhorn(
    a: Any,
    b: Any,
    X: Any,
    Y: Any = None,
    reg: float = 1.0,
    backend: str = "auto",
    *,
    rng: Any = None,
    **kwargs: Any,
) -> SinkhornResult:
    """Entropic optimal transport between two point clouds with a pluggable Gibbs kernel.

    Solves ``min_P <P, M> + reg sum P log P`` over plans with marginals ``a`` and ``b``,
    ``M_ij = ||x_i - y_j||^2``, by Sinkhorn-Knopp on ``K = exp(-M / reg)``, where ``K`` is exact
    or approximated by ``backend``.

    Parameters
    ----------
    a : array-like of shape (n,) or None
        Source weights (non-negative; ``None`` for uniform ``1/n``). Zero weights are allowed.
        If any of ``a``, ``b``, ``X``, ``Y`` is a Dask array, the solve runs with Dask
        (:func:`sketchot.distributed.sinkhorn_dask`; ``pip install "sketchot[dask]"``).
    b : array-like of shape (m,) or None
        Target weights, same total mass as ``a``.
    X : array-like, shape (n, d)
        Source points (integer arrays such as pixels are converted to float).
    Y : array-like, shape (m, d)
        Target points. sketchot takes point clouds; for a precomputed cost matrix use POT's
        ``ot.sinkhorn(a, b, M, reg)``.
    reg : float, default=1.0
        Entropic regularisation (> 0). The paper's ``gamma`` is ``1 / reg``.
    backend : str, default='auto'
        ``'auto'`` (the cheapest kernel that meets ``accuracy``, escalating when the check
        fails: :mod:`sketchot.solver.auto`) or a registered backend
        (:func:`sketchot.available_backends`), used as it is.
    rng : None, int, Generator, ...
        Randomness of the approximate backends and of the sampled true-kernel check.
    **kwargs
        Solver options (:class:`~sketchot.solver.SolverOptions`: ``max_iter``, ``tol``,
        ``check_every``, ``safeguard``, ``log_domain``, ``accuracy``, ``true_kernel_samples``,
        ``errors``, ``warn``, ``verbose``), ``dtype``, ``rank``, and the backend's parameters
        (``sketchot.get_backend(backend).defaults``). Anything else is rejected.

    Returns
    -------
    SinkhornResult

    Notes
    -----
    Time per iteration: ``O((n + m) r)`` for rank-``r`` backends, ``O(n m)`` for the exact one
    (``O(n m d)`` when streamed). Memory ``O((n + m) r)`` for low-rank backends.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((500, 3)), rng.random((400, 3))
    >>> res = sketchot.sinkhorn(None, None, X, Y, reg=1.0, backend="nystrom", rank=50, rng=0)
    >>> bool(res.converged), res.backend, bool(res.accuracy_met)
    (True, 'nystrom', True)
    """
    if any_dask(a, b, X, Y):
        # --- Dask inputs: the same solve on a cluster (sketchot.distributed, issue 14) ---
        require_dask()
        from ..distributed.solver import sinkhorn_dask

        return sinkhorn_dask(a, b, X, Y, reg, backend, rng=rng, **kwargs)
    options, backend_params = SolverOptions.split(kwargs)
    check_backend_params("sinkhorn", backend, backend_params)
    geometry = check_problem(X, Y, reg)
    a, b, notes = check_marginals(a, b, *geometry.shape)
    if backend == "auto":
        return solve_auto(
            a, b, geometry, options, rng=rng, notes=notes, solve=solve, **backend_params
        )
    accuracy = options.accuracy if options.accuracy is not None else 1e-3
    kernel = build_kernel(geometry, backend, rng=rng, accuracy=accuracy, **backend_params)
    if options.verbose:
        print(f"sketchot.sinkhorn: built {kernel!r} in {kernel.info.build_time:.3f} s")
    return solve(a, b, kernel, options, rng=rng, notes=notes)


def sinkhorn2(
    a: Any, b: Any, X: Any, Y: Any = None, reg: float = 1.0, backend: str = "polyts", **kwargs: Any
) -> float:
    """``<P, M>`` of :func:`sinkhorn`'s plan (POT's ``sinkhorn2`` convention); same arguments."""
    return sinkhorn(a, b, X, Y, reg, backend, **kwargs).value_linear


def check_backend_params(caller: str, backend: str, params: dict[str, Any]) -> None:
    """Reject keyword arguments that are neither solver options nor the backend's parameters,
    naming everything the caller accepts."""
    if backend == "auto":
        unknown = sorted(set(params) - {"dtype"})
        if unknown:
            raise TypeError(
                f"{caller}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}"
                f"; backend='auto' chooses its own parameters (it accepts dtype); solver "
                f"options: {', '.join(SolverOptions.names())}"
            )
        return
    record = get_backend(backend)
    accepted = set(record.defaults) | {"dtype"} | ({"rank"} if record.params_for_rank else set())
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise TypeError(
            f"{caller}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"solver options: {', '.join(SolverOptions.names())}; backend {backend!r} "
            f"parameters: {', '.join(sorted(accepted))}"
        )


def check_problem(X: Any, Y: Any, reg: Any) -> GibbsGeometry:
    """Validate the clouds and ``reg`` once; return their geometry."""
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
    return GibbsGeometry(X, Y, reg)


def check_marginals(a: Any, b: Any, n: int, m: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Validated weights; ``b`` rescaled to ``a``'s mass when they differ by rounding only."""
    a = check_weights(a, "a", n, "X")
    b = check_weights(b, "b", m, "Y")
    notes = []
    mass_a, mass_b = a.sum(), b.sum()
    if not np.isclose(mass_a, mass_b, rtol=MASS_RTOL, atol=0.0):
        raise ValueError(
            f"a and b must have the same total mass (balanced transport); got sum(a) = "
            f"{mass_a:.8g} and sum(b) = {mass_b:.8g}"
        )
    if mass_a != mass_b:
        b = b * (mass_a / mass_b)
        notes.append(f"b was rescaled by {mass_a / mass_b:.12g} to the mass of a")
    return a, b, notes


def sinkhorn_kernel(a: Any, b: Any, kernel: KernelOperator, **kwargs: Any) -> SinkhornResult:
    """Sinkhorn-Knopp on a prebuilt :class:`~sketchot.kernels.KernelOperator`.

    Same solver options as :func:`sinkhorn` (and ``rng`` for the sampled check); use it to
    solve several problems with one kernel. A kernel built on Dask arrays
    (:func:`sketchot.make_kernel` with Dask ``X``, ``Y``) is solved with Dask
    (:func:`sketchot.distributed.sinkhorn_kernel_dask`).
    """
    if not isinstance(kernel, KernelOperator):
        raise TypeError(f"kernel must be a sketchot KernelOperator; got {describe(kernel)}")
    if getattr(kernel.geometry, "distributed", False) or any_dask(a, b):
        # a kernel built on Dask arrays (or Dask weights): the solve runs with Dask too
        require_dask()
        from ..distributed.solver import sinkhorn_kernel_dask

        return sinkhorn_kernel_dask(a, b, kernel, **kwargs)
    rng = kwargs.pop("rng", None)
    options = SolverOptions(**kwargs)
    a, b, notes = check_marginals(a, b, *kernel.shape)
    return solve(a, b, kernel, options, rng=rng, notes=notes)


def solve(
    a: np.ndarray,
    b: np.ndarray,
    kernel: KernelOperator,
    options: SolverOptions,
    *,
    rng: Any = None,
    notes: list[str] | None = None,
) -> SinkhornResult:
    """The solve on validated inputs: iterations, summary, checks."""
    exact = "exact" in kernel.info.capabilities
    log_products = "log_products" in kernel.info.capabilities
    if options.log_domain is True and not (exact or log_products):
        raise ValueError(
            f"log_domain=True needs a kernel with the 'exact' or 'log_products' capability; "
            f"backend {kernel.info.backend!r} only offers linear products"
        )
    tol = options.tol
    if kernel.dtype == np.float32:
        floor = FLOAT32_RELATIVE_TOL * _norm(b) / float(b.sum())
        if tol < floor:
            if options.warn:
                warnings.warn(
                    f"tol={tol:g} is below what float32 kernels resolve; using tol={floor:.3g} "
                    "(1e-6 ||b||_2 / sum(b)). Pass dtype=numpy.float64 for tighter tolerances.",
                    UserWarning,
                    stacklevel=3,
                )
            tol = floor
    printer = _Printer(options.verbose)
    if options.epsilon_scaling and not exact:
        raise ValueError(
            "epsilon_scaling=True needs a kernel with the 'exact' capability (the kernel must "
            f"represent every intermediate reg); backend {kernel.info.backend!r} does not"
        )
    _announce_long_run(kernel, options, printer)
    guard = Safeguard(kernel, options.safeguard)
    start = time.perf_counter()
    use_log = (exact or log_products) and options.log_domain is not False
    if use_log and exact:
        state = _stabilized(kernel, a, b, options, tol, printer)
    elif use_log:
        state = _log_iterations(kernel, a, b, options, tol, printer)
    else:
        state = _multiplicative(kernel, a, b, options, tol, guard, printer)
    elapsed = time.perf_counter() - start

    summary = plan_summary(kernel, state[0], state[1])
    final_error = _norm(summary.col_marginal - b) / float(b.sum())
    result = SinkhornResult(
        **iteration_fields(kernel, a, b, options, guard, state, tol, elapsed, final_error),
        marginals=(summary.row_marginal, summary.col_marginal),
        value_linear=summary.cost,
        mass=summary.mass,
        log_domain=use_log,
        notes=list(notes or []),
    )
    if options.accuracy is not None:
        result.true_kernel = _check_true_kernel(result, options, rng)
    return finish_solve(result, options, guard, printer, final_error)


def iteration_fields(kernel, a, b, options, guard, state, tol, elapsed, final_error):
    """The :class:`SinkhornResult` fields every solve (in memory or Dask) fills alike from
    its iterations: ``state = (log_u, log_v, n_iter, converged, history)``."""
    log_u, log_v, n_iter, converged, history = state
    return {
        "kernel": kernel,
        "a": a,
        "b": b,
        "reg": kernel.geometry.reg,
        "potentials": (log_u, log_v),
        "n_iter": n_iter,
        # the last iterate may meet tol between two scheduled checks
        "converged": converged or bool(final_error < tol),
        "tol": tol,
        "safeguard": {"policy": options.safeguard, **guard.counts},
        "timings": {
            "build": kernel.info.build_time,
            "iterations": elapsed,
            "per_iteration": elapsed / max(n_iter, 1),
        },
        "error_history": history,
        "options": options.as_dict(),
    }


def finish_solve(result, options, guard, printer, final_error: float):
    """What every solve ends with: refuse impossible results, then the warnings (repairs,
    missed accuracy, non-convergence) and the verbose summary. Returns ``result``."""
    _refuse_impossible(result, options)
    if options.warn:
        guard.warn(result.n_iter)
        _warn_accuracy(result, options)
        if not result.converged:
            warnings.warn(
                f"Sinkhorn did not converge in {options.max_iter} iterations (column-marginal "
                f"error {final_error:.3e} > tol={result.tol:g}); increase max_iter or reg.",
                UserWarning,
                stacklevel=4,
            )
    if options.verbose:
        printer.summary(result)
    return result


def _norm(x: np.ndarray) -> float:
    """L2 norm that does not overflow for huge masses (scaled by the largest entry)."""
    scale = float(np.max(np.abs(x))) if x.size else 0.0
    if not np.isfinite(scale):
        return scale
    if scale == 0.0:
        return 0.0
    return scale * float(np.linalg.norm(x / scale))


def _check_true_kernel(result: SinkhornResult, options: SolverOptions, rng: Any):
    n, m = result.kernel.shape
    if "exact" in result.kernel.info.capabilities:
        # The plan's own marginals are the true-kernel check, exactly and at no cost.
        mass = float(result.a.sum())
        err_a, err_b = result.marginal_errors
        return TrueKernelCheck(
            err_a, err_b, err_a / mass, err_b / mass, n, m, True, err_a / mass, err_b / mass
        )
    samples = options.true_kernel_samples
    if samples == "auto":
        samples = max(n, m) if n * m <= EXHAUSTIVE_CHECK_ENTRIES else SAMPLED_CHECK_SIZE
    return result.check_true_kernel(samples, rng)


def _refuse_impossible(result: SinkhornResult, options: SolverOptions) -> None:
    """Negative or non-finite cost or mass is never returned as an ordinary number."""
    problems = []
    if not np.isfinite(result.value_linear) or result.value_linear < 0:
        problems.append(f"transport cost <P, M> = {result.value_linear:.6g}")
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
    warnings.warn(message, InvalidResultWarning, stacklevel=4)


def _warn_accuracy(result: SinkhornResult, options: SolverOptions) -> None:
    check = result.true_kernel
    if check is None or result.accuracy_met:
        return
    warnings.warn(
        f"backend {result.backend!r}: against the exact kernel the scalings miss the "
        f"marginals by {_relative(check.relative_a)} (a) and {_relative(check.relative_b)} (b) "
        f"of the mass (upper bound {check.bound:.2g} > accuracy={options.accuracy:g}; "
        f"{'exact' if check.exhaustive else f'{check.n_rows} sampled rows and columns'}), "
        f"whatever the solver reports for its own kernel. {advise(result)}",
        AccuracyWarning,
        stacklevel=4,
    )


def _multiplicative(kernel, a, b, options, tol, guard, printer):
    """Kernel-space iterations in POT's order, one fused pass per half-step (plus one
    projection of the Anderson-mixed ``v``); bad denominators go to the safeguard."""
    n, m = kernel.shape
    # full_like: NumPy weights give np.full exactly; Dask weights keep their chunks.
    u = np.full_like(a, 1.0 / n)
    v = np.full_like(b, 1.0 / m)
    z = kernel.project("rows", u)
    mass = float(b.sum())
    history: list[tuple[int, float]] = []
    converged = False
    n_iter = 0
    check_every = options.check_every
    # A repaired pass changes the map, so the mixing restarts (Dask solves refuse a memory).
    memory = options.anderson_memory(log_domain=False)
    mixer = AndersonMixer(memory, b > 0) if memory else None
    for iteration in range(1, options.max_iter + 1):
        cols = kernel.fused_pass("cols", z, b)
        # cols.products = K^T u of the previous u: its column marginal is free here.
        if iteration > 1 and (iteration - 2) % check_every == 0:
            with np.errstate(over="ignore", invalid="ignore"):
                error = _norm(v * cols.products - b) / mass
            history.append((iteration - 1, error))
            printer.iteration(iteration - 1, error)
            if error < tol:
                converged = True
                break
        v_previous = v
        v, y = _repaired(cols, "cols", b, u, guard)
        if mixer is not None and cols.n_bad:
            mixer.reset()
        elif mixer is not None:
            log_v = _log_scaling(v)
            mixed = mixer.step(_log_scaling(v_previous), log_v)
            if mixed is not log_v:  # an extrapolated v needs its own projection
                v = np.exp(mixed)
                y = kernel.project("cols", v)
        u, z = _repaired(kernel.fused_pass("rows", y, a), "rows", a, v, guard)
        n_iter = iteration
        if guard.repaired:
            # Repaired denominators mix the exact and the approximate kernel, so mass is no
            # longer conserved and u, v can drift apart geometrically: rebalance (P is
            # invariant under (u / c, v c)).
            balance = np.sqrt(np.max(u) / np.max(v))
            if np.isfinite(balance) and balance > 0:
                u, z, v = u / balance, z / balance, v * balance
    return _log_scaling(u), _log_scaling(v), n_iter, converged, history


def _log_scaling(x):
    """``log x`` with ``log 0 = -inf`` and no divide warning, also where the log is evaluated
    later in another thread (Dask scalings); equal to ``np.log`` on every input."""
    zero = x == 0
    return np.where(zero, -np.inf, np.log(np.where(zero, 1.0, x)))


def _repaired(result, side, numerator, other, guard):
    """``(ratios, projection)`` of a pass, after the safeguard handled its bad entries."""
    if not result.n_bad:
        return result.ratios, result.projection
    return guard.apply(side, result, numerator, other)


def _log_iterations(kernel, a, b, options, tol, printer):
    """Iterations on log-scalings with the operator's log-domain passes (``'log_products'``):
    finite whatever the spread of the scalings, Anderson-mixed. Starts from ``v = 1/m``."""
    n, m = kernel.shape
    mass = float(b.sum())
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a), np.log(b)
    log_v = np.full(m, -np.log(m))
    history: list[tuple[int, float]] = []
    converged = False
    n_iter = 0
    log_u = np.full(n, -np.log(n))
    mixer = AndersonMixer(options.anderson_memory(log_domain=True), b > 0)
    for iteration in range(1, options.max_iter + 1):
        rows = kernel.fused_pass("rows", log_v, log_a, log=True)
        log_u, log_Ktu = rows.ratios, rows.projection
        n_iter = iteration
        if (iteration - 1) % options.check_every == 0:
            with np.errstate(over="ignore", invalid="ignore"):
                error = _norm(np.exp(log_v + log_Ktu) - b) / mass
            history.append((iteration, error))
            printer.iteration(iteration, error)
            if error < tol:
                converged = True
                break
        log_v = mixer.step(log_v, np.where(b > 0, log_b - log_Ktu, -np.inf))
    return log_u, log_v, n_iter, converged, history


def _stabilized(kernel, a, b, options, tol, printer):
    """The exact kernel's log-stable path (absorption, optional epsilon-scaling) on its
    geometry: :func:`~sketchot.solver.exact_paths.exact_sinkhorn`."""
    g = kernel.geometry
    mass = float(b.sum())
    path = exact_sinkhorn(
        g.Xc, g.Yc, a, b, g.reg,
        tol=tol * mass, max_iter=options.max_iter, check_every=options.check_every,
        dtype=kernel.dtype, max_dense_bytes=kernel.info.params.get("max_dense_bytes", 1 << 30),
        epsilon_scaling=options.epsilon_scaling,
        anderson=options.anderson_memory(log_domain=True),
    )  # fmt: skip
    history = [(iteration, error / mass) for iteration, error in path.history]
    for iteration, error in history:
        printer.iteration(iteration, error)
    return path.log_u, path.log_v, path.n_iter, path.converged, history


#: A run estimated to take longer than this warns before it starts.
LONG_RUN_SECONDS = 600.0


def _announce_long_run(kernel: KernelOperator, options: SolverOptions, printer: _Printer) -> None:
    """Say how long an iteration will take when the builder estimated a slow pass."""
    per_pass = kernel.info.seconds_per_pass
    if per_pass is None:
        return
    per_iteration = 2.0 * per_pass
    printer.say(
        f"estimated {per_iteration:.3g} s per iteration, up to "
        f"{per_iteration * options.max_iter / 60:.3g} min for max_iter={options.max_iter}"
    )
    if options.warn and per_iteration * min(options.max_iter, 100) > LONG_RUN_SECONDS:
        warnings.warn(
            f"backend {kernel.info.backend!r}: one iteration on {kernel.shape[0]} x "
            f"{kernel.shape[1]} points is estimated at {per_iteration:.3g} s, so 100 "
            f"iterations take about {per_iteration * 100 / 3600:.2g} h; a larger reg, fewer "
            "points, or backend='auto' cost less",
            UserWarning,
            stacklevel=4,
        )


def _relative(value: float) -> str:
    """A relative error as a percentage, or in scientific notation when it is huge."""
    return f"{value:.1%}" if value < 10 else f"{value:.2g}x"


class _Printer:
    """Verbose output: a header, one line per check, a summary with the true-kernel check."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.started = time.perf_counter()
        self.header_done = False

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"sketchot.sinkhorn: {text}")

    def iteration(self, iteration: int, error: float) -> None:
        if not self.enabled:
            return
        if not self.header_done:
            print(f"{'iter':>6} | {'marginal err (L2)':>18} | {'elapsed s':>9}")
            self.header_done = True
        print(f"{iteration:6d} | {error:18.6e} | {time.perf_counter() - self.started:9.3f}")

    def summary(self, result: SinkhornResult) -> None:
        err_a, err_b = result.marginal_errors
        print(
            f"sketchot.sinkhorn: {result.status} after {result.n_iter} iterations "
            f"({result.timings['per_iteration'] * 1e3:.2f} ms each, build "
            f"{result.timings['build']:.3f} s); <P, M> = {result.value_linear:.6g}; "
            f"L1 marginal errors a {err_a:.2e}, b {err_b:.2e}"
        )
        if result.true_kernel is not None:
            print(f"sketchot.sinkhorn: {result.true_kernel}")
