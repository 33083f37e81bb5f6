"""A rollout worker as a Ray actor: :class:`RolloutHost` wraps a :class:`~asyncrl.rollout.worker.RolloutWorker`.

A *threaded* actor (``max_concurrency=2``): ``update_weights`` runs on a second thread while ``generate``
runs, which is how a weight update reaches a generating worker (partial rollout).
"""

import logging
import time
from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.driver.host_common import limit_threads

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
                                    workers=self.spec.rollout.replicas)
        self._weights: Any = None  # the last version's HF tensors received (interrupt-sync scores under them)
        self._paused_reported = 0.0  # the engine's apply_seconds already reported by update_weights
        self._scorer: Any = None  # the training-side SegmentScorer, built on the first interrupt-sync window

    def generate(self, n_groups: int) -> list[Any]:
        return self.worker.generate(n_groups)

    def update_weights(self, weights: Any, version: int) -> dict[str, float]:
        """Load (first time, worker idle) or hand over (thread-safe) new weights: a weight-sync handle
        (``weightsync.objectstore.BucketRefs``: the buckets are pulled here) or an HF dict of arrays.

        Returns ``transfer_s`` (buckets pulled and reassembled, generation running meanwhile),
        ``handover_s`` (the engine's private copy), ``pause_s`` (generation stopped installing weights since
        the last call: this version when applied at once, else the boundary swaps of earlier versions)
        and ``bytes``."""
        from asyncrl.trainer.weightsync.objectstore import receive

        engine = self.worker.engine
        got = receive(weights)
        t0 = time.perf_counter()
        if self.worker.version < 0:
            self.worker.load_weights(got.state, version)
        else:
            self.worker.update_weights(got.state, version)
        handover = time.perf_counter() - t0
        self._weights = got.state  # views of the object store's buckets (interrupt-sync scores under them)
        pause = float(getattr(engine, "apply_seconds", 0.0)) - self._paused_reported
        self._paused_reported += pause
        return {"transfer_s": got.transfer_s, "handover_s": handover, "pause_s": pause, "bytes": float(got.nbytes)}

    def evaluate(self, problems: list[Any], version: int, temperature: float, seed: int, first: int) -> list[Any]:
        """One sample of each held-out problem under ``version`` (``RolloutWorker.evaluate``); the driver
        calls it only while no ``generate`` runs here."""
        return self.worker.evaluate(problems, version=version, temperature=temperature, seed=seed, first=first)

    # ------------------------------------------------------------------ interrupt-sync (paper §5.1)
    def sync_interrupt(self, timeout_s: float) -> int:
        """Phase *interrupt*: stop generation at a token boundary and hold it; in-flight episodes stay
        suspended here (a running ``generate`` returns its finished trajectories). Returns how many."""
        return len(self.worker.interrupt(timeout_s, hold=True))

    def sync_score(self, trajs: list[Any], version: int, release: bool) -> dict[str, Any]:
        """Phase *score*: with the engine's memory released (``release``), score every unscored sampled
        token of ``version`` -- of the suspended episodes here and of ``trajs`` (finished ones the driver
        holds) -- with the training-side model code under this worker's weights of ``version``.

        Returns ``{"scores": [(positions, values)] per trajs, "tokens": n, "release_s", "score_s",
        "acquire_s"}``; the suspended episodes keep their scores and carry them when they finish.
        """
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
                                                        seed=self.spec.train.seed))
        builds = self._scorer.builds
        try:
            self._scorer.load(self._weights, version)
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
        return {"scores": scores, "tokens": sum(len(p) for p, _ in results),
                "release_s": t1 - t0, "score_s": t2 - t1, "acquire_s": t3 - t2,
                "scorer_build_s": self._scorer.build_seconds if built else 0.0,
                "scorer_load_s": self._scorer.load_seconds}

    def set_prompt_cursor(self, n: int) -> None:
        """Continue the worker's prompt sequence at group ``n`` (resume, replacement)."""
        self.worker.set_prompt_cursor(n)

    def sync_resume(self) -> None:
        """Phase *resume*: end the hold (the new weights were handed over in phase *update*)."""
        self.worker.resume()

    def stats(self) -> dict[str, Any]:
        return vars(self.worker.stats()).copy()
