"""Placement as one explicit object (:class:`sketchot._arrays.ArrayContext`): the public
entries pass the caller's placement to the geometries they build, derived geometries keep
it, no hidden state decides it; JAX arrays run through the device code (issue 43, item 2's
proof: a new array library is one backend)."""

import inspect
import warnings

import numpy as np
import pytest

import sketchot
from sketchot._arrays import NUMPY, DeviceArrays, array_context
from sketchot.gibbs import GibbsGeometry
from sketchot.kernels import ExactKernel, LowRankKernel

BACKENDS = {
    "exact": {"reg": 0.5},
    "nystrom": {"reg": 1.0, "rank": 30},
    "polyts": {"reg": 0.5},
    "polyts_local": {"reg": 0.5},
}


def clouds():
    rng = np.random.default_rng(20261128)
    return rng.random((120, 3)), rng.beta(2.0, 5.0, size=(90, 3))


def test_the_placement_is_not_a_public_parameter():
    """The entries are passed their placement by the decorator; callers never see it."""
    for entry in (sketchot.sinkhorn, sketchot.make_kernel, sketchot.barycenter):
        assert "_arrays" not in inspect.signature(entry).parameters


def test_a_geometry_built_directly_keeps_its_placement_in_derived_geometries():
    """The placement is a constructor argument (NumPy by default), never read from the call
    in progress: a geometry built outside an entry runs where it was told, and its
    :meth:`at_reg` and :meth:`sample` keep it."""
    jnp = pytest.importorskip("jax.numpy")
    X, Y = clouds()
    assert GibbsGeometry(X, Y, 0.5).context is NUMPY
    placement = array_context(X=jnp.asarray(X))
    geometry = GibbsGeometry(X, Y, 0.5, context=placement)
    assert geometry.computes_on_device()
    assert geometry.at_reg(0.1).context is placement
    assert geometry.sample(10, np.random.default_rng(0)).context is placement
    # the placement's own products agree with NumPy's
    V = np.random.default_rng(1).random((90, 2))
    np.testing.assert_allclose(
        geometry.matmat(slice(None), V), GibbsGeometry(X, Y, 0.5).matmat(slice(None), V),
        rtol=1e-5,  # JAX without x64 computes in float32 (here outside enable_x64)
    )  # fmt: skip


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_jax_arrays_run_the_device_code_and_equal_numpys_to_rounding(backend):
    """JAX arrays (with float64 enabled for the test) take the device operators, on the CPU
    here, and give NumPy's potentials to float64 rounding (sums in other orders); the answer
    is JAX arrays."""
    jax = pytest.importorskip("jax")
    X, Y = clouds()
    params = BACKENDS[backend]
    reference = sketchot.sinkhorn(None, None, X, Y, backend=backend, rng=0, **params)
    with jax.enable_x64(True):
        result = sketchot.sinkhorn(
            None, None, jax.numpy.asarray(X), jax.numpy.asarray(Y), backend=backend, rng=0,
            **params,
        )  # fmt: skip
        kernel = result.host.kernel
        assert kernel.geometry.context.library == "jax" and kernel.geometry.computes_on_device()
        # one class per kernel family, whose clouds or factors live on JAX's device
        if backend == "exact":
            assert type(kernel) is ExactKernel and kernel.on_device
        if backend == "nystrom":
            assert type(kernel) is LowRankKernel and kernel.on_device
        f = result.potentials[0]
        assert type(f).__module__.startswith("jax") and f.dtype == jax.numpy.float64
        np.testing.assert_allclose(np.asarray(f), reference.potentials[0], rtol=1e-9, atol=1e-12)
        assert bool(result.accuracy_met)


def test_jax_without_float64_runs_float32_and_certifies_in_float64():
    """Without ``jax_enable_x64`` JAX holds no float64: the kernels on its device declare
    float32 (no silent truncation warning from JAX), the answer is float32 JAX arrays, and
    the true-kernel check (float64, on the host) certifies it."""
    jax = pytest.importorskip("jax")
    X, Y = clouds()
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # JAX's "float64 ... truncated" warning
        for backend in ("exact", "nystrom"):
            params = BACKENDS[backend]
            jX, jY = jax.numpy.asarray(X), jax.numpy.asarray(Y)
            result = sketchot.sinkhorn(None, None, jX, jY, backend=backend, rng=0, **params)
            assert result.host.kernel.dtype == np.float32
            assert result.potentials[0].dtype == jax.numpy.float32
            assert bool(result.accuracy_met) and result.host.true_kernel.bound <= 1e-3


def test_an_immutable_library_is_written_by_new_arrays():
    """:meth:`DeviceArrays.assign` writes NumPy in place and returns a new JAX array."""
    jnp = pytest.importorskip("jax.numpy")
    host = DeviceArrays(NUMPY)
    target = np.zeros(4)
    assert host.assign(target, slice(1, 3), 1.0) is target and target.tolist() == [0, 1, 1, 0]
    on = DeviceArrays(array_context(X=jnp.zeros((2, 2))))
    before = jnp.zeros(4)
    after = on.assign(before, slice(1, 3), 1.0)
    assert np.asarray(after).tolist() == [0, 1, 1, 0]
    assert np.asarray(before).tolist() == [0, 0, 0, 0]  # the original is unchanged


def test_a_loss_object_passes_the_tensors_placement_to_its_warm_solves(device_operators):
    """``sketchot.nn``'s autograd function hands its loss object the tensors' placement
    explicitly: the cold solve and the warm solve of the next step (a kernel rebuilt on the
    moved points) both run the device operators, as a loss on a GPU must."""
    torch = pytest.importorskip("torch")
    X, Y = (torch.as_tensor(c) for c in clouds())
    X.requires_grad_(True)
    loss = sketchot.SinkhornDivergence(reg=0.5, backend="exact")
    optimiser = torch.optim.SGD([X], lr=0.1)
    kernels = []
    for _ in range(2):
        optimiser.zero_grad()
        sketchot.nn.sinkhorn_divergence(X, Y, loss=loss).backward()
        optimiser.step()  # moves X in place
        kernels.append(loss.last.results["ab"].kernel)
    for kernel in kernels:
        assert kernel.geometry.context.library == "torch"
        assert kernel.geometry.computes_on_device() and kernel.on_device


def test_jax_tracers_are_refused_by_name_and_the_advised_callback_works():
    """Inside ``jax.grad`` / ``jax.jit`` the arrays are tracers without numbers: refused by
    name; ``jax.pure_callback``, the advice, gives the eager call's value under ``jit``."""
    jax = pytest.importorskip("jax")
    X, Y = clouds()
    jX, jY = jax.numpy.asarray(X), jax.numpy.asarray(Y)
    with pytest.raises(TypeError, match=r"X is a JAX tracer.*jax.pure_callback"):
        jax.grad(lambda P: sketchot.sinkhorn(None, None, P, jY, reg=0.5).value)(jX)

    def value(P):
        return np.float32(sketchot.sinkhorn2(None, None, np.asarray(P), Y, reg=0.5, rng=0))

    shape = jax.ShapeDtypeStruct((), jax.numpy.float32)
    jitted = jax.jit(lambda P: jax.pure_callback(value, shape, P))
    expected = sketchot.sinkhorn2(None, None, np.asarray(jX), Y, reg=0.5, rng=0)
    assert float(jitted(jX)) == pytest.approx(expected, rel=1e-6)  # float32 rounding


def test_jax_jobs_answer_in_jax_and_equal_numpys():
    """A barycenter of JAX clouds (its inner solves on JAX's device) and a kernel built
    once and solved on: JAX arrays out, NumPy's numbers to float64 rounding."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(7)
    clouds_ = [rng.random((80, 2)) for _ in range(2)]
    # five outer steps (not converged: the warning says so) are enough to compare
    settings = {"reg": 0.05, "n_support": 30, "rng": 0, "max_iter": 5}
    with pytest.warns(UserWarning, match="stopped after 5 outer steps"):
        reference = sketchot.barycenter(clouds_, **settings)
    with jax.enable_x64(True), pytest.warns(UserWarning, match="stopped after 5 outer steps"):
        ours = sketchot.barycenter([jax.numpy.asarray(c) for c in clouds_], **settings)
        assert type(ours.X).__module__.startswith("jax")
        np.testing.assert_allclose(np.asarray(ours.X), reference.X, rtol=1e-9, atol=1e-12)
        jX, jY = (jax.numpy.asarray(c) for c in clouds_)
        kernel = sketchot.make_kernel(jX, jY, 0.1, "exact")
        assert kernel.host.geometry.computes_on_device()
        solved = sketchot.sinkhorn_kernel(None, None, kernel)
        expected = sketchot.sinkhorn(None, None, *clouds_, reg=0.1, backend="exact")
        np.testing.assert_allclose(
            np.asarray(solved.potentials[0]), expected.potentials[0], rtol=1e-9, atol=1e-12
        )
