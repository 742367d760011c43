"""POT's tests of ``ot.batch.solve_sample_batch``, ported to
:func:`sketchot.solve_sample_batch`.

Source: POT's ``test/batch/test_solve_batch.py`` (MIT licence; repository PythonOT/POT at
commit aed0120, the tests of the installed POT 0.9.7). Each test names the POT test it
ports; inputs, assertions and tolerances are POT's. POT's clouds drawn from the global NumPy
or torch generators are drawn here from explicit seeds. sketchot's :class:`BatchResult`
holds the potentials ``(log u, log v)``, not the plans: a plan is
``exp(log u_i + log v_j - M_ij / reg)``.

No equivalent (not ported): ``test_solve_batch[solver, reg_type]`` (random cost matrices
without a point-cloud form), ``test_bregman_batch`` (POT's projections on a given kernel),
``test_gradients_torch[autodiff]`` and ``[last_step]`` (differentiation through the
iterations: sketchot's gradients come from the potentials, no iteration is unrolled).
"""

from __future__ import annotations

import numpy as np
import pytest
from ot.batch import dist_batch, loss_linear_batch, loss_linear_samples_batch

import sketchot


def batch_plans(res, M, reg):
    log_u, log_v = (np.asarray(p) for p in res.potentials)
    return np.exp(log_u[:, :, None] + log_v[:, None, :] - M / reg)


def metric_case(metric):
    batchsize, n, d = 2, 4, 2
    rng = np.random.RandomState(0)
    X = rng.rand(batchsize, n, d)
    if metric == "kl":
        X = np.abs(X) + 1e-6
        X = X / np.sum(X, axis=-1, keepdims=True)
    return X


def test_metrics_sqeuclidean():
    """POT batch/test_solve_batch.py::test_metrics['sqeuclidean'] (sketchot's batches solve the
    squared Euclidean cost, its default: ``metric=`` left out): the value equals the cost
    recomputed from the plan and from the samples to 1e-5."""
    X = metric_case("sqeuclidean")
    M = dist_batch(X, X, metric="sqeuclidean")
    assert (M >= 0).all()
    res = sketchot.solve_sample_batch(X, X, reg=0.1, max_iter=10, tol=1e-5)
    plans = batch_plans(res, M, 0.1)
    loss = np.asarray(res.value_linear)
    np.testing.assert_allclose(loss, loss_linear_batch(M, plans), atol=1e-5)
    np.testing.assert_allclose(
        loss, loss_linear_samples_batch(X, X, plans, metric="sqeuclidean"), atol=1e-5
    )


def test_metrics_sqeuclidean_named():
    """POT batch/test_solve_batch.py::test_metrics['sqeuclidean'] with its ``metric=`` spelled out:
    naming the batches' own cost is accepted."""
    X = metric_case("sqeuclidean")
    M = dist_batch(X, X, metric="sqeuclidean")
    res = sketchot.solve_sample_batch(X, X, reg=0.1, max_iter=10, tol=1e-5,
                                      metric="sqeuclidean")  # fmt: skip
    np.testing.assert_allclose(
        np.asarray(res.value_linear), loss_linear_batch(M, batch_plans(res, M, 0.1)), atol=1e-5
    )


@pytest.mark.parametrize("metric", ["euclidean", "minkowski", "kl"])
def test_metrics_other_costs(metric):
    """POT batch/test_solve_batch.py::test_metrics[metric]: sketchot's batches refuse another cost
    by name and say to solve pair by pair (documented difference); pair by pair,
    ``sketchot.sinkhorn(metric=...)`` gives a value equal to the cost of its plan to 1e-5
    (``'kl'``, which is not an ``ot.dist`` metric, as a callable on the batch's cost)."""
    X = metric_case(metric)
    M = dist_batch(X, X, metric=metric)
    assert (M >= 0).all()
    with pytest.raises(TypeError, match=r"does not take metric.*pair by pair"):
        sketchot.solve_sample_batch(X, X, reg=0.1, max_iter=10, tol=1e-5, metric=metric)
    for k in range(X.shape[0]):
        cost = (
            metric
            if metric != "kl"
            else (lambda A, B: dist_batch(A[None], B[None], metric="kl")[0])
        )
        res = sketchot.sinkhorn(None, None, X[k], X[k], 0.1, backend="exact", metric=cost,
                                max_iter=10, tol=1e-5, accuracy=None)  # fmt: skip
        np.testing.assert_allclose(res.value_linear, np.sum(res.plan * M[k]), atol=1e-5)


def test_backend():
    """POT batch/test_solve_batch.py::test_backend (``solve_sample_batch`` on each array library;
    ``ot.batch.solve_batch`` on cost matrices has no equivalent)."""
    torch = pytest.importorskip("torch")
    batchsize, n, d = 2, 4, 2
    X = np.random.RandomState(0).randn(batchsize, n, d)
    res = sketchot.solve_sample_batch(X, X, reg=0.1, max_iter=10, tol=1e-5)
    Xb = torch.from_numpy(X)
    resb = sketchot.solve_sample_batch(Xb, Xb, reg=0.1, max_iter=10, tol=1e-5)
    assert isinstance(resb.value_linear, torch.Tensor)
    np.testing.assert_allclose(resb.value_linear.numpy(), np.asarray(res.value_linear))


def _torch_case():
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    X = torch.randn((2, 4, 2), generator=generator, dtype=torch.float64, requires_grad=True)
    return torch, X


def test_gradients_torch_detach():
    """POT batch/test_solve_batch.py::test_gradients_torch['detach'] (``grad='detach'`` -> solve
    on ``X.detach()``): the value carries no gradient."""
    _, X = _torch_case()
    res = sketchot.solve_sample_batch(X.detach(), X.detach(), reg=0.1, max_iter=10, tol=1e-5)
    loss = res.value_linear.sum()
    assert loss.grad is None
    assert not loss.requires_grad


def test_gradients_torch_envelope():
    """POT batch/test_solve_batch.py::test_gradients_torch['envelope']: the value's gradient
    reaches ``X``, or the call refuses a tensor that requires grad by name (never a value
    that silently drops the gradient)."""
    _, X = _torch_case()
    try:
        res = sketchot.solve_sample_batch(X, X, reg=0.1, max_iter=10, tol=1e-5)
    except TypeError as error:
        assert "grad" in str(error)
        return
    loss = res.value_linear.sum()
    loss.backward()
    assert X.grad is not None
