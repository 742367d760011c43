"""What the solver does with non-positive denominators of a signed approximate kernel.

RFF, Nystrom and sketched kernels are signed approximations: ``(K~ v)_i`` or ``(K~^T u)_j`` can
be zero, negative or not finite, and ``u_i = a_i / (K~ v)_i`` would then be negative, infinite
or NaN (POT's solvers let that through). Every fused pass of the operator reports such
entries in a mask; :class:`Safeguard` applies the policy chosen by ``safeguard=``:

``'exact'``
    Recompute each bad denominator with the true kernel row or column (``O(m d)`` each), from
    the operator's geometry. If more than 1% of a pass is bad (the approximation is broken and
    repairing it would cost more than the exact kernel), or the exact value underflows, clip.
``'clip'``
    Replace it by ``1e-12`` times the largest healthy denominator of the pass.
``'raise'``
    Raise :class:`NonPositiveKernelError`.
``'none'``
    Leave its scaling at 0.
``'propagate'``
    Keep the raw ratio, whatever its sign or finiteness (the literal update of the paper's
    protocol: faults are counted and propagate).

The plan stays ``diag(u) K~ diag(v)``, so repairs show up honestly in the marginal errors and
the true-kernel check. Counts go to ``SinkhornResult.safeguard``; one warning sums them up.
"""

from __future__ import annotations

import warnings

import numpy as np

from .._validation import user_stacklevel
from ..kernels import IDENTITY_STEP, FusedPass, KernelOperator, RatioStep, get_backend
from .errors import KernelSafeguardWarning, NonPositiveKernelError

# Floor of the 'clip' policy, relative to the largest healthy denominator of the pass.
CLIP_RATIO = 1e-12

# Largest fraction of a pass the 'exact' policy recomputes: each entry costs a true-kernel row,
# so at 1% the repairs stay below ~2% of an exact iteration's work.
EXACT_REPAIR_FRACTION = 0.01


class Safeguard:
    """Applies a policy to the bad entries of fused passes, and counts what it did."""

    def __init__(self, kernel: KernelOperator, policy: str) -> None:
        self.kernel = kernel
        self.policy = policy
        self.counts = {"rows_repaired": 0, "cols_repaired": 0, "clipped": 0}
        # every bad entry seen, whatever the policy did with it (the plain protocol's faults)
        self.faults = 0
        self.budget_exceeded = False

    @property
    def repaired(self) -> bool:
        """Whether any denominator has been repaired so far."""
        return bool(self.counts["rows_repaired"] or self.counts["cols_repaired"])

    def apply(
        self,
        side: str,
        result: FusedPass,
        numerator: np.ndarray,
        other: np.ndarray,
        step: RatioStep = IDENTITY_STEP,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Repaired ``(ratios, projection)`` of a pass with bad entries.

        ``other`` is the vector the pass multiplied (``v`` for ``'rows'``, ``u`` for
        ``'cols'``), which the exact repair needs; ``step`` the penalty step of the pass.
        """
        positions = np.flatnonzero(result.bad)
        count = positions.size
        self.faults += count
        if self.policy == "none":
            return result.ratios, result.projection
        if self.policy == "propagate":
            ratios = result.ratios.copy()
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                ratios[positions] = step.take(positions).apply(
                    numerator[positions] / result.products[positions]
                )
            projection = result.projection + self.kernel.project(side, ratios[positions], positions)
            return ratios, projection
        if self.policy == "raise":
            what = "K~ v" if side == "rows" else "K~^T u"
            raise NonPositiveKernelError(
                f"backend {self.kernel.info.backend!r}: {count} entries of {what} are not "
                f"positive (reg={self.kernel.geometry.reg:g}); {_advice(self.kernel)}, or pass "
                "safeguard='exact' to recompute them with the exact kernel"
            )
        self.counts[f"{side}_repaired"] += count
        denominators = result.products[positions].copy()
        unresolved = np.ones(count, dtype=bool)
        if self.policy == "exact":
            if count > EXACT_REPAIR_FRACTION * result.bad.size:
                self.budget_exceeded = True
            else:
                denominators = self.kernel.geometry.matmat(
                    positions, other, transpose=side == "cols"
                )
                unresolved = ~(denominators > 0)
        if unresolved.any():
            self.counts["clipped"] += int(unresolved.sum())
            healthy = result.products[~result.bad & (result.products > 0)]
            healthy = healthy[np.isfinite(healthy)]
            denominators[unresolved] = CLIP_RATIO * (healthy.max() if healthy.size else 1.0)
        ratios = result.ratios.copy()
        ratios[positions] = step.take(positions).apply(numerator[positions] / denominators)
        projection = result.projection + self.kernel.project(side, ratios[positions], positions)
        return ratios, projection

    def count_deferred(self, side: str, count: int) -> None:
        """``count`` bad entries of a pass of a ``'deferred'`` operator, seen only after the
        pass was computed (their ratios are already 0, as ``'none'`` leaves them). The other
        policies rewrite entries in the pass's values, which the solver never holds: they
        raise, ``'raise'`` as usual and the repairing ones saying what to pass instead."""
        self.faults += count
        if self.policy == "none":
            return
        what = "K~ v" if side == "rows" else "K~^T u"
        reason = (
            ""
            if self.policy == "raise"
            else f"; safeguard={self.policy!r} needs the pass's values, which backend "
            f"{self.kernel.info.backend!r} computes lazily (e.g. on a Dask cluster): pass "
            "safeguard='none' (their scalings are set to 0) or 'raise'"
        )
        raise NonPositiveKernelError(
            f"backend {self.kernel.info.backend!r}: {count} entries of {what} are not "
            f"positive (reg={self.kernel.geometry.reg:g}){reason}; {_advice(self.kernel)}"
        )

    def warn(self, n_iter: int) -> None:
        """One warning summarising the repairs, if any were made."""
        rows, cols = self.counts["rows_repaired"], self.counts["cols_repaired"]
        if rows + cols == 0 or self.policy in ("none", "propagate"):
            return
        action = {
            "exact": "recomputed them with the exact kernel",
            "clip": "clipped them to a small positive floor",
        }[self.policy]
        clipped = self.counts["clipped"]
        extra = ""
        if clipped and self.policy == "exact":
            reason = (
                "more than 1% of a pass was non-positive: the approximation is broken"
                if self.budget_exceeded
                else "the exact value underflowed"
            )
            extra = f" ({clipped} were clipped instead: {reason})"
        warnings.warn(
            f"backend {self.kernel.info.backend!r} gave {rows} non-positive or non-finite "
            f"entries of K~ v and {cols} of K~^T u over {n_iter} iterations at "
            f"reg={self.kernel.geometry.reg:g}; safeguard={self.policy!r} {action}{extra}. "
            f"The approximation is too coarse here: {_advice(self.kernel)}.",
            KernelSafeguardWarning,
            stacklevel=user_stacklevel(),
        )


def _advice(kernel: KernelOperator) -> str:
    """The backend record's advice (its own words), or a generic one."""
    try:
        advice = get_backend(kernel.info.backend).advice
    except ValueError:
        advice = ""
    return advice or "increase reg"
