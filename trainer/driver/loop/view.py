"""What a stage of the loop may see and do: :class:`LoopView`, the narrow side of the driver's ``_Loop``
that the old-logit stages (:mod:`.stages`, :mod:`.dedicated_stage`) and the evaluation
(:mod:`.evaluation`) are typed against, instead of the whole loop object and its private methods.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from asyncrl.trainer.driver.hosts.fleet import HostHandles
from asyncrl.trainer.driver.loop.staleness import StalenessBuffer
from asyncrl.trainer.driver.loop.workers import WorkerPool
from asyncrl.trainer.driver.run.metrics import DriverMetrics

if TYPE_CHECKING:
    from ray import ObjectRef


class LoopView(Protocol):
    """The loop as a stage sees it. Read-only members are properties; ``paused`` is the one flag a
    stage sets (the evaluation: no training generate call is admitted while it runs)."""

    paused: bool

    @property
    def version(self) -> int:
        """The actor's current version (the version rollout holds)."""

    @property
    def W(self) -> int:  # noqa: N802 -- the paper's symbol for async.maxStaleness
        """The staleness window (``async.maxStaleness``, the setting)."""

    @property
    def hosts(self) -> HostHandles: ...

    @property
    def m(self) -> DriverMetrics: ...

    @property
    def buffer(self) -> StalenessBuffer: ...

    @property
    def workers(self) -> WorkerPool:
        """Every rollout worker's slot (idle since when, or its generate call in flight: admitted at which
        version, holding how many groups); the evaluation holds and releases them."""

    @property
    def step_extra(self) -> dict[str, float]:
        """Figures a stage adds to the next step's report (``dedicated_wait_s``)."""

    def wait_any(self, *extra: "ObjectRef") -> "ObjectRef | Literal[False] | None":
        """Wait for one call (generate, the stage's, or one of ``extra``) and handle it; the ``extra`` ref that
        finished, None otherwise, False when nothing is in flight."""

    def collect(self, ref: "ObjectRef") -> None:
        """A generate call ``ref`` came back: count it and put its groups in the buffer."""

    def replace_rollout(self, i: int, exc: BaseException) -> None:
        """Start a new rollout worker ``i`` in place of a dead one (it gets the current weights)."""

    def on_every_worker(self, call: Callable[[Any], Any]) -> list[Any]:
        """``ray.get`` of ``call(worker)`` on every rollout worker; a dead one is replaced (answer None)."""
