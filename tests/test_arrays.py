"""The Array API boundary (:mod:`sketchot._arrays`): the caller's library, device and dtype
in, the same out; mixed inputs refused by name."""

import subprocess
import sys

import numpy as np
import pytest

import sketchot
from sketchot._arrays import NUMPY, UserArrays, array_context

torch = pytest.importorskip("torch")


def clouds(n=80, m=60, d=2, dtype=torch.float64):
    generator = torch.Generator().manual_seed(3)
    X = torch.rand(n, d, generator=generator, dtype=dtype)
    Y = torch.rand(m, d, generator=generator, dtype=dtype) + 0.3
    return X, Y


def test_numpy_inputs_stay_numpy_and_are_not_wrapped():
    rng = np.random.default_rng(0)
    X, Y = rng.random((30, 2)), rng.random((20, 2))
    result = sketchot.sinkhorn(None, None, X, Y, reg=0.5)
    assert type(result) is sketchot.SinkhornResult and isinstance(result.plan, np.ndarray)
    assert array_context(X=X, Y=[1.0, 2.0], a=None) is NUMPY


def test_tensor_results_are_tensors_in_the_points_dtype():
    X, Y = clouds(dtype=torch.float32)
    result = sketchot.sinkhorn(None, None, X, Y, reg=0.1, backend="exact")
    assert isinstance(result, sketchot.SinkhornResult) and isinstance(result, UserArrays)
    for value in (*result.potentials, *result.marginals, result.u, result.plan):
        assert isinstance(value, torch.Tensor) and value.dtype == torch.float32
    # values are 0-d tensors in the points' dtype, as POT's OTResult (issue 42)
    assert isinstance(result.value, torch.Tensor) and result.value.dtype == torch.float32
    assert result.value.ndim == 0 and isinstance(result.host.plan, np.ndarray)
    # the same solve as NumPy's, to float32 rounding of the returned arrays
    reference = sketchot.sinkhorn(None, None, X.numpy(), Y.numpy(), reg=0.1, backend="exact")
    np.testing.assert_allclose(result.plan.numpy(), reference.plan, rtol=1e-5, atol=1e-12)
    mapped = result.barycentric_map(X[:5])
    assert isinstance(mapped, torch.Tensor) and mapped.shape == (5, 2)


@pytest.mark.parametrize("backend", ["exact", "nystrom"])
def test_cpu_tensors_take_numpys_operators_on_views_unless_told(backend, device_operators):
    """Tensors in host memory are solved by NumPy's operators on zero-copy views (the same
    numbers as NumPy's call, bit for bit); with ``HOST_ARRAYS_ON_DEVICE`` (what the tests and
    an accelerator use) the device operators, to rounding (sums in other orders)."""
    from sketchot import _arrays
    from sketchot.kernels import ExactKernel, LowRankKernel

    X, Y = clouds()
    host_class = ExactKernel if backend == "exact" else LowRankKernel
    # a reg the rank-30 Nystrom kernel holds on these clouds
    params = {"rank": 30, "reg": 1.0} if backend == "nystrom" else {"reg": 0.1}
    reference = sketchot.sinkhorn(None, None, X.numpy(), Y.numpy(), backend=backend,
                                  rng=0, **params)  # fmt: skip
    _arrays.HOST_ARRAYS_ON_DEVICE = False  # the default (the fixture restores its value)
    result = sketchot.sinkhorn(None, None, X, Y, backend=backend, rng=0, **params)
    assert type(result.host.kernel) is host_class
    assert array_context(X=X).on_host and not result.host.kernel.geometry.computes_on_device()
    assert isinstance(result.potentials[0], torch.Tensor)
    assert np.array_equal(result.potentials[0].numpy(), reference.potentials[0])
    _arrays.HOST_ARRAYS_ON_DEVICE = True
    on_device = sketchot.sinkhorn(None, None, X, Y, backend=backend, rng=0, **params)
    # one class per kernel family: the placement is its geometry's
    expected = ExactKernel if backend == "exact" else LowRankKernel
    assert type(on_device.host.kernel) is expected and on_device.host.kernel.on_device
    np.testing.assert_allclose(on_device.potentials[0].numpy(), reference.potentials[0],
                               rtol=1e-9, atol=1e-12)  # fmt: skip


def test_sinkhorn2_is_a_0d_tensor_and_refuses_gradients_by_name():
    X, Y = clouds()
    value = sketchot.sinkhorn2(None, None, X, Y, reg=0.2, backend="exact")
    assert isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype == torch.float64
    with pytest.raises(TypeError, match=r"X requires grad.*solve_sample\(.*\)\.value"):
        sketchot.sinkhorn2(None, None, X.requires_grad_(), Y, reg=0.2)


def test_warm_start_kernel_and_plan_products_take_tensors():
    X, Y = clouds()
    first = sketchot.sinkhorn(None, None, X, Y, reg=0.1, backend="exact")
    warm = sketchot.sinkhorn(None, None, X, Y, reg=0.1, backend="exact", warmstart=first.potentials)
    # started at the fixed point: one check's worth of iterations
    assert warm.n_iter <= 10 and isinstance(warm.potentials[1], torch.Tensor)
    kernel = sketchot.make_kernel(X, Y, 1.0, "nystrom", rank=40, rng=0)
    assert isinstance(kernel, sketchot.KernelOperator)
    assert isinstance(kernel.matvec(torch.ones(60, dtype=torch.float64)), torch.Tensor)
    again = sketchot.sinkhorn_kernel(None, None, kernel, warn=False)
    assert isinstance(again.potentials[0], torch.Tensor)
    column = first.lazy_plan.matvec(torch.ones(60, dtype=torch.float64))
    torch.testing.assert_close(column, first.marginals[0])


def test_mixed_libraries_and_devices_are_refused_by_name():
    X, Y = clouds()
    with pytest.raises(TypeError, match=r"one library; got X \(torch\), Y \(cupy\)"):
        array_context(X=X, Y=_Foreign())
    with pytest.raises(TypeError, match=r"one device; got X on cpu, Y on meta"):
        sketchot.sinkhorn(None, None, X, Y.to("meta"), reg=0.1)


class _Foreign:
    """An array of another Array API library, as far as the boundary can tell."""

    __module__ = "cupy"

    def __array_namespace__(self):  # pragma: no cover - never called
        raise AssertionError


def test_batch_and_barycenter_answer_in_tensors():
    generator = torch.Generator().manual_seed(1)
    X = torch.rand(3, 20, 2, generator=generator, dtype=torch.float64)
    Y = torch.rand(3, 25, 2, generator=generator, dtype=torch.float64)
    batch = sketchot.sinkhorn_batch(X, Y, reg=0.1)
    assert isinstance(batch.potentials[0], torch.Tensor) and batch.potentials[0].shape == (3, 20)
    reference = sketchot.sinkhorn_batch(X.numpy(), Y.numpy(), reg=0.1)
    np.testing.assert_array_equal(batch.potentials[0].numpy(), reference.potentials[0])
    center = sketchot.barycenter([X[0], Y[0]], reg=0.1, n_support=10, rng=0)
    assert isinstance(center.X, torch.Tensor) and center.X.shape == (10, 2)


def test_import_does_not_load_torch_or_array_api_compat():
    code = "import sys, sketchot; print('torch' in sys.modules, 'array_api_compat' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_come_back_on_their_device():
    X, Y = (t.cuda() for t in clouds())
    result = sketchot.sinkhorn(None, None, X, Y, reg=0.1)
    assert result.potentials[0].device == X.device and result.plan.device == X.device
    assert sketchot.sinkhorn2(None, None, X, Y, reg=0.1).device == X.device


@pytest.mark.parametrize(
    "call",
    [
        lambda X: sketchot.sinkhorn_batch(X[None], X[None].detach(), reg=0.5),
        lambda X: sketchot.solve_sample_batch(X[None], X[None].detach(), reg=0.5),
        lambda X: sketchot.pairwise_divergences([X, X.detach() + 1.0], reg=0.5),
        lambda X: sketchot.barycenter([X, X.detach() + 1.0], n_support=5, reg=0.5, rng=0),
    ],
    ids=["sinkhorn_batch", "solve_sample_batch", "pairwise_divergences", "barycenter"],
)
def test_entries_without_gradients_refuse_tensors_that_require_grad(call):
    """Their answers carry no gradient: a tensor that requires grad is refused by name (before,
    the values came back without a graph and ``backward()`` failed far from the cause, or a
    loss built on them silently missed the term)."""
    torch = pytest.importorskip("torch")
    X = torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    X.requires_grad_(True)
    with pytest.raises(TypeError, match=r"requires grad.*detach"):
        call(X)
