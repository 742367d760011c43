"""backend='auto' and rank='auto': the cheapest representation that meets the accuracy."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import sketchot
from sketchot.color import load_image, sample_pixels
from sketchot.kernels import available_backends, get_backend
from sketchot.kernels.judge import Verdict, kernel_error
from sketchot.kernels.local import rtol_for
from sketchot.kernels.registry import LOW_RANK_KIND
from sketchot.policy import auto_rule, register_auto, unregister_auto

ladder = importlib.import_module("sketchot.policy.ladder")


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(11)
    return rng.random((700, 3)), rng.beta(2, 5, size=(600, 3))


@pytest.fixture(scope="module")
def photo():
    """3000 pixel colours of each default image: at reg = 0.01 far beyond a global low rank,
    and the block-local kernel predicted at 0.02 s an iteration against 0.05 s for the
    streamed exact kernel (at 1500, 0.014 s against 0.013 s: a tie the test would not
    decide)."""
    rng = np.random.default_rng(4)
    return tuple(
        sample_pixels(load_image(f"images/default_{name}.png"), 3000, rng=rng).colors
        for name in ("source", "target")
    )


def as_if_large(monkeypatch):
    """``auto`` skips the stored exact kernel, as if ``n x m`` were huge."""
    monkeypatch.setattr(ladder, "dense_budget_bytes", lambda: 0)
    monkeypatch.setattr(ladder, "DIRECT_DENSE_ENTRIES", 0)


def test_a_problem_that_fits_is_solved_exactly(clouds):
    X, Y = clouds
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.1)
    assert res.backend == "exact" and "is small" in res.reason
    assert res.accuracy_met and res.true_kernel.exhaustive


def test_large_reg_takes_a_low_rank_kernel(clouds, monkeypatch, capsys):
    X, Y = clouds
    monkeypatch.setattr(ladder, "dense_budget_bytes", lambda: 0)  # as if n x m were huge
    res = sketchot.sinkhorn(None, None, X, Y, reg=1.0, rng=0, verbose=True)
    assert res.backend == "nystrom" and res.accuracy_met
    assert res.attempts and res.attempts[-1].accepted
    assert "sketchot auto: chose nystrom" in capsys.readouterr().out


def test_small_reg_takes_the_block_local_kernel(photo, monkeypatch):
    """Photo colours at reg = 0.01: no global low rank is accurate (the notes' sharp
    boundary; each rung's sampled kernel error stays far above the target), and the
    block-local polynomial kernel, predicted cheaper per iteration than the exact one (the
    cost model: counted work, never a timing), meets the accuracy."""
    X, Y = photo
    as_if_large(monkeypatch)
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.01, rng=0)
    low_rank = [a for a in res.attempts if a.backend == "nystrom"]
    assert low_rank and not any(a.accepted for a in low_rank)
    local = [a for a in res.attempts if a.backend == "polyts_local"]
    assert len(local) == 1 and local[0].accepted
    assert res.backend == "polyts_local" and "block-local" in res.reason
    assert "predicted" in res.reason and res.accuracy_met


def test_a_local_kernel_predicted_costlier_is_not_solved(photo, monkeypatch):
    """When the exact kernel is predicted cheaper (stored: its products only read the
    entries), the block-local kernel is built but not solved, the note says why, and the
    exact kernel is used: the one outcome of these inputs."""
    X, Y = photo
    monkeypatch.setattr(ladder, "DIRECT_DENSE_ENTRIES", 0)  # stored, after the ladder
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.01, rng=0)
    local = [a for a in res.attempts if a.backend == "polyts_local"]
    assert len(local) == 1 and not local[0].accepted and "not solved" in local[0].note
    assert "predicted" in local[0].note
    assert res.backend == "exact" and "stored" in res.reason and res.accuracy_met


def test_a_rank_the_memory_refuses_ends_the_low_rank_ladder(photo, monkeypatch):
    """A low-rank rung whose build the memory check refuses is a rung that does not pay:
    ``auto`` goes on to the block-local and exact kernels (a loss step at 10^6 colours, with
    the previous step's kernels alive, once failed on Nystrom's MemoryError at rank 128).
    Asked for by name (``rank='auto'``), a backend whose first rank does not fit raises."""
    registry = importlib.import_module("sketchot.kernels.registry")
    original = registry.check_fits
    allowed = {}

    def refuse_growth(n_bytes, what, parameter):
        # the first rank fits, none larger
        if "nystrom" in what and n_bytes > allowed.setdefault("bytes", n_bytes):
            raise MemoryError(f"{what} would need {n_bytes} bytes (test)")
        return original(n_bytes, what, parameter)

    monkeypatch.setattr(registry, "check_fits", refuse_growth)
    as_if_large(monkeypatch)
    X, Y = photo
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.01, rng=0)
    refused = [a for a in res.attempts if "does not fit in memory" in a.note]
    assert len(refused) == 1 and refused[0].params == {"rank": 128}
    assert res.backend == "polyts_local" and res.accuracy_met
    allowed["bytes"] = 0  # not even the first rank
    with pytest.raises(MemoryError, match="does not fit in memory"):
        sketchot.make_kernel(X, Y, 0.01, "nystrom", rank="auto", rng=0)


def test_a_hopeless_rank_is_rejected_on_a_sample_without_its_full_build(photo, monkeypatch):
    """Above ``SAMPLE_ABOVE`` points a low-rank rung is first built on ``SAMPLE_POINTS`` points
    of each cloud; photo colours at reg = 0.01 are far beyond low rank, so the ladder ends
    on the sample's errors and no rung is built at full size (sizes scaled down here)."""
    monkeypatch.setattr(ladder, "SAMPLE_ABOVE", 1000)
    monkeypatch.setattr(ladder, "SAMPLE_POINTS", 1200)  # ranks 64 and 128 sampled
    as_if_large(monkeypatch)
    X, Y = photo
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.01, rng=0)
    low_rank = [a for a in res.attempts if a.params.get("rank")]
    assert low_rank and all("on 1200 points of each cloud" in a.note for a in low_rank)
    assert all(a.error > ladder.HOPELESS_FACTOR * 1e-3 for a in low_rank)
    assert res.backend == "polyts_local" and res.accuracy_met


def test_a_sample_within_reach_goes_on_to_the_full_build(clouds, monkeypatch):
    """At reg = 1 the sample's rank-64 error is small: the rung is built at full size and
    judged there (the sample never accepts a kernel)."""
    X, Y = clouds
    monkeypatch.setattr(ladder, "SAMPLE_ABOVE", 500)
    monkeypatch.setattr(ladder, "SAMPLE_POINTS", 550)  # 8 x 64 <= 550: rank 64 sampled
    monkeypatch.setattr(ladder, "dense_budget_bytes", lambda: 0)
    sampled = []
    original = ladder.GibbsGeometry.sample

    def spy(geometry, size, generator):
        sampled.append(size)
        return original(geometry, size, generator)

    monkeypatch.setattr(ladder.GibbsGeometry, "sample", spy)
    res = sketchot.sinkhorn(None, None, X, Y, reg=1.0, rng=0)
    assert sampled == [550], "the rung must have been tried on the sample first"
    assert res.backend == "nystrom" and res.accuracy_met
    assert not any("points of each cloud" in a.note for a in res.attempts)
    assert res.kernel.shape == (700, 600)


def test_the_block_local_kernel_is_built_for_the_requested_accuracy(monkeypatch):
    """Its entries are sized by the target (a fiftieth of it): built at the default
    accuracy, a call asking 1e-6 got entries to 1e-5, missed the target by its check and fell
    to the streamed exact kernel (hours at 1e5 points)."""
    rng = np.random.default_rng(5)
    X, Y = rng.random((1500, 3)), rng.random((1500, 3))
    as_if_large(monkeypatch)
    monkeypatch.setattr(ladder, "exact_iteration_seconds", lambda *a, **k: np.inf)
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.01, rng=0, accuracy=1e-6)
    assert res.backend == "polyts_local" and res.accuracy_met
    assert res.kernel.expansion.rtol == rtol_for(1e-6)


def test_above_the_local_dimension_limit_it_streams_the_exact_kernel(monkeypatch):
    rng = np.random.default_rng(12)
    X, Y = rng.random((300, 5)), rng.random((250, 5))
    monkeypatch.setattr(ladder, "dense_budget_bytes", lambda: 0)
    monkeypatch.setattr(ladder, "DIRECT_DENSE_ENTRIES", 0)
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.005, rng=0)
    assert res.backend == "exact" and "streamed" in res.reason and res.accuracy_met
    assert all(a.backend == "nystrom" for a in res.attempts)


def test_make_kernel_auto(clouds, monkeypatch):
    X, Y = clouds
    assert sketchot.make_kernel(X, Y, 0.5).info.backend == "exact"
    monkeypatch.setattr(ladder, "dense_budget_bytes", lambda: 0)
    kernel = sketchot.make_kernel(X, Y, 1.0, rng=0)
    assert kernel.info.backend == "nystrom" and "sampled kernel error" in kernel.info.reason
    assert kernel_error(kernel, rng=1) <= 1e-3 * 10  # another sample, same order
    with pytest.raises(TypeError, match="chooses its own parameters"):
        sketchot.make_kernel(X, Y, 1.0, "auto", n_landmarks=5)


@pytest.mark.parametrize(
    "backend", [name for name in available_backends() if get_backend(name).rank_parameter]
)
def test_rank_auto_for_every_low_rank_backend(clouds, backend):
    X, Y = clouds
    kernel = sketchot.make_kernel(X, Y, 2.0, backend, rank="auto", accuracy=0.05, rng=0)
    assert kernel.info.reason.startswith(f"rank {kernel.info.rank}")
    # an independent sample says the same as the reason, within a factor 10 of sampling noise
    error = kernel_auto_error(kernel)
    if "<= 0.05" in kernel.info.reason:
        assert error <= 0.5
    else:
        assert "would not pay" in kernel.info.reason and error > 0.005
    if backend == "nystrom":  # a smooth kernel at reg 2: Nystrom meets the target
        assert "<= 0.05" in kernel.info.reason


def kernel_auto_error(kernel) -> float:
    return kernel_error(kernel, rng=123)


def test_auto_rejects_backend_parameters(clouds):
    X, Y = clouds
    with pytest.raises(TypeError, match="backend='auto' chooses its own parameters"):
        sketchot.sinkhorn(None, None, X, Y, 1.0, n_landmarks=5)


def test_a_low_rank_attempt_with_a_non_positive_denominator_is_dropped_at_once():
    """Colours of the third pair (n = 5100 per side, above the direct exact size) at a tenth
    of their mean squared distance: Nystrom at rank 64 passes the sampled kernel check but a
    denominator goes non-positive in its solve (measured); the ladder drops it without
    repairs and goes on to rank 128, which meets the target."""
    rng = np.random.default_rng(0)
    X = sample_pixels(load_image("images/pair3_source.png"), 5100, rng=rng).colors
    Y = sample_pixels(load_image("images/pair3_target.png"), 5100, rng=rng).colors
    spread = (X**2).sum(1).mean() + (Y**2).sum(1).mean() - 2 * X.mean(0) @ Y.mean(0)
    res = sketchot.sinkhorn(None, None, X, Y, reg=0.1 * spread, rng=0)
    notes = [a.note for a in res.attempts]
    assert "a denominator went non-positive" in notes
    assert res.accuracy_met and res.attempts[-1].accepted
    # the accepted attempt ran without repairs (its policy was 'raise'); the options are the
    # caller's
    assert res.safeguard == {"policy": "raise", "rows_repaired": 0, "cols_repaired": 0,
                             "clipped": 0, "faults": 0}  # fmt: skip
    assert res.options["safeguard"] == "exact"


def test_the_block_local_kernel_is_its_own_record_and_the_polyts_variant_an_alias(clouds):
    X, Y = clouds
    record = get_backend("polyts_local")
    assert record.kind == "local" and auto_rule("polyts_local").max_dimension == 4
    assert {"tau", "rtol", "max_features"} <= set(record.defaults)
    kernel = sketchot.make_kernel(X, Y, 0.05, "polyts_local", tau=2.0, rtol=1e-6, rng=0)
    assert kernel.info.backend == "polyts_local"
    assert kernel.info.params["tau"] == 2.0 and kernel.info.params["rtol"] == 1e-6
    # the alias is the record at its defaults: entries sized from the accuracy
    alias = sketchot.make_kernel(X, Y, 0.05, "polyts", variant="local", rng=0)
    assert alias.info.backend == "polyts_local"
    assert alias.info.params["rtol"] == rtol_for(sketchot.SolverOptions().accuracy)
    alias = sketchot.make_kernel(X, Y, 0.05, "polyts", variant="local", accuracy=1e-6, rng=0)
    assert alias.info.params["rtol"] == pytest.approx(rtol_for(1e-6))


def test_auto_tries_what_the_records_declare(clouds, monkeypatch):
    """A registered low-rank backend whose policy rule orders it before Nystrom is kept (at
    equal sampled error the earlier rule wins); without a rule, ``auto`` never tries it: the
    strategy reads the policy table, not names."""
    from sketchot.kernels.registry import build_backend

    X, Y = clouds

    def landmark_rows(geometry, *, rng=None, dtype=np.float64, n_rows=10):
        kernel = build_backend(geometry, "nystrom", rng=rng, dtype=dtype, n_landmarks=n_rows)
        kernel.info.backend = "landmark_rows"
        return kernel

    monkeypatch.setattr(ladder, "dense_budget_bytes", lambda: 0)  # as if n x m were huge
    for order, expected in ((-1, "landmark_rows"), (None, "nystrom")):
        sketchot.register_backend("landmark_rows", landmark_rows, rank_parameter="n_rows")
        if order is not None:
            register_auto("landmark_rows", order=order)
        try:
            kernel = sketchot.make_kernel(X, Y, 1.0, rng=0)
            res = sketchot.sinkhorn(None, None, X, Y, reg=1.0, rng=0)
        finally:
            unregister_auto("landmark_rows")
            sketchot.unregister_backend("landmark_rows")
        assert kernel.info.backend == expected and res.backend == expected
        assert res.attempts[0].backend == expected and res.attempts[-1].accepted


def test_polyts_auto_escalates_to_the_block_local_record_within_its_dimension():
    """At reg = 0.01 on the unit cube no global sketch is accurate: in 3-D polyts' 'auto'
    takes polyts_local (d <= its record's max_dimension), in 6-D it keeps the global sketch
    and says that nothing met the target (the solver's check then reports the miss)."""
    rng = np.random.default_rng(0)
    X, Y = rng.random((300, 3)), rng.random((200, 3))
    kernel = sketchot.make_kernel(X, Y, 0.01, "polyts", rng=0)
    assert kernel.info.backend == "polyts_local" and "accepted" in kernel.info.reason
    X, Y = rng.random((300, 6)), rng.random((200, 6))
    kernel = sketchot.make_kernel(X, Y, 0.01, "polyts", rng=0)
    assert kernel.info.backend == "polyts" and "no candidate accepted" in kernel.info.reason


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_float32_rung_that_goes_non_positive_ends_its_climb(clouds, monkeypatch, dtype):
    """A low-rank rung whose sampled error is within reach but whose solve goes non-positive
    (a judge that always says so) ends the climb in float32 (its products' rounding, which a
    larger rank does not shrink) and not in float64 (a larger rank may fix an approximation);
    the ladder then goes on to the next kind of kernel either way."""
    X, Y = clouds
    as_if_large(monkeypatch)
    geometry = sketchot.gibbs.GibbsGeometry(X, Y, 1.0)

    def judge(kernel, kind, error):
        if kind == LOW_RANK_KIND:
            return Verdict(np.inf, False, "a denominator went non-positive")
        return Verdict(0.0, True, "accepted", kernel)

    choice = ladder.choose(geometry, judge, accuracy=1e-3, rng=0, dtype=dtype)
    low_rank = [a for a in choice.attempts if a.backend == "nystrom"]
    assert len(low_rank) == 1 if dtype == np.float32 else len(low_rank) > 1
    assert choice.kernel.info.backend != "nystrom"
