"""A private, quiet local Ray for one job (reference/feasibility.md §1.2).

- ``address="local"`` and a private ``_temp_dir``: never join another cluster on the machine.
- ``RAY_USAGE_STATS_ENABLED=0`` and ``include_dashboard=False``: no phone-home, ~1 GiB less RAM.
- Logical ``num_cpus``: the job's processes ask for fractional CPUs, so the budget is a count of
  processes Ray may place, while each process caps its own torch threads (see ``hosts.py``).
"""

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator


def _configure_env() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Token auth writes a key into the user's home on first init; a local job does not need it.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@contextlib.contextmanager
def local_ray(num_cpus: int, *, quiet: bool = True) -> Iterator[bool]:
    """Start a private local Ray (or reuse one already started in this process, e.g. by a test).

    Yields True when this call started Ray (and will shut it down), False when it reused one.
    """
    import ray

    if ray.is_initialized():
        yield False
        return
    _configure_env()
    temp_dir = tempfile.mkdtemp(prefix="asyncrl-ray-")
    ray.init(
        address="local",
        _temp_dir=temp_dir,
        include_dashboard=False,
        num_cpus=num_cpus,
        logging_level=logging.ERROR if quiet else logging.INFO,
        log_to_driver=not quiet,
        configure_logging=True,
    )
    try:
        yield True
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
