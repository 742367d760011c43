"""Fixtures of the Dask tests: a real ``distributed.LocalCluster`` (no mocks)."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client():
    """Two single-threaded worker processes; they import sketchot from this checkout.

    One cluster per test module (they start in a few seconds); skipped without Dask.
    """
    distributed = pytest.importorskip("dask.distributed")
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), path) if p)
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        memory_limit="1GiB",
    )
    with distributed.Client(cluster) as the_client:
        yield the_client
    cluster.close()
    if path:
        os.environ["PYTHONPATH"] = path
    else:
        os.environ.pop("PYTHONPATH")
