"""GeomLoss's and PyTorch's habits with ``sketchot.SamplesLoss``: one loss object in an
optimiser loop that moves its tensors in place (``torch.optim.SGD``, ``Adam``, by hand), a
model's parameters, ``(B, N, D)`` batches, float32 and float64, non-contiguous tensors, the
same call twice, GeomLoss's number and double backward.

GeomLoss is not installed here: each step is compared with a fresh solve of the same data
by sketchot itself (a new loss object), whose value and gradient are checked against the
dense reference and finite differences in ``tests/test_loss.py`` and ``tests/test_nn.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import sketchot  # noqa: E402

# The exact kernel to tol 1e-12: a warm-started solve and a fresh one stop within ~1e-12 of
# the same potentials, so values and gradients agree to ~1e-9 relative (the tolerance below).
TIGHT = {"backend": "exact", "tol": 1e-12, "max_iter": 100_000}
BLUR = 0.1  # reg = 2 blur^2 = 0.02 on clouds of unit scale: a few hundred iterations


def clouds(seed: int, n: int = 60, m: int = 50, d: int = 2, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    X = 0.5 * rng.standard_normal((n, d))
    Y = 0.3 * rng.standard_normal((m, d)) + np.array([2.0, 1.0] + [0.0] * (d - 2))
    return torch.tensor(X, dtype=dtype), torch.tensor(Y, dtype=dtype)


def fresh(x, y, *weights, **options):
    """Value and gradient w.r.t. ``x`` of a new loss object on copies of the data."""
    x = x.detach().clone().requires_grad_(True)
    loss = sketchot.SamplesLoss("sinkhorn", p=2, **{"blur": BLUR, **TIGHT, **options})
    value = loss(*weights[:1], x, *weights[1:], y) if weights else loss(x, y)
    (grad,) = torch.autograd.grad(value.sum(), x)
    return value.detach(), grad


# float32: the value and gradient are solved in float64 and rounded to float32 once
RTOL = {torch.float64: 1e-8, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_an_optimiser_loop_equals_a_fresh_solve_each_step(dtype, optimizer):
    """GeomLoss's gradient flow: a leaf tensor moved in place by ``torch.optim``, one loss
    object. Before issue 42 the object kept returning the first step's loss and gradient
    (its "nothing moved" test compared the tensor with a view of itself) and X drifted away."""
    X, Y = clouds(0, dtype=dtype)
    X.requires_grad_(True)
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=BLUR, **TIGHT)
    lr = {"SGD": 0.5 * len(X), "Adam": 0.3}[optimizer]
    opt = getattr(torch.optim, optimizer)([X], lr=lr)
    values = []
    for _ in range(8):
        opt.zero_grad()
        L = loss(X, Y)
        L.backward()
        value, grad = fresh(X, Y)
        torch.testing.assert_close(L.detach(), value, rtol=RTOL[dtype], atol=1e-12)
        torch.testing.assert_close(X.grad, grad, rtol=RTOL[dtype], atol=1e-9 * grad.abs().max())
        values.append(L.item())
        opt.step()
    # a flow towards Y: the loss falls (Adam's momentum may overshoot: its best step)
    assert min(values) < 0.5 * values[0]


def test_an_update_by_hand_in_place():
    """``with torch.no_grad(): x -= lr * x.grad; x.grad.zero_()`` (GeomLoss's tutorials)."""
    X, Y = clouds(1)
    X.requires_grad_(True)
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=BLUR, **TIGHT)
    first = None
    for _ in range(6):
        L = loss(X, Y)
        L.backward()
        value, grad = fresh(X, Y)
        torch.testing.assert_close(L.detach(), value, rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(X.grad, grad, rtol=1e-8, atol=1e-9 * grad.abs().max())
        first = L.item() if first is None else first
        with torch.no_grad():
            X -= 0.5 * len(X) * X.grad
            X.grad.zero_()
    assert loss(X, Y).item() < 0.05 * first


def test_a_models_parameters():
    """The loss on a model's output: ``nn.Linear`` mapping the points, trained by SGD; the
    parameters' gradients are the chain rule through a fresh solve's gradient."""
    X, Y = clouds(2)
    model = torch.nn.Linear(2, 2, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2, dtype=torch.float64))
        model.bias.zero_()
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=BLUR, **TIGHT)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    values = []
    for _ in range(6):
        opt.zero_grad()
        out = model(X)
        L = loss(out, Y)
        L.backward()
        _, grad = fresh(out, Y)
        torch.testing.assert_close(model.bias.grad, grad.sum(0), rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(model.weight.grad, grad.T @ X, rtol=1e-8, atol=1e-12)
        values.append(L.item())
        opt.step()
    assert values[-1] < 0.5 * values[0]


def test_batches_in_an_optimiser_loop():
    """``(B, N, D)`` clouds moved in place: each item equals a fresh single solve."""
    pairs = [clouds(seed, n=40, m=30) for seed in (3, 4, 5)]
    X = torch.stack([p[0] for p in pairs]).requires_grad_(True)
    Y = torch.stack([p[1] for p in pairs])
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=BLUR, **TIGHT)
    opt = torch.optim.SGD([X], lr=0.5 * X.shape[1])
    for _ in range(4):
        opt.zero_grad()
        L = loss(X, Y)
        assert L.shape == (3,)
        L.sum().backward()
        for k in range(3):
            value, grad = fresh(X[k], Y[k])
            torch.testing.assert_close(L[k].detach(), value, rtol=1e-8, atol=1e-12)
            torch.testing.assert_close(X.grad[k], grad, rtol=1e-8, atol=1e-9 * grad.abs().max())
        opt.step()


@pytest.mark.parametrize("view", ["transposed", "sliced", "expanded weights"])
def test_non_contiguous_tensors(view):
    """``x.T.contiguous().T`` (column-major), every other row of a larger tensor: the same
    value and gradient as the contiguous copy."""
    X, Y = clouds(6)
    if view == "transposed":
        x = X.T.contiguous().T.requires_grad_(True)
    else:
        big = torch.zeros(2 * len(X), 3, dtype=X.dtype)
        big[::2, 1:] = X
        x = big[::2, 1:].requires_grad_(True)
    assert not x.is_contiguous()
    weights = ()
    if view == "expanded weights":  # stride-0 weights (torch.full(...).expand)
        weights = (
            torch.tensor(1 / len(X), dtype=X.dtype).expand(len(X)),
            torch.tensor(1 / len(Y), dtype=Y.dtype).expand(len(Y)),
        )
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=BLUR, **TIGHT)
    value = loss(*weights[:1], x, *weights[1:], Y) if weights else loss(x, Y)
    value.backward()
    ref, grad = fresh(X.contiguous(), Y)
    torch.testing.assert_close(value.detach(), ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(x.grad, grad, rtol=1e-10, atol=1e-14)


def test_the_same_object_on_the_same_data_twice_gives_the_same_bits():
    X, Y = clouds(7)
    X.requires_grad_(True)
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=BLUR, **TIGHT)
    first = loss(X, Y)
    (g1,) = torch.autograd.grad(first, X)
    second = loss(X, Y)
    (g2,) = torch.autograd.grad(second, X)
    assert first.item() == second.item() and torch.equal(g1, g2)
    assert loss.last[0].warm["ab"]  # the previous solve was kept: nothing moved


def test_geomloss_number_convention():
    """GeomLoss's ``SamplesLoss('sinkhorn', p=2, blur)`` is ``S / 2`` with sketchot's ``S``
    at ``reg = 2 blur^2`` (its cost is ``|x - y|^2 / 2``, its temperature ``blur^p``)."""
    X, Y = clouds(8)
    value = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.3, **TIGHT)(X, Y)
    S = sketchot.sinkhorn_divergence(X.numpy(), Y.numpy(), reg=2 * 0.3**2, **TIGHT)
    assert value.item() == pytest.approx(S.value / 2, rel=1e-12)  # the same solve


def test_a_gradient_penalty_is_refused_not_silently_zero():
    """``autograd.grad(..., create_graph=True)`` returns the first derivative (its value is
    right); differentiating it again raises: sketchot has no second derivatives, and before
    issue 42 the gradient came back without a graph (a penalty on it contributed nothing)."""
    X, Y = clouds(9)
    X.requires_grad_(True)
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=BLUR, **TIGHT)
    (grad,) = torch.autograd.grad(loss(X, Y), X, create_graph=True)
    torch.testing.assert_close(grad.detach(), fresh(X, Y)[1], rtol=1e-10, atol=1e-14)
    assert grad.requires_grad
    penalty = (grad**2).sum()
    with pytest.raises(RuntimeError, match="no second derivatives"):
        penalty.backward()


def test_sinkhorn_divergence_takes_tensors_and_returns_a_differentiable_tensor():
    """``sketchot.sinkhorn_divergence`` on tensors is ``sketchot.nn.sinkhorn_divergence``
    (reachable without importing ``sketchot.nn`` first)."""
    X, Y = clouds(10)
    X.requires_grad_(True)
    value = sketchot.sinkhorn_divergence(X, Y, reg=2 * BLUR**2, **TIGHT)
    value.backward()
    assert isinstance(value, torch.Tensor) and value.ndim == 0
    ref, grad = fresh(X, Y)
    torch.testing.assert_close(value.detach(), 2 * ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(X.grad, 2 * grad, rtol=1e-10, atol=1e-14)
    assert sketchot.nn.sinkhorn_divergence is not None


def test_an_optimiser_loop_on_the_default_backend():
    """``backend='auto'`` (the default) with its default accuracy: each step against a fresh
    solve within that accuracy (relative marginal error 1e-3 of each solve: the value agrees
    to about that fraction of the cross term)."""
    X, Y = clouds(11, n=200, m=150)
    X.requires_grad_(True)
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.05, rng=0)
    opt = torch.optim.SGD([X], lr=0.5 * len(X))
    values = []
    for _ in range(6):
        opt.zero_grad()
        L = loss(X, Y)
        L.backward()
        ref = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.05, rng=0)(X.detach(), Y)
        assert L.item() == pytest.approx(ref.item(), rel=1e-2, abs=1e-3)
        values.append(L.item())
        opt.step()
    assert values[-1] < 0.1 * values[0]


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    steps=st.lists(st.floats(-0.5, 0.5), min_size=2, max_size=4),
    dtype=st.sampled_from([torch.float64, torch.float32]),
)
def test_a_loss_object_on_moving_data_equals_a_fresh_solve(seed, steps, dtype):
    """The property: whatever in-place moves happen between calls, the object's value and
    gradient are those of a fresh solve of the data as it is now."""
    X, Y = clouds(seed, n=20, m=15, dtype=dtype)
    X.requires_grad_(True)
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.3, **TIGHT)
    direction = torch.tensor(
        np.random.default_rng(seed).standard_normal(tuple(X.shape)), dtype=dtype
    )
    for shift in steps:
        X.grad = None
        L = loss(X, Y)
        L.backward()
        value, grad = fresh(X, Y, blur=0.3)
        torch.testing.assert_close(L.detach(), value, rtol=RTOL[dtype], atol=1e-10)
        torch.testing.assert_close(X.grad, grad, rtol=RTOL[dtype], atol=1e-8)
        with torch.no_grad():
            X += shift * direction
