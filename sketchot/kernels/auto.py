"""Choosing a kernel representation from the problem: the kernel-level half of ``'auto'``.

:func:`choose_kernel` (what ``make_kernel(..., backend='auto')`` does) tries the cheapest
representation first and measures it: the exact kernel stored densely when ``n x m`` fits the
dense budget; otherwise Nystrom with a rank that doubles until a sampled relative error of
``K~ v`` against the true ``K v`` meets the target, while an iteration stays cheaper than an
exact one; otherwise the exact kernel streamed in row blocks. The solver's ``'auto'``
(:mod:`sketchot.solver.auto`) uses the same ladder but judges each rung by the TRUE-kernel
marginal error of the solved scalings, which is what the user's accuracy means.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY, DEFAULT_MAX_DENSE_BYTES
from .._memory import USABLE_FRACTION, available_bytes
from .._validation import check_rng
from ..gibbs import GibbsGeometry
from .base import KernelOperator
from .registry import build_backend

#: The low-rank backend of the ladder, and its first rank (doubled at each rung).
LOW_RANK_BACKEND = "nystrom"
FIRST_RANK = 64

#: Rows and columns on which a kernel's products are compared with the true kernel.
KERNEL_CHECK_ROWS = 64

#: A low-rank rung whose error falls by less than this factor when the rank doubles is
#: considered stalled: the kernel is beyond low rank at this reg (the error of a global
#: approximation is absolute, and Sinkhorn's scalings amplify it on the small entries).
STALL_FACTOR = 2.0


@dataclass(frozen=True)
class Attempt:
    """One rung tried by ``'auto'``: what was built and what was measured."""

    backend: str
    params: dict[str, Any]
    error: float
    seconds: float
    accepted: bool
    note: str = ""

    def __str__(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        verdict = "accepted" if self.accepted else "rejected"
        return (
            f"{self.backend}({params}): error {self.error:.2g}, {self.seconds:.2f} s, {verdict}"
            + (f" ({self.note})" if self.note else "")
        )


def dense_budget_bytes() -> float:
    """Bytes the exact kernel may take when stored: 1 GiB, or less when memory is short."""
    return min(DEFAULT_MAX_DENSE_BYTES, USABLE_FRACTION * available_bytes())


def max_useful_rank(n: int, m: int) -> int:
    """Largest rank whose iteration (``~4 (n + m) r`` flops) is cheaper than an exact one
    (``~2 n m`` for a stored kernel, several times more streamed): ``n m / (n + m)``."""
    return max(1, (n * m) // (n + m))


def kernel_error(kernel: KernelOperator, rng: Any = None, n_rows: int = KERNEL_CHECK_ROWS) -> float:
    """Largest relative error of ``K~ v`` and ``K~^T u`` against the true kernel on sampled rows
    and columns, for an all-ones and a random positive vector (``O(n_rows (n + m) d)``)."""
    generator = check_rng(rng)
    g = kernel.geometry
    n, m = kernel.shape
    worst = 0.0
    for transpose, size, other in ((False, n, m), (True, m, n)):
        index = np.sort(generator.choice(size, size=min(n_rows, size), replace=False))
        probes = np.column_stack([np.ones(other), generator.random(other) + 0.1])
        truth = g.matmat(index, probes, transpose=transpose)
        approx = kernel.rmatmat(probes) if transpose else kernel.matmat(probes)
        with np.errstate(divide="ignore", invalid="ignore"):
            error = np.abs(approx[index] - truth) / truth
        worst = max(worst, float(np.nanmax(np.where(np.isfinite(error), error, np.inf))))
    return worst


def low_rank_ladder(n: int, m: int) -> list[int]:
    """Ranks tried by ``'auto'``: 64, 128, ... up to :func:`max_useful_rank`."""
    cap = min(max_useful_rank(n, m), n + m)
    ranks = []
    rank = min(FIRST_RANK, cap)
    while rank <= cap:
        ranks.append(rank)
        rank *= 2
    return ranks


def adaptive_rank(
    geometry: GibbsGeometry,
    backend: str,
    *,
    accuracy: float = DEFAULT_ACCURACY,
    rng: Any = None,
    dtype: Any = np.float64,
    build: Callable[..., KernelOperator] = build_backend,
    measure: Callable[[KernelOperator, Any], float] = kernel_error,
    **params: Any,
) -> KernelOperator:
    """A low-rank backend at the smallest doubling rank (64, 128, ...) whose sampled kernel
    error (:func:`kernel_error`) meets ``accuracy``; stops at :func:`max_useful_rank` or when
    doubling no longer halves the error, and returns the last kernel built, with
    ``info.reason`` saying which case it was. The reference is adaptive Nystrom with a
    doubling trick (Altschuler, Bach, Rudi, Niles-Weed 2019), whose rank comes from an
    effective-dimension bound; here it is measured.

    ``build(geometry, backend, rng=, dtype=, rank=, **params)`` and ``measure(kernel, rng)``
    default to the in-memory builder and check (a chunked geometry passes its own).
    """
    generator = check_rng(rng)
    n, m = geometry.shape
    previous = np.inf
    kernel = None
    for rank in low_rank_ladder(n, m):
        kernel = build(geometry, backend, rng=generator, dtype=dtype, rank=rank, **params)
        error = measure(kernel, generator)
        if error <= accuracy:
            kernel.info.reason = f"rank {rank}: sampled kernel error {error:.2g} <= {accuracy:g}"
            return kernel
        if previous / error < STALL_FACTOR:
            break
        previous = error
    kernel.info.reason = (
        f"rank {kernel.info.rank}: sampled kernel error {error:.2g} > {accuracy:g}, and a larger "
        "rank would not pay (stalled, or costlier than the exact kernel)"
    )
    return kernel


def choose_kernel(
    geometry: GibbsGeometry,
    *,
    accuracy: float = DEFAULT_ACCURACY,
    rng: Any = None,
    dtype: Any = np.float64,
    verbose: bool = False,
    build: Callable[..., KernelOperator] = build_backend,
    measure: Callable[[KernelOperator, Any], float] = kernel_error,
    store: bool = True,
) -> tuple[KernelOperator, str, list[Attempt]]:
    """The cheapest kernel whose sampled product error meets ``accuracy``.

    ``build`` and ``measure`` as in :func:`adaptive_rank`; ``store=False`` (a geometry whose
    kernel is never stored, e.g. on a cluster) skips the stored exact kernel.

    Returns ``(kernel, reason, attempts)``.
    """
    n, m = geometry.shape
    attempts: list[Attempt] = []
    itemsize = np.dtype(dtype).itemsize
    if store and n * m * itemsize <= dense_budget_bytes():
        kernel = build(geometry, "exact", dtype=dtype)
        reason = f"n x m = {n} x {m} fits the dense budget: the exact kernel, stored"
        return kernel, reason, attempts
    previous = np.inf
    generator = check_rng(rng)
    for rank in low_rank_ladder(n, m):
        start = time.perf_counter()
        kernel = build(geometry, LOW_RANK_BACKEND, rng=generator, dtype=dtype, rank=rank)
        error = measure(kernel, generator)
        accepted = error <= accuracy
        attempts.append(
            Attempt(LOW_RANK_BACKEND, {"rank": rank}, error, time.perf_counter() - start, accepted)
        )
        if verbose:
            print(f"sketchot auto: {attempts[-1]}")
        if accepted:
            reason = f"{LOW_RANK_BACKEND} at rank {rank}: sampled kernel error {error:.2g}"
            return kernel, reason, attempts
        if error > accuracy and previous / error < STALL_FACTOR:
            break
        previous = error
    kernel = build(geometry, "exact", dtype=dtype, max_dense_bytes=0)
    reason = "no low rank met the target before costing more than the exact kernel: streamed"
    return kernel, reason, attempts
