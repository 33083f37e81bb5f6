"""The start-up discrepancy probe: before training, does every engine's ``logp_mu`` mean what the actor means?

Peers' users lose weeks to an engine whose log-probs are not those of the distribution it sampled from
(vime #64/#69, TRL #4159: vLLM's raw log-probs with sampling at T = 0.6 gave first-token ratios of 2.0).
asyncrl's correction divides by ``mu`` everywhere, so the job checks it once, before the first step
(``spec.correction.startupCheck``):

1. every rollout engine samples ``rollouts`` held-out problems of the task at ``task.temperature``, under the
   version the actor holds (``RolloutWorker.evaluate``: no training prompt, counter or sampler is touched);
2. the actor scores the same tokens (``logp_theta`` at the same temperature, no grad);
3. per engine, over the sampled tokens: ``log r_d = logp_theta - logp_mu`` -> mean and p99 of ``|log r_d|``
   (:class:`EngineDiscrepancy`), and the statistics the diagnosis reads;
4. above ``maxMeanAbsLogRatio`` or ``maxP99AbsLogRatio`` the job refuses to start
   (:class:`StartupCheckError`, exit code 2) with the likely cause (:func:`diagnose`).

The diagnosis, in order (each rule is a measured signature, tested by provoking the cause for real where
asyncrl can: ``tests/trainer/test_startup_probe.py``):

- ``none``: mean ``|log r_d|`` below 1e-5, float32 rounding;
- ``temperature``: the actor itself re-scores the tokens at a grid of temperatures
  (:data:`TEMPERATURE_GRID`); when ``logp_mu`` matches one of them at least 4x better than
  ``task.temperature``, the engine's log-probs are at that temperature (raw, unprocessed log-probs, vLLM's
  default, read as temperature 1). Its signature in the plain statistics: the ratio grows with the
  log-prob's magnitude, so the first, most uncertain, tokens show it most;
- ``top-p``: ``logp_mu > logp_theta`` on almost every token: log-probs of a truncated, renormalised
  distribution (top-p/top-k) against the full one;
- ``chat-template``: the discrepancy sits on the first sampled token of each trajectory (5x the rest):
  the sides condition on different prompt tokens (a template or BOS rendered on one side only);
- ``family-mapping``: large, unstructured ratios (mean ``|log r_d|`` of 0.1 nat or more, ~100x the bf16
  level, that no temperature explains): the two sides do not compute the same network (a converter
  mapping, a config key such as the RoPE base or the norm epsilon). Measured with megatron's grouped QKV
  split as a plain ``[Q; K; V]`` (the classic mapping bug) on the random tiny-llama: mean 0.13, p99 0.34;
- ``dtype``: small unstructured noise (mean below 0.05; below 5e-3 nothing else is considered) from a
  bfloat16 engine against the fp32 actor. Measured on the quickstart's tiny-llama (16 held-out calculator
  rollouts): mean 1.3e-3, p99 5.5e-3 at random initialisation; mean 4.0e-3, p99 1.5e-2 after 150
  supervised steps. The spec's defaults (``maxMeanAbsLogRatio`` 0.05, ``maxP99AbsLogRatio`` 0.5,
  :class:`~asyncrl.api.correction.StartupCheckSpec`) leave 12x and 30x of room and still refuse an engine
  at temperature 0.6 for the actor's 1.0 (measured mean 0.08 to 0.57, by model);
- ``unknown`` otherwise.
"""

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.driver.run.summary import SummaryDraft

if TYPE_CHECKING:
    from asyncrl.trainer.driver.hosts.fleet import HostHandles
    from asyncrl.trainer.driver.run.metrics import DriverMetrics

log = logging.getLogger(__name__)

Cause = Literal["none", "temperature", "top-p", "family-mapping", "chat-template", "dtype", "unknown"]
# Cause -> what to tell the user (the fix); the numbers are appended per engine.
CAUSES: dict[Cause, str] = {
    "none": "no discrepancy beyond float32 rounding",
    "temperature": "temperature mismatch: the engine's log-probs are those of another temperature than "
                   "task.temperature (raw instead of temperature-processed log-probs read as temperature 1); make "
                   "the engine report log softmax(z / task.temperature), the distribution it samples from",
    "top-p": "truncated sampling distribution: logp_mu >= logp_theta on almost every token, the log-probs of a "
             "top-p/top-k renormalised distribution against the full one; sample without truncation or have the "
             "actor apply the same truncation",
    "family-mapping": "wrong family mapping: huge, unstructured ratios mean the engine and the actor do not compute "
                      "the same network; check the model folder's config.json family and the HF <-> Megatron "
                      "converter (rope_theta, rms_norm_eps, QKV layout, tied embeddings)",
    "chat-template": "different prompts: the discrepancy sits on the first sampled token of each trajectory; the "
                     "engine and the actor condition on different prompt tokens (a chat template or BOS applied on "
                     "one side only)",
    "dtype": "dtype noise: a bfloat16 engine against the float32 actor, unstructured and small; raise "
             "correction.startupCheck's thresholds, or use model.rolloutDtype: float32 (or rollout.engineArgs "
             "fp32Head: true)",
    "unknown": "no known signature; compare the engine's and the actor's log-probs on one trajectory by hand",
}
ROUNDING = 1e-5  # mean |log r_d| of a float32 engine: ~2e-7 measured
# Temperatures the actor re-scores a refused engine's tokens at (and task.temperature itself).
TEMPERATURE_GRID: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
TEMPERATURE_FIT_GAIN = 4.0  # the best temperature matches logp_mu this much better than task.temperature
ONE_SIDED_SHARE = 0.95  # top-p: share of tokens with log r_d < 0
TOP_P_MEAN_ABS = 0.01  # top-p: below this a one-sided difference is rounding of near-certain tokens
BF16_LEVEL = 1.3e-3  # mean |log r_d| of the quickstart's bf16 engine (module docstring)
LARGE_MEAN_ABS = 0.1  # nats, ~100x the bf16 level with no temperature behind it: family mapping
FIRST_TOKEN_SKEW = 5.0  # chat template: first sampled token vs the rest
BF16_NOISE_MEAN_ABS = 0.05  # above this a bf16 engine is more than dtype noise


class StartupCheckError(RuntimeError):
    """The probe refused the job (exit code 2: the job's configuration, not a transient failure)."""

    exit_code = 2


@dataclass(frozen=True)
class EngineDiscrepancy:
    """``log r_d = logp_theta - logp_mu`` over one engine's sampled tokens at version ``version``."""

    engine: str  # "rollout-0 (transformers, bfloat16)"
    dtype: str  # the engine's dtype (model.rolloutDtype)
    version: int
    trajectories: int
    tokens: int  # sampled tokens with finite log-probs on both sides
    mean_log_ratio: float  # signed mean of log r_d
    mean_abs_log_ratio: float
    p99_abs_log_ratio: float
    max_abs_log_ratio: float
    first_token_mean_abs: float  # the first sampled token of each trajectory
    rest_mean_abs: float  # every other sampled token (nan when there is none)
    negative_share: float  # share of tokens with log r_d < 0 (logp_mu above logp_theta)
    # Only for an engine above the thresholds: the temperature whose actor log-probs match logp_mu best, and
    # the mean |logp_theta(T) - logp_mu| there.
    fitted_temperature: float | None = None
    fitted_mean_abs: float | None = None
    p50_abs_log_ratio: float | None = None  # the median of |log r_d| (bench/paper's records)

    def record(self) -> dict[str, Any]:
        """JSON form (summary.json): floats to 4 significant digits."""
        return {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Verdict:
    """One engine's outcome: its statistics, whether they are inside the thresholds, the likely cause."""

    stats: EngineDiscrepancy
    passed: bool
    cause: Cause
    detail: str  # the cause's explanation with this engine's numbers

    def line(self) -> str:
        s = self.stats
        head = (f"{s.engine}: {s.tokens} tokens of {s.trajectories} rollouts at version {s.version}: mean |log r_d| "
                f"{s.mean_abs_log_ratio:.2e}, p99 {s.p99_abs_log_ratio:.2e}, first token {s.first_token_mean_abs:.2e}")
        return f"{head} -> {'ok' if self.passed else 'REFUSED'} (looks like: {self.cause})"

    def record(self) -> dict[str, Any]:
        return {**self.stats.record(), "passed": self.passed, "cause": self.cause}


@dataclass(frozen=True)
class Thresholds:
    """``spec.correction.startupCheck``'s limits."""

    max_mean_abs: float
    max_p99_abs: float


def engine_discrepancy(engine: str, dtype: str, version: int, logp_theta: torch.Tensor, logp_mu: torch.Tensor,
                       loss_mask: torch.Tensor) -> EngineDiscrepancy:
    """Statistics of ``log r_d`` over the sampled tokens.

    Args:
        logp_theta: ``[B, T]`` the actor's log-probs of the tokens (fp32).
        logp_mu: ``[B, T]`` the engine's (0 where not sampled).
        loss_mask: ``[B, T]`` bool, True = a sampled token.
    """
    if not (logp_theta.shape == logp_mu.shape == loss_mask.shape) or logp_theta.dim() != 2:
        raise ValueError(f"engine_discrepancy: logp_theta {tuple(logp_theta.shape)}, logp_mu {tuple(logp_mu.shape)} "
                         f"and loss_mask {tuple(loss_mask.shape)} must be one [B, T] shape")
    pi, mu = logp_theta.double(), logp_mu.double()
    valid = loss_mask.bool() & torch.isfinite(pi) & torch.isfinite(mu)
    # first sampled token of each row: the first True of loss_mask
    first = valid & (valid.long().cumsum(dim=1) == 1)
    d = (pi - mu)[valid]  # [N]
    n = int(d.numel())
    if n == 0:
        raise ValueError(f"{engine}: no sampled token with finite log-probs to compare; raise startupCheck.rollouts")
    rest = valid & ~first
    return EngineDiscrepancy(
        engine=engine, dtype=dtype, version=version, trajectories=int(loss_mask.any(dim=1).sum()), tokens=n,
        mean_log_ratio=float(d.mean()), mean_abs_log_ratio=float(d.abs().mean()),
        p99_abs_log_ratio=float(torch.quantile(d.abs(), 0.99)), max_abs_log_ratio=float(d.abs().max()),
        first_token_mean_abs=float((pi - mu)[first].abs().mean()),
        rest_mean_abs=float((pi - mu)[rest].abs().mean()) if bool(rest.any()) else math.nan,
        negative_share=float((d < 0).double().mean()),
        p50_abs_log_ratio=float(torch.quantile(d.abs(), 0.5)),
    )


def diagnose(s: EngineDiscrepancy, temperature: float) -> tuple[Cause, str]:
    """The likely cause of ``s``'s discrepancy (module docstring), and its explanation with the numbers."""
    if s.mean_abs_log_ratio <= ROUNDING:
        return "none", CAUSES["none"]
    fitted, at_fit = s.fitted_temperature, s.fitted_mean_abs
    if fitted is not None and at_fit is not None and not math.isclose(fitted, temperature) \
            and at_fit * TEMPERATURE_FIT_GAIN <= s.mean_abs_log_ratio:
        raw = " -- raw log-probs" if math.isclose(fitted, 1.0) else ""
        return "temperature", (f"{CAUSES['temperature']} (logp_mu matches the actor's log-probs at temperature "
                               f"{fitted:g}{raw}: mean |diff| {at_fit:.2e}, against {s.mean_abs_log_ratio:.2e} at "
                               f"task.temperature {temperature:g})")
    if s.dtype == "bfloat16" and s.mean_abs_log_ratio <= BF16_NOISE_MEAN_ABS / 10:
        return "dtype", CAUSES["dtype"]  # the measured bf16 level: nothing else is worth naming
    if s.negative_share >= ONE_SIDED_SHARE and s.mean_abs_log_ratio >= TOP_P_MEAN_ABS:
        return "top-p", f"{CAUSES['top-p']} ({100 * s.negative_share:.0f}% of tokens have logp_mu > logp_theta)"
    rest = s.rest_mean_abs if math.isfinite(s.rest_mean_abs) else 0.0
    if s.first_token_mean_abs >= FIRST_TOKEN_SKEW * max(rest, 1e-12):
        return "chat-template", (f"{CAUSES['chat-template']} (first token {s.first_token_mean_abs:.2e} vs "
                                 f"{rest:.2e} on the others)")
    if s.mean_abs_log_ratio >= LARGE_MEAN_ABS:
        return "family-mapping", (f"{CAUSES['family-mapping']} (mean |log r_d| {s.mean_abs_log_ratio:.2f} nats, "
                                  f"{s.mean_abs_log_ratio / BF16_LEVEL:.0f}x the bf16 level, and no temperature "
                                  "explains it)")
    if s.dtype == "bfloat16" and s.mean_abs_log_ratio <= BF16_NOISE_MEAN_ABS:
        return "dtype", CAUSES["dtype"]
    return "unknown", CAUSES["unknown"]


def within(s: EngineDiscrepancy, limits: Thresholds) -> bool:
    return s.mean_abs_log_ratio <= limits.max_mean_abs and s.p99_abs_log_ratio <= limits.max_p99_abs


def judge(s: EngineDiscrepancy, limits: Thresholds, temperature: float) -> Verdict:
    cause, detail = diagnose(s, temperature)
    return Verdict(s, within(s, limits), cause, detail)


def refusal(verdicts: Sequence[Verdict], limits: Thresholds) -> str:
    """The message of a refused start: every refused engine with its numbers, cause and fix."""
    bad = [v for v in verdicts if not v.passed]
    lines = [f"the start-up discrepancy probe refused the job: {len(bad)} of {len(verdicts)} rollout engines are "
             f"above correction.startupCheck (maxMeanAbsLogRatio {limits.max_mean_abs:g}, maxP99AbsLogRatio "
             f"{limits.max_p99_abs:g})"]
    for v in bad:
        lines.append(f"  {v.line()}")
        lines.append(f"    likely cause: {v.detail}")
    lines.append("  (set correction.startupCheck.enabled: false to start anyway)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ scoring trajectories
def padded(trajs: Sequence[Trajectory], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(tokens [B, T] long, logp_mu [B, T] fp32, loss_mask [B, T] bool)`` of ``trajs``."""
    B, T = len(trajs), max(len(t.tokens) for t in trajs)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    logp_mu = torch.zeros(B, T, dtype=torch.float32)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, t in enumerate(trajs):
        n = len(t.tokens)
        tokens[b, :n] = torch.tensor(t.tokens, dtype=torch.long)
        logp_mu[b, :n] = torch.tensor(t.logp_mu, dtype=torch.float32)
        mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.bool)
    return tokens, logp_mu, mask


Score = Callable[[torch.Tensor, float], torch.Tensor]  # (tokens [B, T], temperature) -> actor logp [B, T]


def fit_temperature(tokens: torch.Tensor, logp_mu: torch.Tensor, loss_mask: torch.Tensor, score: Score,
                    grid: Sequence[float] = TEMPERATURE_GRID) -> tuple[float, float]:
    """``(T, mean |logp_theta(T) - logp_mu|)`` for the ``T`` of ``grid`` that matches ``logp_mu`` best.

    Args:
        tokens: ``[B, T]`` long; logp_mu: ``[B, T]``; loss_mask: ``[B, T]`` bool (the sampled tokens).
    """
    best: tuple[float, float] | None = None
    for t in grid:
        diff = (score(tokens, t).double() - logp_mu.double())[loss_mask]
        m = float(diff[torch.isfinite(diff)].abs().mean())
        if best is None or m < best[1]:
            best = (float(t), m)
    assert best is not None  # a non-empty grid
    return best


def probe_engine(engine: str, dtype: str, version: int, trajs: Sequence[Trajectory], score: Score, pad_id: int,
                 *, temperature: float, limits: Thresholds) -> Verdict:
    """One engine's trajectories scored by the actor (``score`` at ``temperature``) and judged; an engine
    above ``limits`` is re-scored at :data:`TEMPERATURE_GRID` for the diagnosis."""
    if not trajs:
        raise ValueError(f"{engine}: the probe got no trajectories")
    tokens, logp_mu, mask = padded(trajs, pad_id)
    stats = engine_discrepancy(engine, dtype, version, score(tokens, temperature).float(), logp_mu, mask)
    if not within(stats, limits):
        fitted, at_fit = fit_temperature(tokens, logp_mu, mask, score, (*TEMPERATURE_GRID, temperature))
        stats = replace(stats, fitted_temperature=fitted, fitted_mean_abs=at_fit)
    return judge(stats, limits, temperature)


def check(verdicts: Sequence[Verdict], limits: Thresholds) -> None:
    """Log one line per engine; raise :class:`StartupCheckError` when one is refused."""
    for v in verdicts:
        log.log(logging.INFO if v.passed else logging.WARNING, "startup probe: %s", v.line())
    if not all(v.passed for v in verdicts):
        raise StartupCheckError(refusal(verdicts, limits))


# ------------------------------------------------------------------------------------ in the driver
def run_probe(hosts: "HostHandles", spec: AsyncRLJobSpec, version: int) -> list[Verdict]:
    """Steps 1-3 on the job's Ray hosts: each rollout worker samples the probe's held-out problems under
    ``version`` and the actor scores them; one :class:`Verdict` per worker (:func:`check` decides)."""
    import numpy as np
    import ray

    from asyncrl.rollout.envs.binding import task_samples

    settings = spec.correction.startup_check
    limits = Thresholds(settings.max_mean_abs_log_ratio, settings.max_p99_abs_log_ratio)
    temperature = float(spec.task.temperature)
    # the task's held-out samples, as the evaluation draws them (never trained on; no user code runs here)
    samples = task_samples(spec.task, workers=spec.rollout.replicas, seed=spec.train.seed)
    problems = samples.heldout(settings.rollouts, spec.train.seed)
    refs = [w.evaluate.remote(problems, version, temperature, spec.train.seed, 0) for w in hosts.rollout]

    def score(tokens: torch.Tensor, t: float) -> torch.Tensor:
        return torch.from_numpy(np.array(ray.get(hosts.actor.score.remote(tokens.numpy(), t))))  # writable copy

    out = []
    for i, ref in enumerate(refs):
        name = f"rollout-{i} ({spec.rollout.engine}, {spec.model.rollout_dtype})"
        out.append(probe_engine(name, spec.model.rollout_dtype, version, ray.get(ref), score, hosts.pad_id,
                                temperature=temperature, limits=limits))
    return out


def startup_check(hosts: "HostHandles", spec: AsyncRLJobSpec, version: int, summary: SummaryDraft,
                  metrics: "DriverMetrics") -> list[Verdict]:
    """The driver's step: probe every engine, record it (``summary.startup_check``, the
    ``asyncrl_startup_log_ratio_abs`` gauges of the worst engine, one log line per engine), then
    :func:`check`: a refused engine raises :class:`StartupCheckError` (the summary says why)."""
    import time

    t0 = time.monotonic()
    verdicts = run_probe(hosts, spec, version)
    summary.startup_check = {
        "passed": all(v.passed for v in verdicts), "seconds": round(time.monotonic() - t0, 3),
        "max_mean_abs_log_ratio": spec.correction.startup_check.max_mean_abs_log_ratio,
        "max_p99_abs_log_ratio": spec.correction.startup_check.max_p99_abs_log_ratio,
        "engines": [v.record() for v in verdicts],
    }
    metrics.startup_log_ratio.labels("mean").set(max(v.stats.mean_abs_log_ratio for v in verdicts))
    metrics.startup_log_ratio.labels("p99").set(max(v.stats.p99_abs_log_ratio for v in verdicts))
    check(verdicts, Thresholds(spec.correction.startup_check.max_mean_abs_log_ratio,
                               spec.correction.startup_check.max_p99_abs_log_ratio))
    return verdicts
