"""A rollout worker's share of the agent endpoint: the server, the agents' loop, and the branches of sessions.

The worker builds every episode of an agent task here (:meth:`AgentHost.start_episode`) and hands its finished
episodes back (:meth:`AgentHost.settle`). A session usually is one trajectory. When the harness sends a request
that does not extend the conversation, the trajectory so far ends as a *superseded branch*
(``info["superseded_branch"]``) and the next branch starts as a new episode of the same GRPO group member from
that request (its prompt: the request's messages, rendered; nothing of it trained twice). Superseded branches
wait here until their session ends and then leave with its reward, so every branch of a member carries the
same reward; the staleness buffer counts a group's members without them (``trainer/driver/loop/staleness.py``).
"""

import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncrl.api.constants import AGENT_ADVERTISE_ENV, AGENT_BIND_ENV
from asyncrl.rollout.agent.endpoint import AgentEndpoint
from asyncrl.rollout.agent.environment import AgentAdapter, AgentEnvironment
from asyncrl.rollout.agent.keys import session_key
from asyncrl.rollout.agent.limits import EndpointLimits
from asyncrl.rollout.agent.runner import AgentRunner
from asyncrl.rollout.envs.binding import AgentTask
from asyncrl.rollout.envs.interface import Sample
from asyncrl.rollout.envs.runner import EnvFault, EnvRunner
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.tokenizer import Tokenizer
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus


def bind_address(worker_index: int) -> tuple[str, int]:
    """Where this worker's endpoint listens: ``$ASYNCRL_AGENT_BIND`` (``host:port``, set in a cluster's rollout
    pods) or loopback on a free port (a local run)."""
    spec = os.environ.get(AGENT_BIND_ENV, "")
    if not spec:
        return "127.0.0.1", 0
    host, colon, port = spec.rpartition(":")
    try:
        if not colon:
            raise ValueError(spec)
        return host or "0.0.0.0", int(port)
    except ValueError:
        raise ValueError(f"${AGENT_BIND_ENV}={spec!r}: expected host:port, e.g. 0.0.0.0:8100") from None


def advertised(url: str | None) -> str | None:
    """``$ASYNCRL_AGENT_ADVERTISE`` as a base URL: an IPv6 pod address (``http://fd00::5:8100``, as the pod's
    environment spells it) gets its brackets (``http://[fd00::5]:8100``)."""
    if not url:
        return None
    m = re.fullmatch(r"(https?://)([0-9A-Fa-f:.]+):(\d+)(/.*)?", url)
    if m and m.group(2).count(":") >= 2:
        return f"{m.group(1)}[{m.group(2)}]:{m.group(3)}{m.group(4) or ''}"
    return url


@dataclass
class _Pending:
    tid: str
    gid: str
    sample: Sample
    env: AgentEnvironment
    tokenizer: Tokenizer
    runner: EnvRunner | None
    fmt: str
    opened: float


@dataclass
class AgentHost:
    """The endpoint, the agent loop and the branch bookkeeping of one rollout worker."""

    task: AgentTask
    endpoint: AgentEndpoint
    loop: AgentRunner | None  # the agent runner process (None: agent external)
    timeout_s: float
    name: str = "agent"
    _held: dict[str, list[Trajectory]] = field(default_factory=dict)  # session id -> its superseded branches
    _pending: list["_Pending"] = field(default_factory=list)  # sessions opened, first request not there yet
    _carry: list[Episode] = field(default_factory=list)  # started while take_ready waits for the others
    _carry_failed: list[tuple[str, str, EnvFault]] = field(default_factory=list)

    @classmethod
    def start(cls, task: AgentTask, *, model_name: str, worker_index: int, timeout_s: float,
              name: str = "agent", temperature: float = 1.0, agent_path: str = "",
              python_path: Sequence[str] = (), context: int = 0) -> "AgentHost":
        """The endpoint and, for an agent function (``agent_path``: ``spec.task.agent``), its runner process, which
        imports the function by that name (:class:`AgentLoadError`, naming ``spec.task.agent``, when it cannot).
        ``context``: the model's context in tokens (every request's prompt and ``max_tokens`` must fit it).
        An external agent's session key is read and checked first (:func:`~asyncrl.rollout.agent.keys.session_key`:
        :class:`~asyncrl.rollout.agent.keys.SessionKeyError` before anything listens)."""
        host, port = bind_address(worker_index)
        limits = EndpointLimits.from_spec(task.endpoint, context=context)
        key = session_key(os.environ, external=task.fn is None, bind_host=host,
                          key_from=getattr(task.endpoint, "session_key_from", None))  # before anything listens
        endpoint = AgentEndpoint(host=host, port=port, advertise=advertised(os.environ.get(AGENT_ADVERTISE_ENV)),
                                 model=model_name, limits=limits, temperature=temperature,
                                 session_key=key, hidden_fields=task.hidden_fields)
        try:
            runner = AgentRunner(agent_path, python_path, timeout_s=timeout_s) if task.fn is not None else None
        except BaseException:
            endpoint.close()
            raise
        return cls(task, endpoint, runner, timeout_s, name)

    def _episode(self, tid: str, gid: str, env: AgentEnvironment, sample: Sample, tokenizer: Tokenizer,
                 runner: EnvRunner | None, fmt: str) -> Episode:
        adapter = AgentAdapter(self.name, env, dict(sample), tokenizer, runner=runner, tool_call_format=fmt)
        try:
            return Episode.start(tid, gid, adapter, random.Random(0))
        except EnvFault:
            env.close("the episode could not start")
            raise

    def open(self, tid: str, gid: str, sample: Sample, tokenizer: Tokenizer, runner: EnvRunner | None,
             fmt: str) -> None:
        """Open a session for a new episode and return at once: the episode starts once the agent's first request
        is there (:meth:`take_ready`), so a harness that serves its sessions one after another never waits for a
        session the worker has not started generating yet."""
        env = AgentEnvironment(self.endpoint, self.task.fn, scorer=self.task.scorer, traj_id=tid,
                               timeout_s=self.timeout_s, loop=self.loop)
        env.open(sample)
        self._pending.append(_Pending(tid, gid, dict(sample), env, tokenizer, runner, fmt, time.monotonic()))

    @property
    def pending(self) -> int:
        """Sessions opened whose first request has not arrived."""
        return len(self._pending)

    def pending_with(self, prefix: str) -> int:
        return sum(p.tid.startswith(prefix) for p in self._pending)

    def take_ready(self, *, block: bool, prefix: str = "") -> tuple[list[Episode], list[tuple[str, str, EnvFault]]]:
        """The episodes of opened sessions whose first request (or fault) arrived, and the starts that failed
        ``(traj id, group id, fault)``; a session with nothing after ``envTimeoutSeconds`` fails (``timeout``).
        ``block``: wait until at least one session is there (or failed). Only sessions whose trajectory id starts with
        ``prefix`` are looked at (an evaluation takes its own sessions only)."""
        while True:
            self.endpoint.sessions.wake.clear()
            started: list[Episode] = []
            failed: list[tuple[str, str, EnvFault]] = []
            keep: list[_Pending] = []
            now = time.monotonic()
            for p in self._pending:
                s = p.env.session
                if not p.tid.startswith(prefix):
                    keep.append(p)
                elif s is not None and s.mailbox.ready():
                    try:
                        started.append(self._episode(p.tid, p.gid, p.env, p.sample, p.tokenizer, p.runner, p.fmt))
                    except EnvFault as fault:
                        failed.append((p.tid, p.gid, fault))
                elif now - p.opened > self.timeout_s:
                    p.env.close("no first request in time", aborted=True)
                    what = "no harness took the session" if self.task.fn is None else "the agent sent no request"
                    failed.append((p.tid, p.gid, EnvFault(
                        "timeout", f"{what} within {self.timeout_s:g} s (spec.task.envTimeoutSeconds)")))
                else:
                    keep.append(p)
            self._pending = keep
            mine = [p for p in keep if p.tid.startswith(prefix)]
            # in-process agents send their first request at once: wait for all of them (one batch, not a trickle);
            # an external harness may serve its sessions one after another: start with what is there
            enough = not mine if self.task.fn is not None else (started or failed or not mine)
            if enough or not block:
                out, self._carry = self._carry + started, []
                bad, self._carry_failed = self._carry_failed + failed, []
                return out, bad
            self._carry += started
            self._carry_failed += failed
            oldest = min(p.opened for p in mine)
            self.endpoint.sessions.wake.wait(max(0.01, oldest + self.timeout_s - time.monotonic()))

    def settle(self, done: Sequence[Episode]) -> tuple[list[Trajectory], list[Episode]]:
        """The trajectories of finished episodes that may leave now, and the episodes of new branches (to resume).

        A superseded branch is held until its session's last branch ends; it then leaves with that branch's
        reward and success (ABORTED with it when the session failed)."""
        out: list[Trajectory] = []
        branches: list[Episode] = []
        for e in done:
            adapter = e.env
            assert isinstance(adapter, AgentAdapter)
            env = adapter.env
            t = e.to_trajectory()
            sid = env.session.id if env.session is not None else ""
            if env.branch_to is not None and t.status is TrajectoryStatus.FINISHED:
                t.info["superseded_branch"] = True
                self._held.setdefault(sid, []).append(t)
                base = t.traj_id.split("-b")[0]
                nxt = AgentEnvironment.continuation(env, f"{base}-b{env.branch + 1}")
                try:
                    branches.append(self._episode(nxt.traj_id, t.group_id, nxt, adapter.sample, adapter.tokenizer,
                                                  adapter.runner, adapter.tool_call_format))
                except EnvFault as fault:
                    out.extend(self._release(sid, None, f"the next branch could not start: {fault}"))
                continue
            if t.status is TrajectoryStatus.TRUNCATED:  # at maxNewTokens: the request in flight gets the turn so far
                adapter.answer_at_budget()
            aborted = t.status is TrajectoryStatus.ABORTED
            env.close("the episode was aborted" if aborted else "the episode ended", aborted=aborted)
            out.extend(self._release(sid, t))
            out.append(t)
        return out, branches

    def _release(self, sid: str, last: Trajectory | None, why: str = "") -> list[Trajectory]:
        held = self._held.pop(sid, [])
        for h in held:
            if last is None or last.status is TrajectoryStatus.ABORTED:
                h.status, h.reward, h.success = TrajectoryStatus.ABORTED, 0.0, False
                h.info["end_reason"] = why or "the session's last branch was aborted"
            else:
                h.reward, h.success = last.reward, last.success
        return held

    def abort(self, episodes: Sequence[Episode], snapshots: list[Trajectory]) -> list[Trajectory]:
        """Suspended episodes dropped for good: close their sessions; their held branches leave ABORTED too, and so
        do sessions still waiting for their first request."""
        out = list(snapshots)
        for p in self._pending:
            p.env.close("the job dropped the session", aborted=True)
            out.append(Trajectory(traj_id=p.tid, group_id=p.gid, task=self.name, tokens=[], prompt_len=0,
                                  loss_mask=[], versions=[], logp_mu=[], turn_ids=[], status=TrajectoryStatus.ABORTED,
                                  info={"end_reason": "the job dropped the session before its first request"}))
        self._pending = []
        for e in episodes:
            if isinstance(e.env, AgentAdapter):
                env = e.env.env
                env.close("the job dropped the episode", aborted=True)
                if env.session is not None:
                    out.extend(self._release(env.session.id, None, "the job dropped the session"))
        return out

    def close_evaluation(self, episodes: Sequence[Episode]) -> None:
        """An evaluation's sessions end with their one trajectory (a branch there ends the evaluation episode)."""
        for e in episodes:
            if isinstance(e.env, AgentAdapter):
                e.env.env.close("the evaluation episode ended")

    def close(self) -> None:
        self.endpoint.close()
        if self.loop is not None:
            self.loop.close()



__all__ = ["AgentHost", "advertised", "bind_address"]
