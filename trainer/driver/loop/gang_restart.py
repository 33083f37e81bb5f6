"""Gang restarts of a local run: what the operator does in a cluster when the actor gang fails.

In a cluster a lost actor pod or a failed driver restarts every pod of the job from its last complete
checkpoint, counted once against ``runPolicy.backoffLimit`` however many ranks died with it
(``operator/lifecycle.py``). Locally the driver is the whole job, so :func:`run_with_restarts` does the
same when an attempt fails because the actor group failed (:class:`ActorRankError`: a rank died or
raised, and the group killed every rank within about a second, ``actor_group.py``): it reruns
:func:`~asyncrl.trainer.driver.loop.training_loop.run_job` in the same run directory -- a fresh local Ray, fresh actor
ranks with a fresh rendezvous, fresh rollout workers -- which resumes from the newest complete checkpoint
exactly as a rerun after a kill does: weights, optimizer and version from the actor's checkpoint, each
worker's prompt cursor from the driver's state beside it (no prompt trained before the checkpoint is
drawn again, so no trained token is trained twice), the steps after the checkpoint cut from
``metrics.jsonl`` and trained again on fresh prompts, the rollout workers loaded with the resumed
version. ``summary.json`` says ``restarts`` and each one's cause. Once ``backoffLimit`` restarts are
spent the next failure fails the run: :class:`GangRestartLimitError`.

Only the actor group's failures restart a local run. A bad spec, the start-up check, a full disk or
repeated non-finite losses end it at once as before (in a cluster the operator restarts a driver that
exited 1 whatever the cause; locally the same rerun is one command away, and the message says why).
"""

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Unpack

from asyncrl.api.job import AsyncRLJob
from asyncrl.trainer.driver.hosts.actor_group import ActorRankError
from asyncrl.trainer.driver.loop.training_loop import (
    RunCallbacks,
    RunOptions,
    RunResult,
    default_run_dir,
    run_job,
)

log = logging.getLogger(__name__)

RestartCallback = Callable[[int, ActorRankError], None]  # (restart number from 1, the failure that caused it)


class GangRestartLimitError(RuntimeError):
    """The actor group failed again after ``runPolicy.backoffLimit`` gang restarts."""

    def __init__(self, failure: ActorRankError, restarts: int, limit: int) -> None:
        self.failure, self.restarts, self.limit = failure, restarts, limit
        super().__init__(f"{failure.line}; the actor gang was restarted {restarts} "
                         f"time(s) and runPolicy.backoffLimit={limit} is reached: the run failed (raise "
                         "spec.runPolicy.backoffLimit to allow more restarts, or fix the rank's error)")


def run_with_restarts(job: AsyncRLJob, options: RunOptions | None = None, *,
                      on_restart: RestartCallback | None = None, **callbacks: Unpack[RunCallbacks]) -> RunResult:
    """:func:`run_job`, with the whole gang restarted from the last complete checkpoint (same run directory)
    each time the actor group fails, at most ``spec.runPolicy.backoffLimit`` times. ``callbacks`` go to
    every attempt's :func:`run_job` (``on_step``, ``on_batch``, ...); ``on_restart`` hears each restart."""
    limit = job.spec.run_policy.backoff_limit
    options = options or RunOptions()
    options = replace(options, run_dir=options.run_dir or default_run_dir(job))  # every attempt's directory
    causes = list(options.restarts)
    while True:
        try:
            return run_job(job, replace(options, restarts=tuple(causes)), **callbacks)
        except ActorRankError as exc:
            if len(causes) >= limit:
                raise GangRestartLimitError(exc, len(causes), limit) from exc
            causes.append(exc.line)
            log.warning("restarting the actor gang from the last complete checkpoint (restart %d/%d): %s",
                        len(causes), limit, exc)
            if on_restart is not None:
                on_restart(len(causes), exc)
