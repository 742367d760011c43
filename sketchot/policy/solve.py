"""``backend='auto'`` for a solve: the one strategy of :mod:`.ladder`, each
candidate judged by the TRUE-kernel marginal error of its solved scalings (the user's
``accuracy``).

The strategy reads the policy table and names no backend; this module only says how a
candidate is solved and judged:

* a low-rank candidate runs quietly, its iterations Anderson-mixed unless the caller fixed
  the memory, and is rejected at once when a denominator goes non-positive (repairs cost
  exact rows, and such a kernel was not accurate on the measured cases);
* a ``'local'`` candidate runs quietly too, but shows its progress when the caller asked
  for it (its solve can be long);
* the final exact kernel runs with the caller's options.

The result says what was chosen and why (``result.backend``, ``result.reason``), lists
every rung tried (``result.attempts``; ``verbose=True`` prints them as they happen) and holds
the explicit call that gives the same bits (``result.replay``: the chosen backend, its
parameters and the options its solve ran with; each candidate is built and solved with the
caller's ``rng`` as given, as that call would be).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from .._defaults import DEFAULT_ACCURACY
from .._validation import check_rng
from ..gibbs import GibbsGeometry
from ..kernels import get_backend
from ..kernels.judge import Verdict, candidate_rng
from ..kernels.registry import LOCAL_KIND, LOW_RANK_KIND
from ..solver import (
    LinearRangeError,
    NonPositiveKernelError,
    Problem,
    SinkhornResult,
    SolverOptions,
)
from ..solver.options import DEFAULT_ANDERSON_MEMORY
from .ladder import choose


def solve_auto(
    problem: Problem,
    geometry: GibbsGeometry,
    options: SolverOptions,
    *,
    rng: Any = None,
    dtype: Any = np.float64,
    solve: Any,
) -> SinkhornResult:
    """Run the strategy; ``solve(problem, kernel, options, rng=)`` runs one candidate. The
    result is built once with the choice's ``reason`` and ``attempts`` and the caller's
    options."""
    target = options.accuracy if options.accuracy is not None else DEFAULT_ACCURACY
    generator = check_rng(rng)
    seed = candidate_rng(rng, generator)  # each solve draws afresh, as an explicit call would
    quiet = dataclasses.replace(options, warn=False, errors="warn", verbose=False)
    mixed = DEFAULT_ANDERSON_MEMORY if options.anderson == "auto" else options.anderson
    trial = {
        LOW_RANK_KIND: dataclasses.replace(quiet, safeguard="raise", anderson=mixed),
        LOCAL_KIND: dataclasses.replace(quiet, verbose=options.verbose),
    }

    def judge(kernel: Any, kind: str | None, error: float) -> Verdict:
        if kind is None:
            return Verdict(np.nan, True, "", solve(problem, kernel, options, rng=seed))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = solve(problem, kernel, trial.get(kind, quiet), rng=seed)
        except NonPositiveKernelError:
            return Verdict(np.inf, False, "a denominator went non-positive")
        except LinearRangeError:  # a KL step the plain iteration cannot hold: the next kind
            return Verdict(np.inf, False, "the plain iteration's numerators leave float64")
        check = result.true_kernel
        measured = check.bound if check is not None else np.inf
        accepted = bool(result.accuracy_met) and _possible(result)
        return Verdict(measured, accepted, "true-kernel marginal error of the solve", result)

    choice = choose(
        geometry, judge, accuracy=target, rng=generator, dtype=dtype, verbose=options.verbose
    )
    # the options of the chosen candidate's solve that change its numbers (a low-rank one
    # ran Anderson-mixed; its safeguard raised on what an accepted solve never met)
    replay = dict(choice.replay)
    if get_backend(replay["backend"]).kind == LOW_RANK_KIND:
        replay["anderson"] = mixed
    return dataclasses.replace(
        choice.outcome,
        reason=choice.reason,
        attempts=list(choice.attempts),
        options=options.as_dict(),
        replay=replay,
    )


def _possible(result: SinkhornResult) -> bool:
    """Whether the result's cost and mass are possible (finite, non-negative)."""
    return bool(
        np.isfinite(result.value_linear)
        and result.value_linear >= 0
        and np.isfinite(result.mass)
        and result.mass > 0
    )
