"""The policy: what ``backend='auto'`` and ``rank='auto'`` choose, in one place.

Layers: above the solver (its judge solves candidates), below the jobs. :mod:`.table` says
which backends ``'auto'`` tries and how (the backends' records hold only their kernels'
facts); :mod:`.ladder` runs the choice, reading the cost model of
:mod:`sketchot.kernels.cost` (counted work, committed constants: never a clock);
:mod:`.solve` judges each candidate by a solve; :mod:`.describe` writes the ladder in words
for the docs. The layers below never import it: the callers above (:mod:`sketchot.api`,
the jobs) pass this package as ``policy=`` to the kernels' and the solver's ``'auto'``
entries, which call its ``choose``, ``adaptive_rank`` and ``solve_auto``.
"""

from .ladder import adaptive_rank, choose
from .solve import solve_auto
from .table import AutoRule, auto_backends, auto_rule, auto_rules, register_auto, unregister_auto

__all__ = [
    "AutoRule",
    "adaptive_rank",
    "auto_backends",
    "auto_rule",
    "auto_rules",
    "choose",
    "register_auto",
    "solve_auto",
    "unregister_auto",
]
