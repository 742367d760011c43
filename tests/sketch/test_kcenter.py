import numpy as np
import pytest

from sketchot.sketch import greedy_k_center


def test_farthest_point_sequence_and_assignment():
    rng = np.random.default_rng(0)
    points = rng.standard_normal((300, 4))
    result = greedy_k_center(points, 9, rng=1)
    dist = np.linalg.norm(points[:, None, :] - points[None, result.centers, :], axis=2)
    # every next centre is a farthest point from the centres chosen before it
    for position in range(1, 9):
        to_previous = dist[:, :position].min(axis=1)
        assert to_previous[result.centers[position]] == pytest.approx(to_previous.max(), rel=1e-12)
    # assignment to the nearest centre, distances and sizes consistent
    np.testing.assert_array_equal(result.assignment, dist.argmin(axis=1))
    np.testing.assert_allclose(result.distances, dist.min(axis=1), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(result.cluster_sizes, np.bincount(result.assignment, minlength=9))
    assert result.cluster_sizes.sum() == 300
    assert result.cost == pytest.approx(dist.min(axis=1).sum(), rel=1e-9)


def test_first_centre_comes_from_rng():
    points = np.random.default_rng(2).random((50, 2))
    assert (
        greedy_k_center(points, 3, rng=5).centers.tolist()
        == greedy_k_center(points, 3, rng=5).centers.tolist()
    )
    firsts = {int(greedy_k_center(points, 1, rng=seed).centers[0]) for seed in range(20)}
    assert len(firsts) > 1


def test_k_equal_n_has_zero_cost():
    points = np.random.default_rng(3).random((12, 3))
    result = greedy_k_center(points, 12, rng=0)
    assert sorted(result.centers.tolist()) == list(range(12))
    assert result.cost == 0.0


@pytest.mark.parametrize("k", [0, 11])
def test_bad_k(k):
    with pytest.raises(ValueError, match="n_centers"):
        greedy_k_center(np.ones((10, 2)), k)
