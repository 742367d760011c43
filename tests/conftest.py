"""Shared fixtures: small point clouds drawn from explicit generators."""

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import settings

# CI draws the same examples on every run (.ci/run sets HYPOTHESIS_PROFILE=ci): a landing
# never hangs on a new draw; local runs keep exploring new examples
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

if importlib.util.find_spec("torch") is not None and "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        # Triton reads it once, when imported: its interpreter runs the fused passes' tests
        # on CPU tensors (only where a test asks: fused_interpreter)
        os.environ["TRITON_INTERPRET"] = "1"


class Library:
    """An array library the public calls take: ``library(a, X, ...)`` converts NumPy inputs
    (``None`` passes), ``library.owns(value)`` says whether a result is in that library.
    ``array_api_strict`` is the standard's own strict implementation: a test that passes on it
    uses nothing outside the Array API (the stand-in for CuPy and the others)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.module = pytest.importorskip(name) if name != "numpy" else np
        if name == "jax":
            self.module = pytest.importorskip("jax.numpy")
        if name == "array_api_strict":
            pytest.importorskip("array_api_compat")

    def __call__(self, *arrays):
        converted = tuple(self.convert(array) for array in arrays)
        return converted[0] if len(converted) == 1 else converted

    def convert(self, array):
        if array is None or self.name == "numpy":
            return array
        if self.name == "torch":
            return self.module.as_tensor(np.asarray(array))
        return self.module.asarray(np.asarray(array))

    def owns(self, value) -> bool:
        if self.name == "numpy":
            return isinstance(value, np.ndarray)
        if self.name == "torch":
            return isinstance(value, self.module.Tensor)
        return type(value).__module__.startswith(self.name)

    def __repr__(self) -> str:
        return self.name


@pytest.fixture
def device_operators(monkeypatch):
    """Arrays in host memory take the device operators (:mod:`sketchot.kernels.device`), as
    arrays on an accelerator do: how their code runs without a GPU (by default CPU tensors
    take NumPy's operators on views of them)."""
    from sketchot import _arrays

    monkeypatch.setattr(_arrays, "HOST_ARRAYS_ON_DEVICE", True)


@pytest.fixture(params=["numpy", "torch", "array_api_strict", "jax"])
def library(request):
    """The contract and solver tests run on NumPy arrays, on PyTorch CPU tensors, on the
    Array API's strict arrays and on JAX arrays (each skipped when not installed), with the
    same tolerances: results come back in the inputs' library. The other libraries' arrays
    take the device operators (``device_operators``; JAX's always do): the code that runs on
    a GPU. JAX runs with float64 enabled for the test only (``jax.enable_x64``, a context,
    not the global switch), as NumPy's results are float64."""
    if request.param != "numpy":
        request.getfixturevalue("device_operators")
    library = Library(request.param)
    if request.param != "jax":
        yield library
        return
    import jax

    with jax.enable_x64(True):
        yield library


@pytest.fixture
def colours() -> tuple[np.ndarray, np.ndarray]:
    """Two colour-like clouds in [0, 1]^3 with different distributions (source, target)."""
    rng = np.random.default_rng(20261125)
    X = rng.random((120, 3))
    Y = rng.beta(2.0, 5.0, size=(90, 3))
    return X, Y


def _dense_ot(X, Y, a, b, reg, reg_m=None, scale=1.0):
    """``min <P, scale ||x - y||^2> + reg KL(P | a b^T) [+ reg_m KL(P 1 | a) + reg_m KL(P^T 1 |
    b)]`` by float64 log-domain Sinkhorn on the dense cost, to 1e-14 on the potentials."""
    from scipy.special import logsumexp

    C = scale * ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    with np.errstate(divide="ignore"):  # zero weights: log 0 = -inf drops them
        log_a, log_b = np.log(a), np.log(b)
    k = 1.0 if reg_m is None else reg_m / (reg_m + reg)
    f, g = np.zeros(len(a)), np.zeros(len(b))
    for _ in range(100_000):
        f = -k * reg * logsumexp(log_b[None, :] + (g[None, :] - C) / reg, axis=1)
        g_new = -k * reg * logsumexp(log_a[:, None] + (f[:, None] - C) / reg, axis=0)
        done = np.abs(g_new - g).max() < 1e-14
        g = g_new
        if done:
            break
    P = np.exp(log_a[:, None] + log_b[None, :] + (f[:, None] + g[None, :] - C) / reg)

    def kl(p, q):
        keep = p > 0  # 0 log 0 = 0
        return float((p[keep] * np.log(p[keep] / q[keep])).sum() - p.sum() + q.sum())

    value = float((P * C).sum()) + reg * kl(P.ravel(), np.outer(a, b).ravel())
    if reg_m is not None:
        value += reg_m * (kl(P.sum(1), a) + kl(P.sum(0), b))
    return value


def _dense_divergence(X, Y, a, b, reg, reg_m=None, scale=1.0):
    """The debiased divergence of Sejourne et al. (Feydy et al. when balanced) from
    :func:`_dense_ot`: ``OT(a, b) - OT(a, a) / 2 - OT(b, b) / 2 + reg (m(a) - m(b))^2 / 2``."""
    value = _dense_ot(X, Y, a, b, reg, reg_m, scale)
    value -= 0.5 * (
        _dense_ot(X, X, a, a, reg, reg_m, scale) + _dense_ot(Y, Y, b, b, reg, reg_m, scale)
    )
    if reg_m is not None:
        value += 0.5 * reg * (a.sum() - b.sum()) ** 2
    return value


@pytest.fixture
def dense_divergence():
    """The dense float64 log-domain reference of the Sinkhorn divergence (tests of
    :mod:`sketchot.loss` and :mod:`sketchot.nn`)."""
    return _dense_divergence


@pytest.fixture
def dense_ot():
    """The dense float64 log-domain reference of the entropic OT objective."""
    return _dense_ot


@pytest.fixture
def fused_interpreter(monkeypatch):
    """The fused Triton passes (:mod:`sketchot.fused`) on CPU tensors, under Triton's
    interpreter (how they are tested without a GPU; on CUDA they compile). Skipped without
    Triton 3.7 or newer: the interpreter of 3.6 fails on NumPy 2.4's stricter scalar rule."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton runs compiled here (a CUDA device): the CUDA tests check it")
    triton = pytest.importorskip("triton")
    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if version < (3, 7):
        pytest.skip(f"Triton's interpreter needs Triton >= 3.7; found {triton.__version__}")
    from sketchot import _arrays, fused

    monkeypatch.setattr(_arrays, "HOST_ARRAYS_ON_DEVICE", True)
    monkeypatch.setattr(fused, "CPU_INTERPRETER", True)
    return fused
