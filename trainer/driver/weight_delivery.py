"""How a new version's weights reach the rollout workers (``actor.weightSync``), in one place.

The driver calls these four and nothing else on the weight path: at start (:func:`initial`), after
every applied step (:func:`to_every_worker`), inside an interrupt-sync window (:func:`to_workers`) and
for a replaced worker (:func:`to_replacement`). ``hosts.weights`` is the sync handle rollout holds now
(today the object-store bucket refs the actor's ``weight_handle`` returns).
"""

from collections.abc import Callable
from typing import Any

from asyncrl.trainer.driver.hosts import HostHandles

OnEveryWorker = Callable[[Callable[[Any], Any]], list[Any]]  # _Loop.on_every_worker: replaces dead workers


def initial(hosts: HostHandles, version: int) -> None:
    """Publish the actor's current weights and install them on every rollout worker (blocking)."""
    import ray

    hosts.weights = hosts.actor.weight_handle.remote()
    ray.get([w.update_weights.remote(hosts.weights, version) for w in hosts.rollout])


def to_every_worker(hosts: HostHandles, on_every_worker: OnEveryWorker, weights: Any, version: int) -> list[Any]:
    """``version``'s ``weights`` (a step's sync handle) to every worker; each worker's
    ``RolloutHost.update_weights`` parts, None for a worker found dead and replaced."""
    return on_every_worker(lambda w: w.update_weights.remote(weights, version))


def to_workers(hosts: HostHandles, workers: list[Any], weights: Any, version: int) -> list[Any]:
    """``weights`` to exactly ``workers`` (an interrupt-sync window: generation is stopped on all of them)."""
    import ray

    return ray.get([w.update_weights.remote(weights, version) for w in workers])


def to_replacement(hosts: HostHandles, worker: Any, version: int) -> Any:
    """The weights rollout holds now (``hosts.weights``) to a worker that joined late (a replacement)."""
    import ray

    return ray.get(worker.update_weights.remote(hosts.weights, version))
