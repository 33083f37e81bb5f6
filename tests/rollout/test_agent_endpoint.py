"""The OpenAI-compatible agent endpoint through a real rollout worker: the real openai client, real HTTP, a real
tiny torch model. Token labelling (sampled turns trained, everything the agent adds forced), branches, retries,
every fault costing its episode only, keys, and the external-session form driven by a second process."""

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory, TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker
from asyncrl.trainer.driver.loop.staleness import StalenessBuffer

PLUGINS = str(Path(__file__).parent / "plugins")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")


def _worker(agent: str, **task: Any) -> RolloutWorker:
    spec = TaskSpec(agent=agent, python_path=[PLUGINS], **{"group_size": 2, "max_new_tokens": 200, **task})
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True))
    w.load_weights(build_model(w.arch, seed=0).state_dict(), version=0)
    return w


def _runs(t: Trajectory, decode: Any) -> list[tuple[bool, str]]:
    """The trajectory after its prompt as runs of (sampled?, text)."""
    out: list[tuple[bool, str]] = []
    for tok, m in zip(t.tokens[t.prompt_len:], t.loss_mask[t.prompt_len:], strict=True):
        piece = decode([tok])
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + piece)
        else:
            out.append((m, piece))
    return out


def test_the_trajectory_trains_exactly_the_sampled_turns_and_forces_what_the_agent_adds() -> None:
    w = _worker("toy_agents:three_turns")
    import toy_agents  # on the path once the worker bound the task (spec.task.pythonPath)

    try:
        out = w.generate(2)
    finally:
        w.close()
    assert len(out) == 4 and all(t.status is TrajectoryStatus.FINISHED for t in out)
    tok = w.tokenizer
    eos = tok.decode([tok.eos_id])
    for t in out:
        assert t.reward == 0.5 and t.info["agent"] == {"requests": 3, "retries": 0, "branches": 0}
        runs = _runs(t, tok.decode)
        sampled = [text for m, text in runs if m]
        forced = [text for m, text in runs if not m]
        # three turns of max_tokens=6 sampled ids each, or fewer when the model sampled its end-of-turn token
        assert len(sampled) == 3
        for s in sampled:
            n = len(tok.encode(s.removesuffix(eos))) + s.endswith(eos)
            assert n == 6 or (n < 6 and s.endswith(eos)), s
        # what the agent added after each turn: the end-of-turn token when the turn lacked it, then its user message
        assert forced == [("" if sampled[k].endswith(eos) else eos) + f"more {k}" for k in (0, 1)]
        for i, m in enumerate(t.loss_mask):
            if m:
                assert t.versions[i] == 0 and t.logp_mu[i] <= 0.0
            else:
                assert t.versions[i] == NO_VERSION
    # the clients saw what was sampled: each answer's content is its turn's text, parsed (tool-call blocks out)
    from asyncrl.rollout.envs.toolcalls import parse_hermes

    contents = sorted(c for cs in toy_agents.SEEN.values() for c in cs)
    trained = sorted(parse_hermes(s)[0] for t in out for m, s in _runs(t, tok.decode) if m)
    assert contents == trained


def test_a_chat_template_session_forces_only_the_templates_tail() -> None:
    from transformers import AutoTokenizer

    from asyncrl.rollout.smollm import smollm2_gguf
    from asyncrl.rollout.tokenizer import HFTokenizer

    path = smollm2_gguf()
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = HFTokenizer(hf, "smollm2")
    spec = TaskSpec(agent="toy_agents:three_turns", python_path=[PLUGINS], group_size=1, max_new_tokens=200)
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True), tokenizer=tok)
    w.load_weights(build_model(w.arch, seed=0).state_dict(), version=0)
    try:
        (t,) = w.generate(1)
    finally:
        w.close()
    assert t.status is TrajectoryStatus.FINISHED, t.info
    prompt = tok.decode(t.tokens[: t.prompt_len])
    assert prompt.startswith("<|im_start|>system\nbe brief") and '"name":"lookup"' in prompt  # tools rendered
    assert prompt.endswith("<|im_start|>assistant\n")
    forced = [text for m, text in _runs(t, tok.decode) if not m]
    # a turn cut at max_tokens gets the template's end of turn forced, then exactly the tail up to the next header
    assert forced == [f"<|im_end|>\n<|im_start|>user\nmore {k}<|im_end|>\n<|im_start|>assistant\n" for k in (0, 1)]
    # the trained tokens are the sampled ids themselves: decoding and re-encoding them is not what was trained on
    sampled_ids = [i for i, m in zip(t.tokens, t.loss_mask, strict=True) if m]
    assert len(sampled_ids) == 18


def test_a_request_that_rewrites_history_starts_a_counted_branch_and_labels_nothing_twice() -> None:
    w = _worker("toy_agents:edits_history", group_size=2)
    try:
        out = w.generate(1)
        # the new branches ran in the same call (a branch joins the next round of the call that saw it)
    finally:
        w.close()
    assert w.agent_counters()["prefix_mismatch"] == 2
    superseded = [t for t in out if t.info.get("superseded_branch")]
    final = [t for t in out if not t.info.get("superseded_branch")]
    assert len(superseded) == 2 and len(final) == 2
    for t in out:
        assert t.status is TrajectoryStatus.FINISHED and t.reward == 1.0  # every branch: the session's reward
    def turns(t: Trajectory) -> list[str]:
        return [text for m, text in _runs(t, w.tokenizer.decode) if m]

    for t in final:
        assert t.info["agent"]["branches"] == 1 and t.traj_id.endswith("-b1")
        # two turns of at most max_tokens=5 after the rewritten history (a sampled end of turn ends one sooner)
        assert len(turns(t)) == 2 and all(len(w.tokenizer.encode(x)) <= 5 for x in turns(t))
        prompt = w.tokenizer.decode(t.tokens[: t.prompt_len])
        assert "start over" in prompt  # the rewritten request is the branch's prompt, never trained on
    for t in superseded:
        assert len(turns(t)) == 2  # its own two turns, and nothing of the next branch
    # the staleness buffer takes the group: two members (the last branches), the superseded ones ride along
    buf = StalenessBuffer(2, 1, base_version=0, group_size=2)
    assert buf.reserve(1, 0) == 1
    assert buf.put(out, 1) == 1


class _Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status_code, self._body = status, body

    def json(self) -> Any:
        return json.loads(self._body)


def _http(method: str, url: str, key: str = "", body: Any = None) -> _Answer:
    """One HTTP call with the standard library (the answer's status and body, errors included)."""
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return _Answer(r.status, r.read())
    except urllib.error.HTTPError as exc:
        return _Answer(exc.code, exc.read())


def _post(url: str, key: str, body: Any) -> _Answer:
    return _http("POST", url, key, body)


def test_an_sdk_retry_gets_the_recorded_answer_not_a_second_turn() -> None:
    w = _worker("external", group_size=1)
    try:
        got: dict[str, Any] = {}

        def harness() -> None:
            base = w.endpoint_url
            assert base is not None
            s = _http("POST", f"{base}/sessions", body={})
            while s.status_code == 429:
                s = _http("POST", f"{base}/sessions", body={})
            sess = s.json()
            body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                    "temperature": 0.2}  # not the job's 1.0: answered at the job's, counted
            first = _post(f"{sess['base_url']}/chat/completions", sess["api_key"], body)
            again = _post(f"{sess['base_url']}/chat/completions", sess["api_key"], body)  # the retry
            got.update(first=first.json(), again=again.json())
            _post(f"{sess['base_url']}/sessions/{sess['id']}/reward", sess["api_key"], {"reward": 1.0})

        th = threading.Thread(target=harness)
        th.start()
        (t,) = w.generate(1)
        th.join(30)
    finally:
        w.close()
    assert got["again"] == got["first"]
    assert w.agent_counters()["sampling_overridden"] == 2
    assert t.reward == 1.0 and 1 <= sum(t.loss_mask) <= 4  # one turn (max_tokens=4), sampled once
    assert t.info["agent"] == {"requests": 1, "retries": 1, "branches": 0}


@pytest.mark.parametrize(("agent", "reason"), [
    ("toy_agents:raises", "agent_exception"),
    ("toy_agents:no_reward", "agent_no_reward"),
    ("toy_agents:never_calls", "agent_no_request"),
    ("toy_agents:malformed", "agent_bad_request"),
    ("toy_agents:nan_reward", "nonfinite_reward"),
    ("toy_agents:hangs", "timeout"),
])
def test_each_fault_costs_its_episode_only_and_is_counted(agent: str, reason: str) -> None:
    w = _worker(agent, group_size=2, env_timeout_seconds=2.0)
    try:
        out = w.generate(1)
    finally:
        w.close()
    assert [t.status for t in out] == [TrajectoryStatus.ABORTED] * 2
    assert {t.info["env_error"] for t in out} == {reason}
    assert w.env_errors()[reason] == 2
    assert w.stats().trajectories_aborted == 2


def test_faulty_sessions_do_not_touch_the_healthy_ones() -> None:
    w = _worker("toy_agents:by_seed", group_size=2)
    try:
        out = w.generate(6)  # six groups of seeds: some raise, some never call the model, the rest are healthy
    finally:
        w.close()
    ok = [t for t in out if t.status is TrajectoryStatus.FINISHED]
    bad = [t for t in out if t.status is TrajectoryStatus.ABORTED]
    assert ok and bad and len(ok) + len(bad) == 12
    assert all(len([m for m, _ in _runs(t, w.tokenizer.decode) if m]) == 3 and t.reward == 0.5 for t in ok)
    assert sum(w.env_errors().values()) == len(bad)


def test_unknown_and_ended_keys_get_openai_errors() -> None:
    w = _worker("toy_agents:three_turns", group_size=1)
    try:
        w.generate(1)
        base = w.endpoint_url
        assert base is not None
        ended = next(iter(w.agent.endpoint.sessions._by_key)) if w.agent else ""

        async def ask(key: str) -> Exception:
            async with openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0) as c:
                try:
                    await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
                except openai.APIStatusError as exc:
                    return exc
            raise AssertionError("the request was answered")

        unknown, late = asyncio.run(ask("sk-nobody")), asyncio.run(ask(ended))
        models = _http("GET", f"{base}/models").json()
    finally:
        w.close()
    assert isinstance(unknown, openai.AuthenticationError) and unknown.status_code == 401
    assert isinstance(late, openai.NotFoundError) and late.status_code == 404
    body = late.body
    assert isinstance(body, dict) and body["code"] == "session_finished" and "has ended" in body["message"]
    assert models["object"] == "list" and models["data"][0]["owned_by"] == "asyncrl"
    assert w.agent_counters()["unauthorized"] == 2


HARNESS = r'''
import json, sys, time, urllib.error, urllib.request
import openai


def post(url, key="", body=None):
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())

base, n = sys.argv[1], int(sys.argv[2])
done = 0
client_sessions = []
while done < n:
    status, s = post(f"{base}/sessions")
    if status == 429:
        time.sleep(0.05)  # the harness's own polling back-off (its retry, not a test synchronisation)
        continue
    c = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    msgs = [{"role": "user", "content": f"task {s['sample']['seed'] % 7}"}]
    a = c.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    msgs += [a.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "x", "content": "42"}]
    c.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    status, _ = post(f"{base}/sessions/{s['id']}/reward", s["api_key"], {"reward": 0.25})
    assert status == 200, status
    done += 1
print("harness done", done)
'''


def test_an_external_harness_in_another_process_trains_through_sessions() -> None:
    w = _worker("external", group_size=2)
    try:
        base = w.endpoint_url
        proc = subprocess.Popen([sys.executable, "-c", HARNESS, str(base), "4"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        out = w.generate(2)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        w.close()
    assert proc.returncode == 0, stderr
    assert "harness done 4" in stdout
    assert len(out) == 4 and all(t.status is TrajectoryStatus.FINISHED and t.reward == 0.25 for t in out)
    assert all(len([m for m, _ in _runs(t, w.tokenizer.decode) if m]) == 2 for t in out)  # two turns each
    assert w.agent_counters()["sessions_claimed"] == 4


def test_the_cluster_addresses_the_operator_sets_are_read_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.rollout.agent.host import advertised, bind_address

    assert bind_address(0) == ("127.0.0.1", 0)  # a local run: loopback, a free port
    monkeypatch.setenv("ASYNCRL_AGENT_BIND", "0.0.0.0:8100")
    assert bind_address(3) == ("0.0.0.0", 8100)
    monkeypatch.setenv("ASYNCRL_AGENT_BIND", "8100")
    with pytest.raises(ValueError, match="host:port"):
        bind_address(0)
    assert advertised("http://10.1.2.3:8100") == "http://10.1.2.3:8100"
    assert advertised("http://fd00::5:8100") == "http://[fd00::5]:8100"  # an IPv6 pod address gets its brackets
    assert advertised("") is None


def test_taking_a_session_needs_the_session_key_when_the_job_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_AGENT_SESSION_KEY", "s3cret")
    w = _worker("external", group_size=1, env_timeout_seconds=5.0)
    try:
        base = w.endpoint_url
        assert base is not None
        w.agent.open("w0-g0-s0", "w0-g0", {"seed": 2}, w.tokenizer, w.runner, "hermes") if w.agent else None
        refused = [_http("POST", f"{base}/sessions", key, {}) for key in ("", "wrong")]
        taken = _http("POST", f"{base}/sessions", "s3cret", {})
    finally:
        w.close()
    assert [r.status_code for r in refused] == [401, 401]
    assert refused[1].json()["error"]["code"] == "invalid_api_key"
    assert taken.status_code == 200 and taken.json()["sample"] == {"seed": 2}


def test_the_endpoint_sends_answers_without_nagles_delay() -> None:
    import socket

    from asyncrl.rollout.agent.endpoint import AgentEndpoint

    ep = AgentEndpoint()
    try:
        assert ep._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0  # copied to accepted connections
        assert ep.base_url == f"http://127.0.0.1:{ep.port}/v1"
    finally:
        ep.close()


def test_unknown_routes_and_methods_get_openai_errors() -> None:
    from asyncrl.rollout.agent.endpoint import AgentEndpoint

    ep = AgentEndpoint()
    try:
        missing = _http("POST", f"{ep.base_url}/completions", body={"prompt": "x"})
        wrong = _http("GET", f"{ep.base_url}/chat/completions")
        health = _http("GET", f"http://127.0.0.1:{ep.port}/health")
    finally:
        ep.close()
    assert missing.status_code == 404
    err = missing.json()["error"]
    assert err["code"] == "not_found" and "/v1/chat/completions" in err["message"]
    assert err["type"] == "invalid_request_error"
    assert wrong.status_code == 405 and "GET is not allowed" in wrong.json()["error"]["message"]
    assert health.status_code == 200 and health.json() == {"ok": True, "sessions_waiting": 0}


def test_the_endpoint_runs_on_the_c_http_parser_and_loop() -> None:
    """httptools and uvloop are dependencies: without them uvicorn falls back to h11 and asyncio's loop, three times
    the CPU per request on the GIL the decode loop needs (bench/agent_endpoint.py --profile)."""
    from asyncrl.rollout.agent.endpoint import AgentEndpoint

    ep = AgentEndpoint()
    try:
        _http("GET", f"{ep.base_url}/models")
        config = ep._server.config
        assert config.loaded
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        assert issubclass(config.http_protocol_class, HttpToolsProtocol)  # httptools, under the guard (http_guard.py)
        loop = config.get_loop_factory()()  # what Server.run made the endpoint's loop with
        loop_kind = type(loop).__module__
        loop.close()
    finally:
        ep.close()
    assert loop_kind.startswith("uvloop"), loop_kind
