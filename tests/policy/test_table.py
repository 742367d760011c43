"""The policy table: the records hold their kernels' facts only, the rules what ``'auto'``
tries."""

from __future__ import annotations

import dataclasses

import pytest

import sketchot
from sketchot.kernels import Backend
from sketchot.kernels.local import MAX_DIMENSION, local_iteration_cost
from sketchot.policy import auto_backends, auto_rule, auto_rules, register_auto, unregister_auto


def test_the_record_holds_kernel_facts_only():
    fields = {field.name for field in dataclasses.fields(Backend)}
    policy = {"auto_order", "auto_params", "streamed_params", "min_dimension", "max_dimension",
              "iteration_cost", "test_params"}  # fmt: skip
    assert not fields & policy
    with pytest.raises(TypeError, match="auto_order"):
        sketchot.register_backend("never", lambda g, *, rng=None, dtype=None: None, auto_order=0)
    assert "never" not in sketchot.available_backends()


def test_the_built_in_rules():
    """What the records declared before the table (one fact, now in one place)."""
    assert set(auto_rules()) == {"exact", "nystrom", "polyts", "polyts_local", "cur", "grid"}
    # grids only (the record's support), points only, after the exact kernel in its kind
    assert (auto_rule("grid").order, auto_rule("grid").min_dimension) == (1, 1)
    assert auto_rule("cur").max_dimension == 0  # cost matrices only (no points: d = 0)
    assert dict(auto_rule("exact").streamed_params) == {"max_dense_bytes": 0}
    polyts = auto_rule("polyts")
    assert (polyts.order, dict(polyts.params), polyts.min_dimension) == (
        1,
        {"variant": "improved"},
        20,
    )
    local = auto_rule("polyts_local")
    assert local.max_dimension == MAX_DIMENSION and local.iteration_cost is local_iteration_cost
    assert auto_rule("rff") is None  # only used when named
    assert [r.name for r, _ in auto_backends("low_rank", 3)] == ["nystrom"]
    assert [r.name for r, _ in auto_backends("low_rank", 20)] == ["nystrom", "polyts"]
    assert [r.name for r, _ in auto_backends("local", 4)] == ["polyts_local"]
    assert auto_backends("local", 5) == ()


def test_register_auto_checks_its_arguments():
    with pytest.raises(ValueError, match="backend must be 'auto' or one of"):
        register_auto("no_such_backend")
    with pytest.raises(ValueError, match="order must be a number; got"):
        register_auto("rff", order="first")
    with pytest.raises(ValueError, match="kind must be one of"):
        auto_backends("global", 3)
    assert auto_rule("rff") is None


def test_a_rule_of_an_unregistered_backend_is_skipped():
    record = sketchot.get_backend("nystrom")
    sketchot.register_backend("gone", record.builder, rank_parameter="n_landmarks")
    register_auto("gone", order=-1)
    try:
        assert [r.name for r, _ in auto_backends("low_rank", 3)] == ["gone", "nystrom"]
        sketchot.unregister_backend("gone")
        assert [r.name for r, _ in auto_backends("low_rank", 3)] == ["nystrom"]
    finally:
        unregister_auto("gone")
    assert "gone" not in auto_rules()


def test_the_paper_costs_are_the_papers_not_the_records():
    """The comparable-cost settings live with the paper's setting
    (:mod:`sketchot.kernels.paper`), not in the records (values as before the move)."""
    from sketchot.kernels import paper

    assert "paper_cost" not in {field.name for field in dataclasses.fields(Backend)}
    assert set(sketchot.comparable_parameters()) == set(paper.PAPER_COSTS)
    assert sketchot.comparable_parameters(10, 2) == {
        "nystrom": {"n_landmarks": 5},  # ceil(max(sqrt(2 x 10), 2))
        "polyts": {"sketch_dim": 10, "degree": 2, "variant": "paper"},
        "rff": {"n_features": 20},  # m r
    }
