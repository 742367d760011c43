"""The policy table: which backends ``'auto'`` tries, in which order, with which parameters.

A backend's record (:class:`~sketchot.kernels.Backend`) says what its kernel IS (its kind,
its parameters, its rank, its costs' support, its memory); whether and how ``'auto'`` tries
it is policy, and lives here, one :class:`AutoRule` per backend that ``'auto'`` may try.
The built-in rules are declared below; :func:`register_auto` adds a rule for a backend
registered by a user (:func:`~sketchot.register_backend`), :func:`unregister_auto` removes
it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._validation import describe
from ..kernels import get_backend
from ..kernels.local import MAX_DIMENSION, local_iteration_cost
from ..kernels.registry import KINDS, Backend


@dataclass(frozen=True)
class AutoRule:
    """How ``'auto'`` tries one backend.

    Attributes
    ----------
    order : float
        Its place in the ladder among backends of the same kind (smaller first; ties by
        name).
    params : mapping
        Parameters ``'auto'`` builds it with (besides the rank).
    streamed_params : mapping
        For the exact kind: parameters that stream the kernel instead of storing it.
    min_dimension, max_dimension : int or None
        Dimensions ``d`` where ``'auto'`` tries it (``None``: no bound).
    iteration_cost : callable or None
        ``kernel -> seconds`` of one iteration PREDICTED from counted work
        (:mod:`sketchot.kernels.cost`: one core, the committed constants), never timed, so
        that ``'auto'`` chooses the same on a busy machine. ``'auto'`` tries a ``'local'``
        kind only when it beats the exact kernel's prediction (``None``: always).
    """

    order: float = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    streamed_params: Mapping[str, Any] = field(default_factory=dict)
    min_dimension: int | None = None
    max_dimension: int | None = None
    iteration_cost: Callable[[Any], float] | None = None

    def applies_to(self, dimension: int) -> bool:
        """Whether ``'auto'`` tries it in dimension ``dimension``."""
        return (self.min_dimension is None or dimension >= self.min_dimension) and (
            self.max_dimension is None or dimension <= self.max_dimension
        )


_RULES: dict[str, AutoRule] = {}


def register_auto(
    name: str,
    *,
    order: float = 0,
    params: Mapping[str, Any] | None = None,
    streamed_params: Mapping[str, Any] | None = None,
    min_dimension: int | None = None,
    max_dimension: int | None = None,
    iteration_cost: Callable[[Any], float] | None = None,
) -> AutoRule:
    """Let ``'auto'`` try a registered backend (see :class:`AutoRule` for the parameters).

    Returns
    -------
    AutoRule
        The rule, now in the table (it replaces an earlier rule of the same backend).

    Raises
    ------
    ValueError
        ``name`` is not a registered backend (the message lists them), or ``order`` is not
        a number.

    Examples
    --------
    >>> import sketchot
    >>> from sketchot.policy import auto_rule, register_auto, unregister_auto
    >>> record = sketchot.get_backend("nystrom")
    >>> _ = sketchot.register_backend("my_nystrom", record.builder, rank_parameter="n_landmarks")
    >>> register_auto("my_nystrom", order=2).order
    2
    >>> unregister_auto("my_nystrom")
    >>> auto_rule("my_nystrom") is None
    True
    >>> sketchot.unregister_backend("my_nystrom")
    """
    get_backend(name)
    if isinstance(order, bool) or not isinstance(order, int | float):
        raise ValueError(f"order must be a number; got {describe(order)}")
    rule = AutoRule(
        order=order,
        params=MappingProxyType(dict(params or {})),
        streamed_params=MappingProxyType(dict(streamed_params or {})),
        min_dimension=min_dimension,
        max_dimension=max_dimension,
        iteration_cost=iteration_cost,
    )
    _RULES[name] = rule
    return rule


def unregister_auto(name: str) -> None:
    """Stop ``'auto'`` trying ``name`` (nothing happens when it has no rule)."""
    _RULES.pop(name, None)


def auto_rules() -> dict[str, AutoRule]:
    """Every rule, by backend name (a copy)."""
    return dict(_RULES)


def auto_rule(name: str) -> AutoRule | None:
    """The rule of a backend (``None``: ``'auto'`` never tries it)."""
    return _RULES.get(name)


def auto_backends(
    kind: str, dimension: int, among: Any = None, cost: Any = None
) -> tuple[tuple[Backend, AutoRule], ...]:
    """``(record, rule)`` of the backends of a kind that ``'auto'`` tries in dimension
    ``dimension``, in their rules' order (``among``: only these names, e.g. the backends
    that run on Dask; ``cost``: only those whose kernel represents it). A rule whose backend
    was unregistered is skipped."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {describe(kind)}")
    found = []
    for name, rule in _RULES.items():
        try:
            record = get_backend(name)
        except ValueError:  # unregistered since: 'auto' cannot build it
            continue
        if (
            record.kind == kind
            and rule.applies_to(dimension)
            and (among is None or name in among)
            and (cost is None or record.supports(cost))
        ):
            found.append((record, rule))
    return tuple(sorted(found, key=lambda pair: (pair[1].order, pair[0].name)))


# The built-in rules. The true kernel: first on small problems, last otherwise (streamed
# when it does not fit the dense budget).
register_auto("exact", streamed_params={"max_dense_bytes": 0})
# Between two tensor-product grids, the exact kernel applied axis by axis: first (the ladder
# tries a 'grids' backend only when both clouds are grids, before any other rung).
register_auto("grid", order=1, min_dimension=1)
# Global low ranks at a doubling rank: Nystrom first ...
register_auto("nystrom", order=0)
# ... then the improved polynomial sketch at the same rank, from d = 20 on: it beat Nystrom
# at equal rank on isotropic data there (benchmarks/results/kernel_approx.md); below,
# Nystrom won every case measured.
register_auto("polyts", order=1, params={"variant": "improved"}, min_dimension=20)
# On a cost matrix (no points), the skeleton of exp(-M / reg): the one low rank there.
# (max_dimension=0: a cost matrix's dimension; on points Nystrom and polyts keep the rung)
register_auto("cur", order=0, max_dimension=0)
# The block-local kernel where its features stay few (d <= 4), when its counted iteration
# beats the exact kernel's.
register_auto(
    "polyts_local", order=0, max_dimension=MAX_DIMENSION, iteration_cost=local_iteration_cost
)
