"""POT's tests of ``ot.da.SinkhornTransport``, ported to
:class:`sketchot.SketchSinkhornTransport`.

Source: POT's ``test/test_da.py`` (MIT licence; repository PythonOT/POT at commit aed0120,
the tests of the installed POT 0.9.7). Each test names the POT test it ports; inputs,
assertions and tolerances are POT's. POT draws ``make_data_classif`` from NumPy's global
random state; the ports pass ``random_state`` (randomness only through an explicit seed).
POT's default ``tol=1e-8`` of ``SinkhornTransport`` is passed where an assertion compares
numbers with POT's.

No equivalent (not ported): ``test_unbalanced_sinkhorn_transport_class``
(``UnbalancedSinkhornTransport``: sketchot has none; the rest of the ``ot.da`` family belongs
to the cost-matrix issue), and the tests of the classes sketchot does not mirror (EMD, Lpl1,
L1l2, mapping, JCPOT, Laplace, ``test_class_jax_tf``).
"""

from __future__ import annotations

import numpy as np
import ot
import pytest
from numpy.testing import assert_allclose, assert_equal
from ot.datasets import make_data_classif
from ot.utils import unif

import sketchot

# POT's default tol of ot.da.SinkhornTransport
POT_TOL = 1e-8


def data(ns: int = 50, nt: int = 50):
    Xs, ys = make_data_classif("3gauss", ns, random_state=0)
    Xt, yt = make_data_classif("3gauss2", nt, random_state=1)
    return Xs, ys, Xt, yt


def test_log_da():
    """POT test_da.py::test_log_da[SinkhornTransport] and the ``log=True`` part of
    ``test_sinkhorn_transport_class``: POT's ``log=True`` fills ``log_`` (sketchot always
    does)."""
    Xs, ys, Xt, _ = data()
    otda = sketchot.SketchSinkhornTransport(log=True)
    otda.fit(Xs=Xs, ys=ys, Xt=Xt)
    assert hasattr(otda, "log_")
    assert len(otda.log_.keys()) != 0


def test_sinkhorn_transport_class():
    """POT test_da.py::test_sinkhorn_transport_class (fit, coupling marginals to rtol = atol
    = 1e-3, transform, out of sample, inverse, labels, fit_transform). sketchot has no
    ``cost_`` (it never builds the n x m cost; documented difference)."""
    ns, nt = 50, 50
    Xs, ys, Xt, yt = data(ns, nt)

    otda = sketchot.SketchSinkhornTransport(rng=0)
    otda.fit(Xs=Xs, Xt=Xt)
    assert hasattr(otda, "coupling_")
    assert hasattr(otda, "log_")
    assert not hasattr(otda, "cost_")

    assert_equal(otda.coupling_.shape, ((Xs.shape[0], Xt.shape[0])))

    mu_s = unif(ns)
    mu_t = unif(nt)
    assert_allclose(np.sum(otda.coupling_, axis=0), mu_t, rtol=1e-3, atol=1e-3)
    assert_allclose(np.sum(otda.coupling_, axis=1), mu_s, rtol=1e-3, atol=1e-3)

    transp_Xs = otda.transform(Xs=Xs)
    assert_equal(transp_Xs.shape, Xs.shape)

    Xs_new = make_data_classif("3gauss", ns + 1, random_state=2)[0]
    transp_Xs_new = otda.transform(Xs_new)
    assert_equal(transp_Xs_new.shape, Xs_new.shape)

    transp_Xt = otda.inverse_transform(Xt=Xt)
    assert_equal(transp_Xt.shape, Xt.shape)

    transp_yt = otda.transform_labels(ys)
    assert_equal(transp_yt.shape[0], yt.shape[0])
    assert_equal(transp_yt.shape[1], len(np.unique(ys)))

    transp_ys = otda.inverse_transform_labels(yt)
    assert_equal(transp_ys.shape[0], ys.shape[0])
    assert_equal(transp_ys.shape[1], len(np.unique(yt)))

    Xt_new = make_data_classif("3gauss2", nt + 1, random_state=3)[0]
    transp_Xt_new = otda.inverse_transform(Xt=Xt_new)
    assert_equal(transp_Xt_new.shape, Xt_new.shape)

    transp_Xs = otda.fit_transform(Xs=Xs, Xt=Xt)
    assert_equal(transp_Xs.shape, Xs.shape)


def test_sinkhorn_transport_class_semi_supervised():
    """POT test_da.py::test_sinkhorn_transport_class (its semi-supervised part: ``ys`` and
    ``yt`` make the cost of pairs of different labels ``limit_max``): sketchot never builds
    the cost matrix and refuses both labels by name (documented difference)."""
    Xs, ys, Xt, yt = data()
    with pytest.raises(ValueError, match="ys and yt were both given"):
        sketchot.SketchSinkhornTransport().fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt)


def test_sinkhorn_transport_class_out_of_sample_maps():
    """POT test_da.py::test_sinkhorn_transport_class (its ``out_of_sample_map`` part): on
    the fitted samples POT's ``'ferradans'`` and ``'continuous'`` maps agree to 5 decimals;
    sketchot's default map (``'continuous'``) agrees with POT's ``'ferradans'`` to 5 decimals
    at POT's tol, and so does sketchot's ``'ferradans'``."""
    Xs, _, Xt, _ = data()
    ref = ot.da.SinkhornTransport(out_of_sample_map="ferradans")
    ref_Xs = ref.fit_transform(Xs=Xs, Xt=Xt)
    ref_Xt = ref.inverse_transform(Xt=Xt)

    otda = sketchot.SketchSinkhornTransport(tol=POT_TOL, rng=0)
    transp_Xs2 = otda.fit_transform(Xs=Xs, Xt=Xt)
    assert_equal(transp_Xs2.shape, Xs.shape)
    transp_Xt2 = otda.inverse_transform(Xt=Xt)
    assert_equal(transp_Xt2.shape, Xt.shape)

    np.testing.assert_almost_equal(ref_Xs, transp_Xs2, decimal=5)
    np.testing.assert_almost_equal(ref_Xt, transp_Xt2, decimal=5)

    same = sketchot.SketchSinkhornTransport(out_of_sample_map="ferradans", tol=POT_TOL, rng=0)
    np.testing.assert_almost_equal(ref_Xs, same.fit_transform(Xs=Xs, Xt=Xt), decimal=5)
    np.testing.assert_almost_equal(ref_Xt, same.inverse_transform(Xt=Xt), decimal=5)


def test_sinkhorn_transport_class_unknown_map():
    """POT test_da.py::test_sinkhorn_transport_class (last assertion): an unknown
    ``out_of_sample_map`` is refused when the estimator is made, naming the argument."""
    with pytest.raises((ValueError, TypeError), match="out_of_sample_map"):
        sketchot.SketchSinkhornTransport(out_of_sample_map="unknown")
