"""Bad input at every public entry: one table of cases x entries (issue 42, item 7).

Each reported bad case is an example of a class; the table sweeps the class over every public
function that takes the argument. An entry declares the name under which it takes each role
(``solve_sample`` takes the first cloud as ``X_a`` and ``reg_m`` as ``unbalanced``), and the
error must name THAT argument, say what was expected and show what was received: a
``TypeError`` or ``ValueError`` raised by sketchot, never NumPy's, torch's or Dask's own message
(``setting an array element with a sequence``, ``data type 'float8' not understood``, ``stack
expects a non-empty TensorList``, ``Chunks do not add up to shape``), and no file is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import sketchot

RNG = np.random.default_rng(0)
X, Y = RNG.random((12, 2)), RNG.random((10, 2)) + 0.3
STACK_X, STACK_Y = RNG.random((3, 12, 2)), RNG.random((3, 10, 2))
REG = 0.5  # explicit everywhere: the default of reg is not part of these tests


@dataclass
class Entry:
    """A public function, called with the clouds of its ``shape`` and ``over`` replacing
    inputs by role; ``names`` maps each role it takes to its own name for it; ``refuses``
    the keywords of sketchot's other solves it refuses with a reason ("does not take")."""

    call: Callable[[dict[str, Any]], Any]
    names: dict[str, str]
    shape: str = "cloud"  # 'cloud' (n, d), 'stack' (B, n, d) or 'clouds' (a list)
    refuses: tuple[str, ...] = ()
    options: bool = True  # takes the solver options (max_iter, ...)
    extra: dict[str, Any] = field(default_factory=dict)


def _inputs(entry: Entry, over: dict[str, Any]) -> dict[str, Any]:
    first, second = (STACK_X, STACK_Y) if entry.shape == "stack" else (X, Y)
    inputs = {"X": first, "Y": second, "a": None, "reg": REG, "kw": {}}
    for role, value in over.items():
        if role in inputs and role != "kw":
            inputs[role] = value
        else:  # a keyword, under the entry's own name for the role
            inputs["kw"][entry.names.get(role, role)] = value
    return inputs


def _divergence(i):
    return sketchot.SinkhornDivergence(i["reg"], backend="exact", **i["kw"])(i["X"], i["Y"])


SOLVE_NAMES = {"X": "X", "a": "a", "reg": "reg", "reg_m": "reg_m", "dtype": "dtype",
               "warm": "warmstart"}  # fmt: skip


def _named(caller: str, names: dict[str, str]) -> dict[str, str]:
    """``names`` with the public function's own name, which its messages must use."""
    return {**names, "caller": caller}


ENTRIES = {
    "sinkhorn": Entry(
        lambda i: sketchot.sinkhorn(i["a"], None, i["X"], i["Y"], i["reg"], "exact", **i["kw"]),
        _named("sinkhorn", SOLVE_NAMES),
    ),
    "sinkhorn2": Entry(
        lambda i: sketchot.sinkhorn2(i["a"], None, i["X"], i["Y"], i["reg"], "exact", **i["kw"]),
        _named("sinkhorn2", SOLVE_NAMES),
    ),
    "sinkhorn_unbalanced": Entry(
        lambda i: sketchot.sinkhorn_unbalanced(
            i["a"], None, i["X"], i["Y"], i["reg"], i["kw"].pop("reg_m", 1.0), "exact", **i["kw"]
        ),
        _named("sinkhorn_unbalanced", SOLVE_NAMES),
    ),
    "solve_sample": Entry(
        lambda i: sketchot.solve_sample(
            i["X"], i["Y"], i["a"], None, reg=i["reg"], backend="exact", **i["kw"]
        ),
        _named(
            "solve_sample",
            {**SOLVE_NAMES, "X": "X_a", "reg_m": "unbalanced", "warm": "potentials_init"},
        ),
    ),
    "sinkhorn_kernel": Entry(
        lambda i: sketchot.sinkhorn_kernel(
            i["a"], None, sketchot.make_kernel(i["X"], i["Y"], i["reg"], "exact"), **i["kw"]
        ),
        {**SOLVE_NAMES, "dtype": None},
    ),
    "make_kernel": Entry(
        lambda i: sketchot.make_kernel(i["X"], i["Y"], i["reg"], "exact", **i["kw"]),
        {"X": "X", "reg": "reg", "dtype": "dtype"},
        options=False,
    ),
    "sinkhorn_divergence": Entry(
        lambda i: sketchot.sinkhorn_divergence(
            i["X"], i["Y"], i["a"], None, reg=i["reg"], backend="exact", **i["kw"]
        ),
        {"X": "X", "a": "a", "reg": "reg", "reg_m": "reg_m", "dtype": "dtype"},
    ),
    "SinkhornDivergence": Entry(
        _divergence, {"X": "X", "reg": "reg", "reg_m": "reg_m", "dtype": "dtype"}
    ),
    "barycenter": Entry(
        lambda i: sketchot.barycenter(
            [i["X"], i["Y"]], reg=i["reg"], n_support=4, rng=0, backend="exact", **i["kw"]
        ),
        _named("barycenter", {"X": "clouds[0]", "reg": "reg", "dtype": "dtype"}),
        refuses=("metric", "reg_m", "warmstart"),
    ),
    "sinkhorn_batch": Entry(
        lambda i: sketchot.sinkhorn_batch(i["X"], i["Y"], i["a"], None, i["reg"], **i["kw"]),
        _named("sinkhorn_batch", {"X": "X", "a": "a", "reg": "reg"}),
        shape="stack",
        refuses=("metric", "reg_m", "dtype", "backend", "rank", "rng", "warmstart"),
    ),
    "solve_sample_batch": Entry(
        lambda i: sketchot.solve_sample_batch(i["X"], i["Y"], i["reg"], i["a"], **i["kw"]),
        _named("solve_sample_batch", {"X": "X_a", "a": "a", "reg": "reg"}),
        shape="stack",
        refuses=("metric", "reg_m", "unbalanced", "dtype", "backend", "potentials_init"),
    ),
    "pairwise_divergences": Entry(
        lambda i: sketchot.pairwise_divergences(i["X"], i["a"], i["reg"], **i["kw"]),
        _named("pairwise_divergences", {"X": "clouds", "a": "weights", "reg": "reg"}),
        shape="stack",
        refuses=("metric", "reg_m", "dtype", "backend"),
    ),
    "SketchSinkhornTransport": Entry(
        lambda i: sketchot.SketchSinkhornTransport(reg_e=i["reg"], backend="exact", **i["kw"]).fit(
            Xs=i["X"], Xt=i["Y"]
        ),
        {"X": "Xs", "reg": "reg_e"},
    ),
}


def _masked(entry: Entry) -> np.ma.MaskedArray:
    base = STACK_X if entry.shape == "stack" else X
    mask = np.zeros(base.shape, dtype=bool)
    mask.flat[0] = True
    return np.ma.masked_array(base, mask=mask)


def _masked_weights(shape: tuple[int, ...]) -> np.ma.MaskedArray:
    mask = np.zeros(shape, dtype=bool)
    mask.flat[0] = True
    return np.ma.masked_array(np.full(shape, 1 / 12), mask=mask)


def _ragged(entry: Entry) -> list:
    if entry.shape == "stack":  # clouds of different sizes (taken) and dimensions (refused)
        return [X.tolist(), X[:5, :1].tolist(), X.tolist()]
    return [[0.1, 0.2], [0.3]]  # rows of different lengths


def _with_nan(entry: Entry) -> np.ndarray:
    base = (STACK_X if entry.shape == "stack" else X).copy()
    base.flat[3] = np.nan
    return base


def _empty(entry: Entry) -> np.ndarray:
    return np.zeros((0, 12, 2)) if entry.shape == "stack" else np.zeros((0, 2))


def _complex(entry: Entry) -> np.ndarray:
    return (STACK_X if entry.shape == "stack" else X) + 1j


def _name(entry: Entry, role: str) -> str:
    return re.escape(entry.names[role])


@dataclass
class Case:
    """A bad value for one role, the error and its message (a regex, from the entry's name
    for the role); entries that refuse the keyword outright must say "does not take"."""

    role: str
    value: Callable[[Entry], Any]
    error: type | tuple[type, ...]
    message: Callable[[Entry], str]


CASES = {
    "masked clouds": Case(
        "X", _masked, TypeError, lambda e: rf"^{_name(e, 'X')} is a numpy masked array with 1 "
    ),
    "masked weights": Case(
        "a",
        lambda e: _masked_weights((3, 12) if e.shape == "stack" else (12,)),
        TypeError,
        lambda e: rf"^{_name(e, 'a')} is a numpy masked array .*\.filled\(0\)",
    ),
    "ragged clouds": Case(
        "X",
        _ragged,
        (TypeError, ValueError),
        lambda e: (
            rf"^{_name(e, 'X')}(\[1\] must have 2 columns| must be a (2-D numeric array|"
            "stack of clouds of one shape))"
        ),
    ),
    "NaN in the clouds": Case(
        "X", _with_nan, ValueError, lambda e: rf"^{_name(e, 'X')} must contain only finite"
    ),
    "complex clouds": Case("X", _complex, TypeError, lambda e: rf"^{_name(e, 'X')} must be a real"),
    "no point or no cloud": Case(
        "X", _empty, ValueError, lambda e: rf"^{_name(e, 'X')} must be (a )?non-empty"
    ),
    "reg as a string": Case(
        "reg",
        lambda e: "1",
        TypeError,
        lambda e: rf"^{_name(e, 'reg')} must be a real number; got '1' \(str\)",
    ),
    "negative reg": Case(
        "reg", lambda e: -1.0, ValueError, lambda e: rf"^{_name(e, 'reg')} must be > 0; got -1"
    ),
    "reg_m as a string": Case(
        "reg_m",
        lambda e: "1",
        TypeError,
        lambda e: rf"^{_name(e, 'reg_m')} must be None, a real number .*got '1' \(str\)",
    ),
    "reg_m as a bool": Case(
        "reg_m",
        lambda e: True,
        TypeError,
        lambda e: rf"^{_name(e, 'reg_m')} must be None, a real number .*got True \(bool\)",
    ),
    "reg_m of zero on one side": Case(
        "reg_m",
        lambda e: (1.0, 0.0),
        ValueError,
        lambda e: rf"^{_name(e, 'reg_m')} must be > 0 on each side.*the b side: 0.0",
    ),
    "dtype float8": Case(
        "dtype",
        lambda e: "float8",
        TypeError,
        lambda e: r"^dtype must be numpy.float64 or numpy.float32; got 'float8' \(str\)",
    ),
    "warm start of the wrong shape": Case(
        "warm",
        lambda e: (np.zeros(3), np.zeros(10)),
        ValueError,
        lambda e: (
            rf"^{_name(e, 'warm')}\[0\] \(log u\) must have shape \(12,\) .* got shape "
            r"\(3,\)"
        ),
    ),
    "warm start of strings": Case(
        "warm",
        lambda e: (["a"] * 12, np.zeros(10)),
        TypeError,
        lambda e: rf"^{_name(e, 'warm')}\[0\] \(log u\) must be a 1-D real array",
    ),
    "half a warm start": Case(
        "warm",
        lambda e: (np.zeros(12), None),
        ValueError,
        lambda e: rf"^{_name(e, 'warm')} must be None or a pair .* pass both",
    ),
    "a misspelt option": Case(
        "max_iters",
        lambda e: 10,
        TypeError,
        lambda e: (
            (rf"^{re.escape(e.names['caller'])}\(\) got " if "caller" in e.names else "")
            + r"unexpected keyword argument\(s\) 'max_iters' \(did you mean 'max_iter'\?\)"
        ),
    ),
}


def _table():
    for case_name, case in CASES.items():
        for entry_name, entry in ENTRIES.items():
            if case.role == "max_iters" and not entry.options:
                continue
            if case.role in ("X", "Y", "a", "reg", "max_iters") or entry.names.get(case.role):
                if case.role == "a" and "a" not in entry.names:
                    continue
                yield pytest.param(entry_name, case_name, id=f"{case_name}-{entry_name}")


@pytest.mark.parametrize(("entry_name", "case_name"), list(_table()))
def test_bad_input_names_the_argument_in_the_callers_terms(entry_name, case_name, tmp_path,
                                                           monkeypatch):  # fmt: skip
    entry, case = ENTRIES[entry_name], CASES[case_name]
    monkeypatch.chdir(tmp_path)  # nothing may be written, here or anywhere
    with pytest.raises(case.error, match=case.message(entry)):
        entry.call(_inputs(entry, {case.role: case.value(entry)}))
    assert list(tmp_path.iterdir()) == []


def _refusals():
    for entry_name, entry in ENTRIES.items():
        for keyword in entry.refuses:
            yield pytest.param(entry_name, keyword, id=f"{keyword}-{entry_name}")


REFUSED_VALUES = {"metric": "euclidean", "reg_m": 1.0, "unbalanced": 1.0, "dtype": np.float32,
                  "backend": "exact", "rank": 5, "rng": 0, "warmstart": None,
                  "potentials_init": None}  # fmt: skip


@pytest.mark.parametrize(("entry_name", "keyword"), list(_refusals()))
def test_arguments_of_the_other_solves_are_refused_with_the_reason(entry_name, keyword):
    """``barycenter(metric=...)`` said "did you mean 'metric'?"; the batches listed the
    keyword as unknown. Each now says it does not take it, and why."""
    entry = ENTRIES[entry_name]
    inputs = _inputs(entry, {})
    inputs["kw"][keyword] = REFUSED_VALUES[keyword]
    with pytest.raises(TypeError, match=rf"^{entry_name}\(\) does not take {keyword} \(got "):
        entry.call(inputs)


def test_no_message_suggests_the_name_it_refuses():
    from sketchot._validation import unknown_names

    assert unknown_names(["metric"], ["metric", "max_iter"]) == (
        "'metric' (not an argument of this function)"
    )
    assert "did you mean" not in unknown_names(["reg_m"], ["max_iter"], elsewhere=["reg_m"])


@pytest.mark.parametrize(
    ("masses", "reg_m", "message"),
    [
        ((1.0, 2.0), None, r"the default, reg_m=None.*Pass a finite reg_m"),
        ((1.0, 2.0), (np.inf, np.inf), r"^reg_m=\(inf, inf\) .* makes both marginals hard"),
        ((1.0, 2.0), np.inf, r"^reg_m=inf .* makes both marginals hard"),
    ],
)
def test_unequal_masses_say_what_the_caller_passed(masses, reg_m, message):
    a, b = np.full(12, masses[0] / 12), np.full(10, masses[1] / 10)
    with pytest.raises(ValueError, match=message):
        sketchot.sinkhorn(a, b, X, Y, REG, "exact", reg_m=reg_m)
    with pytest.raises(ValueError, match=message.replace("reg_m", "unbalanced")):
        sketchot.solve_sample(X, Y, a, b, reg=REG, backend="exact", unbalanced=reg_m)


def test_solve_sample_names_pots_arguments_when_given_sinkhorns():
    with pytest.raises(TypeError, match=r"solve_sample\(\) takes sinkhorn's reg_m as unbalanced"):
        sketchot.solve_sample(X, Y, reg=REG, reg_m=1.0)
    with pytest.raises(TypeError, match=r"takes sinkhorn's warmstart as potentials_init"):
        sketchot.solve_sample(X, Y, reg=REG, warmstart=None)
    with pytest.raises(TypeError, match=r"^potentials_init must be None or a pair"):
        sketchot.solve_sample(X, Y, reg=REG, potentials_init=np.zeros(12))


def test_numbers_in_other_forms_are_still_numbers():
    """The stricter reg_m check refuses strings and bools only: NumPy scalars, 0-d arrays and
    pairs given as arrays solve as before (the same bits as the Python float)."""
    a, b = np.full(12, 1 / 12), np.full(10, 0.2)  # unequal masses: reg_m is used
    reference = sketchot.sinkhorn(a, b, X, Y, REG, "exact", reg_m=0.7).value
    for reg_m in (np.float64(0.7), np.array(0.7), np.array([0.7, 0.7]), [0.7, 0.7]):
        assert sketchot.sinkhorn(a, b, X, Y, REG, "exact", reg_m=reg_m).value == reference


def test_renamed_errors_survive_pickling():
    """Errors cross process boundaries (Dask workers, multiprocessing) by pickle."""
    import pickle

    from sketchot._validation import RenamableValueError

    error = RenamableValueError("{reg_m} must be > 0; got -1", reg_m="reg_m")
    back = pickle.loads(pickle.dumps(error.renamed(reg_m="unbalanced")))
    assert isinstance(back, ValueError) and str(back) == "unbalanced must be > 0; got -1"
    assert str(back.renamed(reg_m="reg_m")) == "reg_m must be > 0; got -1"


def test_a_batch_of_no_clouds_from_torch_is_refused_by_name():
    torch = pytest.importorskip("torch")
    empty_x, empty_y = torch.zeros((0, 5, 2)), torch.zeros((0, 4, 2))
    with pytest.raises(ValueError, match=r"^X must be a non-empty stack of clouds"):
        sketchot.sinkhorn_batch(empty_x, empty_y, reg=REG)
    with pytest.raises(ValueError, match=r"^x and y must hold at least one cloud"):
        sketchot.SamplesLoss("sinkhorn", blur=0.5)(empty_x, empty_y)


@pytest.mark.parametrize(
    "image",
    [
        np.full((4, 4, 3), np.nan),
        np.ma.masked_array(np.zeros((4, 4, 3)), mask=np.ones((4, 4, 3), dtype=bool)),
        np.zeros((4, 4, 5)),
        np.full((4, 4, 3), 2.0),
    ],
    ids=["NaN", "masked", "5 channels", "float above 1"],
)
def test_a_bad_image_leaves_the_users_file_as_it_was(image, tmp_path):
    out = tmp_path / "result.png"
    out.write_bytes(b"previous result")
    with pytest.raises((TypeError, ValueError), match=r"^image "):
        sketchot.save_image(image, out)
    assert out.read_bytes() == b"previous result"
    assert [p.name for p in tmp_path.iterdir()] == ["result.png"]


@pytest.mark.parametrize("dask_side", ["X", "Y"])
def test_one_dask_operand_is_enough(dask_side):
    """Issue 42: a Dask X with a NumPy Y failed with Dask's "Chunks do not add up to shape"
    (the NumPy side was given the Dask side's chunk tuple). The NumPy side now takes the
    Dask side's chunk size; the answer is the in-memory one to rounding (docs/user_guide/
    dask.rst: rtol 1e-9 here, the solves' sums differ in order only)."""
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(3)
    P, Q = rng.random((300, 2)), rng.random((200, 2))
    lazy = {"X": da.from_array(P, chunks=(70, 2)), "Y": da.from_array(Q, chunks=(70, 2))}
    left = lazy["X"] if dask_side == "X" else P
    right = lazy["Y"] if dask_side == "Y" else Q
    mixed = sketchot.sinkhorn(None, None, left, right, REG, "exact", rng=0)
    memory = sketchot.sinkhorn(None, None, P, Q, REG, "exact", rng=0)
    np.testing.assert_allclose(mixed.value, memory.value, rtol=1e-9)
    masked = np.ma.masked_array(Q, mask=np.eye(200, 2, dtype=bool))
    with pytest.raises(TypeError, match=r"^Y is a numpy masked array"):
        sketchot.sinkhorn(None, None, lazy["X"], masked, REG, "exact", rng=0)
