"""A rollout worker as a Ray actor: :class:`RolloutHost` wraps a :class:`~asyncrl.rollout.worker.RolloutWorker`.

A *threaded* actor (``max_concurrency=2``): ``update_weights`` runs on a second thread while ``generate``
runs, which is how a weight update reaches a generating worker (partial rollout).
"""

import logging
import time
from typing import TYPE_CHECKING, Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits_route import OldLogitsRoute
from asyncrl.trainer.driver.hosts.common import limit_threads

if TYPE_CHECKING:
    import torch

    from asyncrl.rollout.adapter_merge import AdapterMerge
    from asyncrl.rollout.envs.interface import Sample
    from asyncrl.rollout.trajectory import Trajectory
    from asyncrl.trainer.collective.endpoint import Endpoint
    from asyncrl.trainer.oldlogits.score_result import ScoreResult
    from asyncrl.trainer.oldlogits.segment_scorer import SegmentScorer
    from asyncrl.trainer.weight_sync.broadcast import Backend, BroadcastVersion, SyncGroup
    from asyncrl.trainer.weight_sync.lora_base import BaseRefs
    from asyncrl.trainer.weight_sync.outcome import Received, SyncFailed, SyncOutcome
    from asyncrl.trainer.weight_sync.transport import HfArrays, WeightHandle

log = logging.getLogger(__name__)


class RolloutHost:
    """One rollout worker process."""

    def __init__(self, spec_json: dict[str, Any], worker_index: int, threads: int) -> None:
        limit_threads(threads)
        from asyncrl.rollout.worker import RolloutWorker

        self.spec = AsyncRLJobSpec.model_validate(spec_json)
        self.threads = threads
        self.worker = RolloutWorker(self.spec.task, self.spec.model, self.spec.async_, worker_index=worker_index,
                                    seed=self.spec.train.seed, rollout=self.spec.rollout,
                                    workers=self.spec.rollout.replicas,
                                    capture_routes=self.spec.correction.routing_replay == "rollout")
        # the last version's HF tensors received (interrupt-sync scores under them)
        self._weights: dict[str, torch.Tensor] | None = None
        self._paused_reported = 0.0  # the engine's apply_seconds already reported by update_weights
        self._scorer: SegmentScorer | None = None  # the training-side scorer, built on the first interrupt-sync window
        self._group: SyncGroup | None = None  # once the driver formed one (transport broadcast)
        self._base_fingerprint: str | None = None  # spec.model.lora: the base the engine holds (lora_base.py)
        # spec.model.lora + interrupt-sync: the wire's base (kept once) onto which the scorer's weights of each
        # version are merged in fp32 (rollout/adapter_merge.py); ``_weights`` then holds that version's adapters
        self._score_merge: AdapterMerge | None = None

    def generate(self, n_groups: int) -> "list[Trajectory]":
        return self.worker.generate(n_groups)

    def update_weights(self, weights: "WeightHandle | HfArrays", version: int,
                       base: "BaseRefs | None" = None) -> "SyncOutcome":
        """Load (first time, worker idle) or hand over (thread-safe) new weights: a weight-sync handle
        (``objectstore.BucketRefs``: the buckets are pulled here; ``disk.DiskVersion``: the version's file
        is read; ``broadcast.BroadcastVersion``: the buckets arrive in this worker's broadcast group) or an
        HF dict of arrays, each taken through its transport (``weight_sync.transport.receive``).

        Returns :class:`~asyncrl.trainer.weight_sync.outcome.Delivered`: ``transfer_seconds`` (buckets taken off
        the transport and reassembled, generation running meanwhile), ``handover_seconds`` (the engine's private
        copy), ``pause_seconds`` (generation stopped installing weights since the last call: this version when
        applied at once, else the boundary swaps of earlier versions) and ``nbytes``; ``SyncFailed`` when the
        broadcast group broke (a member died: the driver sends this version through the object store and forms
        the group again).

        Under ``spec.model.lora``, ``base`` is the actor's frozen base for a worker that holds none (a replacement):
        fetched only when this worker needs it (``weight_sync/lora_base.complete``), and a base whose fingerprint
        differs from the one its engine holds is refused, naming both."""
        from asyncrl.trainer.weight_sync.broadcast import BroadcastVersion
        from asyncrl.trainer.weight_sync.lora_base import complete
        from asyncrl.trainer.weight_sync.outcome import Delivered, SyncFailed
        from asyncrl.trainer.weight_sync.transport import receive

        engine = self.worker.engine
        if isinstance(weights, BroadcastVersion):
            taken = self._receive_broadcast(weights)
            if isinstance(taken, SyncFailed):
                return taken
            got = taken
        else:
            got = receive(weights)
        if got.version is not None and got.version != version:
            raise RuntimeError(f"weight sync: worker {self.worker.worker_index} was handed version {got.version} "
                               f"as version {version}")
        state, nbytes, base_fp = got.state, got.nbytes, self._base_fingerprint
        if self.spec.model.lora is not None:  # a worker without the base takes it with this version
            done = complete(state, base, base_fp, worker=f"rollout worker {self.worker.worker_index}",
                            tied=self.worker.arch.tie_embeddings)
            state, nbytes, base_fp = done.state, nbytes + done.base_nbytes, done.fingerprint
        t0 = time.perf_counter()
        if self.worker.version < 0:
            self.worker.load_weights(state, version)
        else:
            self.worker.update_weights(state, version)
        self._base_fingerprint = base_fp
        handover = time.perf_counter() - t0
        # Interrupt-sync scores the outgoing version with the training-side model from host memory: views of
        # the object store's buckets, of the file read, or of the broadcast buckets (copied off the GPU under
        # NCCL, so the engine's device memory can be released while the scorer runs). Nobody else reads them:
        # not kept (under NCCL they would hold a second copy of the model in device memory).
        self._weights = self._keep_for_scoring(got.state, state) if self._scores_old_versions else None
        pause = float(getattr(engine, "apply_seconds", 0.0)) - self._paused_reported
        self._paused_reported += pause
        return Delivered(transfer_seconds=got.transfer_seconds, nbytes=nbytes, handover_seconds=handover,
                         pause_seconds=pause)

    def _keep_for_scoring(self, got: "dict[str, torch.Tensor]",
                          state: "dict[str, torch.Tensor]") -> "dict[str, torch.Tensor]":
        """What interrupt-sync's scorer will load as this version. Full fine-tuning: the tensors received.
        ``spec.model.lora``: the version's adapters alone, and the base when ``state`` carries one (the first
        delivery, or a joiner's fetched base) copied off the transport's buffers and kept for every later version
        (:meth:`_scorer_weights` merges them). No full-weight copy comes over the wire for the scorer."""
        if self.spec.model.lora is None:
            return _on_host(got)
        from asyncrl.rollout.adapter_merge import AdapterMerge, is_hf_adapter_name

        base = {k: v for k, v in state.items() if not is_hf_adapter_name(k)}
        if base:
            self._score_merge = AdapterMerge()
            self._score_merge.base = {k: v.detach().to("cpu", copy=True) for k, v in base.items()}
        return _on_host({k: v for k, v in state.items() if is_hf_adapter_name(k)})

    def _scorer_weights(self) -> "dict[str, torch.Tensor]":
        """The full weights of the version held, for the scorer: under ``spec.model.lora`` the kept base with this
        version's adapters merged in fp32 (``AdapterMerge.resolve``, as the engine and the dedicated scorers do)."""
        assert self._weights is not None  # sync_score checked it
        if self.spec.model.lora is None:
            return self._weights
        if self._score_merge is None:
            raise RuntimeError(f"interrupt-sync (LoRA): worker {self.worker.worker_index} holds adapters of version "
                               f"{self.worker.version} but no base to merge them onto")
        return self._score_merge.resolve(self._weights)

    @property
    def _scores_old_versions(self) -> bool:
        """Interrupt-sync: this worker scores ``pi_old`` under the version it holds (``sync_score``)."""
        return self.spec.old_logits_route is OldLogitsRoute.INTERRUPT_SYNC

    # ------------------------------------------------------------------ broadcast group (weightSync)
    def ping_sync(self) -> bool:
        """The driver checks every member answers before it forms the broadcast group."""
        return True

    def open_sync_group(self, endpoint: "Endpoint", rank: int, world: int, backend: "Backend",
                        timeout_s: float) -> None:
        """Join (again) the weight-sync broadcast group at ``endpoint`` (address and token) as ``rank`` of ``world``
        (the actor is rank 0)."""
        from asyncrl.trainer.weight_sync.broadcast import open_group

        self._group = None  # the previous group is dropped first
        self._group = open_group(endpoint, rank, world, backend=backend, timeout_s=timeout_s)

    def _receive_broadcast(self, handle: "BroadcastVersion") -> "Received | SyncFailed":
        from asyncrl.trainer.weight_sync.outcome import SyncFailed
        from asyncrl.trainer.weight_sync.transport import receive

        if self._group is None:
            return SyncFailed(f"worker {self.worker.worker_index} is in no broadcast group")
        try:
            return receive(handle, self._group)
        except Exception as exc:  # noqa: BLE001 -- the group broke (a member died): the driver recovers
            self._group = None
            return SyncFailed(f"{type(exc).__name__}: {exc}")

    def evaluate(self, problems: "list[Sample]", version: int, temperature: float, seed: int,
                 first: int) -> "list[Trajectory]":
        """One sample of each held-out problem under ``version`` (``RolloutWorker.evaluate``); the driver
        calls it only while no ``generate`` runs here."""
        return self.worker.evaluate(problems, version=version, temperature=temperature, seed=seed, first=first)

    # ------------------------------------------------------------------ interrupt-sync (paper §5.1)
    def sync_interrupt(self, timeout_s: float) -> int:
        """Phase *interrupt*: stop generation at a token boundary and hold it; in-flight episodes stay
        suspended here (a running ``generate`` returns its finished trajectories). Returns how many."""
        return len(self.worker.interrupt(timeout_s, hold=True))

    def sync_score(self, trajs: "list[Trajectory]", version: int, release: bool) -> "ScoreResult":
        """Phase *score*: with the engine's memory released (``release``), score every unscored sampled
        token of ``version`` -- of the suspended episodes here and of ``trajs`` (finished ones the driver
        holds) -- with the training-side model code under this worker's weights of ``version``.

        Returns a :class:`~asyncrl.trainer.oldlogits.score_result.ScoreResult` (the scores per trajs, the tokens
        scored, the phases' seconds); the suspended episodes keep their scores and carry them when they finish.
        """
        from asyncrl.trainer.oldlogits.precision import actor_bf16
        from asyncrl.trainer.oldlogits.score_result import ScoreResult
        from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings, SegmentScorer

        if self.worker.version != version or self._weights is None:
            raise RuntimeError(
                f"interrupt-sync: worker {self.worker.worker_index} holds version {self.worker.version}, "
                f"the driver scores version {version}"
            )
        t0 = time.perf_counter()
        if release:
            self.worker.release()
        t1 = time.perf_counter()
        if self._scorer is None:
            self._scorer = SegmentScorer(ScorerSettings(self.worker.arch, temperature=self.spec.task.temperature,
                                                        seed=self.spec.train.seed, bf16=actor_bf16(self.spec)))
        builds = self._scorer.builds
        try:
            self._scorer.load(self._scorer_weights(), version)
            episodes = self.worker.suspended_episodes()
            snaps = [e.to_trajectory() for e in episodes]
            results = self._scorer.score([*snaps, *trajs], version)
            for e, (pos, val) in zip(episodes, results[: len(snaps)], strict=True):
                if pos:
                    e.set_logp_old(pos, val)
            scores = results[len(snaps):]
        finally:
            if release:
                self._scorer.free()  # the engine gets the memory back
        t2 = time.perf_counter()
        if release:
            self.worker.acquire()
        t3 = time.perf_counter()
        built = self._scorer.builds > builds  # this window built the model (first, or after free())
        return ScoreResult(scores=scores, tokens=sum(len(p) for p, _ in results),
                           release_seconds=t1 - t0, score_seconds=t2 - t1, acquire_seconds=t3 - t2,
                           scorer_build_seconds=self._scorer.build_seconds if built else 0.0,
                           scorer_load_seconds=self._scorer.load_seconds)

    def set_prompt_cursor(self, n: int) -> None:
        """Continue the worker's prompt sequence at group ``n`` (resume, replacement)."""
        self.worker.set_prompt_cursor(n)

    def sync_resume(self) -> None:
        """Phase *resume*: end the hold (the new weights were handed over in phase *update*)."""
        self.worker.resume()

    def stats(self) -> dict[str, Any]:
        return vars(self.worker.stats()).copy()

    def endpoint_url(self) -> str | None:
        """The base URL of this worker's agent endpoint (None without ``spec.task.agent``)."""
        return self.worker.endpoint_url

    def agent_refusals(self) -> dict[str, int]:
        """This worker's endpoint refusals so far by reason (``asyncrl_agent_requests_refused_total``; {} without
        ``spec.task.agent``)."""
        return {} if self.worker.agent is None else self.worker.agent.endpoint.refusals.snapshot()


def _on_host(state: "dict[str, torch.Tensor]") -> "dict[str, torch.Tensor]":
    """``state``'s tensors in host memory (no copy for those already there)."""
    return {k: v.cpu() for k, v in state.items()}
