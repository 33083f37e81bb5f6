"""DedicatedPlan: every sampled token scored exactly once under its own version, while resident.

The property test drives random schedules (generate calls admitted and returned with partial
rollouts spanning versions, scorers executing their calls in Ray's per-caller order, answers
arriving late, trains, drops, scorers killed and replaced) through the plan and fake scorers whose
"log-prob" of a token is a pure function of (token, position, *the scorer's resident version*): a
token scored under any other version, or twice, or never, is caught.
"""

import random
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus
from asyncrl.trainer.oldlogits.dedicated_plan import Advance, DedicatedPlan, Push, ScoreRequest


def _logp(token: int, position: int, version: int) -> float:
    """What the fake scorer returns: distinct per (token, position, version), finite, < 0."""
    return -0.001 - (token * 7 + position * 13 + version * 101) % 997 / 1000.0


class CountingTrajectory(Trajectory):
    """A Trajectory that counts how often each position was given an old log-prob."""

    def set_logp_old(self, positions: list[int], values: list[float]) -> None:
        counts = self.info.setdefault("score_counts", {})
        for p in positions:
            counts[p] = counts.get(p, 0) + 1
        super().set_logp_old(positions, values)


def _traj(tid: str, versions: list[int], rng: random.Random) -> CountingTrajectory:
    """Prompt of 2 tokens, then sampled tokens of ``versions`` with an environment token between turns."""
    tokens, mask, vers = [rng.randrange(50), rng.randrange(50)], [False, False], [-1, -1]
    for i, v in enumerate(versions):
        if i and rng.random() < 0.2:  # an environment (tool) token
            tokens.append(rng.randrange(50))
            mask.append(False)
            vers.append(-1)
        tokens.append(rng.randrange(50))
        mask.append(True)
        vers.append(v)
    n = len(tokens)
    return CountingTrajectory(
        traj_id=tid, group_id=tid, task="t", tokens=tokens, prompt_len=2, loss_mask=mask, versions=vers,
        logp_mu=[0.0] * n, turn_ids=[0 if m else -1 for m in mask],
    )


@dataclass
class FakeScorer:
    """A replica: executes its calls one at a time in submission order (as a Ray actor does)."""

    queue: deque = field(default_factory=deque)
    pushed: set[int] = field(default_factory=set)
    resident: int = -1

    def execute(self) -> tuple[int, list[list[float]]] | None:
        action = self.queue.popleft()
        if isinstance(action, Push):
            assert action.version > self.resident, (action, self.resident)
            self.pushed.add(action.version)
        elif isinstance(action, Advance):
            assert action.version == self.resident or action.version in self.pushed, (action, self.pushed)
            self.resident = action.version
            self.pushed = {v for v in self.pushed if v > action.version}
        else:
            assert isinstance(action, ScoreRequest)
            assert action.version == self.resident, (action.version, self.resident)
            values = [[_logp(s.tokens[p], p, self.resident) for p in s.positions] for s in action.segments]
            return action.request_id, values
        return None


class World:
    """The driver around the plan, with fake generate calls and fake scorers."""

    def __init__(self, replicas: int, max_lag: int, start: int, rng: random.Random) -> None:
        self.rng = rng
        self.plan = DedicatedPlan(replicas=replicas, max_lag_versions=max_lag, start_version=start)
        self.max_lag = max_lag
        self.version = start
        self.scorers: dict[int, FakeScorer | None] = {r: FakeScorer() for r in range(replicas)}
        self.calls: dict[int, int] = {}  # call id -> admission version
        self.buffer: dict[str, CountingTrajectory] = {}
        self.answers: list[tuple[int, list[list[float]]]] = []
        self.trained: list[tuple[CountingTrajectory, int]] = []
        self.ids = 0
        self.dispatch()

    def dispatch(self) -> None:
        for action in self.plan.next_actions():
            scorer = self.scorers[action.replica]
            assert scorer is not None, f"{action} sent to a dead replica"
            scorer.queue.append(action)

    # ---- events
    def admit(self) -> None:
        self.ids += 1
        self.calls[self.ids] = self.version
        self.plan.admitted(self.ids, self.version)

    def return_call(self, cid: int | None = None) -> None:
        if not self.calls:
            return
        cid = cid if cid is not None else self.rng.choice(sorted(self.calls))
        admitted = self.calls.pop(cid)
        trajs = []
        for k in range(self.rng.randrange(1, 4)):
            n = self.rng.randrange(1, 6)
            # Partial rollout: nondecreasing versions from the admission version (the first token's) to
            # the actor's version now.
            versions = [admitted, *sorted(self.rng.randrange(admitted, self.version + 1) for _ in range(n))]
            trajs.append(_traj(f"c{cid}-{k}", versions, self.rng))
        if trajs and self.rng.random() < 0.1:
            trajs[0].status = TrajectoryStatus.ABORTED  # never trained: the plan must ignore it
        unscorable = self.plan.returned(cid, trajs)
        assert unscorable == [], unscorable  # calls admitted at the actor's version never break the rule
        self.buffer |= {t.traj_id: t for t in trajs if t.status is not TrajectoryStatus.ABORTED}

    def execute(self) -> bool:
        live = [r for r, s in self.scorers.items() if s is not None and s.queue]
        if not live:
            return False
        answer = self.scorers[self.rng.choice(live)].execute()  # type: ignore[union-attr]
        if answer is not None:
            self.answers.append(answer)
        return True

    def deliver(self) -> bool:
        if not self.answers:
            return False
        self.plan.scored(*self.answers.pop(self.rng.randrange(len(self.answers))))
        return True

    def kill(self) -> None:
        r = self.rng.choice(sorted(self.scorers))
        if self.scorers[r] is not None:
            self.scorers[r] = None  # its queued calls die with it; answers already sent may still arrive
            self.plan.replica_lost(r)

    def replace(self) -> None:
        for r, s in self.scorers.items():
            if s is None:
                self.scorers[r] = FakeScorer()
                self.plan.replica_replaced(r)

    def drop(self) -> None:
        if self.buffer:
            tid = self.rng.choice(sorted(self.buffer))
            del self.buffer[tid]
            self.plan.released([tid])

    def train(self, wait: bool) -> None:
        if not self.buffer:
            return
        batch = [self.buffer[t] for t in self.rng.sample(sorted(self.buffer), min(3, len(self.buffer)))]
        gate = self.plan.gate(batch, self.version)
        if gate.wait and wait:
            gate = self.wait_for(batch)
        if gate.wait:
            return
        assert gate.lag <= self.max_lag
        for t in batch:
            self.check_scored(t, self.version)
            del self.buffer[t.traj_id]
            self.trained.append((t, self.version))
        self.plan.released([t.traj_id for t in batch])
        self.version += 1
        self.plan.published(self.version)

    def wait_for(self, batch: list[CountingTrajectory]):  # noqa: ANN201 -- TrainGate
        """What the driver does at a closed gate: keep collecting; calls eventually return."""
        for _ in range(2_000):
            self.replace()
            progressed = self.execute() or self.deliver()
            if not progressed and self.calls:
                self.return_call(min(self.calls))
            self.dispatch()
            gate = self.plan.gate(batch, self.version)
            if not gate.wait:
                return gate
        raise AssertionError(f"deadlock: gate still closed, {gate.reason}; plan {self.plan.state()}")

    def check_scored(self, t: CountingTrajectory, trained_at: int) -> None:
        counts = t.info.get("score_counts", {})
        for i, (m, v) in enumerate(zip(t.loss_mask, t.versions, strict=True)):
            if not m:
                assert i not in counts
                continue
            assert counts.get(i, 0) <= 1, f"{t.traj_id} position {i} scored {counts[i]} times"
            if v < trained_at:
                assert counts.get(i, 0) == 1, f"{t.traj_id} position {i} (version {v}) trained unscored"
            if counts.get(i):
                assert t.logp_old is not None
                assert t.logp_old[i] == _logp(t.tokens[i], i, v), f"{t.traj_id} position {i} not scored under {v}"


OPS = ["admit", "admit", "return", "execute", "execute", "execute", "deliver", "deliver", "train",
       "train_wait", "drop", "kill", "replace"]


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=10, max_size=150),
    seed=st.integers(0, 2**32 - 1),
    replicas=st.integers(1, 3),
    max_lag=st.integers(0, 3),
    start=st.integers(0, 4),
)
def test_random_schedules_score_each_token_once_under_its_version(
    ops: list[str], seed: int, replicas: int, max_lag: int, start: int
) -> None:
    w = World(replicas, max_lag, start, random.Random(seed))
    for op in ops:
        if op == "admit":
            w.admit()
        elif op == "return":
            w.return_call()
        elif op == "execute":
            w.execute()
        elif op == "deliver":
            w.deliver()
        elif op in ("train", "train_wait"):
            w.train(wait=op == "train_wait")
        elif op == "drop":
            w.drop()
        elif op == "kill":
            w.kill()
        else:
            w.replace()
        w.dispatch()
        assert w.plan.resident <= w.version
    # Liveness: every call returns, dead scorers are replaced; everything left trains, one batch per step.
    for cid in sorted(w.calls):
        w.return_call(cid)
        w.dispatch()
    while w.buffer:
        before = len(w.buffer)
        w.train(wait=True)
        assert len(w.buffer) < before
    for t, at in w.trained:
        w.check_scored(t, at)
    w.replace()
    w.dispatch()
    while w.execute() or w.deliver():
        w.dispatch()
    assert w.plan.resident == w.version  # nothing holds the scorers back any more
    state = w.plan.state()
    assert state.pending_tokens == 0 and state.outstanding_requests == 0


def test_advance_waits_for_calls_admitted_at_or_below_the_resident_version() -> None:
    plan = DedicatedPlan(replicas=1, max_lag_versions=1, start_version=0)
    assert plan.next_actions() == [Push(0, 0), Advance(0, 0)]  # bootstrap
    plan.admitted("a", 0)
    plan.published(1)
    plan.published(2)
    # A call admitted at 0 may still bring tokens of version 0: the scorer stays at 0.
    assert plan.next_actions() == [Push(0, 1), Push(0, 2)]
    assert plan.resident == 0
    gate = plan.gate([], actor_version=2)
    assert gate.wait and gate.over_lag and gate.lag == 2 and "trail the actor by 2" in gate.reason
    rng = random.Random(0)
    t = _traj("t", [0, 0, 1, 2], rng)  # a partial rollout spanning three versions
    assert plan.returned("a", [t]) == []
    actions = plan.next_actions()
    assert len(actions) == 1 and isinstance(actions[0], ScoreRequest)
    req = actions[0]
    assert (req.version, req.tokens) == (0, 2)
    # Unanswered: the scorer may not leave version 0 yet, whatever else is ready.
    assert plan.next_actions() == [] and plan.resident == 0
    assert plan.scored(req.request_id, [[-1.0, -2.0]]) == 2
    actions = plan.next_actions()  # one jump 0 -> 1 (version 1 has work); then version 1's request
    assert actions[0] == Advance(0, 1) and isinstance(actions[1], ScoreRequest) and actions[1].version == 1
    gate = plan.gate([t], actor_version=2)
    assert gate.wait and gate.unscored_tokens == 1 and gate.unscored_versions == (1,) and not gate.over_lag


def test_a_lost_scorer_s_requests_go_to_a_live_replica_and_a_late_answer_is_ignored() -> None:
    plan = DedicatedPlan(replicas=2, max_lag_versions=1, start_version=3)
    plan.next_actions()
    plan.admitted(1, 3)
    rng = random.Random(1)
    trajs = [_traj(f"t{i}", [3] * (i + 1), rng) for i in range(4)]
    plan.returned(1, trajs)
    reqs = [a for a in plan.next_actions() if isinstance(a, ScoreRequest)]
    assert sorted(r.replica for r in reqs) == [0, 1]  # spread over both replicas
    assert sum(r.tokens for r in reqs) == 1 + 2 + 3 + 4
    lost = next(r for r in reqs if r.replica == 1)
    assert plan.replica_lost(1) == lost.tokens
    reissued = [a for a in plan.next_actions() if isinstance(a, ScoreRequest)]
    assert [r.replica for r in reissued] == [0] and reissued[0].tokens == lost.tokens
    assert plan.scored(lost.request_id, [[-1.0] * len(s.positions) for s in lost.segments]) == 0  # ignored
    # The replacement is bootstrapped with the resident version before it gets work.
    plan.replica_replaced(1)
    assert plan.next_actions()[:2] == [Push(1, 3), Advance(1, 3)]


def test_tokens_of_a_version_already_left_are_unscorable_not_rescored() -> None:
    plan = DedicatedPlan(replicas=1, max_lag_versions=2, start_version=0)
    plan.next_actions()
    plan.published(1)
    plan.next_actions()
    assert plan.resident == 1
    with pytest.raises(ValueError, match="admitted at version 0, older than the scorers' resident version 1"):
        plan.admitted("late", 0)
    plan.admitted("x", 1)
    t = _traj("old", [0, 1], random.Random(2))  # a worker that broke the admission rule
    assert plan.returned("x", [t]) == ["old"]
    assert plan.state().unscorable_trajectories_total == 1 and plan.state().trajectories == 0
    # Trained anyway, it would wait forever: the gate names it instead.
    with pytest.raises(ValueError, match=r"trajectories \['old'\] \(of 1\) have unscored tokens older than version 1"):
        plan.gate([t], actor_version=1)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match=r"replicas must be >= 1, got 0.*maxLagVersions must be >= 0, got -1"):
        DedicatedPlan(replicas=0, max_lag_versions=-1, start_version=0)
    plan = DedicatedPlan(replicas=1, max_lag_versions=0, start_version=0)
    with pytest.raises(ValueError, match="expected version 1 .* got 3"):
        plan.published(3)
    with pytest.raises(KeyError, match="call 'nope' was never admitted"):
        plan.returned("nope", [])
    plan.next_actions()
    plan.admitted(1, 0)
    plan.returned(1, [_traj("t", [0], random.Random(3))])
    req = plan.next_actions()[0]
    assert isinstance(req, ScoreRequest)
    with pytest.raises(ValueError, match=r"trajectory t: 1 values for 1 positions, non-finite at positions \[\d+\]"):
        plan.scored(req.request_id, [[float("nan")]])
