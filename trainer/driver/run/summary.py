"""The run's summary, typed: what ``run_job`` hands back (``RunResult.summary``) and ``summary.json`` holds.

The loop fills a :class:`SummaryDraft` while it runs (each part when it is known: the start-up, the warm
start or resume, the loop's accounting); :meth:`SummaryDraft.finish` makes the :class:`RunSummary` once,
when the run ends, with its status, error and the log's :class:`StepTotals`. :meth:`RunSummary.to_json` is
the one serialiser of ``summary.json``: the fields in declaration order (the order the keys always had),
a part the run never reached absent rather than null (``metrics_url`` is the exception: null without an
endpoint), the totals spread at the top level. :meth:`RunSummary.from_json` reads such a file back.

Parts other modules build (the start-up probe's record, a stage's summary, the export's record, how the
actor loaded the model) stay the JSON objects they build; the run's own parts are typed here.
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal, TypeAlias, get_args

from asyncrl.trainer.driver.run.metrics_log import JSON, JSONObject

RunStatus: TypeAlias = Literal["running", "succeeded", "preempted", "interrupted", "failed"]
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)


@dataclass(frozen=True)
class EvalPoint:
    """One held-out evaluation on the summary's curve (``loop_s``: training seconds, evaluations excluded)."""

    version: int
    success: float  # rounded to 1e-4
    reward: float  # rounded to 1e-4
    seconds: float | None  # eval_s (None: the line did not say)
    loop_s: float

    def to_json(self) -> dict[str, JSON]:
        return {"version": self.version, "success": self.success, "reward": self.reward,
                "seconds": self.seconds, "loop_s": self.loop_s}


@dataclass(frozen=True)
class StepTotals:
    """What the ``metrics.jsonl`` lines add up to (``accounting.summarise``); None where no step or no
    evaluation says it."""

    steps_done: int  # applied steps
    wall_s: float
    start_success: float | None  # means over the first / last window of applied steps
    final_success: float | None
    start_reward: float | None
    final_reward: float | None
    final_version: int | None
    eval_first: float | None  # held-out evaluation (spec.eval): first and last success, every evaluation
    eval_last: float | None
    eval_first_version: int | None
    eval_last_version: int | None
    eval_curve: tuple[EvalPoint, ...]
    eval_s: float

    def to_json(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["eval_curve"] = [p.to_json() for p in self.eval_curve]
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> "StepTotals":
        curve = d.get("eval_curve")
        points = tuple(EvalPoint(**p) for p in curve) if isinstance(curve, list) else ()
        return cls(**{f.name: d.get(f.name) for f in fields(cls) if f.name != "eval_curve"},  # type: ignore[arg-type]
                   eval_curve=points)


@dataclass
class SummaryDraft:
    """The summary while the run is under way: the loop sets each part as it learns it (None: not reached).
    Its fields are :class:`RunSummary`'s without ``status``, ``error``, ``totals`` and ``report``, in the
    same order (a test holds them equal)."""

    job: str
    run_dir: str
    max_staleness: int
    reference: str
    metrics_url: str | None = None
    restarts: int = 0  # gang restarts before this attempt
    restart_causes: tuple[str, ...] | None = None  # each restart's cause (None: no restart)
    startup_s: float | None = None
    model_load: JSONObject | None = None  # how the actor loaded spec.model.weights
    notices: list[str] | None = None  # a checkpoint skipped, a torn log line repaired (see notes())
    resumed_from: str | None = None
    warm_start: JSONObject | None = None
    start_version: int | None = None
    startup_check: JSONObject | None = None  # the start-up probe's record
    resume: JSONObject | None = None  # the workers' prompt cursors at the resume
    export: JSONObject | None = None  # the newest export (at the end, the final one)
    final_checkpoint: str | None = None  # SIGTERM: the final checkpoint
    stopped: JSONObject | None = None  # SIGTERM: when and how the loop stopped
    interrupt_sync: JSONObject | None = None  # the old-logit stage's summary (one of these two)
    dedicated: JSONObject | None = None
    worker_replacements: int | None = None
    env_errors: Mapping[str, int] | None = None  # episodes the environment's code aborted, by reason
    buffer: Mapping[str, int] | None = None  # the staleness buffer's counts at the end
    loop: JSONObject | None = None  # the loop's seconds (idle, training, evaluation)

    def notes(self) -> list[str]:
        """The notices, to append to (from here on the summary has them, if only ``[]``)."""
        if self.notices is None:
            self.notices = []
        return self.notices

    def add_stage(self, parts: Mapping[str, JSONObject]) -> None:
        """The old-logit stage's summary (``Stage.summary()``: ``{"interrupt_sync": ...}``,
        ``{"dedicated": ...}`` or ``{}``)."""
        for name, part in parts.items():
            if name not in ("interrupt_sync", "dedicated"):
                raise ValueError(f"unknown stage summary {name!r}; valid: interrupt_sync, dedicated")
            setattr(self, name, part)

    def to_json(self) -> dict[str, JSON]:
        """The summary so far in ``summary.json``'s form (what ``on_start`` hears)."""
        return self.finish("running").to_json()

    def finish(self, status: RunStatus, *, error: str | None = None, totals: StepTotals | None = None,
               report: str | None = None) -> "RunSummary":
        """The run's summary, made once: this draft's parts with how the run ended."""
        parts = {f.name: getattr(self, f.name) for f in fields(self)}
        parts["notices"] = None if self.notices is None else tuple(self.notices)
        return RunSummary(**parts, status=status, error=error, totals=totals, report=report)


@dataclass(frozen=True)
class RunSummary:
    """One run's summary (``summary.json``; ``last-attempt.json`` for an attempt that failed before it
    logged a step). The fields are in the file's key order; one that is None is absent from the file,
    except ``metrics_url`` (null: no endpoint). A summary read back from an early failure may lack what
    a run always writes (``max_staleness``, ``totals``, ...): those are None too."""

    job: str
    run_dir: str
    status: RunStatus = "running"
    max_staleness: int | None = None
    reference: str | None = None
    metrics_url: str | None = None
    restarts: int | None = None
    restart_causes: tuple[str, ...] | None = None
    startup_s: float | None = None
    model_load: JSONObject | None = None
    notices: tuple[str, ...] | None = None
    resumed_from: str | None = None
    warm_start: JSONObject | None = None
    start_version: int | None = None
    startup_check: JSONObject | None = None
    resume: JSONObject | None = None
    export: JSONObject | None = None
    final_checkpoint: str | None = None
    stopped: JSONObject | None = None
    interrupt_sync: JSONObject | None = None
    dedicated: JSONObject | None = None
    worker_replacements: int | None = None
    env_errors: Mapping[str, int] | None = None
    buffer: Mapping[str, int] | None = None
    loop: JSONObject | None = None
    error: str | None = None  # the one line of what ended a failed run (faults.describe)
    totals: StepTotals | None = None  # what the metrics.jsonl lines add up to, spread at the top level
    report: str | None = None  # report.png

    def to_json(self) -> dict[str, JSON]:
        """``summary.json``'s object (the one serialiser; ``RunDir.write_summary`` writes it)."""
        out: dict[str, JSON] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "totals":
                out |= value.to_json() if value is not None else {}
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            elif value is not None or f.name == "metrics_url":
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> "RunSummary":
        """A ``summary.json`` read back (keys it does not know are ignored)."""
        names = {f.name for f in fields(cls)} - {"totals"}
        kwargs = {k: tuple(v) if k in _TUPLES and isinstance(v, list) else v for k, v in d.items() if k in names}
        totals = StepTotals.from_json(d) if "steps_done" in d else None
        return cls(**{"job": "", "run_dir": "", **kwargs}, totals=totals)  # type: ignore[arg-type]


_TUPLES = ("restart_causes", "notices")
