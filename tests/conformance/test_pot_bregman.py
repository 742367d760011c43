"""POT's tests of ``ot.sinkhorn``, ``ot.sinkhorn2``, ``sinkhorn_log`` and ``ot.bregman``'s
empirical solvers, ported to :func:`sketchot.sinkhorn` and friends.

Source: POT's ``test/test_bregman.py`` (MIT licence; repository PythonOT/POT at commit
aed0120, the tests of the installed POT 0.9.7). Each test names the POT test function it
ports; the inputs, assertions and tolerances are POT's, with these mappings:

- ``M = ot.dist(x, y)`` -> the clouds ``X=x, Y=y`` (sketchot's default cost is ``ot.dist``'s
  squared Euclidean one); ``ot.utils.dist0(n)`` -> ``X = Y = arange(n)[:, None]``;
  ``M / s`` -> ``X / sqrt(s)``.
- ``stopThr`` -> ``tol`` (POT's criterion: L2 error of the column marginal), POT's default
  ``stopThr=1e-9`` passed explicitly where POT relies on it; ``numItermax`` -> ``max_iter``.
- ``method=`` -> ``backend="exact"`` and, for POT's variants, sketchot's options
  (``log_domain=True`` for ``sinkhorn_log``, ``epsilon_scaling=True`` for
  ``sinkhorn_epsilon_scaling``, ``anderson=0`` for plain iterates).
- ``log=True`` -> the result's fields (``potentials`` = ``(log u, log v)``, so that
  ``P = exp(log u + log v - M / reg)``, POT's lazy ``f, g``); ``log["lazy_plan"][:]`` ->
  ``result.lazy_plan.to_dense()``.

Where POT compares two of its own methods, the reference here is POT's ``ot.sinkhorn`` on the
same cost matrix (a port must fail when sketchot's answer differs from POT's). Where POT's
assertion is vacuous (``np.allclose`` whose result is dropped), the port asserts it with
``np.allclose``'s default tolerances. A deliberate difference asserts sketchot's documented
behaviour and is a row of ``docs/user_guide/coming_from_pot.rst`` ("POT's test cases").

Not ported from this file (sketchot does not mirror them): the barycenter tests
(``test_barycenter*``, ``test_wasserstein_bary_2d*``, ``test_free_support_sinkhorn_barycenter``,
``test_convergence_warning_barycenters``, ``test_barycenter_stabilization``), ``test_unmix``,
``test_screenkhorn``, ``test_convolutional_barycenter_non_square``.
"""

from __future__ import annotations

import warnings

import numpy as np
import ot
import pytest

import sketchot

# POT's default stopThr of ot.sinkhorn and ot.bregman.empirical_sinkhorn
POT_STOPTHR = 1e-9


def grid(n: int, step: float = 1.0) -> np.ndarray:
    """POT's 1-D histogram support ``arange(n)`` as a cloud: ``dist0(n) = ot.dist(grid)``."""
    return (step * np.arange(n, dtype=np.float64))[:, None]


def plan(res) -> np.ndarray:
    """The dense plan of a small solve."""
    return np.asarray(res.plan)


# --------------------------------------------------------------------------------- sinkhorn


@pytest.mark.parametrize("verbose", [True, False])
@pytest.mark.parametrize("warn", [True, False])
def test_sinkhorn(verbose, warn):
    """POT test_bregman.py::test_sinkhorn[verbose, warn]."""
    n = 100
    rng = np.random.RandomState(0)
    x = rng.randn(n, 2)
    u = ot.utils.unif(n)

    G = plan(
        sketchot.sinkhorn(u, u, x, x, 1, backend="exact", tol=1e-10, verbose=verbose, warn=warn)
    )

    np.testing.assert_allclose(u, G.sum(1), atol=1e-05)
    np.testing.assert_allclose(u, G.sum(0), atol=1e-05)

    # POT's stopThr=0 ("never stop early"): sketchot asks for tol > 0, the smallest float
    # stops at max_iter all the same
    with pytest.warns(UserWarning):
        sketchot.sinkhorn(u, u, x, x, 1, backend="exact", tol=np.finfo(float).tiny, max_iter=1)


def test_sinkhorn_tol_zero_is_refused():
    """POT test_bregman.py::test_sinkhorn passes stopThr=0; sketchot refuses tol=0 by name
    (documented difference)."""
    x = np.random.RandomState(0).randn(10, 2)
    with pytest.raises(ValueError, match="tol"):
        sketchot.sinkhorn(None, None, x, x, 1, backend="exact", tol=0, max_iter=1)


@pytest.mark.parametrize("entry", ["sinkhorn", "sinkhorn2"])
def test_convergence_warning(entry):
    """POT test_bregman.py::test_convergence_warning[method] (the five methods collapse to
    sketchot's one solver; the barycenter part is not ported). One iteration on
    ``dist0(100)`` leaves no mass in the plan: POT warns and returns it, sketchot refuses it
    (documented difference) and, with ``errors='warn'``, returns it with an
    :class:`~sketchot.InvalidResultWarning` (a ``UserWarning``)."""
    n = 100
    a1 = ot.datasets.make_1D_gauss(n, m=30, s=10)
    a2 = ot.datasets.make_1D_gauss(n, m=40, s=10)
    X = grid(n)
    solve = getattr(sketchot, entry)
    tiny = np.finfo(float).tiny

    with pytest.raises(sketchot.InvalidResultError, match="max_iter"):
        solve(a1, a2, X, X, 1.0, backend="exact", tol=tiny, max_iter=1)
    with pytest.warns(UserWarning):
        solve(a1, a2, X, X, 1.0, backend="exact", tol=tiny, max_iter=1, errors="warn")
    # POT: warn=False silences the convergence warning; the impossible result's warning is
    # what errors='warn' asked for, and the only one left
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        solve(a1, a2, X, X, 1.0, backend="exact", tol=tiny, max_iter=1, errors="warn",
              warn=False)  # fmt: skip
    assert [w.category for w in caught] == [sketchot.InvalidResultWarning]


def test_not_implemented_method():
    """POT test_bregman.py::test_not_implemented_method (``method=`` -> ``backend=``; the
    barycenter calls are not ported)."""
    w = 10
    n = w**2
    rng = np.random.RandomState(42)
    A_img = rng.rand(2, w, w)
    A_flat = A_img.reshape(n, 2)
    a1, a2 = A_flat.T
    X = grid(n)
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn(a1, a2, X, X, 0.01, backend="new_method")
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn2(a1, a2, X, X, 0.01, backend="new_method")


@pytest.mark.parametrize("method", ["sinkhorn", "sinkhorn_stabilized"])
def test_nan_warning(method):
    """POT test_bregman.py::test_nan_warning[method]: reg=0 gives NaNs and a warning in POT;
    sketchot refuses reg=0 by name (documented difference)."""
    n = 100
    a1 = ot.datasets.make_1D_gauss(n, m=30, s=10)
    a2 = ot.datasets.make_1D_gauss(n, m=40, s=10)
    X = grid(n)
    with pytest.raises(ValueError, match="reg must be > 0"):
        sketchot.sinkhorn(a1, a2, X, X, 0, backend="exact", warn=False)


@pytest.mark.xfail(
    strict=True,
    reason="reg 1e-5 on dist0(100) (largest cost / reg 9.8e8): both calls now solve it, "
    "certified to the default accuracy 1e-3 (the Sinkhorn-Newton stage), and agree to 1e-6, "
    "but at that accuracy the value sits 0.003 below ot.emd2 (marginal error x cost); POT's "
    "stopThr 1e-9 is below float64's resolution there (log-potentials of 1e9: rounding 1e-7)",
)
def test_sinkhorn_stabilization():
    """POT test_bregman.py::test_sinkhorn_stabilization: two stable iterations agree to
    1e-6 at reg 1e-5 (here the log-domain iteration and the default). POT's two methods agree
    on 0.0, below the exact OT cost 99.3: the port also asks for a value no cheaper than
    ``ot.emd2`` (any coupling's cost is at least the optimum)."""
    n = 100
    a1 = ot.datasets.make_1D_gauss(n, m=30, s=10)
    a2 = ot.datasets.make_1D_gauss(n, m=40, s=10)
    X = grid(n)
    reg = 1e-5
    loss1 = sketchot.sinkhorn2(a1, a2, X, X, reg, backend="exact", log_domain=True)
    loss2 = sketchot.sinkhorn2(a1, a2, X, X, reg, backend="exact")
    np.testing.assert_allclose(loss1, loss2, atol=1e-06)
    assert loss2 >= ot.emd2(a1, a2, ot.utils.dist0(n)) - 1e-06


# --------------------------------------------------------------- several targets b (n, k)


def multi_b_case(n: int):
    rng = np.random.RandomState(0)
    x = rng.randn(n, 2)
    u = ot.utils.unif(n)
    b = rng.rand(n, 3)
    b = b / np.sum(b, 0, keepdims=True)
    return x, u, b


# POT's reference solve stops at its numItermax before stopThr, as in POT's own test
@pytest.mark.filterwarnings("ignore:Sinkhorn did not converge:UserWarning")
@pytest.mark.parametrize(
    ("source", "n", "reg", "atol"),
    [
        ("test_sinkhorn_multi_b", 10, 0.1, 1e-4),
        ("test_sinkhorn_variants_multi_b", 50, 1, 1e-5),
        ("test_sinkhorn2_variants_multi_b", 50, 1, 1e-5),
        ("test_sinkhorn_variants_log_multib", 50, 1, 1e-5),
    ],
)
def test_sinkhorn_multi_b(source, n, reg, atol):
    """POT test_bregman.py::<source> (all methods, verbose and warn cases): ``b`` of shape
    ``(n, k)`` solves k problems in one call, in POT and in sketchot (one call, the k values
    ``<P_k, M>``: :mod:`sketchot.solver.targets`; more in test_pot_targets.py), equal to
    each column solved on its own."""
    x, u, b = multi_b_case(n)
    M = ot.dist(x, x)
    # POT's multi-b sinkhorn returns the k values <P_k, M>
    loss0 = ot.sinkhorn(u, b, M, reg, stopThr=1e-10)
    together = sketchot.sinkhorn2(u, b, x, x, reg, backend="exact", tol=1e-10)
    loss = [sketchot.sinkhorn2(u, b[:, k], x, x, reg, backend="exact", tol=1e-10)
            for k in range(3)]  # fmt: skip
    np.testing.assert_allclose(loss0, loss, atol=atol)
    np.testing.assert_allclose(loss0, together, atol=atol)


def test_stabilized_vs_sinkhorn_multidim():
    """POT test_bregman.py::test_stabilized_vs_sinkhorn_multidim: ``dist0(100) / median``
    with two targets (``assert_allclose``'s default rtol 1e-7), column by column."""
    n = 100
    a = ot.datasets.make_1D_gauss(n, m=20, s=5)
    b1 = ot.datasets.make_1D_gauss(n, m=60, s=8)
    b2 = ot.datasets.make_1D_gauss(n, m=30, s=4)
    b = np.vstack((b1, b2)).T
    M = ot.utils.dist0(n)
    median = np.median(M)
    M /= median
    X = grid(n, 1 / np.sqrt(median))
    epsilon = 0.1

    G_np, _ = ot.bregman.sinkhorn(a, b, M, reg=epsilon, method="sinkhorn", log=True)
    G = [sketchot.sinkhorn2(a, b[:, k], X, X, epsilon, backend="exact", tol=POT_STOPTHR)
         for k in range(2)]  # fmt: skip
    np.testing.assert_allclose(G_np, G)


# ------------------------------------------------------------------- arrays and backends


def test_sinkhorn_backends():
    """POT test_bregman.py::test_sinkhorn_backends (POT's ``np.allclose`` is not asserted
    there; asserted here, against POT's plan, at POT's default stopThr)."""
    torch = pytest.importorskip("torch")
    n_samples, n_features = 100, 2
    rng = np.random.RandomState(0)
    x = rng.randn(n_samples, n_features)
    y = rng.randn(n_samples, n_features)
    a = ot.utils.unif(n_samples)
    M = ot.dist(x, y)

    G = ot.sinkhorn(a, a, M, 1)
    Gs = plan(sketchot.sinkhorn(a, a, x, y, 1, backend="exact", tol=POT_STOPTHR))
    ab, xb, yb = (torch.from_numpy(v) for v in (a, x, y))
    Gb = sketchot.sinkhorn(ab, ab, xb, yb, 1, backend="exact", tol=POT_STOPTHR).plan
    assert isinstance(Gb, torch.Tensor)
    assert np.allclose(G, Gs)
    assert np.allclose(G, Gb.numpy())


def test_sinkhorn2_backends():
    """POT test_bregman.py::test_sinkhorn2_backends (as above, for the value)."""
    torch = pytest.importorskip("torch")
    n_samples, n_features = 100, 2
    rng = np.random.RandomState(0)
    x = rng.randn(n_samples, n_features)
    y = rng.randn(n_samples, n_features)
    a = ot.utils.unif(n_samples)
    M = ot.dist(x, y)

    loss = ot.sinkhorn2(a, a, M, 1)
    ab, xb, yb = (torch.from_numpy(v) for v in (a, x, y))
    lossb = sketchot.sinkhorn2(ab, ab, xb, yb, 1, backend="exact", tol=POT_STOPTHR)
    assert np.allclose(loss, sketchot.sinkhorn2(a, a, x, y, 1, backend="exact", tol=POT_STOPTHR))
    assert np.allclose(loss, float(lossb))


def test_sinkhorn2_gradients():
    """POT test_bregman.py::test_sinkhorn2_gradients (``M`` -> the clouds it is computed
    from). POT backpropagates the entropic value's gradient (the plan) through the linear
    value ``<P, M>`` it returns; sketchot refuses tensors that require grad in ``sinkhorn2``,
    naming the argument and pointing to ``solve_sample(...).value``, whose gradient reaches
    ``a``, ``b``, ``X`` and ``Y`` (documented difference)."""
    torch = pytest.importorskip("torch")
    n_samples, n_features = 100, 2
    rng = np.random.RandomState(0)
    x = rng.randn(n_samples, n_features)
    y = rng.randn(n_samples, n_features)
    a = ot.utils.unif(n_samples)

    a1 = torch.tensor(a, requires_grad=True)
    b1 = torch.tensor(a, requires_grad=True)
    x1 = torch.tensor(x, requires_grad=True)
    y1 = torch.tensor(y, requires_grad=True)

    with pytest.raises(TypeError, match=r"^a requires grad.*solve_sample"):
        sketchot.sinkhorn2(a1, b1, x1, y1, 1, backend="exact")
    val = sketchot.solve_sample(x1, y1, a1, b1, reg=1, backend="exact").value
    val.backward()

    assert a1.grad is not None and a1.shape == a1.grad.shape
    assert b1.grad is not None and b1.shape == b1.grad.shape
    assert x1.grad is not None and x1.shape == x1.grad.shape
    assert y1.grad is not None and y1.shape == y1.grad.shape


def _dtype_case(library: str, dtype: str):
    n = 100
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2).astype(dtype)
    u = ot.utils.unif(n).astype(dtype)
    if library == "torch":
        torch = pytest.importorskip("torch")
        x, u = torch.from_numpy(x), torch.from_numpy(u)
    return x, u


def _dtype_of(value) -> str:
    return str(value.dtype).replace("torch.", "")


@pytest.mark.parametrize(
    ("library", "dtype"),
    [
        ("numpy", "float32"),
        ("numpy", "float64"),
        ("torch", "float32"),
        ("torch", "float64"),
    ],
)
def test_sinkhorn_variants_dtype_device(library, dtype):
    """POT test_bregman.py::test_sinkhorn_variants_dtype_device[method] (POT's type list of
    each array library: the plan has the cost's dtype and device; the methods collapse)."""
    x, u = _dtype_case(library, dtype)
    Gb = sketchot.sinkhorn(u, u, x, x, 1, backend="exact", tol=1e-10).plan
    assert type(Gb) is type(x)
    assert _dtype_of(Gb) == dtype


@pytest.mark.parametrize(
    ("library", "dtype"),
    [
        ("numpy", "float32"),
        ("numpy", "float64"),
        ("torch", "float32"),
        ("torch", "float64"),
    ],
)
def test_sinkhorn2_variants_dtype_device(library, dtype):
    """POT test_bregman.py::test_sinkhorn2_variants_dtype_device[method]: the value has the
    cost's dtype and device (a NumPy scalar, a 0-d tensor)."""
    x, u = _dtype_case(library, dtype)
    lossb = sketchot.sinkhorn2(u, u, x, x, 1, backend="exact", tol=1e-10)
    if library == "numpy":
        assert isinstance(lossb, np.generic | np.ndarray)
    else:
        assert type(lossb) is type(x)
    assert _dtype_of(lossb) == dtype


# ------------------------------------------------------------------------- empty weights


@pytest.mark.parametrize(
    "options", [{}, {"log_domain": True}, {"epsilon_scaling": True}, {"anderson": 0}]
)
def test_sinkhorn_empty(options):
    """POT test_bregman.py::test_sinkhorn_empty (each POT method -> a sketchot option):
    POT's empty weights ``[]`` mean uniform; sketchot's uniform is ``None`` and ``[]`` is
    refused by name (documented difference)."""
    n = 100
    rng = np.random.RandomState(0)
    x = rng.randn(n, 2)
    u = ot.utils.unif(n)

    res = sketchot.sinkhorn(None, None, x, x, 1, backend="exact", tol=1e-10, verbose=True,
                            **options)  # fmt: skip
    G = plan(res)
    np.testing.assert_allclose(u, G.sum(1), atol=1e-05)
    np.testing.assert_allclose(u, G.sum(0), atol=1e-05)

    with pytest.raises(ValueError, match=r"^a must"):
        sketchot.sinkhorn([], [], x, x, 1, backend="exact", tol=1e-10)


# ---------------------------------------------------------------------------- variants


_VARIANTS = [
    pytest.param({}, id="default"),
    pytest.param({"anderson": 0}, id="sinkhorn"),
    pytest.param({"log_domain": True}, id="sinkhorn_log"),
    pytest.param({"epsilon_scaling": True}, id="sinkhorn_epsilon_scaling"),
]


@pytest.mark.parametrize("options", _VARIANTS)
def test_sinkhorn_variants(options):
    """POT test_bregman.py::test_sinkhorn_variants: every variant's plan within 1e-5 of
    ``ot.sinkhorn``'s (stopThr 1e-10); POT's stabilized and greenkhorn methods have no
    sketchot option."""
    n = 100
    rng = np.random.RandomState(0)
    x = rng.randn(n, 2)
    u = ot.utils.unif(n)
    M = ot.dist(x, x)

    G = ot.sinkhorn(u, u, M, 1, method="sinkhorn", stopThr=1e-10)
    G0 = plan(sketchot.sinkhorn(u, u, x, x, 1, backend="exact", tol=1e-10, **options))
    np.testing.assert_allclose(G, G0, atol=1e-05)


@pytest.mark.parametrize("options", _VARIANTS)
def test_sinkhorn_variants_log(options):
    """POT test_bregman.py::test_sinkhorn_variants_log: as above at n = 50 with
    ``log=True`` (-> the result's potentials, which give the same plan)."""
    n = 50
    rng = np.random.RandomState(0)
    x = rng.randn(n, 2)
    u = ot.utils.unif(n)
    M = ot.dist(x, x)

    G0, _ = ot.sinkhorn(u, u, M, 1, method="sinkhorn", stopThr=1e-10, log=True)
    res = sketchot.sinkhorn(u, u, x, x, 1, backend="exact", tol=1e-10, **options)
    log_u, log_v = res.potentials
    np.testing.assert_allclose(G0, plan(res), atol=1e-05)
    np.testing.assert_allclose(G0, np.exp(log_u[:, None] + log_v[None, :] - M), atol=1e-05)


def test_implemented_methods():
    """POT test_bregman.py::test_implemented_methods (``method=`` -> ``backend=``): the
    implemented ones run, an unknown name is a ValueError. POT's 1-D-only methods
    (greenkhorn, epsilon scaling refused by sinkhorn2) have no sketchot counterpart."""
    n = 3
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = ot.utils.unif(n)
    epsilon = 1.0
    for backend in ["exact", "auto"]:
        sketchot.sinkhorn(a, b, x, x, epsilon, backend=backend)
        sketchot.sinkhorn2(a, b, x, x, epsilon, backend=backend)
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn(a, b, x, x, epsilon, backend="foo")
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn2(a, b, x, x, epsilon, backend="foo")


# ----------------------------------------------------------------------- empirical solvers


def test_empirical_sinkhorn():
    """POT test_bregman.py::test_empirical_sinkhorn (``empirical_sinkhorn(X_s, X_t, reg)``
    -> ``sketchot.sinkhorn(None, None, X_s, X_t, reg)``; its default stopThr 1e-9 given as
    ``tol``)."""
    n = 10
    a = ot.unif(n)
    b = ot.unif(n)
    X_s = np.reshape(1.0 * np.arange(n), (n, 1))
    X_t = np.reshape(1.0 * np.arange(0, n), (n, 1))
    M = ot.dist(X_s, X_t)
    M_m = ot.dist(X_s, X_t, metric="euclidean")
    kw = {"backend": "exact", "tol": POT_STOPTHR}

    G_sqe = plan(sketchot.sinkhorn(None, None, X_s, X_t, 1, **kw))
    sinkhorn_sqe = ot.sinkhorn(a, b, M, 1)

    G_log = plan(sketchot.sinkhorn(None, None, X_s, X_t, 0.1, **kw))
    sinkhorn_log, _ = ot.sinkhorn(a, b, M, 0.1, log=True)

    G_m = plan(sketchot.sinkhorn(None, None, X_s, X_t, 1, metric="euclidean", **kw))
    sinkhorn_m = ot.sinkhorn(a, b, M_m, 1)

    loss_emp_sinkhorn = sketchot.sinkhorn2(None, None, X_s, X_t, 1, **kw)
    loss_sinkhorn = ot.sinkhorn2(a, b, M, 1)

    np.testing.assert_allclose(sinkhorn_sqe.sum(1), G_sqe.sum(1), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_sqe.sum(0), G_sqe.sum(0), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_log.sum(1), G_log.sum(1), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_log.sum(0), G_log.sum(0), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_m.sum(1), G_m.sum(1), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_m.sum(0), G_m.sum(0), atol=1e-05)
    np.testing.assert_allclose(loss_emp_sinkhorn, loss_sinkhorn, atol=1e-05)


def test_lazy_empirical_sinkhorn():
    """POT test_bregman.py::test_lazy_empirical_sinkhorn (``isLazy=True`` returns
    ``f, g`` with ``P = exp(f + g - M / reg)``: sketchot's ``potentials``; POT's batch sizes
    have no counterpart, sketchot streams its own blocks; ``log["lazy_plan"][:]`` ->
    ``lazy_plan.to_dense()``)."""
    n = 10
    a = ot.unif(n)
    b = ot.unif(n)
    numIterMax = 1000
    X_s = np.reshape(np.arange(n, dtype=np.float64), (n, 1))
    X_t = np.reshape(np.arange(0, n, dtype=np.float64), (n, 1))
    M = ot.dist(X_s, X_t)
    M_m = ot.dist(X_s, X_t, metric="euclidean")
    kw = {"backend": "exact", "tol": POT_STOPTHR, "max_iter": numIterMax}

    f, g = sketchot.sinkhorn(None, None, X_s, X_t, 1, verbose=True, **kw).potentials
    G_sqe = np.exp(f[:, None] + g[None, :] - M / 1)
    sinkhorn_sqe = ot.sinkhorn(a, b, M, 1)

    f, g = sketchot.sinkhorn(None, None, X_s, X_t, 1, **kw).potentials
    G_log = np.exp(f[:, None] + g[None, :] - M / 1)
    sinkhorn_log, _ = ot.sinkhorn(a, b, M, 1, log=True)

    f, g = sketchot.sinkhorn(None, None, X_s, X_t, 1, metric="euclidean", **kw).potentials
    G_m = np.exp(f[:, None] + g[None, :] - M_m / 1)
    sinkhorn_m = ot.sinkhorn(a, b, M_m, 1)

    res = sketchot.sinkhorn(None, None, X_s, X_t, 1, **kw)
    G_lazy = res.lazy_plan.to_dense()
    loss_emp_sinkhorn = res.value_linear
    loss_sinkhorn = ot.sinkhorn2(a, b, M, 1)

    np.testing.assert_allclose(G_sqe[1, 1], G_lazy[1, 1], atol=1e-03)
    np.testing.assert_allclose(sinkhorn_sqe.sum(1), G_sqe.sum(1), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_sqe.sum(0), G_sqe.sum(0), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_log.sum(1), G_log.sum(1), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_log.sum(0), G_log.sum(0), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_m.sum(1), G_m.sum(1), atol=1e-05)
    np.testing.assert_allclose(sinkhorn_m.sum(0), G_m.sum(0), atol=1e-05)
    np.testing.assert_allclose(loss_emp_sinkhorn, loss_sinkhorn, atol=1e-05)
    np.testing.assert_allclose(G_log, G_lazy, atol=1e-05)


def divergence_case():
    n = 10
    a = np.linspace(1, n, n)
    a /= a.sum()
    b = ot.unif(n)
    X_s = np.reshape(np.arange(n, dtype=np.float64), (n, 1))
    X_t = np.reshape(np.arange(0, n * 2, 2, dtype=np.float64), (n, 1))
    return a, b, X_s, X_t


# POT's reference solve stops at its numItermax before stopThr, as in POT's own test
@pytest.mark.filterwarnings("ignore:Sinkhorn did not converge:UserWarning")
def test_empirical_sinkhorn_divergence():
    """POT test_bregman.py::test_empirical_sinkhorn_divergence: POT's divergence combines
    ``sinkhorn2`` values (the linear cost ``<P, M>``); sketchot's is Feydy et al.'s, on the
    entropic objective ``<P, M> + reg KL(P | a b^T)`` (``ot.solve(M, reg=...).value``),
    documented in the user guide's page on losses (documented difference). Same inputs and
    tolerance (1e-5) against each convention's reference."""
    a, b, X_s, X_t = divergence_case()
    M, M_s, M_t = ot.dist(X_s, X_t), ot.dist(X_s, X_s), ot.dist(X_t, X_t)

    emp_sinkhorn_div = sketchot.sinkhorn_divergence(
        X_s, X_t, a, b, 1, backend="exact", tol=POT_STOPTHR
    ).value
    # sketchot's convention, computed with POT
    entropic_div = (
        ot.solve(M, a, b, reg=1, tol=1e-12).value
        - 1 / 2 * ot.solve(M_s, a, a, reg=1, tol=1e-12).value
        - 1 / 2 * ot.solve(M_t, b, b, reg=1, tol=1e-12).value
    )
    np.testing.assert_allclose(emp_sinkhorn_div, entropic_div, atol=1e-05)
    # POT's convention, from sketchot's plans' linear costs
    pot_div = ot.bregman.empirical_sinkhorn_divergence(X_s, X_t, 1, a=a, b=b)
    linear_div = (
        sketchot.sinkhorn2(a, b, X_s, X_t, 1, backend="exact", tol=POT_STOPTHR)
        - 1 / 2 * sketchot.sinkhorn2(a, a, X_s, X_s, 1, backend="exact", tol=POT_STOPTHR)
        - 1 / 2 * sketchot.sinkhorn2(b, b, X_t, X_t, 1, backend="exact", tol=POT_STOPTHR)
    )
    np.testing.assert_allclose(linear_div, pot_div, atol=1e-05)
    # the two conventions differ by more than POT's tolerance on these inputs
    assert abs(emp_sinkhorn_div - pot_div) > 1e-2


def test_empirical_sinkhorn_divergence_gradient():
    """POT test_bregman.py::test_empirical_sinkhorn_divergence_gradient
    (``ot.bregman.empirical_sinkhorn_divergence`` on tensors ->
    ``sketchot.nn.sinkhorn_divergence``)."""
    torch = pytest.importorskip("torch")
    import sketchot.nn

    a, b, X_s, X_t = divergence_case()
    ab, bb, X_sb, X_tb = (torch.from_numpy(v) for v in (a, b, X_s, X_t))
    for tensor in (ab, bb, X_sb, X_tb):
        tensor.requires_grad = True

    emp_sinkhorn_div = sketchot.nn.sinkhorn_divergence(X_sb, X_tb, ab, bb, 1)
    emp_sinkhorn_div.backward()

    assert ab.grad is not None
    assert bb.grad is not None
    assert X_sb.grad is not None
    assert X_tb.grad is not None


# ---------------------------------------------------------------------------- warm starts


def warmstart_case():
    m, n = 10, 20
    a, b = ot.unif(m), ot.unif(n)
    Xs = np.arange(m).reshape(-1, 1) * 1.0
    Xt = np.arange(n).reshape(-1, 1) * 1.0
    M = ot.dist(Xs, Xt)
    _, log = ot.lp.emd(a, b, M, log=True)
    return a, b, Xs, Xt, M, (log["u"], log["v"])


@pytest.mark.parametrize("options", _VARIANTS)
def test_sinkhorn_warmstart(options):
    """POT test_bregman.py::test_sinkhorn_warmstart (POT's ``warmstart`` is the
    log-scalings, sketchot's too; each POT method -> a sketchot option)."""
    a, b, Xs, Xt, _, warmstart = warmstart_case()
    reg = 1
    kw = {"backend": "exact", "tol": POT_STOPTHR, **options}
    pi_unif = plan(sketchot.sinkhorn(a, b, Xs, Xt, reg, warmstart=None, **kw))
    pi_sh = plan(sketchot.sinkhorn(a, b, Xs, Xt, reg, warmstart=warmstart, **kw))
    np.testing.assert_allclose(pi_unif, pi_sh, atol=1e-05)


def test_empirical_sinkhorn_warmstart():
    """POT test_bregman.py::test_empirical_sinkhorn_warmstart (lazy ``f, g`` -> the
    potentials; the not-lazy plan -> ``plan``)."""
    _, _, Xs, Xt, M, warmstart = warmstart_case()
    reg = 1
    kw = {"backend": "exact", "tol": POT_STOPTHR}
    f, g = sketchot.sinkhorn(None, None, Xs, Xt, reg, warmstart=None, **kw).potentials
    pi_unif = np.exp(f[:, None] + g[None, :] - M / reg)
    res = sketchot.sinkhorn(None, None, Xs, Xt, reg, warmstart=warmstart, **kw)
    f, g = res.potentials
    pi_ws_lazy = np.exp(f[:, None] + g[None, :] - M / reg)
    pi_ws_not_lazy = plan(res)
    np.testing.assert_allclose(pi_unif, pi_ws_lazy, atol=1e-05)
    np.testing.assert_allclose(pi_unif, pi_ws_not_lazy, atol=1e-05)


def test_empirical_sinkhorn_divergence_warmstart():
    """POT test_bregman.py::test_empirical_sinkhorn_divergence_warmstart: sketchot's
    divergence warm-starts from a previous :class:`~sketchot.DivergenceResult`
    (``warm_start=``), not from POT's pair of potentials."""
    _, _, Xs, Xt, _, _ = warmstart_case()
    reg = 1
    kw = {"backend": "exact", "tol": POT_STOPTHR}
    sd_unif = sketchot.sinkhorn_divergence(Xs, Xt, reg=reg, **kw)
    sd_ws = sketchot.sinkhorn_divergence(Xs, Xt, reg=reg, warm_start=sd_unif, **kw)
    np.testing.assert_allclose(sd_unif.value, sd_ws.value, atol=1e-05)
