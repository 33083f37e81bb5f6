"""One rank of the actor as a Ray actor: :class:`ActorHost` wraps a
:class:`~asyncrl.trainer.actor.megatron_actor.MegatronActor` with its warm start, train step, weights and
checkpoints. Tensors cross processes as numpy arrays (Ray stores them once, readers map them zero-copy).
"""

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.driver.hosts.common import limit_threads, task_context
from asyncrl.trainer.driver.hosts.warm_start import warm_start_lr

if TYPE_CHECKING:
    from asyncrl.trainer.collective.endpoint import Endpoint
    from asyncrl.trainer.driver.run.step_report import ActorStep
    from asyncrl.trainer.weight_sync.broadcast import Backend
    from asyncrl.trainer.weight_sync.lora_base import BaseRefs
    from asyncrl.trainer.weight_sync.objectstore import BucketRefs
    from asyncrl.trainer.weight_sync.outcome import SendOutcome
    from asyncrl.trainer.weight_sync.transport import WeightHandle

log = logging.getLogger(__name__)

Weights = dict[str, np.ndarray]


class ActorHost:
    """The Megatron actor process."""

    def __init__(self, spec_json: dict[str, Any], threads: int, work_dir: str | None = None, *,
                 rank: int = 0, init_method: "Endpoint | None" = None, collective_host: str | None = None) -> None:
        limit_threads(threads)
        self.threads = threads
        from dataclasses import replace

        from asyncrl.rollout.envs.binding import task_tokenizer
        from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
        from asyncrl.trainer.megatron.parallel import Layout

        self.spec = AsyncRLJobSpec.model_validate(spec_json)
        self.tokenizer = task_tokenizer(self.spec.model, self.spec.task)  # the rollout workers resolve the same one
        self.pad = self.tokenizer.pad_id
        a = self.spec.actor
        self.rank, self.world = rank, a.world_size
        # Every rank gets the run's one snapshot folder: ranks on one node share a version's files
        # (trainer/oldlogits/node_share.py names them by shard and node, so none collide).
        self.context = task_context(self.spec, self.tokenizer)  # the longest trajectory the model is built for
        settings = ActorSettings.from_spec(self.spec, self.tokenizer.vocab_size, num_threads=threads,
                                           max_sequence_length=self.context, work_dir=work_dir)
        layout = Layout(tp=a.megatron.tensor_parallel, pp=a.megatron.pipeline_parallel, ep=a.megatron.expert_parallel,
                        rank=rank, world=self.world, init_method=init_method)
        self.actor = MegatronActor(replace(settings, layout=layout))
        from asyncrl.trainer.weight_sync.actor_side import ActorSync

        self._sync = ActorSync(self.spec, rank, layout.tp, self.spec.actor.weight_sync.transport)
        self._collective_host = collective_host  # the broadcast store's address (endpoint.bind_host; None: Ray's)

    def pad_id(self) -> int:
        return self.pad

    def context_length(self) -> int:
        """The longest trajectory (tokens) the actor's model is built for: the driver refuses longer ones."""
        return self.context

    def model_load(self) -> dict[str, Any] | None:
        """How loading ``spec.model.weights`` went (seconds, peak RSS, ...); None for a random init."""
        report = self.actor.load_report
        return None if report is None else report.record()

    def load_warm_start(self, cache_dir: str) -> bool:
        """Load a cached warm start (True) or report there is none (False)."""
        from asyncrl.trainer.actor.checkpoint_io import load_rank
        from asyncrl.trainer.checkpoint.folder import CheckpointError
        from asyncrl.trainer.checkpoint.sharded import verified

        cache = Path(cache_dir)
        if not (cache / "meta.json").exists():  # the actor writes checkpoints atomically
            return False
        try:
            verified(cache)  # sizes and checksums, agreed by every rank: a damaged cache is redone, not loaded
        except CheckpointError as exc:
            logging.getLogger(__name__).warning("%s; running the warm start again", exc)
            return False
        load_rank(self.actor, str(cache), rank=self.rank, old_logits=False)  # the provider starts from these weights
        self.actor.version = 0
        return True

    def warm_start(self, start: int, stop: int, total: int, threads: int, batch_size: int = 128) -> list[float]:
        """Supervised steps ``[start, stop)`` of ``total`` on generated demonstrations; their losses.

        Called in chunks so the driver can show progress. Runs with ``threads`` torch threads (nothing
        else computes meanwhile: rollout waits for the first weights; the driver splits a machine's cores
        between the ranks on it, :func:`~asyncrl.trainer.driver.hosts.warm_start.warm_start_threads`), then returns to
        the actor's own budget and ``train.learningRate``. Each DP rank trains its token-balanced share of
        the ``batch_size`` demonstrations (:meth:`MegatronActor.sft_step`; every rank draws them all from the
        same seeded generator), one gradient all-reduce per step.
        """
        import random

        import torch

        from asyncrl.rollout.envs.demos import demonstrations, loss_weights, pad_batch

        if start == 0:
            self._demo_rng = random.Random(self.spec.train.seed)
        losses = []
        torch.set_num_threads(threads)
        try:
            for step in range(start, stop):
                self.actor.set_learning_rate(warm_start_lr(step, total))
                demos = demonstrations(self.spec.task.name, batch_size, self._demo_rng,
                                       max_tool_calls=self.spec.task.max_tool_calls, tokenizer=self.tokenizer)
                b = pad_batch(demos, pad_id=self.pad)
                weights = loss_weights(self.spec.task.name, b, self.tokenizer)  # customer-service: the copied ids
                losses.append(self.actor.sft_step(b.tokens, b.loss_mask, weights).loss)
        finally:
            torch.set_num_threads(self.threads)
            self.actor.set_learning_rate(self.spec.train.learning_rate)
        return losses

    def supervised(self, demos: list[tuple[list[int], list[bool]]], learning_rate: float, threads: int) -> float:
        """One supervised step on the given ``(tokens, loss_mask)`` sequences at ``learning_rate``; its loss (the
        supervised controls of ``bench/customer_service.py``: successful demonstrations, or the policy's own
        successes). The actor's own budget and ``train.learningRate`` are restored after it."""
        import torch

        from asyncrl.rollout.envs.demos import pad_batch

        torch.set_num_threads(threads)
        try:
            self.actor.set_learning_rate(learning_rate)
            b = pad_batch(demos, pad_id=self.pad)
            return float(self.actor.sft_step(b.tokens, b.loss_mask).loss)
        finally:
            torch.set_num_threads(self.threads)
            self.actor.set_learning_rate(self.spec.train.learning_rate)

    def save_warm_start(self, cache_dir: str) -> None:
        """RL starts at version 0: warm-start steps are not policy versions."""
        self.actor.version = 0
        self.save_checkpoint(cache_dir)

    def train_step(self, batch: dict[str, np.ndarray], version: int,
                   live_versions: list[int] | None = None) -> tuple["ActorStep", "WeightHandle | None"]:
        """One optimizer step on ``TrainBatch.to_numpy()``'s arrays; returns (the step's typed report, the new
        weights' sync handle or None when no update applied). ``live_versions``: the versions untrained tokens
        may still carry after this step (weight snapshots of every other version are released)."""
        from asyncrl.trainer.actor.batch import TrainBatch
        from asyncrl.trainer.driver.run.step_report import ActorStep

        if self.actor.version != version:
            raise RuntimeError(f"driver expected actor version {version}, actor is at {self.actor.version}")
        tb = TrainBatch.from_numpy(batch)
        kwargs = {} if live_versions is None else {"live_versions": live_versions}
        out = self.actor.train_step(tb, **kwargs)
        if not out.applied:
            return ActorStep(out, batch_summary=tb.summary()), None
        t0 = time.perf_counter()
        handle = self.weight_handle()
        return ActorStep(out, publish_seconds=time.perf_counter() - t0), handle  # gather, convert, cast, pack, put

    def weights(self) -> Weights | None:
        """HF-named weights (rank 0; the other ranks take part in the TP gather and return None)."""
        if self.rank != 0 and self.actor.settings.layout.tp == 1:
            return None  # no collective to join
        full = self.actor.hf_state_dict()
        return {k: v.numpy() for k, v in full.items()} if self.rank == 0 else None

    # ------------------------------------------------------------------ weight sync (actor.weightSync)
    def configure_sync(self, disk_root: str | None, disk_keep: int) -> None:
        """Every rank, once, from the driver: where the disk transport writes and how many versions stay."""
        self._sync.disk_root, self._sync.disk_keep = disk_root, disk_keep

    def weight_handle(self) -> "WeightHandle | None":
        """This version's weights for rollout through ``actor.weightSync``: bucket refs in the object store, a
        version folder on disk, or a broadcast handle whose bytes :meth:`send_weights` sends (rank 0; the other
        ranks join the TP gathers and return None)."""
        return self._sync.publish(self.actor)

    def sync_endpoint(self) -> "Endpoint":
        """A new endpoint for the broadcast group's store (rank 0 serves it): a free port on this node's
        loopback (a local run) or pod IP, and a fresh token the driver hands to the members through Ray."""
        from asyncrl.trainer.collective.endpoint import new_endpoint

        return new_endpoint(self._collective_host)

    def open_sync_group(self, endpoint: "Endpoint", world: int, backend: "Backend", timeout_s: float) -> None:
        """Join the broadcast group as its source (rank 0 of the group; actor ranks > 0 are not members)."""
        from asyncrl.trainer.weight_sync.broadcast import open_group

        if self.rank == 0:
            self._sync.group = None  # the previous group (if any) is dropped first
            self._sync.group = open_group(endpoint, 0, world, backend=backend, timeout_s=timeout_s)

    def send_weights(self, version: int) -> "SendOutcome | None":
        """Broadcast ``version`` to the group (every rank: the TP gathers); rank 0's ``Sent``, or ``SyncFailed``
        when a member was gone."""
        return self._sync.send(self.actor, version)

    def weights_for_joiner(self, version: int) -> "BucketRefs | None":
        """``version`` as object-store bucket refs for a receiver outside the broadcast group (rank 0)."""
        return self._sync.for_joiner(self.actor, version)

    def base_for_joiner(self) -> "BaseRefs | None":
        """Under ``spec.model.lora``, the frozen base as object-store buckets for one rollout worker that holds
        none (a replacement; every rank: the TP gathers), fingerprinted (``weight_sync/lora_base.py``)."""
        return self._sync.base_for_joiner(self.actor)

    def score(self, tokens: np.ndarray, temperature: float) -> np.ndarray:
        """No-grad ``logp_theta`` ``[B, T]`` of right-padded ``tokens`` ``[B, T]`` under the current weights at
        ``temperature`` (the start-up discrepancy probe)."""
        import torch

        return self.actor.logprobs(torch.from_numpy(np.ascontiguousarray(tokens)), temperature=temperature).cpu().numpy()

    def save_checkpoint(self, path: str) -> None:
        """Every rank calls this (SPMD): :func:`asyncrl.trainer.actor.checkpoint_io.save_rank` decides what
        each rank writes."""
        from asyncrl.trainer.actor.checkpoint_io import save_rank

        save_rank(self.actor, path, rank=self.rank)

    def load_checkpoint(self, path: str) -> int:
        """Every rank calls this (SPMD); returns the checkpoint's version."""
        from asyncrl.trainer.actor.checkpoint_io import load_rank

        return load_rank(self.actor, path, rank=self.rank)

    def close(self) -> None:
        """Release what outlives the process otherwise (snapshot files of a private folder)."""
        self.actor.close()
