"""The paper's setting (Han, Avron and Shin 2020, Section 4.3): its sketch, and each
approximation at the paper's "comparable cost" to it.

These are facts of the paper's experiments, for reproducing them
(``benchmarks/paper_sinkhorn.py`` and the paper protocol read
:func:`comparable_parameters`), not of the backends' kernels: the records do not hold them.
The sketch's size is also the default of the backends that follow the paper (``rff``'s
features, ``nystrom``'s landmarks, ``polyts``'s sketch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._validation import check_int
from .registry import available_backends

#: The paper's Sinkhorn setting (Han et al. 2020, Section 4.3): sketch dimension and degree.
PAPER_SKETCH_DIM = 20
PAPER_DEGREE = 3


def paper_rank(sketch_dim: int, degree: int) -> int:
    """Features of the paper's sketch: ``m r`` (its constant feature aside)."""
    return sketch_dim * degree


def paper_nystrom_landmarks(sketch_dim: int, degree: int) -> int:
    """``s = ceil(max(sqrt(r m), r))``: the paper's Nystrom rank for a sketch ``(m, r)``."""
    return max(1, math.ceil(max(math.sqrt(degree * sketch_dim), degree)))


#: ``(sketch_dim, degree) -> params``: each backend at the paper's comparable cost to a
#: Poly-TensorSketch of sketch dimension ``m`` and degree ``r`` (Section 4.3, Appendix C).
PAPER_COSTS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "nystrom": lambda sketch_dim, degree: {
        "n_landmarks": paper_nystrom_landmarks(sketch_dim, degree)
    },
    "polyts": lambda sketch_dim, degree: {
        "sketch_dim": sketch_dim,
        "degree": degree,
        "variant": "paper",
    },
    "rff": lambda sketch_dim, degree: {"n_features": max(1, paper_rank(sketch_dim, degree))},
}


def comparable_parameters(
    sketch_dim: int = PAPER_SKETCH_DIM, degree: int = PAPER_DEGREE
) -> dict[str, dict[str, int]]:
    """The paper's "comparable cost" setting of every backend that has one.

    For a Poly-TensorSketch of sketch dimension ``m`` and degree ``r``: RFF with ``D = m r``
    features and Nystrom with ``s = ceil(max(sqrt(r m), r))`` landmarks (Han et al. 2020,
    Section 4.3 and Appendix C). With the paper's ``m = 20, r = 3``: ``D = 60``, ``s = 8``.

    Parameters
    ----------
    sketch_dim : int, default=20
        The sketch dimension ``m`` of the Poly-TensorSketch.
    degree : int, default=3
        Its polynomial degree ``r``.

    Returns
    -------
    dict of str to dict
        For each registered backend of :data:`PAPER_COSTS`, the keyword parameters of that
        setting (e.g. ``{'nystrom': {'n_landmarks': 8}, ...}``), ready for
        ``sketchot.sinkhorn(..., backend=name, **params)``.

    Examples
    --------
    >>> import sketchot
    >>> sketchot.comparable_parameters()["rff"]
    {'n_features': 60}
    """
    sketch_dim = check_int(sketch_dim, "sketch_dim", minimum=1)
    degree = check_int(degree, "degree", minimum=0)
    registered = set(available_backends())
    return {
        name: cost(sketch_dim, degree)
        for name, cost in sorted(PAPER_COSTS.items())
        if name in registered
    }
