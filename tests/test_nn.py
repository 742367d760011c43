"""sketchot.nn: the Sinkhorn divergence through torch autograd and the SamplesLoss front."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sketchot  # noqa: E402
import sketchot.nn  # noqa: E402

TIGHT = {"backend": "exact", "tol": 1e-13, "max_iter": 100_000}


def tensors(seed: int, n: int = 30, m: int = 24, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 2)), 0.8 * rng.random((m, 2)) + 0.3
    a, b = rng.random(n) + 0.2, rng.random(m) + 0.2
    return [
        torch.tensor(v, dtype=dtype, requires_grad=True) for v in (X, Y, a / a.sum(), b / b.sum())
    ]


def test_backward_fills_the_numpy_gradients():
    X, Y, a, b = tensors(0)
    value = sketchot.nn.sinkhorn_divergence(X, Y, a, b, reg=0.1, **TIGHT)
    (3.0 * value).backward()
    ref = sketchot.sinkhorn_divergence(
        *(t.detach().numpy() for t in (X, Y, a, b)), reg=0.1, **TIGHT
    )
    assert value.ndim == 0 and value.item() == pytest.approx(ref.value, rel=1e-12)  # same solve
    for tensor, grad in ((X, ref.grad_X), (Y, ref.grad_Y), (a, ref.grad_a), (b, ref.grad_b)):
        np.testing.assert_allclose(tensor.grad.numpy(), 3.0 * grad, rtol=1e-10, atol=1e-14)


def test_float32_in_float32_out_and_only_requested_gradients():
    X, Y, _, _ = tensors(1, dtype=torch.float32)
    Y = Y.detach()
    value = sketchot.nn.sinkhorn_divergence(X, Y, reg=0.1, backend="exact")
    value.backward()
    assert value.dtype == torch.float32 and X.grad.dtype == torch.float32
    assert Y.grad is None


def test_samples_loss_is_geomloss_convention(dense_divergence):
    """GeomLoss: cost ||x - y||^2 / 2, eps = blur^2, rho = reach^2; its divergence from the
    dense reference with that cost (geomloss itself: the test below, when installed)."""
    X, Y, a, b = tensors(2)
    b2 = (1.5 * b).detach().requires_grad_()
    loss = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.3, reach=0.6, **TIGHT)
    value = loss(a, X, b2, Y)
    numbers = [t.detach().numpy() for t in (X, Y, a, b2)]
    ref = dense_divergence(*numbers, reg=0.3**2, reg_m=0.6**2, scale=0.5)
    assert value.item() == pytest.approx(ref, abs=1e-10)  # both solved to 1e-13
    balanced = sketchot.SamplesLoss(blur=0.3, **TIGHT)(X, Y)
    uniform = [np.full(len(X), 1 / len(X)), np.full(len(Y), 1 / len(Y))]
    ref = dense_divergence(numbers[0], numbers[1], *uniform, reg=0.3**2, scale=0.5)
    assert balanced.item() == pytest.approx(ref, abs=1e-10)


def test_batches_loop_and_match_single_calls():
    pairs = [tensors(s) for s in (3, 4)]
    x = torch.stack([p[0] for p in pairs]).detach().requires_grad_()
    y = torch.stack([p[1] for p in pairs]).detach()
    loss = sketchot.SamplesLoss(blur=0.2, backend="exact")
    values = loss(x, y)
    assert values.shape == (2,) and len(loss.last) == 2
    values.sum().backward()
    for k in range(2):
        single = sketchot.SamplesLoss(blur=0.2, backend="exact")
        xk = x[k].detach().requires_grad_()
        one = single(xk, y[k])
        one.backward()
        assert values[k].item() == pytest.approx(one.item(), rel=1e-12)  # the same solves
        np.testing.assert_allclose(x.grad[k].numpy(), xk.grad.numpy(), rtol=1e-10, atol=1e-15)


def test_warm_starts_across_calls():
    X, Y, _, _ = tensors(5)
    loss = sketchot.SamplesLoss(blur=0.2, backend="exact")
    loss(X, Y)
    assert not any(loss.last[0].warm.values())
    loss(X.detach() + 1e-3, Y)
    assert loss.last[0].warm["ab"]
    cold = sketchot.SamplesLoss(blur=0.2, backend="exact", warm_start=False)
    cold(X, Y)
    cold(X, Y)
    assert not any(cold.last[0].warm.values())


def test_errors():
    X, Y, _, _ = tensors(6)
    with pytest.raises(NotImplementedError, match="p must be 2"):
        sketchot.SamplesLoss(p=1)
    with pytest.raises(ValueError, match="loss must be 'sinkhorn'"):
        sketchot.SamplesLoss("energy")
    with pytest.raises(TypeError, match=r"\(x, y\) or \(a, x, b, y\)"):
        sketchot.SamplesLoss()(X, Y, X)
    with pytest.raises(TypeError, match=r"sketchot\.nn\.sinkhorn_divergence"):
        sketchot.loss.sinkhorn_divergence(X, Y, reg=0.1)  # the NumPy layer itself
    with pytest.raises(TypeError, match="warm_start is for NumPy clouds"):
        sketchot.sinkhorn_divergence(X, Y, reg=0.1, warm_start=None)
    with pytest.raises(TypeError, match=r"y must be a torch\.Tensor"):
        sketchot.SamplesLoss()(X, Y.detach().numpy())


def test_importing_sketchot_does_not_import_torch():
    code = "import sys, sketchot; sketchot.sinkhorn_divergence; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_round_trip_through_the_host():
    X, Y, a, b = (t.detach().cuda().requires_grad_() for t in tensors(7))
    value = sketchot.nn.sinkhorn_divergence(X, Y, a, b, reg=0.1, backend="exact")
    value.backward()
    assert value.device == X.device and X.grad.device == X.device and a.grad.is_cuda


def test_same_number_as_geomloss_when_installed():
    geomloss = pytest.importorskip("geomloss")
    X, Y, _, _ = tensors(8, n=300, m=200)
    theirs = geomloss.SamplesLoss("sinkhorn", p=2, blur=0.3, scaling=0.99, backend="tensorized")
    ours = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.3, **TIGHT)
    # GeomLoss's accuracy is its annealing's: measured agreement 7e-9 at scaling=0.99 (7e-11
    # at 0.999, 4x slower)
    assert ours(X, Y).item() == pytest.approx(theirs(X, Y).item(), abs=1e-7)


# ------------------------------------------------------------------------- issue 42
def test_sketchot_nn_is_reachable_without_importing_it():
    """``sketchot.nn.sinkhorn_divergence`` raised AttributeError unless ``sketchot.nn`` had
    been imported; ``import sketchot`` still imports no torch."""
    code = (
        "import sys, sketchot; before = 'torch' in sys.modules; "
        "print(before, callable(sketchot.nn.sinkhorn_divergence), 'nn' in dir(sketchot))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]


def test_sinkhorn_divergence_dispatches_tensors_to_the_autograd_front():
    """Tensors in: the differentiable 0-d tensor of ``sketchot.nn.sinkhorn_divergence``
    (POT returns its input's type); its ``loss=`` object keeps the full result."""
    X, Y, a, b = tensors(9)
    value = sketchot.sinkhorn_divergence(X, Y, a, b, reg=0.1, **TIGHT)
    value.backward()
    ref = sketchot.sinkhorn_divergence(*(t.detach().numpy() for t in (X, Y, a, b)), 0.1, **TIGHT)
    assert isinstance(value, torch.Tensor) and value.ndim == 0
    assert value.item() == pytest.approx(ref.value, rel=1e-12)  # the same solve
    np.testing.assert_allclose(X.grad.numpy(), ref.grad_X, rtol=1e-10, atol=1e-14)
    loss = sketchot.SinkhornDivergence(0.1, **TIGHT)
    sketchot.sinkhorn_divergence(X, Y, loss=loss)
    assert loss.last.value == pytest.approx(
        sketchot.sinkhorn_divergence(
            X.detach().numpy(), Y.detach().numpy(), reg=0.1, **TIGHT
        ).value,
        rel=1e-12,
    )


def test_create_graph_gives_the_gradient_and_refuses_a_second_derivative():
    """Issue 42: under ``create_graph=True`` the gradient came back without a graph, so a
    gradient penalty contributed nothing without a word."""
    X, Y, a, b = tensors(10)
    loss = sketchot.SamplesLoss(blur=0.3, **TIGHT)
    (first,) = torch.autograd.grad(loss(a, X, b, Y), X)
    grad_X, grad_a = torch.autograd.grad(loss(a, X, b, Y), (X, a), create_graph=True)
    assert torch.equal(grad_X.detach(), first) and grad_X.requires_grad
    for penalty in ((grad_X**2).sum(), grad_a.sum()):
        with pytest.raises(RuntimeError, match="no second derivatives"):
            torch.autograd.grad(penalty, (X, a))
    with pytest.raises(RuntimeError, match="no second derivatives"):
        torch.autograd.functional.hessian(
            lambda Z: sketchot.nn.sinkhorn_divergence(Z, Y.detach(), reg=0.1, **TIGHT), X.detach()
        )


def test_metric_gradients_through_autograd():
    """``SamplesLoss(metric='euclidean')``: its gradient is the value's (central differences);
    a callable metric refuses a position gradient at the forward, naming ``metric``."""
    X, Y, _, _ = tensors(11)
    loss = sketchot.SamplesLoss(blur=0.3, metric="euclidean", warm_start=False, **TIGHT)
    (grad,) = torch.autograd.grad(loss(X, Y), X)
    direction = torch.tensor(np.random.default_rng(12).standard_normal(X.shape))
    h = 1e-5
    with torch.no_grad():
        fd = (loss(X + h * direction, Y) - loss(X - h * direction, Y)).item() / (2 * h)
    # central differences at h = 1e-5 on a cost smooth away from x = y: truncation ~1e-9
    assert (grad * direction).sum().item() == pytest.approx(fd, rel=1e-6, abs=1e-8)

    def metric(A, B):
        return np.sqrt(((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))

    with pytest.raises(ValueError, match="metric=<callable>"):
        sketchot.SamplesLoss(blur=0.3, metric=metric, **TIGHT)(X, Y)
    # weights only: a callable's weight gradients hold
    a = torch.full((len(X),), 1 / len(X), dtype=X.dtype, requires_grad=True)
    b = torch.full((len(Y),), 1 / len(Y), dtype=X.dtype)
    sketchot.SamplesLoss(blur=0.3, metric=metric, **TIGHT)(a, X.detach(), b, Y.detach()).backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()
