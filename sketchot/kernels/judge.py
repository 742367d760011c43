"""Judging a kernel: the sampled product error against the true kernel, a judge's verdict,
the record of one candidate tried, and :func:`escalate` (the first accepted of a backend's
own candidates: ``polyts``'s ``variant='auto'``).

These are the tools of every choice; the choice among backends and of their parameters
(``backend='auto'``, ``rank='auto'``) is the policy's, :mod:`sketchot.policy`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validation import check_rng
from .base import KernelOperator
from .registry import get_backend, rebuild_parameters

#: Rows and columns on which a kernel's products are compared with the true kernel.
KERNEL_CHECK_ROWS = 64


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


@dataclass(frozen=True)
class Verdict:
    """A judge's answer on one candidate: the measured error, whether it is accepted, what
    was measured (``note``), and the outcome (the kernel, or the solve's result; ``None``
    when nothing came out)."""

    error: float
    accepted: bool
    note: str
    outcome: Any = None


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` chose: the outcome of the accepted (or final) candidate, its
    kernel, why, every rung tried, and ``replay``: ``{'backend': name, **parameters}``, the
    explicit call that builds the same kernel (with the same ``rng``)."""

    outcome: Any
    kernel: KernelOperator
    reason: str
    attempts: tuple[Attempt, ...] = field(default_factory=tuple)
    replay: dict[str, Any] = field(default_factory=dict)


def replay_parameters(kernel: KernelOperator) -> dict[str, Any]:
    """``{'backend': name, 'dtype': ..., **parameters}``: what builds ``kernel`` again by an
    explicit ``backend=`` call with the same ``rng`` (its builder's parameters among
    ``info.params``: a rank that ``'auto'`` chose, ``tau``, a tolerance)."""
    name = kernel.info.backend
    return {
        "backend": name,
        "dtype": np.dtype(kernel.dtype).name,
        **rebuild_parameters(name, kernel.info.params),
    }


def candidate_rng(rng: Any, generator: np.random.Generator) -> Any:
    """The ``rng`` each candidate is built and judged with: the caller's seed as given (each
    candidate draws afresh from it, as an explicit ``backend=`` call would, so that the
    chosen one replays bit for bit), or the caller's own Generator (its draws go on)."""
    if isinstance(rng, (np.random.Generator, np.random.BitGenerator)):
        return generator
    return rng


#: ``judge(kernel, kind, error) -> Verdict``: ``kind`` is the record's kind, ``error`` the
#: sampled kernel error (``nan`` when not measured); ``kind=None`` is the final exact kernel,
#: used whatever it measures.
Judge = Callable[[KernelOperator, "str | None", float], Verdict]


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


def kernel_judge(accuracy: float, rng: Any = None, measure: Callable = kernel_error) -> Judge:
    """The judge of a kernel alone: its sampled product error (``measure(kernel, rng)``, unless
    the ladder measured it already) against ``accuracy``."""
    generator = check_rng(rng)

    def judge(kernel: KernelOperator, kind: str | None, error: float) -> Verdict:
        if kind is None:
            return Verdict(np.nan, True, "the exact kernel", kernel)
        if np.isnan(error):
            error = measure(kernel, generator)
        return Verdict(error, bool(error <= accuracy), "sampled kernel error", kernel)

    return judge


def escalate(
    candidates: list[tuple[str, Callable[[], KernelOperator]]],
    judge: Judge,
    *,
    skip: tuple[type[Exception], ...] = (),
) -> Choice:
    """The first candidate the judge accepts, in order, else the first one built: the ladder
    of a backend's own ``'auto'`` (``polyts``'s ``variant='auto'``).

    ``candidates`` are ``(backend, build)`` pairs, ``build()`` returning a kernel of that
    registered backend (the judge is told its record's kind); a build that raises one of
    ``skip`` (e.g. nothing to fit) is recorded and skipped, and raised again when no
    candidate could be built.
    """
    attempts: list[Attempt] = []
    first, failure = None, None
    for name, build in candidates:
        start = time.perf_counter()
        try:
            kernel = build()
        except skip as error:
            failure = failure or error
            attempts.append(Attempt(name, {}, np.nan, time.perf_counter() - start, False,
                                    f"not built: {error}"))  # fmt: skip
            continue
        verdict = judge(kernel, get_backend(name).kind, np.nan)
        attempts.append(Attempt(name, {}, verdict.error, time.perf_counter() - start,
                                verdict.accepted, verdict.note))  # fmt: skip
        if verdict.accepted:
            reason = f"{name}: {verdict.note} {verdict.error:.2g}, accepted"
            return Choice(verdict.outcome, kernel, reason, tuple(attempts))
        first = first or (kernel, verdict)
    if first is None:
        raise failure
    kernel, verdict = first
    tried = "; ".join(str(attempt) for attempt in attempts)
    reason = f"{kernel.info.backend}: no candidate accepted ({tried}), the first one built"
    return Choice(verdict.outcome, kernel, reason, tuple(attempts))
