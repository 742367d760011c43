"""Where the layers below the policy reach ``'auto'``.

``make_kernel(..., backend='auto')`` and ``build_kernel(..., rank='auto')`` (kernels) and
``sinkhorn(..., backend='auto')`` (the solver) are entries of layers below
:mod:`sketchot.policy`, which makes those choices. The policy installs its functions here
when it is imported (``import sketchot`` imports it), so that every import still points
down: the kernels and the solver import this seam, never the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_INSTALLED: dict[str, Callable[..., Any]] = {}


def install(**functions: Callable[..., Any]) -> None:
    """Install the policy's ``choose``, ``adaptive_rank`` and ``solve_auto``."""
    _INSTALLED.update(functions)


def _installed(name: str) -> Callable[..., Any]:
    try:
        return _INSTALLED[name]
    except KeyError:  # only before sketchot/__init__.py has run to its end
        raise RuntimeError(f"'auto' needs sketchot.policy ({name}); import sketchot") from None


def choose(*args: Any, **kwargs: Any) -> Any:
    """:func:`sketchot.policy.ladder.choose`."""
    return _installed("choose")(*args, **kwargs)


def adaptive_rank(*args: Any, **kwargs: Any) -> Any:
    """:func:`sketchot.policy.ladder.adaptive_rank`."""
    return _installed("adaptive_rank")(*args, **kwargs)


def solve_auto(*args: Any, **kwargs: Any) -> Any:
    """:func:`sketchot.policy.solve.solve_auto`."""
    return _installed("solve_auto")(*args, **kwargs)
