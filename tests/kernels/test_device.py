"""The device operators (:mod:`sketchot.kernels.device`) against the NumPy ones: the same
contract, the same numbers. Run on PyTorch CPU tensors (the code is the same on CUDA, where
the last test also runs)."""

import time

import numpy as np
import pytest
from backend_params import contract_params

import sketchot
from sketchot._arrays import array_context
from sketchot.gibbs import GibbsGeometry
from sketchot.kernels import IDENTITY_STEP, ExactKernel, LowRankKernel, RatioStep
from sketchot.kernels.base import ratios_and_bad

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("device_operators")  # CPU tensors take them here

#: products in float64 on both sides, summed in other orders: agreement to rounding
RTOL = 1e-10


def pair(reg=0.3, metric="sqeuclidean", n=70, m=55, seed=0):
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 3)), rng.beta(2, 5, size=(m, 3))
    host = GibbsGeometry(X, Y, reg, metric)
    device = GibbsGeometry(X, Y, reg, metric)
    device.context = array_context(X=torch.as_tensor(X))
    return host, device


@pytest.fixture(params=["stored", "streamed", "fused"])
def kernels(request):
    host, device = pair()
    max_dense_bytes = 1 << 30 if request.param == "stored" else 0
    if request.param == "fused":  # streamed through sketchot.fused's one-launch passes
        request.getfixturevalue("fused_interpreter")
    reference = ExactKernel(host, max_dense_bytes=max_dense_bytes)
    built = sketchot.kernels.exact.build_exact(device, max_dense_bytes=max_dense_bytes)
    assert type(built) is ExactKernel and built.on_device and built.is_dense == reference.is_dense
    assert built.fused == (request.param == "fused")
    built._rows_per_block = 16  # several blocks: the streamed sums cross block edges
    return reference, built


def test_products_rows_and_out_of_sample_match(kernels):
    reference, device = kernels
    rng = np.random.default_rng(1)
    V, U = rng.standard_normal((55, 3)), rng.standard_normal((70, 2))
    np.testing.assert_allclose(device.matmat(V), reference.matmat(V), rtol=RTOL)
    np.testing.assert_allclose(device.rmatmat(U), reference.rmatmat(U), rtol=RTOL)
    np.testing.assert_allclose(device.to_dense(), reference.to_dense(), rtol=RTOL)
    np.testing.assert_allclose(device._rows([3, 9]), reference._rows([3, 9]), rtol=RTOL)
    new = rng.random((5, 3))
    np.testing.assert_allclose(device.apply_new(new, V), reference.apply_new(new, V), rtol=RTOL)
    v, u = V[:, 0], U[:, 0]
    # the dot test: rmatvec is the adjoint of matvec
    assert device.matvec(v) @ u == pytest.approx(v @ device.rmatvec(u), rel=1e-12)


def _step(kind: str, top: np.ndarray, log: bool) -> RatioStep:
    """A penalty step of each kind in the pass's form: hard, KL's power, TV's bounds."""
    if kind == "hard":
        return IDENTITY_STEP
    if kind == "kl":
        return RatioStep(0.7)
    with np.errstate(divide="ignore"):
        if log:
            return RatioStep(1.0, top - 1.0, top + 1.0)
        return RatioStep(1.0, top * np.exp(-1.0), top * np.exp(1.0))


@pytest.mark.parametrize("kind", ["hard", "kl", "tv"])
def test_fused_passes_linear_and_log_match(kernels, kind):
    reference, device = kernels
    rng = np.random.default_rng(2)
    w, numerator = rng.random(55) + 0.1, np.full(70, 1 / 70)
    numerator[4] = 0.0  # a zero weight: ratio 0, never bad
    for log in (False, True):
        with np.errstate(divide="ignore"):  # log 0 = -inf: the zero weight
            values = np.log(w) if log else w
            top = np.log(numerator) if log else numerator
            step = _step(kind, top, log)
            ours = device.fused_pass("rows", values, top, log=log, step=step)
            theirs = reference.fused_pass("rows", values, top, log=log, step=step)
        for name in ("products", "ratios", "projection"):
            np.testing.assert_allclose(
                getattr(ours, name), getattr(theirs, name), rtol=RTOL, err_msg=name
            )
        assert np.array_equal(ours.bad, theirs.bad)
        index = [1, 6, 30]
        np.testing.assert_allclose(
            device.project("rows", ours.ratios[index], index, log=log),
            reference.project("rows", theirs.ratios[index], index, log=log),
            rtol=RTOL,
        )


@pytest.mark.parametrize("side", ["rows", "cols"])
def test_log_means_are_the_log_sums_and_weighted_means(kernels, side):
    """``log_means`` gives ``log(K e^w)`` and the means of the other cloud under
    ``K diag(e^w)``, from the dense kernel on the host; weights near e^800 (beyond float64)
    and zero weights (log -inf) included; an all-zero weight vector gives -inf and 0."""
    reference, device = kernels
    assert "log_means" in device.info.capabilities
    K = reference.to_dense() if side == "rows" else reference.to_dense().T
    g = reference.geometry
    other = g.Yc if side == "rows" else g.Xc
    rng = np.random.default_rng(5)
    log_w = rng.normal(scale=3.0, size=K.shape[1]) + 800.0
    log_w[[0, 7]] = -np.inf
    log_sums, means = device.log_means(side, log_w)
    weights = K * np.exp(log_w - 800.0)[None, :]
    np.testing.assert_allclose(log_sums, np.log(weights.sum(1)) + 800.0, rtol=RTOL)
    expected = weights @ other / weights.sum(1)[:, None]
    np.testing.assert_allclose(means, expected, rtol=RTOL, atol=RTOL * np.abs(other).max())
    log_sums, means = device.log_means(side, np.full(K.shape[1], -np.inf))
    assert np.all(log_sums == -np.inf) and np.all(means == 0.0)
    with pytest.raises(ValueError, match="side"):
        device.log_means("diagonal", log_w)


def test_float32_fused_passes_round_the_weights_spread_not_their_gauge(fused_interpreter):
    """Log weights offset by 1e5 (a balanced solve's gauge) give the same log sums in
    float32 passes: the offset is taken out in float64 (rounded with it, float32 would lose
    1e5 * 1.2e-7 = 0.012 in every exponent). Tolerance: float32's rounding of exponents of
    size ~20 (the weights' spread and c / reg here), 1e-5."""
    host, device = pair()
    dense = ExactKernel(host).to_dense()
    single = sketchot.kernels.exact.build_exact(device, max_dense_bytes=0, dtype=np.float32)
    assert single.fused
    log_w = np.random.default_rng(7).normal(scale=3.0, size=55)
    expected = np.log(dense @ np.exp(log_w))
    for offset in (0.0, 1e5, -1e5):
        log_sums, _ = single.log_means("rows", log_w + offset)
        np.testing.assert_allclose(log_sums - offset, expected, rtol=0, atol=1e-5)
        one = single.fused_pass("rows", log_w + offset, np.zeros(70), log=True)
        np.testing.assert_allclose(one.products - offset, expected, rtol=0, atol=1e-5)


def test_bad_products_are_reported_as_the_numpy_rules_say(kernels):
    """A weight vector with negative entries gives non-positive products: the streamed
    pass's mask and ratios are :func:`ratios_and_bad`'s, block by block."""
    reference, device = kernels
    w = np.linspace(-1.0, 1.0, 55)
    numerator = np.full(70, 1 / 70)
    ours = device.fused_pass("rows", w, numerator)
    expected = ratios_and_bad(numerator, reference.matvec(w))
    np.testing.assert_allclose(ours.ratios, expected[0], rtol=RTOL)
    assert ours.bad.any() and np.array_equal(ours.bad, expected[1])


def test_absorbed_kernels_match(kernels):
    reference, device = kernels
    rng = np.random.default_rng(3)
    alpha, beta = rng.normal(scale=50, size=70), rng.normal(scale=50, size=55)
    alpha[2] = -np.inf  # a zero weight's row: every entry at the floor
    ours, theirs = device.absorbed(alpha, beta), reference.absorbed(alpha, beta)
    np.testing.assert_allclose(ours.to_dense(), theirs.to_dense(), rtol=RTOL)
    w = rng.random(55)
    a = np.full(70, 1 / 70)
    np.testing.assert_allclose(
        ours.fused_pass("rows", w, a).projection, theirs.fused_pass("rows", w, a).projection,
        rtol=RTOL,
    )  # fmt: skip
    with pytest.raises(NotImplementedError):
        ours.fused_pass("rows", w, a, log=True)


def test_float32_storage_and_the_euclidean_cost():
    host, device = pair(metric="euclidean")
    reference = ExactKernel(host, dtype=np.float32)
    ours = sketchot.kernels.exact.build_exact(device, dtype=np.float32)
    assert type(ours) is ExactKernel and ours.on_device
    w = np.linspace(0.5, 1.5, 55)
    # both store float32 entries of the same float64 values: products agree to float32 rounding
    np.testing.assert_allclose(ours.matvec(w), reference.matvec(w), rtol=1e-6)
    callable_cost = GibbsGeometry(host.X, host.Y, 0.3, lambda A, B: np.ones((len(A), len(B))))
    callable_cost.context = device.context
    assert type(sketchot.kernels.exact.build_exact(callable_cost)) is ExactKernel


@pytest.mark.parametrize("backend", ["nystrom", "rff", "polyts"])
def test_low_rank_factors_run_on_the_device(backend):
    rng = np.random.default_rng(4)
    X, Y = rng.random((80, 3)), rng.random((60, 3))
    params = contract_params(backend)
    reference = sketchot.make_kernel(X, Y, 0.5, backend, rng=5, **params)
    view = sketchot.make_kernel(torch.as_tensor(X), torch.as_tensor(Y), 0.5, backend, rng=5,
                                **params)  # fmt: skip
    ours = view.host
    assert type(ours) is LowRankKernel and ours.on_device  # one class, placed on the device
    np.testing.assert_allclose(ours.factors[0], reference.factors[0])  # the same fit
    w, a = rng.random(60) + 0.5, np.full(80, 1 / 80)
    for name in ("products", "ratios", "projection"):
        np.testing.assert_allclose(
            getattr(ours.fused_pass("rows", ours.project("cols", w), a), name),
            getattr(reference.fused_pass("rows", reference.project("cols", w), a), name),
            rtol=RTOL, atol=1e-14,
        )  # fmt: skip
    np.testing.assert_allclose(ours.rmatvec(a), reference.rmatvec(a), rtol=RTOL, atol=1e-14)


def test_the_placement_decides_where_the_one_low_rank_class_runs():
    """One low-rank class for every placement: its placement object (NumPy, the caller's
    device) holds the factors and runs the products, the same numbers to rounding."""
    import importlib.util

    from sketchot._arrays import DeviceArrays
    from sketchot.kernels.base import KernelInfo
    from sketchot.kernels.lowrank import DeviceFactors, HostFactors

    if importlib.util.find_spec("dask") is not None:
        import sketchot.distributed  # noqa: F401  (its placement subclasses nothing here)
    assert not LowRankKernel.__subclasses__()
    host, device = pair()
    rng = np.random.default_rng(15)
    left, right = rng.random((70, 6)), rng.random((55, 6))

    def build(geometry, placement=None):
        identity = lambda points: points @ np.ones((3, 6))  # noqa: E731
        return LowRankKernel(geometry, KernelInfo("test"), left, right, left_map=identity,
                             right_map=identity, dtype=np.float64, placement=placement)  # fmt: skip

    # the default placement is the geometry's; an explicit one overrides it
    assert isinstance(build(host).placement, HostFactors) and not build(host).on_device
    assert isinstance(build(device).placement, DeviceFactors) and build(device).on_device
    on_host = build(host, HostFactors())
    on_device = build(host, DeviceFactors(DeviceArrays(device.context)))
    assert type(on_host) is type(on_device) is LowRankKernel
    assert isinstance(on_device._left_held, torch.Tensor)
    assert "deferred" not in on_device.info.capabilities | on_host.info.capabilities
    V, U, w = rng.random((55, 2)), rng.random((70, 3)), rng.random(6)
    a, new = np.full(70, 1 / 70), rng.random((4, 3))
    pairs = [
        (on_device.matmat(V), on_host.matmat(V)),
        (on_device.rmatmat(U), on_host.rmatmat(U)),
        (on_device.to_dense(rows=[1, 5]), on_host.to_dense(rows=[1, 5])),
        (on_device.project("rows", a[:3], [2, 7, 9]), on_host.project("rows", a[:3], [2, 7, 9])),
        (on_device.apply_new(new, V), on_host.apply_new(new, V)),
        *(
            (getattr(on_device.fused_pass("rows", w, a), name),
             getattr(on_host.fused_pass("rows", w, a), name))
            for name in ("products", "ratios", "projection")
        ),
    ]  # fmt: skip
    for ours, reference in pairs:
        np.testing.assert_allclose(ours, reference, rtol=RTOL)
    np.testing.assert_allclose(on_device.left, left, rtol=RTOL)


#: each low-rank backend's maps (patched below) and variants: the improved sketch at d = 3
#: has exact degrees 1-3 and a folded TensorSketch of degree 4, the paper's only sketches
FACTOR_CASES = [
    ("nystrom", "nystrom_maps", {}),
    ("rff", "rff_maps", {}),
    ("polyts", "_global_maps", {"variant": "improved"}),
    ("polyts", "_global_maps", {"variant": "paper"}),
]


@pytest.mark.parametrize("backend, maps_name, variant", FACTOR_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_low_rank_factors_are_built_on_the_device(monkeypatch, backend, maps_name, variant,
                                                   dtype):  # fmt: skip
    """Every low-rank backend's factors are built where the points live (their host maps
    patched to fail), equal to the host's to rounding, held there only (the NumPy ``left``
    is fetched when read), and rows and indexed projections are taken there."""
    import dataclasses
    import importlib

    rng = np.random.default_rng(14)
    X, Y = rng.random((80, 3)), rng.random((60, 3))
    params = {**contract_params(backend), **variant, "dtype": dtype}
    reference = sketchot.make_kernel(X, Y, 0.5, backend, rng=5, **params)
    module = importlib.import_module(f"sketchot.kernels.{backend}")
    host_maps = getattr(module, maps_name)

    def device_only(*args, **kwargs):
        def refuse(points):
            raise AssertionError("a factor built on the host")

        maps = host_maps(*args, **kwargs)
        return dataclasses.replace(maps, left_factor=refuse, right_factor=refuse)

    monkeypatch.setattr(module, maps_name, device_only)
    ours = sketchot.make_kernel(torch.as_tensor(X), torch.as_tensor(Y), 0.5, backend, rng=5,
                                **params).host  # fmt: skip
    assert isinstance(ours._left_held, torch.Tensor) and not ours._fetched
    assert ours._left_held.dtype == getattr(torch, np.dtype(dtype).name)
    # float32 factors: their own rounding; entries that cancel to ~0 (FFT sums of signed
    # terms) agree to the rounding of the factors' size (atol)
    rtol = 1e-5 if dtype == np.float32 else RTOL
    np.testing.assert_allclose(ours.left, reference.left, rtol=rtol, atol=rtol)
    assert ours.left.dtype == dtype and set(ours._fetched) == {"left"}
    index, u = [2, 7, 40], rng.random(3)
    np.testing.assert_allclose(ours.project("rows", u, index),
                               reference.project("rows", u, index), rtol=rtol,
                               atol=rtol)  # fmt: skip
    np.testing.assert_allclose(ours._rows(np.array(index)), reference._rows(np.array(index)),
                               rtol=rtol, atol=rtol)  # fmt: skip
    assert "right" not in ours._fetched  # rows and projections read the device's copies


def test_the_block_local_kernel_runs_its_products_on_the_device():
    """``polyts_local`` from tensors: the expansion's per-point work runs in torch (the
    sides' arrays kept there), its passes, means and new-point products equal the NumPy
    kernel's to rounding (summed in other orders), and the transposed expansion that new
    target points need goes to the device too."""
    host, device = pair(reg=0.01, n=300, m=260)
    params = {"tau": 2.0, "rtol": 1e-10, "rng": 0}
    reference = sketchot.kernels.local.build_local(host, **params)
    ours = sketchot.kernels.local.build_local(device, **params)
    assert ours.expansion._on is not None and reference.expansion._on is None
    assert isinstance(ours.expansion._x.device.local, torch.Tensor)
    rng = np.random.default_rng(12)
    log_w, numerator = rng.normal(scale=4.0, size=260), np.log(np.full(300, 1 / 300))
    for log in (False, True):
        w = log_w if log else np.exp(log_w)
        one, other = (k.fused_pass("rows", w, numerator, log=log) for k in (ours, reference))
        for name in ("products", "ratios", "projection"):
            np.testing.assert_allclose(
                getattr(one, name), getattr(other, name), rtol=RTOL, err_msg=name
            )
    for side, length in (("rows", 260), ("cols", 300)):
        weights = rng.normal(size=length)
        for got, expected in zip(ours.log_means(side, weights),
                                 reference.log_means(side, weights), strict=True):  # fmt: skip
            np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-12)
    new, V = rng.random((7, 3)), rng.standard_normal((260, 2))
    np.testing.assert_allclose(ours.apply_new(new, V), reference.apply_new(new, V), rtol=RTOL)
    U = rng.standard_normal((300, 2))
    np.testing.assert_allclose(ours.apply_new(new, U, side="target"),
                               reference.apply_new(new, U, side="target"), rtol=RTOL)  # fmt: skip
    assert ours._transposed._on is not None


def test_a_block_local_solve_on_the_device_equals_the_numpy_solve():
    """A small-reg log-domain solve with ``polyts_local`` on tensors: the same iterations,
    potentials and certified error as on NumPy arrays."""
    rng = np.random.default_rng(13)
    X, Y = rng.random((400, 3)), rng.beta(2, 5, size=(350, 3))
    params = {"reg": 0.002, "backend": "polyts_local", "rng": 0}
    reference = sketchot.sinkhorn(None, None, X, Y, **params)
    ours = sketchot.sinkhorn(None, None, torch.as_tensor(X), torch.as_tensor(Y), **params)
    assert ours.host.kernel.expansion._on is not None
    assert ours.n_iter == reference.n_iter and ours.accuracy_met == reference.accuracy_met
    np.testing.assert_allclose(ours.potentials[0].numpy(), reference.potentials[0],
                               rtol=1e-9, atol=1e-9)  # fmt: skip
    assert ours.true_kernel.bound == pytest.approx(reference.true_kernel.bound, rel=1e-3)


def test_a_solve_on_device_kernels_equals_the_numpy_solve():
    rng = np.random.default_rng(6)
    X, Y = rng.random((90, 2)), rng.random((70, 2))
    for params in ({"backend": "exact"}, {"backend": "exact", "max_dense_bytes": 0},
                   {"backend": "exact", "log_domain": True, "anderson": 0}):  # fmt: skip
        reference = sketchot.sinkhorn(None, None, X, Y, reg=0.02, **params)
        ours = sketchot.sinkhorn(None, None, torch.as_tensor(X), torch.as_tensor(Y), reg=0.02,
                                 **params)  # fmt: skip
        assert ours.host.kernel.on_device
        assert ours.n_iter == reference.n_iter and ours.backend == reference.backend
        np.testing.assert_allclose(ours.potentials[0].numpy(), reference.potentials[0],
                                   rtol=1e-9, atol=1e-9)  # fmt: skip
        assert ours.true_kernel.bound == pytest.approx(reference.true_kernel.bound, rel=1e-3,
                                                       abs=1e-12)  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_kernels_hold_their_data_on_the_device():
    X = torch.rand(500, 3, dtype=torch.float64, device="cuda")
    kernel = sketchot.make_kernel(X, X, 0.1, "exact").host
    assert kernel.placement.X.device.type == "cuda" and kernel._dense.device.type == "cuda"
    local = sketchot.make_kernel(X, X, 0.01, "polyts_local", rng=0).host
    assert local.expansion._x.device.local.device.type == "cuda"
    reference = sketchot.make_kernel(X.cpu().numpy(), X.cpu().numpy(), 0.01, "polyts_local",
                                     rng=0)  # fmt: skip
    log_w, zero = np.linspace(-3.0, 3.0, 500), np.zeros(500)
    np.testing.assert_allclose(local.fused_pass("rows", log_w, zero, log=True).products,
                               reference.fused_pass("rows", log_w, zero, log=True).products,
                               rtol=1e-10)  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("params", [{}, {"log_domain": False, "anderson": 0}])
def test_a_cuda_solve_streams_fused_passes_and_equals_the_numpy_solve(params):
    rng = np.random.default_rng(9)
    X, Y = rng.random((900, 3)), rng.random((700, 3))
    # float64 named: dtype=None would take float32 on the GPU (the next test)
    params = {"backend": "exact", "max_dense_bytes": 0, "dtype": np.float64, **params}
    reference = sketchot.sinkhorn(None, None, X, Y, reg=0.02, **params)
    ours = sketchot.sinkhorn(None, None, *(torch.as_tensor(Z, device="cuda") for Z in (X, Y)),
                             reg=0.02, **params)  # fmt: skip
    assert ours.host.kernel.fused and ours.potentials[0].is_cuda
    np.testing.assert_allclose(ours.potentials[0].cpu().numpy(), reference.potentials[0],
                               rtol=1e-9, atol=1e-9)  # fmt: skip
    assert ours.accuracy_met == reference.accuracy_met


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_solve_takes_float32_where_it_meets_the_accuracy():
    rng = np.random.default_rng(10)
    X, Y = (torch.as_tensor(rng.random((900, 3)), device="cuda") for _ in range(2))
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.05, backend="exact", max_dense_bytes=0)
    assert res.host.kernel.dtype == np.float32 and res.accuracy_met
    assert res.potentials[0].dtype == torch.float64  # the points' dtype, whatever the passes'
    tight = sketchot.sinkhorn(None, None, X, Y, reg=0.05, backend="exact", accuracy=1e-7)
    assert tight.host.kernel.dtype == np.float64


def test_dtype_none_takes_float32_on_an_accelerator_only_where_its_rounding_allows(monkeypatch):
    """``default_dtype``: float64 for NumPy and for CPU tensors (host memory); on an
    accelerator float32 from ``FLOAT32_MARGIN * eps32 * max(1, max_cost / reg)`` up."""
    from sketchot.kernels import device as device_module

    host, device = pair(reg=0.3)
    eps32 = float(np.finfo(np.float32).eps)
    assert device_module.default_dtype(host, 1e-2) == np.float64
    assert device_module.default_dtype(device, 1e-2) == np.float64  # a CPU tensor's geometry
    monkeypatch.setattr(device_module, "on_accelerator", lambda geometry: True)
    threshold = device_module.FLOAT32_MARGIN * eps32 * max(1.0, device.max_cost() / device.reg)
    assert device_module.default_dtype(device, threshold) == np.float32
    assert device_module.default_dtype(device, 0.99 * threshold) == np.float64
    assert device_module.default_dtype(device, None) == np.float64  # no check: float64
    small = device.at_reg(1e-4)  # a spread 3000x larger: its threshold too
    assert device_module.default_dtype(small, threshold) == np.float64


def test_a_float32_default_solve_meets_the_accuracy_its_rule_took_it_for(
    fused_interpreter, monkeypatch
):
    """The rule followed: at its own smallest float32 accuracy, a solve of the fused float32
    passes (the GPU's program, under Triton's interpreter) from the float64 solution stays
    within that accuracy against the true kernel, at a reg of 1% of the squared spread (spread
    max_cost / reg ~ 260; started warm: the interpreter is slow)."""
    from sketchot.kernels import device as device_module

    monkeypatch.setattr(device_module, "on_accelerator", lambda geometry: True)
    rng = np.random.default_rng(11)
    X, Y = rng.random((120, 3)), rng.beta(2, 5, size=(100, 3))
    reg = 0.01
    reference = sketchot.sinkhorn(None, None, X, Y, reg=reg, backend="exact", accuracy=None,
                                  tol=1e-12, max_iter=5000)  # fmt: skip
    spread = reference.kernel.geometry.max_cost() / reg
    accuracy = device_module.FLOAT32_MARGIN * float(np.finfo(np.float32).eps) * spread
    res = sketchot.sinkhorn(None, None, torch.as_tensor(X), torch.as_tensor(Y), reg=reg,
                            backend="exact", max_dense_bytes=0, accuracy=accuracy,
                            warmstart=reference.potentials)  # fmt: skip
    assert res.host.kernel.dtype == np.float32 and res.host.kernel.fused
    assert res.accuracy_met and res.true_kernel.exhaustive
    # the approximations keep float64 (signed factors: no entry bound on float32's rounding)
    low_rank = sketchot.sinkhorn(None, None, torch.as_tensor(X), torch.as_tensor(Y), reg=1.0,
                                 backend="nystrom", rank=40, rng=0, accuracy=accuracy)  # fmt: skip
    assert low_rank.host.kernel.dtype == np.float64
    without_check = sketchot.sinkhorn(None, None, torch.as_tensor(X), torch.as_tensor(Y), reg=reg,
                                      backend="exact", accuracy=None, max_iter=3)  # fmt: skip
    assert without_check.host.kernel.dtype == np.float64  # nothing to hold float32 to


def test_auto_predicts_the_exact_iteration_on_the_device_without_timing(monkeypatch):
    """On the caller's device ``auto`` predicts an exact iteration from the declared rates
    (:mod:`sketchot.kernels.cost`), never from a timed block: a random clock changes
    nothing, and the prediction is the entries over the rate of the passes that run."""
    from sketchot.kernels import cost
    from sketchot.policy.ladder import exact_iteration_seconds

    host, device = pair(n=400, m=300)
    first = [exact_iteration_seconds(device, stored=stored) for stored in (True, False)]
    generator = np.random.default_rng(1)
    monkeypatch.setattr(time, "perf_counter", lambda: float(generator.uniform(0, 1e4)))
    assert [exact_iteration_seconds(device, stored=stored) for stored in (True, False)] == first
    assert first[0] == 400 * 300 / cost.DEVICE_BLOCK_ENTRIES_PER_SECOND  # no fused passes
    assert exact_iteration_seconds(host, stored=True) == cost.exact_iteration_cost(
        400, 300, 3, stored=True
    )


@pytest.mark.parametrize("name", ["torch", "array_api_strict"])
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
def test_geometry_true_kernel_values_on_the_device_match_the_host(name, metric):
    """The true-kernel values the solver asks the geometry for (the true-kernel check's
    rows, the safeguard's repairs, barycentric maps of exact kernels) are computed where the
    points live; the same numbers as on the host."""
    module = pytest.importorskip(name)
    host, device = pair(reg=0.05, metric=metric)
    device.context = array_context(X=module.asarray(host.X))
    rng = np.random.default_rng(7)
    index = [0, 5, 17, 69]
    V, log_v = rng.standard_normal((55, 2)), rng.normal(size=55)
    np.testing.assert_allclose(device.matmat(index, V), host.matmat(index, V), rtol=RTOL)
    np.testing.assert_allclose(
        device.log_matvec(index, log_v), host.log_matvec(index, log_v), rtol=RTOL
    )
    log_u = rng.normal(size=70)
    np.testing.assert_allclose(
        device.log_matvec([1, 2], log_u, transpose=True),
        host.log_matvec([1, 2], log_u, transpose=True),
        rtol=RTOL,
    )
    values = rng.random((55, 3))
    for points in (None, rng.random((6, 3))):
        np.testing.assert_allclose(
            device.softmax_average(points, log_v, values),
            host.softmax_average(points, log_v, values),
            rtol=RTOL,
        )
    mapped = device.softmax_average(None, log_u, host.X, transpose=True)
    np.testing.assert_allclose(
        mapped, host.softmax_average(None, log_u, host.X, transpose=True), rtol=RTOL
    )


@pytest.mark.parametrize("seconds", [1e-4, 10.0], ids=["fast", "slow"])
def test_auto_takes_the_exact_kernel_when_the_device_makes_it_cheap(monkeypatch, seconds):
    """``auto`` on the caller's device: the exact kernel directly when its predicted
    iterations are cheap there (a GPU's fused passes), the ladder as on the host otherwise
    (predictions faked: a test never compares a machine's speed)."""
    from sketchot.policy import ladder as auto

    monkeypatch.setattr(auto, "DIRECT_DENSE_ENTRIES", 0)
    monkeypatch.setattr(auto, "exact_iteration_seconds", lambda geometry, stored: seconds)
    rng = np.random.default_rng(8)
    X, Y = (torch.as_tensor(rng.random((200, 3))) for _ in range(2))
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.5, rng=0)
    direct = seconds * auto.DIRECT_EXACT_ITERATIONS <= auto.DIRECT_EXACT_SECONDS
    assert ("caller's device" in res.reason) == direct and not (direct and res.attempts)
    assert res.backend == "exact" if direct else res.backend != "exact"
    assert res.accuracy_met


def test_the_fused_passes_are_what_auto_predicts_on_the_device(fused_interpreter):
    from sketchot.kernels import cost

    _, device = pair(n=400, m=300)
    predicted = sketchot.kernels.device.device_exact_iteration_cost(device)
    assert predicted == 400 * 300 / cost.DEVICE_FUSED_ENTRIES_PER_SECOND


def test_a_fused_kernel_at_another_reg_shares_its_points_and_timing(fused_interpreter):
    """``at_reg`` (epsilon scaling, coarse-to-fine) keeps the device copies and the timed
    pass of the kernel it comes from: a pass costs the same at any reg."""
    _, device = pair()
    kernel = sketchot.kernels.exact.build_exact(device, max_dense_bytes=0)
    other = kernel.at_reg(0.05)
    assert other.placement.fused_points is kernel.placement.fused_points
    assert other.geometry.reg == 0.05
    assert other.info.seconds_per_pass == kernel.info.seconds_per_pass
    w = np.linspace(0.1, 1.0, 55)
    reference = ExactKernel(GibbsGeometry(device.X, device.Y, 0.05), max_dense_bytes=0)
    np.testing.assert_allclose(other.matvec(w), reference.matvec(w), rtol=RTOL)


def test_a_device_where_the_fused_program_fails_takes_the_blocks(fused_interpreter, monkeypatch):
    """A GPU that Triton cannot compile for (the first timed pass fails): the kernel says so
    and runs its unfused device blocks, with the same numbers."""

    def refuse(*args, **kwargs):
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(sketchot.kernels.exact, "fused_pass_seconds", refuse)
    host, device = pair()
    with pytest.warns(RuntimeWarning, match="could not run on cpu.*unfused device blocks"):
        kernel = sketchot.kernels.exact.build_exact(device, max_dense_bytes=0)
    assert not kernel.fused and "absorb" in kernel.info.capabilities
    w = np.linspace(0.1, 1.0, 55)
    reference = ExactKernel(host, max_dense_bytes=0)
    np.testing.assert_allclose(kernel.matvec(w), reference.matvec(w), rtol=RTOL)


def test_clouds_past_the_programs_offsets_take_the_blocks(fused_interpreter):
    from sketchot.gibbs import make_cost

    context, cost = array_context(X=torch.zeros((2, 2))), make_cost("sqeuclidean")
    assert fused_interpreter.fused_available(context, cost, (10**6, 10**6, 64))
    assert not fused_interpreter.fused_available(context, cost, (10**8, 10, 64))
    assert not fused_interpreter.fused_available(context, cost, (10, 10**8, 3))


@pytest.mark.parametrize("max_dense_bytes", [1 << 30, 0], ids=["stored", "streamed"])
def test_the_placement_decides_where_the_one_exact_class_runs(max_dense_bytes):
    """One exact class for every placement (issue 43): its placement object (NumPy, the
    caller's device) holds the clouds and runs the blocks, chosen from the geometry unless
    given; ``at_reg`` and ``absorbed`` keep it (the same device copies); the only subclasses
    are the absorbed and the sparse kernels."""
    from sketchot.kernels.exact import AbsorbedExactKernel, DeviceExact, HostExact
    from sketchot.kernels.matrix_exact import SparseExactKernel

    assert set(ExactKernel.__subclasses__()) == {AbsorbedExactKernel, SparseExactKernel}
    assert not AbsorbedExactKernel.__subclasses__()
    host, device = pair()
    ours = ExactKernel(device, max_dense_bytes=max_dense_bytes)
    on_host = ExactKernel(device, max_dense_bytes=max_dense_bytes, placement=HostExact())
    assert isinstance(ours.placement, DeviceExact) and ours.on_device
    assert isinstance(on_host.placement, HostExact) and not on_host.on_device
    assert isinstance(ExactKernel(host).placement, HostExact)
    alpha, beta = np.linspace(-1.0, 1.0, 70), np.linspace(0.5, -0.5, 55)
    w, a = np.linspace(0.1, 1.0, 55), np.full(70, 1 / 70)
    for derived, expected in [
        (ours.at_reg(0.05), on_host.at_reg(0.05)),
        (ours.absorbed(alpha, beta), on_host.absorbed(alpha, beta)),
    ]:
        assert type(derived) is type(expected) and derived.is_dense == expected.is_dense
        assert isinstance(derived.placement, DeviceExact) and derived.on_device
        assert derived.placement.X is ours.placement.X  # the clouds are copied once
        assert expected.placement is on_host.placement
        # the derived kernels' entries where they run: the host's to rounding
        np.testing.assert_allclose(derived.matvec(w), expected.matvec(w), rtol=RTOL)
        np.testing.assert_allclose(derived._rows(np.arange(3)), expected._rows(np.arange(3)),
                                   rtol=RTOL)  # fmt: skip
    # the one-pass moments are declared where they run, and refused by name elsewhere
    assert "log_means" in ours.info.capabilities
    assert "log_means" not in on_host.info.capabilities
    with pytest.raises(NotImplementedError, match="'log_means' capability"):
        on_host.log_means("rows", np.zeros(55))
    np.testing.assert_allclose(ours.matvec(w), on_host.matvec(w), rtol=RTOL)
    for log in (False, True):
        ours_pass = ours.fused_pass("rows", np.log(w) if log else w, a, log=log)
        host_pass = on_host.fused_pass("rows", np.log(w) if log else w, a, log=log)
        for name in ("products", "ratios", "projection"):
            np.testing.assert_allclose(getattr(ours_pass, name), getattr(host_pass, name),
                                       rtol=RTOL)  # fmt: skip


def test_a_device_placement_refuses_another_kernels_clouds():
    """A placement holds the device copies of the clouds it was first used for: given to a
    kernel of other clouds (or of another precision) it is refused by name, never used to
    answer for them; the same clouds at another ``reg`` share it."""
    _, device = pair()
    _, other = pair(seed=1)
    kernel = ExactKernel(device)
    at_reg = ExactKernel(device.at_reg(0.05), placement=kernel.placement)
    w = np.linspace(0.1, 1.0, 55)
    np.testing.assert_allclose(at_reg.matvec(w), ExactKernel(device.at_reg(0.05)).matvec(w),
                               rtol=RTOL)  # fmt: skip
    with pytest.raises(ValueError, match="placement holds the device copies of another"):
        ExactKernel(other, placement=kernel.placement)
    with pytest.raises(ValueError, match="another precision"):
        ExactKernel(device, dtype=np.float32, placement=kernel.placement)
