"""The ladder of ``'auto'`` in words, written from the code: the docs print it from here
(``docs/conf.py`` writes ``docs/user_guide/generated/auto_ladder.rst`` and the
substitutions of :func:`rst_substitutions`), so that no hand-written copy can drift.
"""

from __future__ import annotations

import math

from .._defaults import DEFAULT_ACCURACY, DEFAULT_MAX_DENSE_BYTES
from .._memory import USABLE_FRACTION
from ..kernels import available_backends, get_backend
from ..kernels.local import RTOL_FRACTION, RTOL_RANGE, rtol_for
from ..kernels.registry import EXACT_KIND, LOCAL_KIND, LOW_RANK_KIND
from . import ladder as _ladder
from .table import AutoRule, auto_rule, auto_rules


def number(value: float) -> str:
    """``1e-4``, ``0.02``, ``25,000,000``: a constant as the docs write it."""
    if float(value).is_integer() and abs(value) >= 1:
        return f"{int(value):,}"
    if abs(value) < 1e-2:
        mantissa, exponent = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:g}"


def _bytes(value: float) -> str:
    return f"{value / 2**30:g} GiB" if value >= 2**30 else f"{value / 2**20:g} MiB"


def _names(kind: str) -> list[tuple[str, AutoRule]]:
    """``(name, rule)`` of every registered backend of ``kind`` with a rule, in the ladder's
    order (in any dimension: the rules' bounds are written out)."""
    registered = set(available_backends())
    found = [
        (name, rule)
        for name, rule in auto_rules().items()
        if name in registered and get_backend(name).kind == kind
    ]
    return sorted(found, key=lambda item: (item[1].order, item[0]))


def _where(rule: AutoRule) -> str:
    bounds = []
    if rule.min_dimension is not None:
        bounds.append(f"``d >= {rule.min_dimension}``")
    if rule.max_dimension is not None:
        bounds.append(f"``d <= {rule.max_dimension}``")
    return f"in dimension {' and '.join(bounds)}" if bounds else ""


def _named(name: str, rule: AutoRule) -> str:
    params = ", ".join(f"{key}={value!r}" for key, value in rule.params.items())
    extras = [f"``{params}``" if params else "", _where(rule)]
    extra = "; ".join(e for e in extras if e)
    return f"``{name}``" + (f" ({extra})" if extra else "")


def local_rtol() -> str:
    """The block-local kernel's entry tolerance as a function of ``accuracy``."""
    low, high = RTOL_RANGE
    return (
        f"``accuracy x {number(RTOL_FRACTION)}``, within ``[{number(low)}, {number(high)}]``: "
        f"``{number(rtol_for(DEFAULT_ACCURACY))}`` at the default "
        f"``accuracy = {number(DEFAULT_ACCURACY)}``"
    )


def ladder() -> list[str]:
    """The rungs of ``'auto'``, cheapest first, as reStructuredText list items (without
    their numbers)."""
    side = math.isqrt(_ladder.DIRECT_DENSE_ENTRIES)
    exact = _names(EXACT_KIND)[0][0]
    exact_rule = auto_rule(exact)
    streamed = ", ".join(f"``{k}={v!r}``" for k, v in exact_rule.streamed_params.items())
    budget = (
        f"{_bytes(DEFAULT_MAX_DENSE_BYTES)} (or {USABLE_FRACTION:.0%} of the machine's total "
        "memory, if less)"
    )
    low_rank = ", then ".join(_named(name, rule) for name, rule in _names(LOW_RANK_KIND))
    local = ", then ".join(_named(name, rule) for name, rule in _names(LOCAL_KIND))
    rungs = [
        f"``n x m`` up to {side} x {side} ({number(_ladder.DIRECT_DENSE_ENTRIES)} entries) "
        f"and within the dense budget: ``{exact}``, stored. On the caller's device (CUDA "
        f"tensors) first: ``{exact}`` directly when {_ladder.DIRECT_EXACT_ITERATIONS} of its "
        f"iterations are predicted (declared rates) to take at most "
        f"{number(_ladder.DIRECT_EXACT_SECONDS)} s there.",
        f"The global low ranks {low_rank} at ranks {_ladder.FIRST_RANK}, "
        f"{2 * _ladder.FIRST_RANK}, ... up to ``n m / (n + m)`` (where an iteration stops "
        "being cheaper than an exact one); at each rank every one is built and the one of "
        "smallest sampled kernel error is solved (none whose error is over "
        f"{number(_ladder.HOPELESS_FACTOR)} times the target). The climb stops when the error "
        f"falls by less than {number(_ladder.STALL_FACTOR)}x per doubling, or when that rate "
        "cannot reach the target before the largest rank; above "
        f"{number(_ladder.SAMPLE_ABOVE)} points on a side each rank is first tried on "
        f"{number(_ladder.SAMPLE_POINTS)} points of each cloud and built at full size only "
        f"when that sample's error is within {number(_ladder.HOPELESS_FACTOR)} times the "
        "target; in float32 a rank whose sampled error is within reach but whose solve goes "
        "non-positive ends the climb (a larger rank does not shrink that rounding).",
        f"The local kernels {local} (entries to a relative ``rtol`` of {local_rtol()}), "
        "when one of their iterations is predicted (counted work, "
        ":mod:`sketchot.kernels.cost`) cheaper than one of the exact kernel.",
        f"``{exact}``, stored when it fits {budget}, streamed ({streamed}) otherwise.",
    ]
    return rungs


def ladder_rst() -> str:
    """The ladder as a numbered reStructuredText list."""
    lines = []
    for number_, rung in enumerate(ladder(), start=1):
        lines.append(f"{number_}. {rung}")
    return "\n".join(lines) + "\n"


def rst_substitutions() -> str:
    """``|local_rtol|`` and the like, for the docs' ``rst_prolog``."""
    return f".. |local_rtol| replace:: {local_rtol()}\n"
