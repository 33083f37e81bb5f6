"""The job's processes as Ray actors: rollout workers and the Megatron actor.

Each host wraps a real component in its own process and caps that process's torch threads, so
that the job's processes share the cores instead of oversubscribing them (each torch process
would otherwise start one thread per core). Tensors cross processes as numpy arrays: Ray
stores them once and readers map them zero-copy (reference/feasibility.md §1.2).

- :class:`RolloutHost`: a :class:`~asyncrl.rollout.worker.RolloutWorker`. A *threaded* actor
  (``max_concurrency=2``): ``update_weights`` runs on a second thread while ``generate`` runs,
  which is how a weight update reaches a generating worker (partial rollout).
- :class:`ActorHost`: a :class:`~asyncrl.trainer.megatron.actor.MegatronActor` with its warm
  start, train step, weights and checkpoints.
"""

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.driver.warm import warm_start_lr

Weights = dict[str, np.ndarray]
Placement = Literal["local", "cluster"]  # where start_hosts puts the processes (see start_hosts)


def _limit_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (a reused Ray worker)
        pass


def _to_torch(weights: Mapping[str, np.ndarray]) -> dict[str, Any]:
    import torch

    with warnings.catch_warnings():
        # Arrays from the object store are read-only; the engine copies them into its parameters.
        warnings.simplefilter("ignore", UserWarning)
        return {k: torch.from_numpy(v) for k, v in weights.items()}


class RolloutHost:
    """One rollout worker process."""

    def __init__(self, spec_json: dict[str, Any], worker_index: int, threads: int) -> None:
        _limit_threads(threads)
        from asyncrl.rollout.worker import RolloutWorker

        spec = AsyncRLJobSpec.model_validate(spec_json)
        self.worker = RolloutWorker(spec.task, spec.model, spec.async_, worker_index=worker_index,
                                    seed=spec.train.seed, rollout=spec.rollout)

    def generate(self, n_groups: int) -> list[Any]:
        return self.worker.generate(n_groups)

    def update_weights(self, weights: Weights, version: int) -> float:
        """Load (first time, worker idle) or hand over (thread-safe) new weights; returns seconds."""
        t0 = time.perf_counter()
        state = _to_torch(weights)
        if self.worker.version < 0:
            self.worker.load_weights(state, version)
        else:
            self.worker.update_weights(state, version)
        return time.perf_counter() - t0

    def stats(self) -> dict[str, Any]:
        return vars(self.worker.stats()).copy()


class ActorHost:
    """The Megatron actor process."""

    def __init__(self, spec_json: dict[str, Any], threads: int) -> None:
        _limit_threads(threads)
        self.threads = threads
        from asyncrl.rollout.tokenizer import TOKENIZER
        from asyncrl.trainer.megatron.actor import MegatronActor

        self.spec = AsyncRLJobSpec.model_validate(spec_json)
        self.pad = TOKENIZER.pad_id
        self.actor = MegatronActor.from_spec(self.spec, TOKENIZER.vocab_size, num_threads=threads)

    def pad_id(self) -> int:
        return self.pad

    def load_warm_start(self, cache_dir: str) -> bool:
        """Load a cached warm start (True) or report there is none (False)."""
        cache = Path(cache_dir)
        if not (cache / "meta.json").exists():  # the actor writes checkpoints atomically
            return False
        self.actor.load_checkpoint(str(cache), old_logits=False)  # the provider starts from these weights
        self.actor.version = 0
        return True

    def warm_start(self, start: int, stop: int, total: int, threads: int, batch_size: int = 128) -> list[float]:
        """Supervised steps ``[start, stop)`` of ``total`` on generated demonstrations; their losses.

        Called in chunks so the driver can show progress. Runs with ``threads`` torch threads
        (nothing else computes meanwhile: rollout waits for the first weights), then returns to
        the actor's own budget and ``train.learningRate``.
        """
        import random

        import torch

        from asyncrl.rollout.envs.demos import demonstrations, pad_batch

        if start == 0:
            self._demo_rng = random.Random(self.spec.train.seed)
        losses = []
        torch.set_num_threads(threads)
        try:
            for step in range(start, stop):
                self.actor.set_learning_rate(warm_start_lr(step, total))
                demos = demonstrations(self.spec.task.name, batch_size, self._demo_rng,
                                       max_tool_calls=self.spec.task.max_tool_calls)
                b = pad_batch(demos)
                losses.append(self.actor.sft_step(b.tokens, b.loss_mask).loss)
        finally:
            torch.set_num_threads(self.threads)
            self.actor.set_learning_rate(self.spec.train.learning_rate)
        return losses

    def save_warm_start(self, cache_dir: str) -> None:
        """RL starts at version 0: warm-start steps are not policy versions."""
        self.actor.version = 0
        self.actor.save_checkpoint(cache_dir)

    def train_step(self, batch: dict[str, np.ndarray], version: int) -> tuple[dict[str, Any], Weights | None]:
        """One optimizer step on ``TrainBatch.to_numpy()``'s arrays; returns (flat stats, new weights or
        None when the step was skipped)."""
        from asyncrl.trainer.megatron.batch import TrainBatch

        if self.actor.version != version:
            raise RuntimeError(f"driver expected actor version {version}, actor is at {self.actor.version}")
        tb = TrainBatch.from_numpy(batch)
        out = self.actor.train_step(tb)
        stats: dict[str, Any] = {
            "applied": out.stepped, "loss": out.loss, "grad_norm": out.grad_norm, "reference": out.reference,
            "ewma_reset": int(out.ewma_reset), "ewma_reset_reason": out.ewma_reset_reason,
            "actor_forward_s": round(out.forward_seconds, 4),
            "actor_reference_s": round(out.reference_seconds, 4), "actor_backward_s": round(out.backward_seconds, 4),
            **out.correction,
        }
        if not out.stepped:
            stats["batch_summary"] = tb.summary()
        return stats, (self.weights() if out.stepped else None)

    def weights(self) -> Weights:
        return {k: v.numpy() for k, v in self.actor.hf_state_dict().items()}

    def save_checkpoint(self, path: str) -> None:
        self.actor.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.actor.load_checkpoint(path)
        return int(self.actor.version)


@dataclass
class HostHandles:
    """Ray handles of one job's processes."""

    actor: Any
    rollout: list[Any]
    pad_id: int

    def kill(self) -> None:
        import ray

        for h in [self.actor, *self.rollout]:
            ray.kill(h)


def start_hosts(spec: AsyncRLJobSpec, *, n_procs_cpus: float, actor_threads: int, rollout_threads: int,
                placement: Placement = "local") -> HostHandles:
    """Start the actor and ``spec.rollout.replicas`` rollout workers; wait until all are up.

    ``placement="local"``: every process asks for ``n_procs_cpus`` logical CPUs of the one local
    node. ``placement="cluster"``: the processes go where the operator's pods advertise their role
    (``ray start --resources``): each rollout worker takes one ``{"rollout": 1}`` and the actor one
    ``{"actor": 1}``, with no CPU request (the role resource alone places them, one per pod), and the
    GPUs of its pod (``gpusPerReplica``), so that Ray hands the process those devices.
    """
    import ray

    spec_json = spec.model_dump(mode="json", by_alias=True)
    actor_cls: Any = ray.remote(ActorHost)
    rollout_cls: Any = ray.remote(RolloutHost)
    if placement == "cluster":
        # The GPUs the pod holds (ray start --num-gpus): Ray then sets CUDA_VISIBLE_DEVICES for the process.
        actor_opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": spec.actor.gpus_per_replica,
                                      "resources": {C.RESOURCE_ACTOR: 1}}
        rollout_opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": spec.rollout.gpus_per_replica,
                                        "resources": {C.RESOURCE_ROLLOUT: 1}}
    else:
        actor_opts = rollout_opts = {"num_cpus": n_procs_cpus}
    actor = actor_cls.options(**actor_opts, max_concurrency=1).remote(spec_json, actor_threads)
    rollout = [
        rollout_cls.options(**rollout_opts, max_concurrency=2).remote(spec_json, i, rollout_threads)
        for i in range(spec.rollout.replicas)
    ]
    pad_id: int = ray.get(actor.pad_id.remote())
    ray.get([w.stats.remote() for w in rollout])  # surfaces construction errors here, not mid-loop
    return HostHandles(actor, rollout, pad_id)
