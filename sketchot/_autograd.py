"""The gradient of a solve's entropic value on PyTorch tensors (envelope theorem).

``value = <P, M> + reg KL(P | a b^T) + reg_m_a KL(P 1 | a) + reg_m_b KL(P^T 1 | b)`` at the
optimal plan ``P`` is a minimum over ``P`` (under the hard marginal constraints), so its
derivatives are those of the objective (of its Lagrangian, for hard sides) at fixed ``P``:

- ``d value / d M_ij = P_ij``, so for the squared Euclidean cost
  ``d value / d x_i = 2 sum_j P_ij (x_i - y_j)`` and ``d value / d y_j = 2 sum_i P_ij (y_j - x_i)``
  (products with the plan: no ``n x m`` array beyond the exact kernel's streamed blocks);
- ``d value / d a_i = reg (sum b - (P 1)_i / a_i) + reg_m_a (1 - (P 1)_i / a_i)`` for a finite
  ``reg_m_a``; for a hard side, ``reg (sum b - (P 1)_i / a_i) + f_i`` with the dual potential
  ``f = reg (log u - log a) + k``: ``k = 0`` for balanced transport, where the value is
  defined on ``sum a = sum b`` only and the gradient up to adding ``(c, -c)`` (every
  mass-preserving directional derivative is exact), ``k`` fixed by the relaxed side's
  stationarity otherwise. ``b`` likewise.
- With total-variation penalties (``unbalanced_type='TV'``) the value is not differentiable
  in the plan's marginals where they meet the weights; its dual, ``<a, f> + <b, g> -
  reg <a b^T, exp((f + g - M) / reg) - 1>`` over potentials in ``[-reg_m, reg_m]``, is
  linear in the weights, so (Danskin) ``d value / d a_i = f_i + reg (sum b - (P 1)_i / a_i)``
  with the solve's own potentials, for a relaxed and a hard side alike.

These are the gradients of the value returned at the converged optimum of the exact kernel's
problem; the caller (:mod:`sketchot.api`) refuses the others (an approximate kernel, another
cost, an iteration that did not converge) before a graph is built.

Nothing here is imported before a caller passed a tensor: :func:`value_function` imports
PyTorch lazily (``import sketchot`` never loads it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

#: The differentiable inputs, in the order of :func:`value_function`'s arguments.
NAMES = ("X", "Y", "a", "b")


def position_gradients(result: Any, X: np.ndarray, Y: np.ndarray | None) -> dict[str, Any]:
    """``d value / d X`` and ``d value / d Y`` for the squared Euclidean cost (``Y`` None:
    the same cloud on both sides, whose gradient is the sum of both)."""
    row, col = result.marginals
    plan = result.lazy_plan
    target = X if Y is None else Y
    grad_x = 2.0 * (row[:, None] * X - plan.matmat(target))
    grad_y = 2.0 * (col[:, None] * target - plan.rmatmat(X))
    if Y is None:
        return {"X": grad_x + grad_y, "Y": None}
    return {"X": grad_x, "Y": grad_y}


def weight_gradient(result: Any, side: int) -> np.ndarray:
    """``d value / d a`` (``side`` 0) or ``d value / d b`` (1); see the module notes."""
    weights, other = (result.a, result.b) if side == 0 else (result.b, result.a)
    marginal, potential = result.marginals[side], result.potentials[side]
    penalty, other_penalty = result.reg_m[side], result.reg_m[1 - side]
    reg = result.reg
    ratio = marginal / weights
    grad = reg * (other.sum() - ratio)
    if result.problem.unbalanced_type == "TV" and not result.problem.balanced:
        return grad + reg * (potential - np.log(weights))
    if np.isfinite(penalty):
        return grad + penalty * (1.0 - ratio)
    shift = 0.0
    if np.isfinite(other_penalty):  # semi-relaxed: the free side's stationarity fixes k
        marginal_o, potential_o = result.marginals[1 - side], result.potentials[1 - side]
        with np.errstate(divide="ignore", invalid="ignore"):
            bracket = reg * (potential_o - np.log(other)) + other_penalty * np.log(
                marginal_o / other
            )
        mask = other > 0
        shift = float(other[mask] @ bracket[mask] / other[mask].sum())
    return grad + reg * (potential - np.log(weights)) + shift


@functools.cache
def value_function() -> Any:
    """The ``torch.autograd.Function`` of the value (built once, importing PyTorch)."""
    import torch

    class EntropicValue(torch.autograd.Function):
        """``value`` as a 0-d tensor; its backward asks ``gradients`` for what it needs."""

        @staticmethod
        def forward(ctx, gradients, value, dtype, X, Y, a, b):
            ctx.gradients = gradients
            ctx.places = [(t.dtype, t.device) if isinstance(t, torch.Tensor) else None
                          for t in (X, Y, a, b)]  # fmt: skip
            device = next(t.device for t in (X, Y, a, b) if isinstance(t, torch.Tensor))
            return torch.tensor(value, dtype=dtype, device=device)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_output):
            wanted = [
                name for name, need in zip(NAMES, ctx.needs_input_grad[3:], strict=True) if need
            ]
            grads = ctx.gradients(wanted)
            out = []
            for name, place in zip(NAMES, ctx.places, strict=True):
                grad = grads.get(name)
                if grad is None or place is None:
                    out.append(None)
                    continue
                dtype, device = place
                out.append(
                    grad_output.to(dtype) * torch.as_tensor(grad, dtype=dtype, device=device)
                )
            return (None, None, None, *out)

    return EntropicValue


def differentiable_value(
    value: float, dtype: Any, tensors: dict[str, Any], gradients: Callable
) -> Any:
    """``value`` as a 0-d tensor of ``dtype`` attached to ``tensors`` (``X``, ``Y``, ``a``,
    ``b``; ``None`` entries ignored) through ``gradients(names) -> {name: ndarray}``."""
    function = value_function()
    return function.apply(gradients, value, dtype, *(tensors.get(name) for name in NAMES))
