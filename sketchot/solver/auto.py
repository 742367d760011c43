"""``backend='auto'``: the cheapest solve that meets the accuracy, escalating when it does not.

The ladder, cheapest first (each rung is judged by the TRUE-kernel marginal error of its
solved scalings, the user's ``accuracy``):

1. the exact kernel stored densely, when ``n x m`` is small (at most 5000 x 5000): a
   2000-point problem is simply solved exactly;
2. Nystrom with k-center landmarks at ranks 64, 128, ... (in dimension >= 20 also the
   improved polynomial sketch at the same rank, keeping the more accurate) while an
   iteration stays cheaper than an exact one; it stops as soon as the measured rate of the
   error per doubling cannot reach the target (below about a tenth of the data's squared
   spread no global low rank works);
3. in dimension <= 4, the block-local polynomial kernel (``polyts`` with
   ``variant='local'``: every entry to a relative 1e-9, at any reg), when one of its
   iterations (timed) is cheaper than one of the exact kernel (timed on a few rows);
4. the exact kernel, stored when ``n x m`` fits the dense budget (1 GiB), streamed in row
   blocks otherwise, with an estimate of its time before it starts.

The result says what was chosen and why (``result.backend``, ``result.reason``) and lists
every rung tried (``result.attempts``); ``verbose=True`` prints them as they happen.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._validation import check_rng
from ..gibbs import GibbsGeometry
from ..kernels import build_kernel, get_backend
from ..kernels.auto import (
    LOW_RANK_BACKEND,
    STALL_FACTOR,
    Attempt,
    dense_budget_bytes,
    kernel_error,
    low_rank_ladder,
)
from .errors import NonPositiveKernelError
from .options import DEFAULT_ANDERSON_MEMORY, SolverOptions
from .problem import Problem
from .result import SinkhornResult

#: Up to this many kernel entries (5000 x 5000) the exact kernel is stored and used directly:
#: its build and iterations then cost about what POT's dense solver costs.
DIRECT_DENSE_ENTRIES = 25_000_000

#: From this dimension on, each rank of the ladder also measures the improved polynomial
#: sketch (it beat Nystrom at equal rank on isotropic data with d >= 20:
#: benchmarks/results/kernel_approx.md); below, Nystrom won every case measured.
SKETCH_MIN_DIMENSION = 20

#: Rows timed to estimate one iteration of the exact kernel.
TIMED_ROWS = 256

#: Iterations over which the build of a stored exact kernel is counted in the comparison.
BUILD_AMORTISED = 100

#: The block-local polynomial kernel is tried up to this dimension (its feature count
#: C(degree + d, d) stays within 1000 at the default degree).
LOCAL_MAX_DIMENSION = 4

#: An exploratory low-rank solve whose sampled kernel error exceeds the target by more than
#: this factor is not run: its scalings could not meet the target.
HOPELESS_FACTOR = 10.0


def solve_auto(
    problem: Problem,
    geometry: GibbsGeometry,
    options: SolverOptions,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    solve: Any,
) -> SinkhornResult:
    """Run the ladder; ``solve(problem, kernel, options, rng=)`` runs one rung."""
    n, m = geometry.shape
    itemsize = np.dtype(dtype).itemsize
    target = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
    attempts: list[Attempt] = []

    def say(text: str) -> None:
        if options.verbose:
            print(f"sketchot auto: {text}")

    def record(rank: int, error: float, start: float, accepted: bool, note: str) -> None:
        seconds = time.perf_counter() - start
        name = kernel.info.backend
        attempts.append(Attempt(name, {"rank": rank}, error, seconds, accepted, note))
        say(str(attempts[-1]))

    def finish(result: SinkhornResult, reason: str) -> SinkhornResult:
        result.reason = reason
        result.attempts = attempts
        say(f"chose {result.backend}: {reason}")
        return result

    dense_fits = n * m * itemsize <= dense_budget_bytes()
    if dense_fits and n * m <= DIRECT_DENSE_ENTRIES:
        kernel = build_kernel(geometry, "exact", dtype=dtype)
        reason = (
            f"n x m = {n} x {m} is small ({n * m * itemsize / 2**20:.0f} MiB): the exact "
            "kernel, stored"
        )
        kernel.info.reason = reason  # the solve knows auto chose it
        return finish(solve(problem, kernel, options, rng=rng), reason)

    generator = check_rng(rng)
    # only backends whose record declares the problem's cost (exact and Nystrom take any)
    polynomial = get_backend("polyts").supports(geometry.cost)
    quiet = dataclasses.replace(options, warn=False, errors="warn", verbose=False)
    # Low-rank attempts: a kernel whose denominators go non-positive is rejected at once
    # (repairs cost exact rows, and such a kernel was not accurate on the measured cases),
    # and the iterations are Anderson-mixed unless the caller fixed the memory.
    mixed = DEFAULT_ANDERSON_MEMORY if options.anderson == "auto" else options.anderson
    attempt = dataclasses.replace(quiet, safeguard="raise", anderson=mixed)
    previous = np.inf
    ladder = low_rank_ladder(n, m)
    for rank in ladder:
        start = time.perf_counter()
        kernel = build_kernel(geometry, LOW_RANK_BACKEND, rng=generator, dtype=dtype, rank=rank)
        error = kernel_error(kernel, generator)
        if geometry.X.shape[1] >= SKETCH_MIN_DIMENSION and polynomial:
            # in higher dimension the improved polynomial sketch can beat Nystrom at equal
            # rank (isotropic data): measure both, keep the more accurate
            sketch = build_kernel(
                geometry, "polyts", rng=generator, dtype=dtype, rank=rank, variant="improved"
            )
            sketch_error = kernel_error(sketch, generator)
            if sketch_error < error:
                kernel, error = sketch, sketch_error
        if error > HOPELESS_FACTOR * target:
            record(rank, error, start, False, "sampled kernel error too large to solve")
            if not worth_doubling(previous, error, HOPELESS_FACTOR * target, rank, ladder[-1]):
                break
            previous = error
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = solve(problem, kernel, attempt, rng=generator)
        except NonPositiveKernelError:
            record(rank, np.inf, start, False, "a denominator went non-positive")
            if not worth_doubling(previous, error, target, rank, ladder[-1]):
                break
            previous = error
            continue
        check = result.true_kernel
        measured = check.bound if check is not None else np.inf
        accepted = bool(result.accuracy_met) and _possible(result)
        record(rank, measured, start, accepted, "true-kernel marginal error of the solve")
        if accepted:
            result.options = options.as_dict()
            reason = (
                f"n x m = {n} x {m} is above the direct exact size; {kernel.info.backend} at "
                f"rank {rank} meets "
                f"accuracy={target:g} against the true kernel (bound {measured:.2g})"
            )
            return finish(result, reason)
        if not worth_doubling(previous, max(measured, error), target, rank, ladder[-1]):
            break
        previous = max(measured, error)

    exact_seconds = exact_iteration_seconds(geometry, stored=dense_fits)
    if geometry.X.shape[1] <= LOCAL_MAX_DIMENSION and polynomial:
        start = time.perf_counter()
        kernel = build_kernel(geometry, "polyts", rng=generator, dtype=dtype, variant="local")
        local_seconds = local_iteration_seconds(kernel)
        if local_seconds < exact_seconds:
            say(f"the block-local kernel: about {local_seconds:.2g} s per iteration")
            # its solve can be long: it shows its progress when the caller asked for it
            shown = dataclasses.replace(quiet, verbose=options.verbose)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = solve(problem, kernel, shown, rng=generator)
            measured = result.true_kernel.bound if result.true_kernel is not None else np.inf
            accepted = bool(result.accuracy_met) and _possible(result)
            note = "true-kernel marginal error of the solve"
        else:
            measured, accepted = np.nan, False
            note = (
                f"not solved: an iteration would take {local_seconds:.2g} s against "
                f"{exact_seconds:.2g} s for the exact kernel"
            )
        attempts.append(
            Attempt(
                "polyts", {"variant": "local"}, measured, time.perf_counter() - start,
                accepted, note,
            )
        )  # fmt: skip
        say(str(attempts[-1]))
        if accepted:
            result.options = options.as_dict()
            clusters = kernel.info.params.get("clusters")
            reason = (
                "no global low rank meets the accuracy at this reg; the block-local "
                f"polynomial kernel ({clusters} clusters, entries to a relative "
                f"{kernel.info.params.get('entry_error_bound', 0):.1g}; an iteration "
                f"{local_seconds:.2g} s against {exact_seconds:.2g} s exact) does "
                f"(bound {measured:.2g})"
            )
            return finish(result, reason)

    if dense_fits:
        kernel = build_kernel(geometry, "exact", dtype=dtype)
        reason = (
            f"no cheaper kernel meets the accuracy; n x m = {n} x {m} "
            f"({n * m * itemsize / 2**20:.0f} MiB) fits the dense budget: the exact kernel, "
            "stored"
        )
        kernel.info.reason = reason  # the solve knows auto chose it
        return finish(solve(problem, kernel, options, rng=generator), reason)

    kernel = build_kernel(geometry, "exact", dtype=dtype, max_dense_bytes=0)
    # one estimate everywhere: a pass each way (as the solve's own announcement says)
    estimate = None if kernel.info.seconds_per_pass is None else 2 * kernel.info.seconds_per_pass
    if estimate is not None:
        say(
            f"the exact kernel streamed: about {estimate:.2g} s per iteration "
            f"(at most {options.max_iter} iterations)"
        )
    reason = (
        "n x m too large to store and no low rank met the accuracy while cheaper than the "
        "exact kernel: the exact kernel, streamed"
    )
    kernel.info.reason = reason  # the solve knows auto chose it
    return finish(solve(problem, kernel, options, rng=generator), reason)


def worth_doubling(previous: float, error: float, target: float, rank: int, cap: int) -> bool:
    """Whether doubling the rank can reach ``target`` before ``cap``, at the rate of the last
    doubling (``previous`` -> ``error``)."""
    gain = previous / error
    if not gain >= STALL_FACTOR:
        return False
    if not np.isfinite(previous):
        return True
    doublings = np.log(error / target) / np.log(gain)
    return rank * 2.0 ** np.ceil(doublings) <= cap


def exact_iteration_seconds(geometry: GibbsGeometry, *, stored: bool) -> float:
    """Seconds of one exact iteration, extrapolated from ``TIMED_ROWS`` rows: computing the
    block's exponentials (streamed) or one product with it (stored), both sides."""
    n = geometry.shape[0]
    rows = slice(0, min(n, TIMED_ROWS))
    start = time.perf_counter()
    block = np.exp(geometry.log_block(rows))
    computed = time.perf_counter() - start
    start = time.perf_counter()
    block @ np.ones(block.shape[1])
    block.T @ np.ones(block.shape[0])
    product = time.perf_counter() - start
    # stored: one product per iteration plus the build, amortised over BUILD_AMORTISED
    per_row = product + computed / BUILD_AMORTISED if stored else computed + product
    return per_row / block.shape[0] * n


def local_iteration_seconds(kernel) -> float:
    """Seconds of one log-domain iteration of the block-local kernel: the faster of two timed
    passes (the first one also pays one-time costs)."""
    n, m = kernel.shape
    times = []
    for _ in range(2):
        start = time.perf_counter()
        kernel.fused_pass("rows", np.zeros(m), np.zeros(n), log=True)
        times.append(time.perf_counter() - start)
    return min(times)


def _possible(result: SinkhornResult) -> bool:
    """Whether the result's cost and mass are possible (finite, non-negative)."""
    return bool(
        np.isfinite(result.value_linear)
        and result.value_linear >= 0
        and np.isfinite(result.mass)
        and result.mass > 0
    )
