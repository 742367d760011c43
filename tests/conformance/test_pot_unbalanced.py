"""POT's tests of ``ot.unbalanced.sinkhorn_unbalanced`` and ``sinkhorn_unbalanced2``, ported
to :func:`sketchot.sinkhorn_unbalanced` and :func:`sketchot.sinkhorn2` with ``reg_m``.

Source: POT's ``test/unbalanced/test_sinkhorn.py`` (MIT licence; repository PythonOT/POT at
commit aed0120, the tests of the installed POT 0.9.7). Each test names the POT test it ports;
inputs, assertions and tolerances are POT's, with these mappings:

- ``M = ot.dist(x, x)`` -> ``X = Y = x``; ``ot.utils.dist0(n) / s`` -> ``arange(n) / sqrt(s)``.
- ``reg_type="kl"`` (POT's default, the reference measure ``a b^T``) is sketchot's problem.
  POT's ``log["logu"]`` scales the kernel ``a b^T * exp(-M / reg)``, sketchot's ``log u``
  the kernel ``exp(-M / reg)``: ``log u = logu + log a`` and ``log v = logv + log b``
  (the same plan).
- POT's default ``stopThr=1e-6`` of ``sinkhorn_unbalanced`` is given as ``tol``.
- ``method=`` (four variants of one iteration) collapses to ``backend="exact"``; the POT
  cases of each method are one port.
- ``b`` of shape ``(n, k)`` is refused by sketchot (``test_pot_bregman.py``,
  ``test_sinkhorn_multi_b``): its ports solve column by column.

No equivalent (not ported): ``reg_type="entropy"`` (the reference measure ``1``; sketchot's
is ``a b^T``) in ``test_unbalanced_convergence``, ``test_unbalanced_marginals``,
``test_unbalanced_warmstart``; ``test_unbalanced_reference_measure`` (no ``c=``);
``test_unbalanced_multiple_inputs`` (multi-target entropy problem);
``test_sinkhorn_wrong_returnCost`` (no ``returnCost``: ``value_linear`` and ``value`` are
both returned); the ``barycenter_unbalanced`` tests (not mirrored).
"""

from __future__ import annotations

import numpy as np
import ot
import pytest
from scipy.special import logsumexp

import sketchot

# POT's default stopThr of ot.unbalanced.sinkhorn_unbalanced
POT_STOPTHR = 1e-6
METHODS = ["sinkhorn", "sinkhorn_stabilized", "sinkhorn_reg_scaling",
           "sinkhorn_translation_invariant"]  # fmt: skip


def pot_log(res, a, b):
    """POT's ``log["logu"], log["logv"]`` (``reg_type='kl'``) from a sketchot result."""
    log_u, log_v = res.potentials
    return log_u - np.log(a), log_v - np.log(b)


def case(seed=42, scale_b=1.0):
    n = 100
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = ot.utils.unif(n) * scale_b
    return x, a, b, ot.dist(x, x)


def solve(a, b, x, reg_m=1.0, **kw):
    return sketchot.sinkhorn_unbalanced(
        a, b, x, x, 1.0, reg_m, backend="exact", **{"tol": POT_STOPTHR, **kw}
    )


def test_unbalanced_convergence():
    """POT unbalanced/test_sinkhorn.py::test_unbalanced_convergence[method, 'kl'] (the four
    methods): the fixed point of the scaling iteration in POT's log form to 1e-5, and the value
    ``sinkhorn_unbalanced2`` (``sinkhorn2`` with ``reg_m``) equal to ``<G, M>``."""
    x, a, b, M = case(scale_b=1.5)
    epsilon = 1.0
    reg_m = 1.0

    res = sketchot.sinkhorn_unbalanced(a, b, x, x, reg=epsilon, reg_m=reg_m, backend="exact",
                                       tol=POT_STOPTHR, verbose=True)  # fmt: skip
    G = np.asarray(res.plan)
    loss = sketchot.sinkhorn2(a, b, x, x, epsilon, backend="exact", reg_m=reg_m,
                              tol=POT_STOPTHR, verbose=True)  # fmt: skip
    logu, logv = pot_log(res, a, b)

    fi = reg_m / (reg_m + epsilon)
    logb = np.log(b + 1e-16)
    loga = np.log(a + 1e-16)
    log_ab = loga[:, None] + logb[None, :]
    logKtu = logsumexp(logu[None, :] - M.T / epsilon + log_ab.T, axis=1)
    logKv = logsumexp(logv[None, :] - M / epsilon + log_ab, axis=1)
    v_final = fi * (logb - logKtu)
    u_final = fi * (loga - logKv)

    np.testing.assert_allclose(u_final, logu, atol=1e-05)
    np.testing.assert_allclose(v_final, logv, atol=1e-05)
    np.testing.assert_allclose(np.sum(G * M), loss, atol=1e-5)


def test_unbalanced_marginals():
    """POT unbalanced/test_sinkhorn.py::test_unbalanced_marginals[method, 'kl']: POT's empty weights
    mean uniform; sketchot's uniform is ``None`` (``[]`` is refused by name, documented
    difference)."""
    x, a, b, _ = case()
    res0 = solve(a, b, x)
    loss0 = sketchot.sinkhorn2(a, b, x, x, 1.0, backend="exact", reg_m=1.0, tol=POT_STOPTHR)
    res_empty = solve(None, None, x)
    loss_empty = sketchot.sinkhorn2(None, None, x, x, 1.0, backend="exact", reg_m=1.0,
                                    tol=POT_STOPTHR)  # fmt: skip

    logu0, logv0 = pot_log(res0, a, b)
    logu_empty, logv_empty = pot_log(res_empty, a, b)
    np.testing.assert_allclose(logu_empty, logu0, atol=1e-05)
    np.testing.assert_allclose(logv_empty, logv0, atol=1e-05)
    np.testing.assert_allclose(np.asarray(res_empty.plan), np.asarray(res0.plan), atol=1e-05)
    np.testing.assert_allclose(loss_empty, loss0, atol=1e-5)

    with pytest.raises(ValueError, match=r"^a must"):
        solve(np.array([]), np.array([]), x)


def test_unbalanced_warmstart():
    """POT unbalanced/test_sinkhorn.py::test_unbalanced_warmstart[method, 'kl']: no warm start, a
    zero warm start and ``ot.emd``'s dual potentials as warm start give the same potentials,
    plans and values to 1e-5 (POT's warm start pairs passed as they are).

    POT's ``stopThr=1e-6`` bounds the relative change of each scaling; sketchot's ``tol``
    bounds the marginal residual in mass, relative to ``sum(a)``: at ``tol=1e-6`` plans and
    values meet POT's 1e-5 but the three potentials were 3e-5 apart on these 100 points;
    POT's 1e-5 on the potentials takes ``tol=1e-8`` (documented difference)."""
    x, a, b, M = case()
    _, log_emd = ot.lp.emd(a, b, M, log=True)
    starts = [None, (np.zeros(M.shape[0]), np.zeros(M.shape[1])), (log_emd["u"], log_emd["v"])]

    def gap(tol):
        res0, res, res1 = (solve(a, b, x, warmstart=start, tol=tol) for start in starts)
        for left, right in [(res, res0), (res0, res1)]:
            np.testing.assert_allclose(left.value_linear, right.value_linear, atol=1e-5)
            np.testing.assert_allclose(np.asarray(left.plan), np.asarray(right.plan), atol=1e-05)
        return max(
            np.abs(mine - theirs).max()
            for left, right in [(res, res0), (res0, res1)]
            for mine, theirs in zip(pot_log(left, a, b), pot_log(right, a, b), strict=True)
        )

    gap(POT_STOPTHR)  # plans and values meet POT's 1e-5 at POT's stopThr
    assert gap(1e-8) <= 1e-05


# POT warns that two of its methods fall back to its classic iteration
@pytest.mark.filterwarnings("ignore:Method not implemented yet:UserWarning")
@pytest.mark.parametrize("method", METHODS)
def test_sinkhorn_unbalanced2(method):
    """POT unbalanced/test_sinkhorn.py::test_sinkhorn_unbalanced2[method, log]: the value with and
    without the log (``sinkhorn2`` and the result's ``value_linear``), each against POT's
    ``sinkhorn_unbalanced2`` with that method, to 1e-5."""
    x, a, b, M = case(scale_b=1.5)
    epsilon = 1.0
    reg_m = 1.0
    loss = sketchot.sinkhorn2(a, b, x, x, epsilon, backend="exact", reg_m=reg_m,
                              tol=POT_STOPTHR, verbose=True)  # fmt: skip
    loss0 = solve(a, b, x, verbose=True).value_linear
    reference = ot.unbalanced.sinkhorn_unbalanced2(a, b, M, epsilon, reg_m, method=method)
    np.testing.assert_allclose(loss, loss0, atol=1e-5)
    np.testing.assert_allclose(loss, reference, atol=1e-5)


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(lambda r: r * np.ones(1), id="array1"),
        pytest.param(lambda r: (r, r), id="tuple2"),
        pytest.param(lambda r: r, id="scalar"),
        pytest.param(lambda r: [r, r], id="list2"),
        pytest.param(lambda r: [r], id="list1"),
    ],
)
def test_unbalanced_relaxation_parameters(form):
    """POT unbalanced/test_sinkhorn.py::test_unbalanced_relaxation_parameters[method, reg_m=1]:
    every form of ``reg_m`` gives the same potentials and plan to 1e-5 (``b`` has two columns:
    each is solved on its own)."""
    n = 100
    rng = np.random.RandomState(50)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = rng.rand(n, 2)
    reg_m = 1
    for k in range(2):
        res = solve(a, b[:, k], x, reg_m=reg_m, verbose=True)
        res_opt = solve(a, b[:, k], x, reg_m=form(reg_m), verbose=True)
        np.testing.assert_allclose(res.potentials[0], res_opt.potentials[0], atol=1e-05)
        np.testing.assert_allclose(res.potentials[1], res_opt.potentials[1], atol=1e-05)
        np.testing.assert_allclose(np.asarray(res.plan), np.asarray(res_opt.plan), atol=1e-05)


@pytest.mark.parametrize(("reg_m1", "reg_m2"), [(1, 1), (1, np.inf), (np.inf, 1)])
def test_unbalanced_relaxation_parameters_pair(reg_m1, reg_m2):
    """POT unbalanced/test_sinkhorn.py::test_unbalanced_relaxation_parameters_pair[method, reg_m1,
    reg_m2]: a pair as a tuple or a list gives the same potentials and plan to 1e-5 (each
    column of ``b`` on its own; ``(inf, inf)`` with unequal masses: see below)."""
    n = 100
    rng = np.random.RandomState(50)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = rng.rand(n, 2)
    for k in range(2):
        res = solve(a, b[:, k], x, reg_m=(reg_m1, reg_m2), verbose=True)
        for opt in [(reg_m1, reg_m2), [reg_m1, reg_m2]]:
            res_opt = solve(a, b[:, k], x, reg_m=opt, verbose=True)
            np.testing.assert_allclose(res.potentials[0], res_opt.potentials[0], atol=1e-05)
            np.testing.assert_allclose(res.potentials[1], res_opt.potentials[1], atol=1e-05)
            np.testing.assert_allclose(np.asarray(res.plan), np.asarray(res_opt.plan), atol=1e-05)


@pytest.mark.parametrize("reg_m", [np.inf, (np.inf, np.inf), [np.inf, np.inf]])
def test_unbalanced_relaxation_parameters_infinite(reg_m):
    """POT unbalanced/test_sinkhorn.py::test_unbalanced_relaxation_parameters[method, inf] and
    ``..._pair[method, inf, inf]``: POT runs balanced Sinkhorn on weights of masses 1 and
    about 50 and compares the forms; sketchot refuses hard constraints on both sides with
    unequal masses, naming ``reg_m`` (documented difference)."""
    n = 100
    rng = np.random.RandomState(50)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = rng.rand(n, 2)
    with pytest.raises(ValueError, match=r"reg_m=.*same total mass"):
        solve(a, b[:, 0], x, reg_m=reg_m)


def test_stabilized_vs_sinkhorn():
    """POT unbalanced/test_sinkhorn.py::test_stabilized_vs_sinkhorn: ``dist0(100) / median``,
    stopThr 1e-12, two targets; each column's ``sinkhorn_unbalanced2`` value against POT's
    (``method='sinkhorn'``, the same stopThr) to 1e-5."""
    n = 100
    a = ot.datasets.make_1D_gauss(n, m=20, s=5)
    b1 = ot.datasets.make_1D_gauss(n, m=60, s=8)
    b2 = ot.datasets.make_1D_gauss(n, m=30, s=4)
    b = np.vstack((b1, b2)).T
    M = ot.utils.dist0(n)
    median = np.median(M)
    M /= median
    X = (np.arange(n, dtype=np.float64) / np.sqrt(median))[:, None]
    epsilon = 1
    reg_m = 1.0
    stopThr = 1e-12
    for k in range(2):
        G2_np = ot.unbalanced.sinkhorn_unbalanced2(
            a, b[:, k], M, epsilon, reg_m, method="sinkhorn", stopThr=stopThr
        )
        G = sketchot.sinkhorn2(a, b[:, k], X, X, epsilon, backend="exact", reg_m=reg_m,
                               tol=stopThr)  # fmt: skip
        np.testing.assert_allclose(G, G2_np, atol=1e-5)


def test_wrong_method():
    """POT unbalanced/test_sinkhorn.py::test_wrong_method (``method=`` -> ``backend=``)."""
    n = 10
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = ot.utils.unif(n) * 1.5
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn_unbalanced(a, b, x, x, reg=1.0, reg_m=1.0, backend="badmethod",
                                     verbose=True)  # fmt: skip
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn2(a, b, x, x, 1.0, backend="badmethod", reg_m=1.0, verbose=True)


def test_implemented_methods():
    """POT unbalanced/test_sinkhorn.py::test_implemented_methods (``method=`` -> ``backend=``; POT's
    not-yet-implemented methods and the barycenter calls have no counterpart)."""
    n = 3
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = ot.utils.unif(n) * 1.5
    for backend in ["exact", "auto"]:
        sketchot.sinkhorn_unbalanced(a, b, x, x, 1.0, 1.0, backend=backend)
        sketchot.sinkhorn2(a, b, x, x, 1.0, backend=backend, reg_m=1.0)
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn_unbalanced(a, b, x, x, 1.0, 1.0, backend="foo")
    with pytest.raises(ValueError, match="backend"):
        sketchot.sinkhorn2(a, b, x, x, 1.0, backend="foo", reg_m=1.0)
