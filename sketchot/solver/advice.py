"""Advice for a result that missed its accuracy target, computed from what was measured.

The advice never names the backend that just failed as its own fix. It is tested to work
when followed (``tests/solver/test_advice.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernels import get_backend

if TYPE_CHECKING:
    from .result import SinkhornResult


def advise(result: SinkhornResult) -> str:
    """One or two sentences: what to change, from the measured errors and iterations."""
    backend = result.backend
    check = result.true_kernel
    if "exact" in result.kernel.info.capabilities:
        if not result.converged:
            history = result.error_history
            trend = (
                f" (marginal error {history[0][1]:.2g} -> {history[-1][1]:.2g})"
                if len(history) >= 2
                else ""
            )
            return (
                f"The exact kernel did not converge in {result.n_iter} iterations{trend}: "
                f"increase max_iter (or reg)."
            )
        return "Tighten tol (the exact kernel's error is the solver's own marginal error)."
    measured = f" (measured {check.relative:.2g})" if check is not None else ""
    try:
        record_advice = get_backend(backend).advice
    except ValueError:
        record_advice = ""
    text = (
        f"The {backend!r} kernel is too coarse at reg={result.reg:g}{measured}: use "
        "backend='auto', which escalates (adaptive rank, then the exact kernel) until the "
        "accuracy is met"
    )
    return text + (f"; {record_advice}." if record_advice else ".")
