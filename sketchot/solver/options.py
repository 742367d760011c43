"""The solver's options: one object, validated once, recorded in every result."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

from .._defaults import DEFAULT_ACCURACY
from .._validation import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    describe,
    user_stacklevel,
)

SAFEGUARD_POLICIES = ("exact", "clip", "raise", "none", "propagate")
ERROR_POLICIES = ("raise", "warn")

#: Anderson memory of ``anderson='auto'`` on log-domain paths: 5 past iterates (typical 3-8;
#: each costs O(m) memory and work per step).
DEFAULT_ANDERSON_MEMORY = 5

#: With ``tol=None`` the iteration stops when its L1 residual (relative to ``sum(a)``) is below
#: this fraction of ``accuracy``: the rest of the budget is the kernel's own error. For the
#: exact kernel that residual IS the checked error, so any fraction up to 1 meets the accuracy;
#: an approximate kernel adds its error to the iteration's. The iteration converges linearly,
#: so the fraction costs ``log(1 / fraction) / rate`` iterations: measured on colours (2000
#: pixels of each default image, reg = 0.01 x mean squared distance, exact kernel, a check
#: every 10 iterations) 1.0 stopped after 31 iterations with the check at 9.0e-4 of the 1e-3
#: (nothing left for a kernel's error), 0.1 after 41 at 3.1e-5, POT's ``tol=1e-9`` after 81.
STOP_FRACTION = 0.1

#: ... unless the kernel bounds its own error: where every product is the true one to a
#: relative ``product_rtol`` of at most :data:`KERNEL_SHARE` ``* accuracy`` (the exact kernel,
#: the block-local expansion), the iteration stops first at this fraction, the solve checks
#: the true kernel, and it goes on to :data:`STOP_FRACTION` only when the check misses the
#: accuracy (the sampled check's confidence margin). Measured on 10^5 uniform points per side
#: at reg 0.01 (polyts_local, a coarse start): 3 fine iterations instead of 6.
CERTIFY_FRACTION = 0.5

#: The largest kernel error (relative, per product) that leaves :data:`CERTIFY_FRACTION`'s
#: first stop its margin (the block-local kernel's is 4% of the accuracy:
#: :data:`~sketchot.kernels.local.RTOL_FRACTION`).
KERNEL_SHARE = 0.05

#: POT's tolerance on its L2 criterion, used when neither ``tol`` nor ``accuracy`` is given.
POT_TOL = 1e-9

#: ``check_every='auto'`` checks every iteration from this many kernel entries ``n m`` on (the
#: check reads the columns pass's products, ``O(m)``, negligible against an ``O(n m)``-ish
#: product; an iteration stopped early is worth more than the check), every
#: :data:`CHECK_EVERY_SMALL` iterations below (POT's pace, where the norms would show).
CHECK_EVERY_ITERATION_ENTRIES = 10_000_000
CHECK_EVERY_SMALL = 10

#: float32 products carry relative errors ~1e-7 per entry: a relative marginal error below
#: this is unreachable (in L2 terms: this fraction of ``||b||_2 / sum(b)``).
FLOAT32_RELATIVE_TOL = 1e-6


@dataclass(frozen=True)
class SolverOptions:
    """Options of :func:`sketchot.sinkhorn_kernel` (and of :func:`sketchot.sinkhorn`).

    Parameters
    ----------
    max_iter : int, default=1000
        Iterations at most (a pair of half-steps each).
    tol : float or None, default=None
        ``None``: stop at the accuracy asked for, when the L1 residual of the fixed point
        relative to ``sum(a)`` (for the exact kernel, the error the ``accuracy`` check
        measures) falls below :data:`STOP_FRACTION` ``* accuracy`` (first below
        :data:`CERTIFY_FRACTION` ``* accuracy`` for kernels that bound their own error, going
        on only when the true-kernel check misses the accuracy); with ``accuracy=None``,
        POT's criterion at ``1e-9``. A float: POT's criterion, stop when the L2
        column-marginal error ``||v * K^T u - b||_2 / sum(b)`` falls below ``tol`` (relative
        to the mass so that any total mass can converge). Checked every ``check_every``
        iterations. With float32 kernels the target is raised to what float32 resolves
        (``1e-6`` relative), with a warning.
    check_every : int or 'auto', default='auto'
        Iterations between convergence checks. ``'auto'``: every iteration when ``n m`` is
        at least :data:`CHECK_EVERY_ITERATION_ENTRIES` (a check costs ``O(m)``, the
        iteration far more), every 10 below (POT's pace) and on Dask (a check is a
        synchronisation).
    safeguard : {'exact', 'clip', 'raise', 'none'}, default='exact'
        What to do with non-positive or non-finite denominators ``K~ v``, ``K~^T u`` of a
        signed approximation: recompute them with the exact kernel, clip them to a small
        floor, raise :class:`~sketchot.NonPositiveKernelError`, or nothing (their scalings
        are set to 0; the paper's plain iteration, for benchmarks).
    log_domain : {'auto', True, False}, default='auto'
        The iteration's strategy (:mod:`sketchot.solver.engine`). ``'auto'`` and ``True``:
        the log-stable form the kernel declares: absorption for the exact kernel (Schmitzer
        2019; multiplicative passes on ``exp((f_i + g_j - C_ij) / reg)``, re-absorbing the
        scalings when they grow), finite for any ``reg`` and as fast as the plain iteration
        where that one works; log-domain passes for kernels with ``'log_products'``.
        ``False``: the plain multiplicative iteration (it can underflow at small ``reg``).
        ``True`` is rejected for kernels that offer neither.
    coarse_to_fine : {'auto', True, False}, default='auto'
        Start the fine iteration from potentials solved on cluster centres and extrapolated
        to the points (:mod:`sketchot.solver.multiscale`; named metrics, in memory). It only
        changes the start: the iteration still stops at ``tol`` and the result is checked
        as usual. ``'auto'``: for cold starts where the fine iterations are expensive and
        many (:func:`~sketchot.solver.multiscale.coarse_pays`: ``n m`` and the largest cost
        over ``reg`` both large).
    epsilon_scaling : {'auto', True, False}, default='auto'
        For kernels with the ``'exact'`` capability: solve with ``reg`` decreasing
        geometrically from the squared diameter, warm-starting each stage (annealing).
        ``'auto'``: when the largest cost over ``reg`` exceeds
        :data:`~sketchot.solver.sinkhorn.EPSILON_SCALING_SPREAD` (a cold start there needs
        thousands of iterations), and as a second attempt when a cold start stalls or breaks
        down.
    anderson : int or 'auto', default='auto'
        Memory of the Anderson acceleration of the column log-scalings
        (:mod:`sketchot.solver.acceleration`): each iteration extrapolates from the last
        ``anderson`` iterates, which cuts the iterations most at small ``reg``. ``'auto'``:
        5 on the log-domain paths (``'log_products'`` kernels, the exact kernel's stabilised
        path), 0 on the multiplicative path of low-rank kernels (large ``reg``, few
        iterations; and the Dask solve, which cannot mix without gathering ``v``, then gives
        the same iterates), except in ``backend='auto'``'s low-rank attempts, which mix.
        An integer applies to every in-memory path (a mixed ``v`` costs
        the low-rank path one extra projection ``R^T v``; a repaired pass restarts the
        history); Dask solves accept only ``0`` or ``'auto'``. ``0`` runs the plain Sinkhorn
        iteration (POT's iterates).
    accuracy : float or None, default=1e-3
        The contract: relative L1 marginal error of the returned scalings against the TRUE
        kernel, ``max(||u * (K v) - a||_1, ||v * (K^T u) - b||_1) / sum(a)``, estimated on
        sampled rows and columns with an upper confidence bound (see
        :class:`~sketchot.TrueKernelCheck`). ``None`` skips the check.
    certify_first : bool, default=True
        With ``tol=None``, in memory (the Dask and batched solvers stop at
        :data:`STOP_FRACTION` ``* accuracy`` only): on kernels that bound their own error,
        stop first at :data:`CERTIFY_FRACTION` ``* accuracy`` and let the true-kernel check
        decide (going on to :data:`STOP_FRACTION` only when it misses). ``False`` goes to
        :data:`STOP_FRACTION` at once: potentials about 5x closer to the fixed point, for
        answers that need more of them than the marginals' accuracy (gradients of a loss,
        which :func:`sketchot.sinkhorn_divergence` asks for by default).
    true_kernel_samples : int or 'auto', default='auto'
        Rows and columns of the true-kernel check; ``'auto'``: all of them when ``n m`` is at
        most 4e6 (the check is then exact), 256 otherwise.
    errors : {'raise', 'warn'}, default='raise'
        Impossible results (negative or non-finite cost or mass) raise
        :class:`~sketchot.InvalidResultError`; ``'warn'`` returns them with a warning.
    warn : bool, default=True
        Warn on non-convergence, repairs, and a missed accuracy target.
    verbose : bool, default=False
        Print the build, the error at every check and the true-kernel check.
    """

    max_iter: int = 1000
    tol: float | None = None
    check_every: int | str = "auto"
    safeguard: str = "exact"
    log_domain: bool | str = "auto"
    coarse_to_fine: bool | str = "auto"
    epsilon_scaling: bool | str = "auto"
    anderson: int | str = "auto"
    accuracy: float | None = DEFAULT_ACCURACY
    certify_first: bool = True
    true_kernel_samples: int | str = "auto"
    errors: str = "raise"
    warn: bool = True
    verbose: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "max_iter", check_int(self.max_iter, "max_iter", minimum=1))
        if self.tol is not None:
            set_(self, "tol", check_float(self.tol, "tol", positive=True))
        if isinstance(self.check_every, str):
            check_choice(self.check_every, "check_every", ("auto",))
        else:
            set_(self, "check_every", check_int(self.check_every, "check_every", minimum=1))
        check_choice(self.safeguard, "safeguard", SAFEGUARD_POLICIES)
        if isinstance(self.log_domain, str):
            check_choice(self.log_domain, "log_domain", ("auto",))
        else:
            try:
                set_(self, "log_domain", check_bool(self.log_domain, "log_domain"))
            except TypeError:
                raise TypeError(
                    f"log_domain must be 'auto', True or False; got {describe(self.log_domain)}"
                ) from None
        if isinstance(self.coarse_to_fine, str):
            check_choice(self.coarse_to_fine, "coarse_to_fine", ("auto",))
        else:
            set_(self, "coarse_to_fine", check_bool(self.coarse_to_fine, "coarse_to_fine"))
        if isinstance(self.epsilon_scaling, str):
            check_choice(self.epsilon_scaling, "epsilon_scaling", ("auto",))
        else:
            set_(self, "epsilon_scaling", check_bool(self.epsilon_scaling, "epsilon_scaling"))
        if isinstance(self.anderson, str):
            check_choice(self.anderson, "anderson", ("auto",))
        else:
            set_(self, "anderson", check_int(self.anderson, "anderson", minimum=0))
        if self.accuracy is not None:
            set_(self, "accuracy", check_float(self.accuracy, "accuracy", positive=True))
        set_(self, "certify_first", check_bool(self.certify_first, "certify_first"))
        if self.true_kernel_samples != "auto":
            set_(
                self,
                "true_kernel_samples",
                check_int(self.true_kernel_samples, "true_kernel_samples", minimum=1),
            )
        check_choice(self.errors, "errors", ERROR_POLICIES)
        set_(self, "warn", check_bool(self.warn, "warn"))
        set_(self, "verbose", check_bool(self.verbose, "verbose"))

    def check_interval(self, shape: tuple[int, int], deferred: bool = False) -> int:
        """Iterations between checks for a kernel of ``shape`` (``check_every``, or its
        ``'auto'`` rule); ``deferred``: a check is a synchronisation (Dask)."""
        if self.check_every != "auto":
            return self.check_every
        if deferred or shape[0] * shape[1] < CHECK_EVERY_ITERATION_ENTRIES:
            return CHECK_EVERY_SMALL
        return 1

    def anderson_memory(self, log_domain: bool) -> int:
        """The Anderson memory of a path: ``anderson``, or for ``'auto'`` the default memory
        on log-domain paths and 0 on the multiplicative one."""
        if self.anderson == "auto":
            return DEFAULT_ANDERSON_MEMORY if log_domain else 0
        return self.anderson

    def stopping(self, float32: bool = False, l2_ratio: Any = None) -> tuple[float, str]:
        """``(tol, norm)`` of the engine's check (:func:`~sketchot.solver.engine.iterate`).

        Parameters
        ----------
        float32 : bool
            Whether the kernel computes in float32: the target is raised to its floor
            (:data:`FLOAT32_RELATIVE_TOL`), with a warning when ``warn``.
        l2_ratio : callable, optional
            ``||b||_2 / sum(b)``, called only for a float32 floor on the L2 criterion.

        Returns
        -------
        tol : float
            The target of the residual.
        norm : {'l1', 'l2'}
            ``'l1'``: the accuracy's rule (``tol=None`` with an ``accuracy``); ``'l2'``:
            POT's criterion.
        """
        if self.tol is None and self.accuracy is not None:
            tol, norm = STOP_FRACTION * self.accuracy, "l1"
        else:
            tol, norm = (POT_TOL if self.tol is None else self.tol), "l2"
        if not float32:
            return tol, norm
        floor = FLOAT32_RELATIVE_TOL * (1.0 if norm == "l1" else float(l2_ratio()))
        if tol < floor:
            if self.warn:
                asked = f"tol={tol:g}"
                if norm == "l1":
                    asked = f"the stopping target {tol:g} ({STOP_FRACTION:g} x accuracy)"
                scale = "" if norm == "l1" else " ||b||_2 / sum(b)"
                warnings.warn(
                    f"{asked} is below what float32 kernels resolve; using {floor:.3g} "
                    f"(1e-6{scale}). Pass dtype=numpy.float64 for tighter tolerances.",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
            tol = floor
        return tol, norm

    def first_target(self, tol: float, norm: str, product_rtol: float | None) -> float:
        """The residual the iteration stops at first: :data:`CERTIFY_FRACTION` ``* accuracy``
        under the accuracy's rule (``norm='l1'``) when the kernel's products are within
        ``product_rtol <=`` :data:`KERNEL_SHARE` ``* accuracy`` of the true ones, ``tol``
        otherwise (a caller's ``tol``, a kernel whose error is not bounded, or
        ``certify_first=False``). Never below ``tol`` (a float32 floor raises both)."""
        if norm != "l1" or self.accuracy is None or product_rtol is None:
            return tol
        if not self.certify_first:
            return tol
        if product_rtol > KERNEL_SHARE * self.accuracy:
            return tol
        return max(tol, CERTIFY_FRACTION * self.accuracy)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def split(cls, kwargs: dict[str, Any]) -> tuple[SolverOptions, dict[str, Any]]:
        """``(options, the remaining keyword arguments)`` from a keyword-argument bag."""
        own = {k: kwargs[k] for k in cls.names() if k in kwargs}
        rest = {k: v for k, v in kwargs.items() if k not in own}
        return cls(**own), rest

    def as_dict(self) -> dict[str, Any]:
        """The options as a plain dict."""
        return asdict(self)
