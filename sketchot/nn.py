"""PyTorch front of :mod:`sketchot.loss`: the Sinkhorn divergence as an autograd function and a
``torch.nn.Module`` in the manner of GeomLoss's ``SamplesLoss``.

Needs PyTorch (``pip install ".[torch]"`` in a clone); ``import sketchot`` never imports it, this
module is loaded on first use of ``sketchot.SamplesLoss`` or ``sketchot.nn``.

The iteration runs in NumPy float64 on the host, the kernels' products where the tensors live
(:mod:`sketchot.kernels.device`); the value and gradients come back on that device (float32
tensors get float32 results). The backward
pass is the envelope-theorem gradient of :func:`sketchot.sinkhorn_divergence` (no unrolled
iterations, memory ``O((n + m) (r + d))``), multiplied by the incoming gradient. There are no
second derivatives: a gradient taken with ``create_graph=True`` is returned (its value is
right) and differentiating it again raises a ``RuntimeError`` (a gradient penalty or a Hessian
would otherwise miss this term without a word).
"""

from __future__ import annotations

from typing import Any

import torch

from ._arrays import array_context
from .loss import DivergenceResult, SinkhornDivergence

#: GeomLoss's ``backend`` names; sketchot chooses its kernel with ``backend='auto'`` for them.
GEOMLOSS_BACKENDS = ("tensorized", "online", "multiscale")


class SinkhornDivergenceFunction(torch.autograd.Function):
    """``S(X, Y, a, b)`` as an autograd function: ``apply(X, Y, a, b, solve)`` with ``solve``
    a callable ``(X, Y, a, b) -> DivergenceResult`` on float64 arrays (``a``, ``b`` may be
    ``None``: uniform). Returns a 0-d tensor of ``X``'s dtype and device; the result of the
    solve is kept in ``solve.last`` when ``solve`` has that attribute
    (:class:`~sketchot.SinkhornDivergence` does)."""

    @staticmethod
    def forward(ctx, X, Y, a, b, solve):
        inputs = (X, Y, a, b)
        arrays = [None if t is None else t.detach().cpu().to(torch.float64).numpy() for t in inputs]
        placement = array_context(X=X, Y=Y, a=a, b=b)
        if isinstance(solve, SinkhornDivergence):  # its kernels run on X's device
            result = solve(*arrays, _arrays=placement)
        else:  # a caller's own solve of NumPy arrays
            result = solve(*arrays)
        # only the gradients autograd will ask for (each position gradient costs plan moments)
        names = ("grad_X", "grad_Y", "grad_a", "grad_b")
        ctx.grads = [
            getattr(result, name) if needed else None
            for name, needed in zip(names, ctx.needs_input_grad[:4], strict=True)
        ]
        ctx.meta = [None if t is None else (t.dtype, t.device) for t in inputs]
        # kept for create_graph=True only; not saved_tensors: moving X in place between
        # forward and backward (the gradient of the value returned) stays allowed
        ctx.inputs = inputs
        return torch.tensor(result.value, dtype=X.dtype, device=X.device)

    @staticmethod
    def backward(ctx, grad_output):
        grads = []
        for needed, grad, meta in zip(ctx.needs_input_grad[:4], ctx.grads, ctx.meta, strict=True):
            if not needed or meta is None:
                grads.append(None)
                continue
            dtype, device = meta
            grads.append(grad_output.to(dtype) * torch.as_tensor(grad, dtype=dtype, device=device))
        if torch.is_grad_enabled():  # create_graph=True: a graph whose next backward refuses
            grads = [None if g is None else _FirstOrderOnly.apply(g, *ctx.inputs) for g in grads]
        return (*grads, None)


class _FirstOrderOnly(torch.autograd.Function):
    """The identity on a first derivative of :class:`SinkhornDivergenceFunction`, linked to the
    inputs it depends on, whose backward toward them raises: a second derivative is refused,
    never silently zero."""

    @staticmethod
    def forward(ctx, grad, *inputs):
        return grad.clone()

    @staticmethod
    def backward(ctx, grad_output):
        if any(ctx.needs_input_grad[1:]):
            raise RuntimeError(
                "sketchot's Sinkhorn divergence has no second derivatives: its gradient (taken "
                "with create_graph=True) was differentiated again, e.g. by a gradient penalty "
                "or a Hessian. Its first derivatives come from the solved potentials (envelope "
                "theorem), without a graph of the iterations to differentiate; keep the loss "
                "out of second-order terms or detach its gradient there"
            )
        return (grad_output, *(None for _ in ctx.needs_input_grad[1:]))


def sinkhorn_divergence(
    X: torch.Tensor,
    Y: torch.Tensor,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    reg: float = 1.0,
    reg_m: Any = None,
    backend: str = "auto",
    *,
    loss: SinkhornDivergence | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """:func:`sketchot.sinkhorn_divergence` on tensors, differentiable w.r.t. ``X``, ``Y``,
    ``a`` and ``b``: a 0-d tensor whose ``backward()`` fills their ``.grad``.

    Parameters
    ----------
    X, Y : Tensor, shape (n, d), (m, d)
        Point clouds (float32 or float64, any device; solved on the host in float64).
    a, b : Tensor of shape (n,), (m,) or None
        Weights (``None``: uniform).
    reg, reg_m, backend, **kwargs
        As in :func:`sketchot.sinkhorn_divergence` (the cost ``||x - y||^2`` unless
        ``metric=``; a callable metric has no position gradients: a tensor ``X`` or ``Y``
        that requires grad is refused at the forward). ``warm_start`` is refused: pass
        ``loss=``.
    loss : SinkhornDivergence, optional
        A loss object to solve with (warm starts across calls); it then fixes ``reg``,
        ``reg_m``, ``backend`` and the options, and the others must be left out.

    Returns
    -------
    Tensor
        0-d, ``X``'s dtype and device.

    Examples
    --------
    >>> import torch, sketchot.nn
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.rand(200, 2, generator=g, dtype=torch.float64, requires_grad=True)
    >>> Y = torch.rand(150, 2, generator=g, dtype=torch.float64) + 0.5
    >>> value = sketchot.nn.sinkhorn_divergence(X, Y, reg=0.1, backend="exact")
    >>> value.backward()
    >>> value.ndim, X.grad.shape
    (0, torch.Size([200, 2]))
    """
    if "warm_start" in kwargs:
        raise TypeError(
            "warm_start is for NumPy clouds (a DivergenceResult); with tensors pass "
            "loss=sketchot.SinkhornDivergence(reg, ...), which warm-starts each call from the last"
        )
    if loss is None:
        loss = SinkhornDivergence(reg, reg_m, backend, **kwargs)
    elif kwargs or reg_m is not None or backend != "auto" or reg != 1.0:
        raise TypeError(
            "pass either loss= (a SinkhornDivergence, which fixes reg, reg_m, backend and the "
            "options) or those parameters, not both"
        )
    _check_tensors(X=X, Y=Y, a=a, b=b)
    return SinkhornDivergenceFunction.apply(X, Y, a, b, loss)


class SamplesLoss(torch.nn.Module):
    """The Sinkhorn divergence as a ``torch.nn.Module`` with GeomLoss's parameters and number.

    ``SamplesLoss("sinkhorn", p=2, blur=0.05)`` here returns what GeomLoss's
    ``geomloss.SamplesLoss("sinkhorn", p=2, blur=0.05)`` returns: GeomLoss's cost for
    ``p = 2`` is ``||x - y||^2 / 2`` and its temperature ``blur^p``, so its divergence is
    ``S / 2`` with :func:`sketchot.sinkhorn_divergence`'s ``S`` at ``reg = 2 blur^2`` and
    ``reg_m = 2 reach^2`` (cost ``||x - y||^2``). Only ``loss='sinkhorn'`` and ``p=2``.

    Parameters
    ----------
    loss : str, default='sinkhorn'
        Only ``'sinkhorn'``.
    p : int, default=2
        Only 2 (the squared Euclidean cost).
    blur : float, default=0.05
        GeomLoss's blur: ``reg = 2 blur^2``.
    reach : float or None, default=None
        GeomLoss's reach (unbalanced transport): ``reg_m = 2 reach^2``; ``None`` balanced.
    debias : bool, default=True
        ``False``: ``OT(a, b) / 2`` alone.
    scaling : float, optional
        Accepted for GeomLoss compatibility and ignored: sketchot's accuracy is set by
        ``accuracy=`` (the true-kernel check), not by an annealing schedule.
    backend : str, default='auto'
        A sketchot backend; GeomLoss's ``'tensorized'``, ``'online'``, ``'multiscale'`` mean
        ``'auto'``.
    warm_start : bool, default=True
        Solve each call from the previous call's potentials and kernel choice (per batch
        item) when that meets the accuracy (:class:`~sketchot.SinkhornDivergence`).
    rng : None, int, Generator
        Randomness of the approximate kernels.
    **kwargs
        Solver options of :func:`sketchot.sinkhorn` (``accuracy``, ``tol``, ``metric``, ...).

    Attributes
    ----------
    last : list of DivergenceResult
        The last call's results (one per batch item): accuracy, backends, timings.

    Notes
    -----
    ``forward(x, y)`` or ``forward(a, x, b, y)`` (GeomLoss's order) with ``x`` of shape
    ``(n, d)`` or ``(B, n, d)`` and weights ``(n,)`` or ``(B, n)``; a batch is solved item
    by item and returns shape ``(B,)``. Each call solves the data as they are at the call,
    also when an optimiser moved them in place since the last one (the solves hold copies).
    No second derivatives: a gradient taken with ``create_graph=True`` raises when it is
    differentiated again.

    Examples
    --------
    >>> import torch, sketchot
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.rand(200, 2, generator=g, requires_grad=True)
    >>> y = torch.rand(150, 2, generator=g) + 0.5
    >>> loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.2, backend="exact")
    >>> value = loss(x, y)
    >>> value.backward()
    >>> value.dtype, x.grad.shape
    (torch.float32, torch.Size([200, 2]))
    """

    def __init__(
        self,
        loss: str = "sinkhorn",
        p: int = 2,
        blur: float = 0.05,
        reach: float | None = None,
        debias: bool = True,
        scaling: float | None = None,
        backend: str = "auto",
        *,
        warm_start: bool = True,
        rng: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if loss != "sinkhorn":
            raise ValueError(f"loss must be 'sinkhorn' (the only one sketchot has); got {loss!r}")
        if p != 2:
            raise NotImplementedError(
                f"p must be 2 (the squared Euclidean cost of sketchot's kernels); got p={p!r}"
            )
        if not (isinstance(blur, int | float) and blur > 0):
            raise ValueError(f"blur must be a positive number; got {blur!r}")
        if reach is not None and not (isinstance(reach, int | float) and reach > 0):
            raise ValueError(f"reach must be None or a positive number; got {reach!r}")
        del scaling
        self.blur, self.reach, self.debias = float(blur), reach, bool(debias)
        self.reg = 2.0 * self.blur**2
        self.reg_m = None if reach is None else 2.0 * float(reach) ** 2
        self.backend = "auto" if backend in GEOMLOSS_BACKENDS else backend
        self.warm_start, self.rng, self.kwargs = bool(warm_start), rng, kwargs
        self._losses: list[SinkhornDivergence] = []
        self.last: list[DivergenceResult] = []

    def _loss(self, index: int) -> SinkhornDivergence:
        options = dict(debias=self.debias, rng=self.rng, **self.kwargs)
        while len(self._losses) <= index:
            self._losses.append(SinkhornDivergence(self.reg, self.reg_m, self.backend, **options))
        loss = self._losses[index]
        if not self.warm_start:
            loss.reset()
        return loss

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        """``forward(x, y)`` or ``forward(a, x, b, y)``; see the class notes."""
        if len(args) == 2:
            (x, y), a, b = args, None, None
        elif len(args) == 4:
            a, x, b, y = args
        else:
            raise TypeError(
                f"SamplesLoss takes (x, y) or (a, x, b, y) (GeomLoss's order); got {len(args)} "
                "arguments"
            )
        _check_tensors(x=x, y=y, a=a, b=b)
        if x.dim() == 2:
            value = SinkhornDivergenceFunction.apply(x, y, a, b, self._loss(0))
            self.last = [self._losses[0].last]
            return 0.5 * value
        if x.dim() != 3 or y.dim() != 3 or x.shape[0] != y.shape[0]:
            raise ValueError(
                "batched clouds must have shapes (B, n, d) and (B, m, d) with the same B; got "
                f"x {tuple(x.shape)} and y {tuple(y.shape)}"
            )
        if x.shape[0] == 0:
            raise ValueError(
                "x and y must hold at least one cloud each (B >= 1 in (B, n, d) and (B, m, d)); "
                f"got x {tuple(x.shape)} and y {tuple(y.shape)}"
            )
        values = []
        for k in range(x.shape[0]):
            ak = None if a is None else a[k]
            bk = None if b is None else b[k]
            values.append(SinkhornDivergenceFunction.apply(x[k], y[k], ak, bk, self._loss(k)))
        self.last = [loss.last for loss in self._losses[: x.shape[0]]]
        return 0.5 * torch.stack(values)

    def extra_repr(self) -> str:
        return (
            f"blur={self.blur:g} (reg={self.reg:g}), reach={self.reach!r}, "
            f"debias={self.debias}, backend={self.backend!r}"
        )


def _check_tensors(**tensors: Any) -> None:
    for name, value in tensors.items():
        if value is None and name in ("a", "b"):
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(value).__name__}")
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor; got dtype {value.dtype}")


__all__ = [
    "GEOMLOSS_BACKENDS",
    "SamplesLoss",
    "SinkhornDivergenceFunction",
    "sinkhorn_divergence",
]
