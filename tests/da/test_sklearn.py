"""The ot.da estimators as scikit-learn estimators: ``clone``, ``get_params`` /
``set_params``, nothing checked or changed in ``__init__``, the same fit twice, the inputs
users pass (read-only, non-contiguous)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from sketchot import SketchSinkhornTransport, SketchUnbalancedSinkhornTransport

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.utils import estimator_checks  # noqa: E402

ESTIMATORS = [SketchSinkhornTransport, SketchUnbalancedSinkhornTransport]


def constructor_parameters(cls) -> set[str]:
    """The named parameters of ``__init__`` (the ``**`` catch-all of backend parameters is
    not one: its keywords land in ``backend_params``)."""
    signature = inspect.signature(cls.__init__)
    return {
        name
        for name, p in signature.parameters.items()
        if name != "self" and p.kind is not p.VAR_KEYWORD
    }


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(3)
    return rng.random((70, 2)), rng.random((50, 2)) + 0.3, rng.random((9, 2))


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_get_params_lists_exactly_the_constructor_parameters(cls):
    assert set(cls().get_params()) == constructor_parameters(cls)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_clone_round_trips_and_refits_to_the_same_answer(cls, clouds):
    Xs, Xt, new = clouds
    estimator = cls(reg_e=0.3, backend="nystrom", n_landmarks=30, rng=5, log=True)
    assert estimator.backend_params == {"n_landmarks": 30}
    copy = clone(estimator)
    assert copy is not estimator and copy.get_params() == estimator.get_params()
    assert not hasattr(copy, "result_")  # clone copies parameters, not the fit
    first = estimator.fit(Xs=Xs, Xt=Xt).transform(Xs=new)
    np.testing.assert_array_equal(copy.fit(Xs=Xs, Xt=Xt).transform(Xs=new), first)


@pytest.mark.parametrize(
    "check",
    [
        "check_no_attributes_set_in_init",
        "check_parameters_default_constructible",
        "check_get_params_invariance",
        "check_set_params",
        "check_estimator_cloneable",
        "check_estimator_repr",
    ],
)
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_scikit_learn_estimator_checks(cls, check):
    """scikit-learn's own checks of the parameter protocol (those that do not need
    ``fit(X, y)``, which these estimators spell ``fit(Xs=, ys=, Xt=, yt=)``)."""
    getattr(estimator_checks, check)(cls.__name__, cls())


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_init_and_set_params_store_invalid_values_and_fit_names_them(cls, clouds):
    """scikit-learn's ``check_do_not_raise_errors_in_init_or_set_params``, by hand: that
    function also passes the ``**`` catch-all as if it were a parameter, which
    ``set_params`` rightly refuses. Every named parameter takes an invalid value without
    an error; ``fit`` then refuses, naming a parameter."""
    Xs, Xt, _ = clouds
    invalid = {name: -1 for name in constructor_parameters(cls)}
    estimator = cls(**invalid)
    assert estimator.get_params() == invalid
    other = cls().set_params(**invalid)
    assert other.get_params() == invalid
    with pytest.raises((TypeError, ValueError)) as error:
        estimator.fit(Xs=Xs, Xt=Xt)
    assert any(name in str(error.value) for name in invalid)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_fit_changes_no_parameter(cls, clouds):
    """POT's fit sets ``log=True`` (continuous map) and multiplies ``limit_max`` by the
    largest cost; these estimators change nothing (a second fit is the first)."""
    Xs, Xt, _ = clouds
    ys = np.arange(Xs.shape[0]) % 2
    yt = np.arange(Xt.shape[0]) % 2
    estimator = cls(limit_max=3.0, out_of_sample_map="continuous")
    before = estimator.get_params()
    first = estimator.fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt).coupling_
    assert estimator.get_params() == before
    np.testing.assert_array_equal(estimator.fit(Xs=Xs, ys=ys, Xt=Xt, yt=yt).coupling_, first)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_read_only_and_non_contiguous_inputs(cls, clouds):
    """Views and read-only arrays give the answer of their contiguous copies, bit for bit,
    and are not written to."""
    Xs, Xt, new = clouds
    wide_s = np.repeat(Xs, 2, axis=1)[:, ::2]  # non-contiguous view equal to Xs
    wide_t = np.asfortranarray(Xt)
    locked = new.copy()
    locked.flags.writeable = False
    ys = (np.arange(Xs.shape[0]) % 3) - 1  # -1 marks unlabelled samples
    ys_view = np.repeat(ys, 2)[::2]
    yt = np.arange(Xt.shape[0]) % 2
    for labels in ((None, None), (ys_view, yt)):
        reference = cls(reg_e=0.2, rng=0).fit(
            Xs=Xs.copy(), ys=labels[0], Xt=Xt.copy(), yt=labels[1]
        )
        viewed = cls(reg_e=0.2, rng=0).fit(Xs=wide_s, ys=labels[0], Xt=wide_t, yt=labels[1])
        np.testing.assert_array_equal(viewed.coupling_, reference.coupling_)
        np.testing.assert_array_equal(viewed.transform(Xs=locked), reference.transform(Xs=new))
        np.testing.assert_array_equal(
            viewed.inverse_transform(Xt=locked), reference.inverse_transform(Xt=new)
        )
    assert not locked.flags.writeable


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_same_call_twice_same_answer(cls, clouds):
    """The same inputs and ``rng`` (an approximate backend draws landmarks) give the same
    bits."""
    Xs, Xt, new = clouds
    runs = [
        cls(reg_e=0.2, backend="nystrom", n_landmarks=45, rng=11).fit(Xs=Xs, Xt=Xt)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(runs[0].coupling_, runs[1].coupling_)
    np.testing.assert_array_equal(runs[0].transform(Xs=new), runs[1].transform(Xs=new))
    np.testing.assert_array_equal(runs[0].log_["log_v"], runs[1].log_["log_v"])


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_unfitted_attributes_are_absent(cls):
    """``hasattr`` is False before fit for the properties (scikit-learn's fitted test),
    and methods say how to fit."""
    estimator = cls()
    assert not hasattr(estimator, "coupling_") and not hasattr(estimator, "cost_")
    with pytest.raises(RuntimeError, match=r"not fitted yet .*call fit\(Xs=\.\.\., Xt=\.\.\.\)"):
        estimator.transform(Xs=np.zeros((2, 2)))
