"""Sinkhorn-Knopp on any kernel operator (Cuturi 2013), POT's conventions.

For weights ``a`` (n) and ``b`` (m) and the Gibbs kernel ``K = exp(-M / reg)``,
``M_ij = ||x_i - y_j||^2``, the iteration

.. math:: v \\leftarrow b \\oslash K^\\top u, \\qquad u \\leftarrow a \\oslash K v

(POT's order and start ``u = 1/n``, ``v = 1/m``) converges to the scalings of the entropic
plan ``P = diag(u) K diag(v)``. The solver only calls the operator interface; every
iteration is two fused sweeps (one over each factor of a low-rank kernel), so it costs
``O((n + m) r)`` for rank-``r`` backends. The L2 error of the column marginal is checked every
``check_every`` iterations, as POT does. For the exact kernel at small ``reg`` the same
iteration runs on log-scalings with log-sum-exp (``log_domain``), which never underflows.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from .._validation import (
    check_choice,
    check_float,
    check_int,
    check_matrix,
    check_weights,
    describe,
)
from ..kernels import KernelOperator, make_kernel
from ..gibbs import sq_norms
from .result import SinkhornResult, strided_sample
from .safeguard import (
    ACCURACY_PARAMETER,
    SAFEGUARD_POLICIES,
    KernelSafeguardWarning,
    LogDomainNeededError,
    Safeguard,
)

# With the exact kernel, the multiplicative iteration is used while the largest cost over reg
# stays below this (kernel entries and scalings then stay within float64 range, e^±500);
# beyond it, or after an underflow, 'auto' switches to the log domain.
LOG_DOMAIN_THRESHOLD = 500.0

# float32 products carry relative errors ~1e-7 per entry, so a column-marginal error below
# this fraction of ||b||_2 is unreachable (measured: float32 iterations stall around 1e-7).
FLOAT32_RELATIVE_TOL = 1e-6

# Relative tolerance on sum(a) == sum(b).
MASS_RTOL = 1e-6

# The automatic true-kernel check warns above this relative L1 marginal error. Working
# approximations measured 1e-6..2e-2 at reg = 1 on colours; broken ones 0.1..1e10.
TRUE_KERNEL_RTOL = 0.05


def sinkhorn(
    a: Any,
    b: Any,
    X: Any,
    Y: Any,
    reg: float = 1.0,
    backend: str = "polyts",
    max_iter: int = 1000,
    tol: float = 1e-9,
    rng: Any = None,
    verbose: bool = False,
    *,
    safeguard: str = "exact",
    log_domain: bool | str = "auto",
    check_every: int = 10,
    warn: bool = True,
    true_kernel_samples: int = 16,
    **backend_params: Any,
) -> SinkhornResult:
    """Entropic optimal transport between two point clouds with a pluggable Gibbs kernel.

    Solves ``min_P <P, M> + reg sum P log P`` over plans with marginals ``a`` and ``b``,
    ``M_ij = ||x_i - y_j||^2``, by Sinkhorn-Knopp on ``K = exp(-M / reg)``, where ``K`` is exact
    or approximated by ``backend``.

    Parameters
    ----------
    a : array-like of shape (n,) or None
        Source weights (non-negative; ``None`` for uniform ``1/n``). Zero weights are allowed.
    b : array-like of shape (m,) or None
        Target weights, same total mass as ``a``.
    X : array-like, shape (n, d)
        Source points (integer arrays such as pixels are converted to float).
    Y : array-like, shape (m, d)
        Target points.
    reg : float, default=1.0
        Entropic regularisation (> 0). The paper's ``gamma`` is ``1 / reg``.
    backend : {'polyts', 'nystrom', 'rff', 'exact'}, default='polyts'
        How ``K`` is represented (see :func:`sketchot.make_kernel`).
    max_iter : int, default=1000
    tol : float, default=1e-9
        Stop when the L2 column-marginal error ``||v * K^T u - b||_2`` is below ``tol``
        (POT's criterion). With ``dtype=numpy.float32`` it is raised to what float32 resolves
        (``1e-6 ||b||_2``), with a warning.
    rng : None, int, Generator, ...
        Randomness of the approximate backends.
    verbose : bool, default=False
        Print the build, the marginal error at every check, and the true-kernel check.
    safeguard : {'exact', 'clip', 'raise'}, default='exact'
        What to do with non-positive or non-finite ``K~ v`` / ``K~^T u`` entries
        (see :mod:`sketchot.solver.safeguard`).
    log_domain : {'auto', True, False}, default='auto'
        Log-domain (stabilised) iterations; only for ``backend='exact'``. ``'auto'`` uses them
        when ``max M / reg`` exceeds 500 or when the multiplicative iteration underflows.
    check_every : int, default=10
        Iterations between convergence checks (the first iteration is always checked).
    warn : bool, default=True
        Warn when the solver does not converge, when the safeguard had to act, or when the
        true-kernel check of an approximate backend fails.
    true_kernel_samples : int, default=16
        After the solve, an approximate backend's scalings are checked against the EXACT
        kernel on this many evenly spaced rows and columns (``O(samples (n + m) d)``; stored
        in ``result.true_kernel``), with a warning when the estimated relative L1 marginal
        error exceeds 5%: a solver can converge perfectly on a wrong kernel. 0 skips it.
    **backend_params
        Backend parameters and ``dtype`` (``n_features``; ``n_landmarks``; ``sketch_dim``,
        ``degree``, ``coreset_size``, ``coefficients``; ``max_dense_bytes``).

    Returns
    -------
    SinkhornResult

    Notes
    -----
    Time per iteration: ``O((n + m) r)`` for low-rank backends, ``O(n m)`` for the exact one
    (``O(n m d)`` when streamed). Memory: ``O((n + m) r)`` for low-rank backends.

    Examples
    --------
    >>> import numpy as np, sketchot
    >>> rng = np.random.default_rng(0)
    >>> X, Y = rng.random((500, 3)), rng.random((400, 3))
    >>> res = sketchot.sinkhorn(None, None, X, Y, reg=1.0, backend="polyts", rng=0)
    >>> bool(res.converged)
    True
    """
    X = check_matrix(X, "X")
    Y = check_matrix(Y, "Y", n_features=X.shape[1], feature_name="X")
    a, b = check_marginals(a, b, X.shape[0], Y.shape[0])
    reg = check_float(reg, "reg", positive=True)
    kernel = make_kernel(X, Y, reg, backend, rng=rng, **backend_params)
    if verbose:
        print(f"sketchot.sinkhorn: built {kernel!r} in {kernel.build_time:.3f} s")
    return sinkhorn_kernel(
        a,
        b,
        kernel,
        max_iter=max_iter,
        tol=tol,
        verbose=verbose,
        safeguard=safeguard,
        log_domain=log_domain,
        check_every=check_every,
        warn=warn,
        rng=rng,
    )


def sinkhorn2(
    a: Any, b: Any, X: Any, Y: Any, reg: float = 1.0, backend: str = "polyts", **kwargs: Any
) -> float:
    """``<P, M>`` of :func:`sinkhorn`'s plan (POT's ``sinkhorn2`` convention); same arguments."""
    return sinkhorn(a, b, X, Y, reg, backend, **kwargs).value_linear


def check_marginals(a: Any, b: Any, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``a`` and ``b`` against the point counts and each other's total mass."""
    a = check_weights(a, "a", n, "X")
    b = check_weights(b, "b", m, "Y")
    if not np.isclose(a.sum(), b.sum(), rtol=MASS_RTOL, atol=0.0):
        raise ValueError(
            f"a and b must have the same total mass (balanced transport); got sum(a) = "
            f"{a.sum():.8g} and sum(b) = {b.sum():.8g}"
        )
    return a, b


def sinkhorn_kernel(
    a: Any,
    b: Any,
    kernel: KernelOperator,
    *,
    max_iter: int = 1000,
    tol: float = 1e-9,
    verbose: bool = False,
    safeguard: str = "exact",
    log_domain: bool | str = "auto",
    check_every: int = 10,
    warn: bool = True,
    rng: Any = None,
    true_kernel_samples: int = 16,
) -> SinkhornResult:
    """Sinkhorn-Knopp on a prebuilt :class:`~sketchot.kernels.KernelOperator`.

    Same options as :func:`sinkhorn`; use it to solve several problems with one kernel.
    ``rng`` only draws the rows of the true-kernel check printed when ``verbose``.
    """
    if not isinstance(kernel, KernelOperator):
        raise TypeError(f"kernel must be a sketchot KernelOperator; got {describe(kernel)}")
    a, b = check_marginals(a, b, *kernel.shape)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_float(tol, "tol", positive=True)
    check_every = check_int(check_every, "check_every", minimum=1)
    true_kernel_samples = check_int(true_kernel_samples, "true_kernel_samples", minimum=0)
    check_choice(safeguard, "safeguard", SAFEGUARD_POLICIES)
    if log_domain not in ("auto", True, False):
        raise ValueError(f"log_domain must be 'auto', True or False; got {describe(log_domain)}")
    if log_domain is True and not kernel.is_exact:
        raise ValueError(
            f"log_domain=True needs the exact kernel (backend='exact'); backend "
            f"{kernel.backend!r} only offers products with an approximate kernel"
        )
    if kernel.dtype == np.float32:
        floor = FLOAT32_RELATIVE_TOL * float(np.linalg.norm(b))
        if tol < floor:
            if warn:
                warnings.warn(
                    f"tol={tol:g} is below what float32 kernels resolve; using tol={floor:.3g} "
                    f"(1e-6 ||b||_2). Pass dtype=numpy.float64 for tighter tolerances.",
                    UserWarning,
                    stacklevel=2,
                )
            tol = floor

    use_log = kernel.is_exact and (
        log_domain is True
        or (log_domain == "auto" and _max_cost(kernel) / kernel.reg > LOG_DOMAIN_THRESHOLD)
    )
    guard = Safeguard(kernel, safeguard, switch_to_log=kernel.is_exact and log_domain == "auto")
    printer = _Printer(verbose)
    start = time.perf_counter()
    if not use_log:
        try:
            state = _multiplicative(kernel, a, b, max_iter, tol, check_every, guard, printer)
        except LogDomainNeededError:
            printer.say("the exact kernel underflowed: restarting in the log domain")
            use_log = True
    if use_log:
        state = _log_domain(kernel, a, b, max_iter, tol, check_every, printer)
    elapsed = time.perf_counter() - start

    log_u, log_v, n_iter, converged, history = state
    summary = kernel.plan_summary(log_u, log_v)
    final_error = float(np.linalg.norm(summary.col_marginal - b))
    if not converged and final_error < tol:
        converged = True  # the last iterate met tol between two scheduled checks
    result = SinkhornResult(
        kernel=kernel,
        a=a,
        b=b,
        reg=kernel.reg,
        potentials=(log_u, log_v),
        n_iter=n_iter,
        converged=converged,
        tol=tol,
        marginals=(summary.row_marginal, summary.col_marginal),
        value_linear=summary.cost,
        mass=summary.mass,
        log_domain=use_log,
        safeguard={"policy": safeguard, **guard.counts},
        timings={
            "build": kernel.build_time,
            "iterations": elapsed,
            "per_iteration": elapsed / max(n_iter, 1),
        },
        error_history=history,
    )
    if true_kernel_samples and not kernel.is_exact:
        result.true_kernel = result._check_on(
            strided_sample(kernel.shape[0], true_kernel_samples),
            strided_sample(kernel.shape[1], true_kernel_samples),
        )
    if warn:
        guard.warn(n_iter)
        check = result.true_kernel
        if check is not None and not max(check.relative_a, check.relative_b) <= TRUE_KERNEL_RTOL:
            warnings.warn(
                f"backend {kernel.backend!r}: against the exact kernel the scalings miss the "
                f"marginals by {_relative(check.relative_a)} (a) and "
                f"{_relative(check.relative_b)} (b) of the mass (estimated on {check.n_rows} "
                f"rows and {check.n_cols} columns), whatever the solver reports for its own "
                f"kernel: the approximation is too coarse at reg={kernel.reg:g}; increase "
                f"{ACCURACY_PARAMETER.get(kernel.backend, 'the rank')} or reg, or use "
                "backend='nystrom' or 'exact'.",
                KernelSafeguardWarning,
                stacklevel=2,
            )
        if not converged:
            warnings.warn(
                f"Sinkhorn did not converge in {max_iter} iterations (column-marginal error "
                f"{final_error:.3e} > tol={tol:g}); increase max_iter or reg.",
                UserWarning,
                stacklevel=2,
            )
    if verbose:
        printer.summary(result, rng)
    return result


def _multiplicative(kernel, a, b, max_iter, tol, check_every, guard, printer):
    """Kernel-space iterations in POT's order, two fused sweeps per iteration."""
    n, m = kernel.shape
    u = np.full(n, 1.0 / n)
    v = np.full(m, 1.0 / m)
    z = kernel.sweep_start(u)
    history: list[tuple[int, float]] = []
    converged = False
    n_iter = 0
    for iteration in range(1, max_iter + 1):
        guard.current = u
        v_next, y, Ktu = kernel.sweep_right(z, b, guard.cols)
        # Ktu = K^T u of the previous iteration: its column marginal is free here.
        if iteration > 1 and (iteration - 2) % check_every == 0:
            error = float(np.linalg.norm(v * Ktu - b))
            history.append((iteration - 1, error))
            printer.iteration(iteration - 1, error)
            if error < tol:
                converged = True
                break
        v = v_next
        guard.current = v
        u, z, _ = kernel.sweep_left(y, a, guard.rows)
        n_iter = iteration
        if guard.repaired:
            # Repaired denominators mix the exact and the approximate kernel, so the iteration
            # no longer conserves mass: v can grow and u shrink geometrically until they
            # overflow. P = diag(u) K diag(v) is invariant under (u / c, v c): rebalance.
            balance = np.sqrt(np.max(u) / np.max(v))
            if np.isfinite(balance) and balance > 0:
                u /= balance
                z /= balance
                v *= balance
    with np.errstate(divide="ignore"):
        return np.log(u), np.log(v), n_iter, converged, history


def _log_domain(kernel, a, b, max_iter, tol, check_every, printer):
    """The same iteration on log-scalings with log-sum-exp sweeps (exact kernel only)."""
    n, m = kernel.shape
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a), np.log(b)
    log_u = np.full(n, -np.log(n))
    log_v = np.full(m, -np.log(m))
    log_Ktu = kernel.log_sweep_start(log_u)
    history: list[tuple[int, float]] = []
    converged = False
    n_iter = 0
    for iteration in range(1, max_iter + 1):
        if iteration > 1 and (iteration - 2) % check_every == 0:
            error = float(np.linalg.norm(np.exp(log_v + log_Ktu) - b))
            history.append((iteration - 1, error))
            printer.iteration(iteration - 1, error)
            if error < tol:
                converged = True
                break
        log_v = np.where(b > 0, log_b - log_Ktu, -np.inf)
        log_u, log_Ktu, _ = kernel.log_sweep_left(log_v, log_a)
        n_iter = iteration
    return log_u, log_v, n_iter, converged, history


def _relative(value: float) -> str:
    """A relative error as a percentage, or in scientific notation when it is huge."""
    return f"{value:.1%}" if value < 10 else f"{value:.2g}x"


def _max_cost(kernel: KernelOperator) -> float:
    """Upper bound on ``max_ij ||x_i - y_j||^2`` from the centred norms (``O(n + m)``)."""
    radius_x = np.sqrt(sq_norms(kernel._Xc).max())
    radius_y = np.sqrt(sq_norms(kernel._Yc).max())
    return float((radius_x + radius_y) ** 2)


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

    def summary(self, result: SinkhornResult, rng: Any) -> None:
        err_a, err_b = result.marginal_errors
        print(
            f"sketchot.sinkhorn: {result.status} after {result.n_iter} iterations "
            f"({result.timings['per_iteration'] * 1e3:.2f} ms each, build "
            f"{result.timings['build']:.3f} s); <P, M> = {result.value_linear:.6g}; "
            f"L1 marginal errors a {err_a:.2e}, b {err_b:.2e}"
        )
        if not result.kernel.is_exact:
            print(f"sketchot.sinkhorn: {result.check_true_kernel(rng=rng)}")
