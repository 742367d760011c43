"""``backend='auto'``: the cheapest solve that meets the accuracy, escalating when it does not.

The ladder, cheapest first (each rung is judged by the TRUE-kernel marginal error of its
solved scalings, the user's ``accuracy``):

1. the exact kernel stored densely, when ``n x m`` fits the dense budget (1 GiB): a
   2000-point problem is simply solved exactly;
2. Nystrom with k-center landmarks at ranks 64, 128, ... while an iteration stays cheaper
   than an exact one; it stops early when doubling the rank no longer halves the kernel
   error (below about a tenth of the data's squared spread no global low rank works);
3. in dimension <= 4, the block-local polynomial kernel (``polyts`` with
   ``variant='local'``: every entry to a relative 1e-9, at any reg);
4. the exact kernel streamed in row blocks, with an estimate of its time before it starts.

The result says what was chosen and why (``result.backend``, ``result.reason``) and lists
every rung tried (``result.attempts``); ``verbose=True`` prints them as they happen.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

import numpy as np

from .._validation import check_rng
from ..gibbs import GibbsGeometry
from ..kernels import build_kernel
from ..kernels.auto import (
    LOW_RANK_BACKEND,
    STALL_FACTOR,
    Attempt,
    dense_budget_bytes,
    kernel_error,
    low_rank_ladder,
)
from .options import SolverOptions
from .result import SinkhornResult

#: The block-local polynomial kernel is tried up to this dimension (its feature count
#: C(degree + d, d) stays within 1000 at the default degree).
LOCAL_MAX_DIMENSION = 4

#: An exploratory low-rank solve whose sampled kernel error exceeds the target by more than
#: this factor is not run: its scalings could not meet the target.
HOPELESS_FACTOR = 10.0


def solve_auto(
    a: np.ndarray,
    b: np.ndarray,
    geometry: GibbsGeometry,
    options: SolverOptions,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    notes: list[str] | None = None,
    solve: Any,
) -> SinkhornResult:
    """Run the ladder; ``solve(a, b, kernel, options, rng=, notes=)`` runs one rung."""
    n, m = geometry.shape
    itemsize = np.dtype(dtype).itemsize
    target = options.accuracy if options.accuracy is not None else 1e-3
    attempts: list[Attempt] = []

    def say(text: str) -> None:
        if options.verbose:
            print(f"sketchot auto: {text}")

    def record(rank: int, error: float, start: float, accepted: bool, note: str) -> None:
        seconds = time.perf_counter() - start
        attempts.append(Attempt(LOW_RANK_BACKEND, {"rank": rank}, error, seconds, accepted, note))
        say(str(attempts[-1]))

    def finish(result: SinkhornResult, reason: str) -> SinkhornResult:
        result.reason = reason
        result.attempts = attempts
        say(f"chose {result.backend}: {reason}")
        return result

    if n * m * itemsize <= dense_budget_bytes():
        kernel = build_kernel(geometry, "exact", dtype=dtype)
        reason = (
            f"n x m = {n} x {m} ({n * m * itemsize / 2**20:.0f} MiB) fits the dense budget: "
            "the exact kernel, stored"
        )
        return finish(solve(a, b, kernel, options, rng=rng, notes=notes), reason)

    generator = check_rng(rng)
    quiet = dataclasses.replace(options, warn=False, errors="warn", verbose=False)
    previous = np.inf
    for rank in low_rank_ladder(n, m):
        start = time.perf_counter()
        kernel = build_kernel(geometry, LOW_RANK_BACKEND, rng=generator, dtype=dtype, rank=rank)
        error = kernel_error(kernel, generator)
        if error > HOPELESS_FACTOR * target:
            record(rank, error, start, False, "sampled kernel error too large to solve")
            if previous / error < STALL_FACTOR:
                break
            previous = error
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = solve(a, b, kernel, quiet, rng=generator, notes=notes)
        check = result.true_kernel
        measured = check.bound if check is not None else np.inf
        accepted = bool(result.accuracy_met) and _possible(result)
        record(rank, measured, start, accepted, "true-kernel marginal error of the solve")
        if accepted:
            result.options = options.as_dict()
            reason = (
                f"n x m too large to store; {LOW_RANK_BACKEND} at rank {rank} meets "
                f"accuracy={target:g} against the true kernel (bound {measured:.2g})"
            )
            return finish(result, reason)
        if previous / max(measured, error) < STALL_FACTOR:
            break
        previous = max(measured, error)

    if geometry.X.shape[1] <= LOCAL_MAX_DIMENSION:
        start = time.perf_counter()
        kernel = build_kernel(geometry, "polyts", rng=generator, dtype=dtype, variant="local")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = solve(a, b, kernel, quiet, rng=generator, notes=notes)
        measured = result.true_kernel.bound if result.true_kernel is not None else np.inf
        accepted = bool(result.accuracy_met) and _possible(result)
        attempts.append(
            Attempt(
                "polyts",
                {"variant": "local"},
                measured,
                time.perf_counter() - start,
                accepted,
                "true-kernel marginal error of the solve",
            )
        )
        say(str(attempts[-1]))
        if accepted:
            result.options = options.as_dict()
            clusters = kernel.info.params.get("clusters")
            reason = (
                "no global low rank meets the accuracy at this reg; the block-local "
                f"polynomial kernel ({clusters} clusters, entries to a relative "
                f"{kernel.info.params.get('entry_error_bound', 0):.1g}) does "
                f"(bound {measured:.2g})"
            )
            return finish(result, reason)

    kernel = build_kernel(geometry, "exact", dtype=dtype, max_dense_bytes=0)
    estimate = kernel.info.seconds_per_pass
    if estimate is not None:
        say(
            f"the exact kernel streamed: about {estimate:.2g} s per iteration "
            f"(at most {options.max_iter} iterations)"
        )
    reason = (
        "n x m too large to store and no low rank met the accuracy while cheaper than the "
        "exact kernel: the exact kernel, streamed"
    )
    return finish(solve(a, b, kernel, options, rng=generator, notes=notes), reason)


def _possible(result: SinkhornResult) -> bool:
    """Whether the result's cost and mass are possible (finite, non-negative)."""
    return bool(
        np.isfinite(result.value_linear)
        and result.value_linear >= 0
        and np.isfinite(result.mass)
        and result.mass > 0
    )
