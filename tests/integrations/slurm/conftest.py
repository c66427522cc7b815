"""A real Slurm cluster for the bridge's end-to-end tests: slurmctld and 4 slurmd (2 nodes with
8 A100 80GB, 2 with 8 RTX 4090 24GB, fake GPU devices), started once per session under `setsid`
and stopped by the pids recorded at start.

Where Slurm is not installed (or not run as root, which `mknod` and slurmd need) the tests skip
with a one-line reason; with GPUFAIR_REQUIRE_SLURM=1 (as CI sets) that is a failure instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_support import LocalSlurm, own_cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with own_cluster(Path(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_cluster: LocalSlurm) -> Iterator[LocalSlurm]:
    """The session's cluster; every job is cancelled after the test."""
    yield slurm_cluster
    slurm_cluster.cancel_all()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One Slurm cluster per run: under `pytest -n` (with `--dist loadgroup`, as `make test`
    runs) the end-to-end tests all go to one worker instead of each worker starting a cluster."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("slurm"))
