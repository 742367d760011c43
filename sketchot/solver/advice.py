"""Advice for a result that missed its accuracy target, computed from what was measured.

* A kernel with the ``'exact'`` capability that did not converge: the number of iterations the
  measured convergence rate needs to reach ``tol`` (linear convergence of Sinkhorn), with a
  margin.
* An approximation: the exact kernel when ``n x m`` fits the dense budget (then the advice
  always works), else ``backend='auto'`` (which escalates until the accuracy is met), plus the
  backend record's own advice.

The advice never names the backend that just failed as its own fix; it is tested to work when
followed (``tests/solver/test_advice.py``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from .._memory import dense_budget_bytes
from ..kernels import get_backend

#: Largest cost / reg at which an exact solve (with its epsilon schedule) met the default
#: accuracy in the default 1000 iterations on every cloud measured (colour-like and Gaussian,
#: d = 2 and 3, n = 120-500: bounds 1e-6 at 1.7e4-2.2e4); at 1.7e5-2.2e5 some did (bounds
#: 3e-5-1e-4), some stalled (4e-3), and at 1.7e6 none did.
RESOLVED_SPREAD = 2e4

#: Largest cost / reg beyond which ``exp(-cost / reg)`` is below float64's smallest normal
#: number (``-log(tiny)`` is about 708): the plain iteration's kernel has zero entries there.
UNDERFLOW_SPREAD = -math.log(sys.float_info.min)

STOPS = {"max_iter": "reached max_iter", "breakdown": "broke down"}

#: Margin on the extrapolated number of iterations: Sinkhorn's rate slows down as it goes.
ITERATION_MARGIN = 2.0

#: Factor on max_iter when too few checks were made to measure a rate (at least the default
#: max_iter, 1000).
BLIND_FACTOR = 10
BLIND_MINIMUM = 1000


def iterations_needed(history: list[tuple[int, float]], tol: float) -> int | None:
    """Iterations to reach ``tol`` at the rate measured between the last two checks after the
    first iteration (whose fast initial drop says nothing about the tail); ``None`` when no
    such rate exists or the error did not decrease."""
    checks = [entry for entry in history if entry[0] > 1]
    if len(checks) < 2:
        return None
    first, last = checks[-2], checks[-1]
    if not (0 < last[1] < first[1]) or last[0] <= first[0]:
        return None  # no decrease, or two checks at one iteration (a Newton stage's)
    rate = math.log(last[1] / first[1]) / (last[0] - first[0])
    return math.ceil(last[0] + math.log(tol / last[1]) / rate)


def _reg_advice(result: Any) -> str:
    """A stalled exact solve: its progress per iteration shrinks like ``reg / cost``, so the
    fix is a larger reg, at most :data:`RESOLVED_SPREAD` below the largest cost."""
    spread = result.kernel.geometry.max_cost()
    suggestion = float(f"{spread / RESOLVED_SPREAD:.2g}")
    scheduled = "stages" in result.iteration_info
    return (
        f"The exact kernel's iteration {STOPS.get(result.stop, result.stop)} at "
        f"reg={result.reg:g} (largest cost / reg "
        f"= {spread / result.reg:.2g}){', even with an epsilon schedule' if scheduled else ''}"
        f": its progress per iteration shrinks like reg / cost. Pass reg={suggestion:g} or "
        "larger (largest cost / "
        f"reg <= {RESOLVED_SPREAD:.0e}), or use an exact OT solver (ot.emd) for unregularised "
        "transport."
    )


def _plain_underflow(result: Any) -> str:
    """The plain iteration asked for (``log_domain=False``) where the kernel's entries
    ``exp(-cost / reg)`` leave float64 (largest cost / reg beyond :data:`UNDERFLOW_SPREAD`):
    no ``max_iter`` or ``reg`` nearby mends it, the log-stable iteration does. ``''``
    otherwise."""
    plain = result.options.get("log_domain") is False
    stable = result.kernel.info.capabilities & {"absorb", "log_products"}
    spread = result.kernel.geometry.max_cost() / result.reg
    if not (plain and stable and spread > UNDERFLOW_SPREAD):
        return ""
    return (
        f"The plain iteration (log_domain=False) at reg={result.reg:g} multiplies kernel "
        f"entries down to exp(-{spread:.3g}), below float64's smallest number: pass "
        "log_domain='auto' (the log-stable iteration, finite at any reg)."
    )


def advise(result: Any) -> str:
    """One or two sentences: what to change, from the measured errors and iterations.

    ``result`` is a :class:`~sketchot.SinkhornResult` (whose module calls this one: no
    import back)."""
    backend = result.backend
    check = result.true_kernel
    n, m = result.kernel.shape
    if "exact" in result.kernel.info.capabilities:
        underflow = _plain_underflow(result)
        if underflow:
            return underflow
        stalled = result.stop in ("stalled", "breakdown")
        beyond = result.kernel.geometry.max_cost() / result.reg > RESOLVED_SPREAD
        if stalled or (beyond and result.n_iter >= BLIND_MINIMUM):
            return _reg_advice(result)
        if not result.converged:
            needed = iterations_needed(result.error_history, result.tol)
            if needed is None:
                blind = max(BLIND_MINIMUM, BLIND_FACTOR * result.n_iter)
                return (
                    f"The exact kernel did not converge in {result.n_iter} iterations, too few "
                    f"to measure its rate: pass max_iter={blind} (or a larger reg)."
                )
            return (
                f"The exact kernel did not converge in {result.n_iter} iterations; at the "
                f"measured rate it needs about {needed}: pass "
                f"max_iter={math.ceil(ITERATION_MARGIN * needed)} (or a larger reg)."
            )
        return "Tighten tol: the exact kernel's error is the solver's own marginal error."
    measured = f" (measured {check.relative:.2g})" if check is not None else ""
    itemsize = result.kernel.dtype.itemsize
    if n * m * itemsize <= dense_budget_bytes():
        fix = (
            f"pass backend='exact' (the {n} x {m} kernel takes "
            f"{max(n * m * itemsize / 2**20, 0.1):.1f} MiB) or backend='auto'"
        )
    else:
        fix = (
            "pass backend='auto', which escalates (adaptive rank, then the exact kernel) "
            "until the accuracy is met"
        )
    try:
        record_advice = get_backend(backend).advice
    except ValueError:
        record_advice = ""
    text = f"The {backend!r} kernel is too coarse at reg={result.reg:g}{measured}: {fix}"
    return text + (f"; {record_advice}." if record_advice else ".")
