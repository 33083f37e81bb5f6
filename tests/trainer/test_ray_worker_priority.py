"""A local run's Ray workers do the job's work at the priority the run was started with (Ray's default starts
them 15 nice levels below it, where any ordinary process on the machine takes nearly all of the CPU from them)."""

import os

import pytest

pytestmark = pytest.mark.usefixtures("ray_session")  # tests/conftest.py: the session's local_ray


def test_the_workers_run_at_the_drivers_niceness() -> None:
    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get([niceness.remote() for _ in range(2)]) == [os.nice(0)] * 2
