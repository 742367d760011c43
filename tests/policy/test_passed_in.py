"""The policy is passed in, never installed: the kernels' and the solver's ``'auto'`` entries
take it as ``policy=`` from the layers above (:mod:`sketchot.api`, the jobs) and refuse, naming
it, when it is missing."""

from __future__ import annotations

import numpy as np
import pytest

import sketchot
from sketchot import kernels, policy, solver


@pytest.fixture
def clouds():
    rng = np.random.default_rng(0)
    return rng.random((60, 2)), rng.random((50, 2))


def test_make_kernel_auto_without_a_policy_names_it(clouds):
    X, Y = clouds
    with pytest.raises(
        TypeError, match=r"backend='auto' needs the policy.*policy=sketchot\.policy"
    ):
        kernels.make_kernel(X, Y, 0.5, "auto")
    geometry = solver.check_problem(X, Y, 1.0)
    with pytest.raises(TypeError, match=r"rank='auto' needs the policy"):
        kernels.build_kernel(geometry, "nystrom", rank="auto", rng=0)


def test_sinkhorn_auto_without_a_policy_names_it(clouds):
    X, Y = clouds
    with pytest.raises(TypeError, match=r"backend='auto' needs the policy"):
        solver.sinkhorn(None, None, X, Y, 0.5, "auto", options=sketchot.SolverOptions())


def test_the_public_entries_pass_the_policy_package(clouds):
    """The same choice and the same bits through the public entry and the layer below given
    :mod:`sketchot.policy` (any object with its functions would do)."""
    X, Y = clouds
    public = sketchot.make_kernel(X, Y, 0.5, rng=1)
    below = kernels.make_kernel(X, Y, 0.5, "auto", rng=1, policy=policy)
    assert below.info.backend == public.info.backend
    np.testing.assert_array_equal(below.matvec(np.ones(50)), public.matvec(np.ones(50)))
    options = sketchot.SolverOptions()
    mine = solver.sinkhorn(None, None, X, Y, 0.5, "auto", options=options, rng=2, policy=policy)
    theirs = sketchot.sinkhorn(None, None, X, Y, reg=0.5, rng=2)
    assert mine.backend == theirs.backend
    np.testing.assert_array_equal(mine.potentials[0], theirs.potentials[0])


def test_a_named_backend_needs_no_policy(clouds):
    X, Y = clouds
    kernel = kernels.make_kernel(X, Y, 0.5, "nystrom", rng=0, rank=20)
    assert kernel.info.backend == "nystrom"
