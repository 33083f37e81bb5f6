"""Hostile and careless harnesses against a real rollout worker's agent endpoint (issue 35): one row per attack, each
answered with its documented status and counted under ``asyncrl_agent_requests_refused_total{reason}``, while an honest
harness (the real ``openai`` client, keep-alive, in this process beside the worker) keeps at least half the sessions
it completes alone, and the worker's memory stays under a cap that reading the attack whole would exceed.

Each row measures in the same test: the honest harness's completed sessions in a window alone, then in a window of the
same length while the attack runs (its own process, ``hostile_agent_client.py``, bounded loops, loopback only); the
assertion is on the ratio of those counts. "before" is what the unmodified endpoint did (measured on loopback: the
issue's figures, or ``AgentEndpoint`` alone with the same attack).
"""

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from asyncrl.api.agent import AgentEndpointSpec
from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker

pytestmark = pytest.mark.slow  # 17 rows of three 2.5 s windows each: ~3 min on 2 loaded cores

CLIENT = str(Path(__file__).parent / "hostile_agent_client.py")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")
WINDOW_S = 2.5  # each measuring window (the counts are compared, never the time)
MAX_NEW_TOKENS = 32
WARM_SESSIONS = 8
# Tries of a row's throughput: on a 2-core machine shared with other jobs a window's count drifts by 2x with their
# load; a refusal that really costs the worker fails every try (measured: 64 MiB header 25.7 -> 0.23 req/s before)
ATTEMPTS = 3
# the test's bounds: a short header timeout and a small connection cap keep the rows short; the rest are the defaults
ENDPOINT = AgentEndpointSpec(header_timeout_seconds=1.0, max_connections=96, max_branches=2)


def _rss_mib() -> tuple[float, float]:
    """(current, peak since the last reset) resident memory of this process, the worker's, in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


@dataclass
class Honest:
    """An honest external harness: take a session, one turn (the real openai client), post the reward; repeat."""

    base: str
    done: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    warm: threading.Event = field(default_factory=threading.Event)  # set after WARM_SESSIONS sessions

    def run(self) -> None:
        hub = openai.OpenAI(base_url=self.base, api_key="none", max_retries=2, timeout=60)  # one keep-alive pool
        while not self.stop.is_set():
            try:
                s: Any = hub.post("/sessions", cast_to=object, body={})
            except openai.RateLimitError:  # no session waits yet (429): the harness's own short back-off
                self.stop.wait(0.01)
                continue
            except openai.APIError as exc:
                self.failed.append(f"claim: {exc}")
                continue
            c = hub.with_options(api_key=s["api_key"])
            try:
                c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
                c.post(f"/sessions/{s['id']}/reward", cast_to=object, body={"reward": 1.0})
                self.done += 1
                if self.done >= WARM_SESSIONS:
                    self.warm.set()
            except openai.APIError as exc:
                self.failed.append(f"session: {exc}")


@dataclass
class Rig:
    worker: RolloutWorker
    honest: Honest
    trajectories: list[Trajectory]
    # the honest sessions of the last window measured alone, right after an attack ended: the next attack's
    # "before" window (the rows run back to back, so one window brackets two attacks); None: measure one
    alone_after: int | None = None

    def refused(self) -> dict[str, int]:
        assert self.worker.agent is not None
        return self.worker.agent.endpoint.refusals.snapshot()


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    spec = TaskSpec(agent="external", group_size=1, max_new_tokens=MAX_NEW_TOKENS, env_timeout_seconds=5.0,
                    endpoint=ENDPOINT)
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True))
    w.load_weights(build_model(w.arch, seed=0).state_dict(), version=0)
    assert w.endpoint_url is not None
    out: list[Trajectory] = []
    stop = threading.Event()

    def generate() -> None:
        while not stop.is_set():
            out.extend(w.generate(4))  # four sessions a round: one slow session stalls a round, not the worker

    gen = threading.Thread(target=generate, name="generate", daemon=True)
    honest = Honest(w.endpoint_url)
    harness = threading.Thread(target=honest.run, name="honest", daemon=True)
    gen.start()
    harness.start()
    assert honest.warm.wait(120), honest.failed[:3]  # the first rounds (allocations, the runner) are not measured
    try:
        yield Rig(w, honest, out)
    finally:
        honest.stop.set()
        harness.join(60)
        stop.set()
        gen.join(60)
        w.close()


@dataclass(frozen=True)
class Row:
    id: str  # the attack (hostile_agent_client.py's row name)
    reason: str  # the refusal counted (asyncrl_agent_requests_refused_total{reason})
    expect: dict[str, Any]  # what the attacker saw (a subset of its JSON result)
    before: str  # what the unmodified endpoint did
    refused_at_least: int = 1
    rss_cap_mib: float = 48.0  # growth of the worker's peak RSS during the attack


ROWS = [
    Row("reward:1e30", "reward_out_of_range", {"status": 400, "json": True, "code": "reward_out_of_range"},
        "200; one such session per group made the loss -1.4e22 and the gradient norm NaN"),
    Row("reward:1e300", "reward_out_of_range", {"status": 400, "json": True, "code": "reward_out_of_range"},
        "200; inf in float32, every later step trained 0 tokens, reward_mean 1e300"),
    Row("reward:" + "1" * 400, "reward_out_of_range", {"status": 400, "json": True, "code": "reward_out_of_range"},
        "500 text/plain (OverflowError traceback)"),
    Row("reward:NaN", "reward_out_of_range", {"status": 400, "json": True, "code": "reward_out_of_range"},
        "400 (already refused)"),
    Row("after_abort", "session_aborted", {"status": 409, "json": True, "code": "session_aborted"},
        "200 (the reward of an aborted session taken)"),
    Row("context", "context_length_exceeded", {"status": 400, "json": True, "code": "context_length_exceeded"},
        "a 16 KB first request took the actor from 842 MiB to 7.2 GB"),
    Row("header", "header_too_large", {"status": 431, "code": "header_too_large"},
        "64 MiB header read whole and answered 200 after 67 s, +64 MiB RSS; honest 25.7 -> 0.23 req/s",
        rss_cap_mib=32.0),
    Row("body", "body_too_large", {"status": 413, "code": "request_too_large"},
        "512 MiB body read whole before its 413: 4.3 s, +504 MiB RSS", rss_cap_mib=64.0),
    Row("slowloris", "header_timeout", {"held": 0}, "40 connections held open with no deadline (8 s and counting)",
        refused_at_least=40),
    Row("flood", "too_many_connections", {"held": 0},
        "900 of 900 half-open connections held; 1,008 held the worker at its fd limit (0.01 req/s)",
        refused_at_least=100),
    Row("branches", "too_many_branches", {"reward_status": 409, "codes": {"too_many_branches": 1,
                                                                        "session_aborted": 400 - 2 - 1}},
        "400 branches taken, all 401 trajectories trained on the session's reward"),
    Row("deep", "bad_request", {"status": 400, "json": True, "code": "json_too_deep"},
        "500 text/plain (RecursionError traceback)"),
    Row("role", "bad_request", {"status": 400, "json": True, "code": "string_too_long"},
        "400 whose message echoed the 1 MB role (1,000,292 bytes back)"),
    Row("budget", "bad_request", {"status": 200}, "a bare 404 for the turn that hit maxNewTokens",
        refused_at_least=0),
    Row("tool_choice", "bad_request", {"status": 400, "json": True, "param": "tool_choice"},
        "200: silently ignored (the turn sampled as if auto)"),
    Row("logit_bias", "bad_request", {"status": 400, "json": True, "param": "logit_bias"},
        "200: silently ignored"),
    Row("unauthorized", "unauthorized", {}, "honest 51.9 -> 9.95 req/s under a 401 flood", refused_at_least=50),
]


def _honest_in_window(rig: Rig) -> int:
    """Sessions the honest harness completes in one window."""
    start = rig.honest.done
    rig.honest.stop.wait(WINDOW_S)
    return rig.honest.done - start


def _subset(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _subset(got[k], v) for k, v in want.items())
    return bool(got == want)


@dataclass(frozen=True)
class Measured:
    alone: float  # honest sessions in a window alone (the mean of the windows before and after the attack)
    during: int  # honest sessions in the window of the attack
    got: dict[str, Any]  # what the attacker saw
    refused: dict[str, int]  # refusals counted during the attack, by reason
    rss_growth_mib: float  # the worker's peak RSS during the attack over its RSS before


def _attack(rig: Rig, row: Row) -> Measured:
    port = rig.worker.agent.endpoint.port if rig.worker.agent else 0
    # the attacker at the lowest CPU priority: on this machine's few cores it stands for a client on another host,
    # so that what is measured is the endpoint's own cost of refusing it
    attack = subprocess.Popen(["nice", "-n", "19", sys.executable, CLIENT, "127.0.0.1", str(port), row.id,
                               str(WINDOW_S)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert attack.stdin is not None and attack.stdout is not None
    assert attack.stdout.readline().strip() == "ready"
    # the honest harness alone (the attacker waits for its go): the window right after the previous attack, if any
    alone = _honest_in_window(rig) if rig.alone_after is None else rig.alone_after
    rig.alone_after = None
    before = rig.refused()
    rss0, _ = _rss_mib()
    _reset_peak()
    start = rig.honest.done
    attack.stdin.write("go\n")
    attack.stdin.flush()
    rig.honest.stop.wait(WINDOW_S)
    during = rig.honest.done - start
    stdout, stderr = attack.communicate(timeout=120)
    _, peak = _rss_mib()
    assert attack.returncode == 0, stderr[-2000:]
    refused = {k: v - before[k] for k, v in rig.refused().items()}
    rig.alone_after = _honest_in_window(rig)
    alone = (alone + rig.alone_after) / 2  # alone before and after: the machine's load drifts
    return Measured(alone, during, json.loads(stdout.strip().splitlines()[-1]), refused, peak - rss0)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id[:20])
def test_a_hostile_request_is_refused_counted_and_bounded_while_an_honest_harness_goes_on(rig: Rig, row: Row) -> None:
    ratios: list[str] = []
    for _ in range(ATTEMPTS):  # the answer, the count and the memory hold every time; the throughput once in three
        m = _attack(rig, row)
        got, refused = m.got, m.refused
        assert _subset(got, row.expect), (got, row.before)
        assert refused[row.reason] >= row.refused_at_least, refused
        assert m.rss_growth_mib < row.rss_cap_mib, f"the worker's RSS grew {m.rss_growth_mib:.0f} MiB under {row.id}"
        if row.id in ("header", "body"):  # cut off early: nowhere near the whole attack was taken
            assert got["sent_mib"] < 32, got
        if row.id == "slowloris":
            assert got["statuses"] == [408] * 40, got
        if row.id == "flood":  # over the cap answered 503 at once, the rest closed at the header timeout
            assert set(got["statuses"]) <= {503, 408} and 503 in got["statuses"], got
        if row.id == "branches":  # the cap's branches taken, the next refused and the session aborted: the rest 409
            assert got["statuses"] == {"200": 2, "400": 1, "409": 400 - 2 - 1}, got
            assert refused["session_aborted"] >= 400 - 2 - 1, refused
        if row.id == "budget":
            assert got["finishes"][-1] == "length", got
        if row.id == "role":
            assert got["bytes"] < 2048, got  # the megabyte is not echoed back
        if row.id == "unauthorized":
            assert set(got["statuses"]) == {"401"}, got
            assert refused["unauthorized"] == sum(got["statuses"].values()), (refused, got)
        assert m.alone > 0, "the honest harness completed nothing alone"
        ratios.append(f"{m.during}/{m.alone:g}")
        if m.during / m.alone >= 0.5:
            print(f"{row.id[:20]}: honest sessions {m.during} under the attack, {m.alone:g} alone; RSS "
                  f"+{m.rss_growth_mib:.0f} MiB; refused {refused[row.reason]} ({row.reason})")
            return
    raise AssertionError(f"honest sessions under {row.id} / alone, each try: {ratios}")


def test_a_session_past_the_branch_cap_trains_nothing(rig: Rig) -> None:
    """The branches row's session: its maxBranches + 1 trajectories (one per branch taken) all left ABORTED, so none
    of them trains on its reward (before: all 401 did)."""
    by_session: dict[str, list[Trajectory]] = {}
    for t in list(rig.trajectories):
        if t.info.get("session"):  # (an episode that failed before its first request has none)
            by_session.setdefault(str(t.info["session"]), []).append(t)
    branched = [ts for ts in by_session.values() if len(ts) > 1]
    assert branched, "the branches row ran first"
    for ts in branched:
        assert len(ts) <= ENDPOINT.max_branches + 1, [t.traj_id for t in ts]
        assert {t.status for t in ts} == {TrajectoryStatus.ABORTED}, [(t.traj_id, t.status) for t in ts]


def test_the_refusals_reach_prometheus_with_every_reason_preset(rig: Rig) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from asyncrl.rollout.agent.limits import REFUSAL_REASONS

    assert rig.worker.endpoint_url is not None
    with urllib.request.urlopen(rig.worker.endpoint_url.removesuffix("/v1") + "/metrics", timeout=30) as r:
        text = r.read().decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "asyncrl_agent_requests_refused"]
    reasons = {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert set(reasons) == set(REFUSAL_REASONS)
    assert reasons == {k: float(v) for k, v in rig.refused().items()}


def test_an_honest_harness_is_never_refused(rig: Rig) -> None:
    assert rig.honest.failed == [], rig.honest.failed[:5]
