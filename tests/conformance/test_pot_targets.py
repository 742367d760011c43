"""POT's tests of several histograms (``b`` of shape ``(m, k)``) ported to sketchot's one
call on one kernel (:mod:`sketchot.solver.targets`).

Sources (MIT licence; repository PythonOT/POT, the tests of the installed POT 0.9.7):
``test/test_bregman.py::test_sinkhorn_multi_b`` and
``test/test_bregman.py::test_stabilized_vs_sinkhorn_multidim`` (balanced), and
``test/test_unbalanced.py::test_unbalanced_multiple_inputs`` (unbalanced). Each test names
the POT test it ports; inputs, assertions and tolerances are POT's, with the mappings of
``test_pot_bregman.py`` (``stopThr`` -> ``tol``, ``M`` -> ``sketchot.solve(M, ...)`` or the
clouds of ``ot.dist``), and these for several histograms:

- POT's ``sinkhorn`` and ``sinkhorn2`` return the ``k`` values ``<P_k, M>``:
  ``result.value_linear`` (``sketchot.sinkhorn2`` returns them as POT's does);
- POT's ``log['u']``, ``log['v']`` (``log['log_u']``, ``log['log_v']`` of ``sinkhorn_log``),
  shapes ``(n, k)`` and ``(m, k)``: ``result.log`` (and ``result.potentials``).

Deliberate differences (rows of ``docs/user_guide/coming_from_pot.rst``, "Several targets"),
asserted below:

- POT 0.9.7's ``sinkhorn_unbalanced`` with several histograms warns "Reg_type not
  implemented yet. Use entropy." and solves ``reg_type='entropy'`` whatever it is given;
  sketchot solves its one problem (POT's default ``reg_type='kl'``) for every column, equal
  to POT's one-column solves. The fixed-point check of
  ``test_unbalanced_multiple_inputs`` is therefore ported with the KL problem's equations.
- POT takes balanced columns of another mass than ``a`` silently (its answer is that of the
  column rescaled to ``sum(a)``); sketchot refuses them, naming the columns.
"""

from __future__ import annotations

import warnings

import numpy as np
import ot
import pytest
from scipy.special import logsumexp

import sketchot


def multi_b_case(n: int = 10):
    """POT test_sinkhorn_multi_b's inputs."""
    rng = np.random.RandomState(0)
    x = rng.randn(n, 2)
    u = ot.utils.unif(n)
    b = rng.rand(n, 3)
    b = b / np.sum(b, 0, keepdims=True)
    return x, u, b


# POT's reference solves stop at its numItermax before stopThr, as in POT's own test
@pytest.mark.filterwarnings("ignore:Sinkhorn did not converge:UserWarning")
@pytest.mark.parametrize("method", ["sinkhorn", "sinkhorn_stabilized", "sinkhorn_log"])
def test_sinkhorn_multi_b(method):
    """POT test_bregman.py::test_sinkhorn_multi_b: the k values of one call equal the k
    one-column solves (POT's ``atol=1e-4``), on the cost matrix and on the clouds; POT's
    own multi-b call (each method) is the reference."""
    x, u, b = multi_b_case()
    M = ot.dist(x, x)
    loss0 = ot.sinkhorn(u, b, M, 0.1, method=method, stopThr=1e-10)
    loss = [ot.sinkhorn2(u, b[:, k], M, 0.1, method=method, stopThr=1e-10) for k in range(3)]
    on_matrix = sketchot.solve(M, u, b, reg=0.1, tol=1e-10)
    on_clouds = sketchot.sinkhorn(u, b, x, x, 0.1, backend="exact", tol=1e-10)
    for values in (on_matrix.value_linear, on_clouds.value_linear):
        np.testing.assert_allclose(loss0, values, atol=1e-4)
        np.testing.assert_allclose(loss, values, atol=1e-4)
    assert on_matrix.converged.all() and on_clouds.accuracy_met.all()


def test_sinkhorn_multi_b_log():
    """POT test_bregman.py::test_sinkhorn_multi_b (``log=True``): POT's log of several
    histograms has ``u``, ``v`` of shapes ``(n, k)``; the plans they give have POT's
    marginals at the same tolerance."""
    x, u, b = multi_b_case()
    M = ot.dist(x, x)
    _, log = ot.sinkhorn(u, b, M, 0.1, stopThr=1e-10, log=True)
    res = sketchot.solve(M, u, b, reg=0.1, tol=1e-10)
    assert res.log["u"].shape == log["u"].shape == (10, 3)
    assert res.log["v"].shape == log["v"].shape == (10, 3)
    K = np.exp(-M / 0.1)
    for k in range(3):
        ours = res.log["u"][:, k, None] * K * res.log["v"][None, :, k]
        theirs = log["u"][:, k, None] * K * log["v"][None, :, k]
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_stabilized_vs_sinkhorn_multidim():
    """POT test_bregman.py::test_stabilized_vs_sinkhorn_multidim: ``dist0(100) / median``,
    two targets in one call, against POT's ``sinkhorn`` (POT compares two of its methods at
    ``assert_allclose``'s default rtol 1e-7; both stop at POT's stopThr 1e-9)."""
    n = 100
    a = ot.datasets.make_1D_gauss(n, m=20, s=5)
    b1 = ot.datasets.make_1D_gauss(n, m=60, s=8)
    b2 = ot.datasets.make_1D_gauss(n, m=30, s=4)
    b = np.vstack((b1, b2)).T
    M = ot.utils.dist0(n)
    M /= np.median(M)
    G_np, log = ot.bregman.sinkhorn(a, b, M, reg=0.1, method="sinkhorn", log=True)
    # POT's stopThr=1e-9 (its default) as tol, and stricter: both within rtol 1e-7
    G = sketchot.solve(M, a, b, reg=0.1, tol=1e-9).value_linear
    np.testing.assert_allclose(G_np, G)
    assert log["u"].shape == (n, 2)


@pytest.mark.parametrize("reg_m", [1.0, (1.0, 2.0)])
def test_unbalanced_multiple_inputs(reg_m):
    """POT test_unbalanced.py::test_unbalanced_multiple_inputs: ``n = 100``, two unbalanced
    targets, ``epsilon = reg_m = 1``: the fixed-point equations hold in the log domain
    (POT's ``atol=1e-5``) and ``len(loss) == b.shape[1]``. The equations are those of the
    KL problem, ``log u = log a - fi log(K v)`` (documented difference above); the values
    equal POT's one-column ``sinkhorn_unbalanced2`` with ``reg_type='kl'``."""
    n = 100
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    a = ot.utils.unif(n)
    b = rng.rand(n, 2)
    M = ot.dist(x, x)
    epsilon = 1.0
    res = sketchot.solve(M, a, b, reg=epsilon, unbalanced=reg_m, tol=1e-10)
    assert len(res.value_linear) == b.shape[1]
    fa, fb = (r / (r + epsilon) for r in np.broadcast_to(reg_m, (2,)))
    log_u, log_v = res.potentials
    logKtu = logsumexp(log_u[:, None, :] - M[:, :, None] / epsilon, axis=0)
    logKv = logsumexp(log_v[None, :, :] - M[:, :, None] / epsilon, axis=1)
    np.testing.assert_allclose(np.log(a)[:, None] - fa * logKv, log_u, atol=1e-5)
    np.testing.assert_allclose(np.log(b) - fb * logKtu, log_v, atol=1e-5)
    pot = [
        ot.unbalanced.sinkhorn_unbalanced2(a, b[:, k], M, epsilon, reg_m, stopThr=1e-10)
        for k in range(2)
    ]
    np.testing.assert_allclose(res.value_linear, pot, atol=1e-5)


def test_pot_solves_entropy_for_several_unbalanced_histograms():
    """The documented difference: POT 0.9.7 warns and solves ``reg_type='entropy'`` for
    several histograms; sketchot keeps the KL problem (its values are POT's one-column
    ``reg_type='kl'`` ones, above), so the two differ where ``a b^T`` is not uniform."""
    n = 100
    rng = np.random.RandomState(42)
    x = rng.randn(n, 2)
    a, b, M = ot.utils.unif(n), rng.rand(n, 2), ot.dist(x, x)
    with pytest.warns(UserWarning, match="Reg_type not implemented yet"):
        theirs = ot.unbalanced.sinkhorn_unbalanced2(a, b, M, 1.0, 1.0, stopThr=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        entropy = [
            ot.unbalanced.sinkhorn_unbalanced2(
                a, b[:, k], M, 1.0, 1.0, reg_type="entropy", stopThr=1e-10
            )
            for k in range(2)
        ]
    np.testing.assert_allclose(theirs, entropy, atol=1e-5)
    ours = sketchot.solve(M, a, b, reg=1.0, unbalanced=1.0, tol=1e-10).value_linear
    assert np.all(np.abs(ours - theirs) > 1e-3)


def test_columns_of_another_mass():
    """POT's ``sinkhorn`` takes a column of another mass silently and answers for it
    rescaled to ``sum(a)``; sketchot refuses it by name, and the rescaled call gives POT's
    values (POT test_sinkhorn_multi_b's inputs and ``atol=1e-4``)."""
    x, u, b = multi_b_case()
    M = ot.dist(x, x)
    heavy = b * np.array([1.0, 2.0, 0.5])
    theirs = ot.sinkhorn2(u, heavy, M, 0.1, stopThr=1e-10)
    with pytest.raises(ValueError, match=r"b\[:, 1\] sums to 2.*b\[:, 2\] sums to 0.5"):
        sketchot.solve(M, u, heavy, reg=0.1)
    rescaled = heavy / heavy.sum(axis=0) * u.sum()
    ours = sketchot.solve(M, u, rescaled, reg=0.1, tol=1e-10).value_linear
    np.testing.assert_allclose(theirs, ours, atol=1e-4)


def test_pot_signature_wrappers_return_the_k_values():
    """POT's ``ot.sinkhorn(a, B, M, reg)`` with several histograms returns the ``k`` values
    ``<P_k, M>`` (its ``sinkhorn_knopp``), not plans: so does ``sketchot.matrix.sinkhorn``
    (POT's signature); ``test_sinkhorn_multi_b``'s data and tolerance (atol 1e-4 between
    POT's methods; both solves here stop at POT's stopThr)."""
    import sketchot.matrix

    rng = np.random.default_rng(0)
    M = ot.dist(rng.random((30, 2)), rng.random((20, 2)))
    B = rng.random((20, 3))
    B /= B.sum(axis=0)
    a = ot.unif(30)
    values = sketchot.matrix.sinkhorn(a, B, M, 0.1, stopThr=1e-9)
    pot = ot.sinkhorn(a, B, M, 0.1, stopThr=1e-9)
    np.testing.assert_allclose(values, pot, atol=1e-4)
    values, log = sketchot.matrix.sinkhorn(a, B, M, 0.1, stopThr=1e-9, log=True)
    assert log["u"].shape == (30, 3) and log["v"].shape == (20, 3)
    assert log["result"].accuracy_met.all()
