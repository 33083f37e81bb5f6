"""The session key and the handed-out sample (issue 35, part C), through a real rollout worker and real HTTP.

Before (measured on main): without ``sessionKeyFrom`` taking a session needed no key, and four keyless clients
claimed 924 sessions in 20 s while the honest harness got 1; each session handed out its dataset row with the
answer, held-out rows included; an empty ``$ASYNCRL_AGENT_SESSION_KEY`` turned the check off and a trailing
newline (a Secret made ``--from-file``) locked every harness out with 401.

After: a cluster always has a key (``tests/operator/test_agent_keys.py``); a key that is empty, padded or holds a
control character stops the worker (and ``asyncrl run``) at start, naming the variable and never the value;
keyless clients get 401 and claim nothing; the sample a harness gets has no answer field (the worker's scorer
still reads it).
"""

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.service import SecretKeyRef
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.agent.keys import SessionKeyError, is_loopback, session_key
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.worker import RolloutWorker

KEY = "k3y-" + "x" * 28  # 32 characters, as the operator's
ENV = "ASYNCRL_AGENT_SESSION_KEY"
TASKS = str(Path(__file__).resolve().parents[2] / "examples" / "tasks")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")
ROW = {"prompt": "Capital of France?", "answer": "paris", "category": "capital"}
REF = SecretKeyRef(name="harness", key="token")

# ---------------------------------------------------------------- the rules, one row per way to get it wrong

# (id, environment value (None: unset), sessionKeyFrom, bind host, what the refusal says)
REFUSED = [
    ("empty", "", None, "0.0.0.0", "is empty: an empty key would turn the check off"),
    ("blank", "   ", REF, "0.0.0.0", "is empty"),
    ("trailing-newline", KEY + "\n", REF, "0.0.0.0", "starts or ends with whitespace"),
    ("leading-space", " " + KEY, None, "127.0.0.1", "starts or ends with whitespace"),
    ("control-character", KEY[:8] + "\x00" + KEY[8:], None, "0.0.0.0", "holds a control character"),
    ("secret-named-but-unset", None, REF, "127.0.0.1", "sessionKeyFrom names Secret 'harness' key 'token'"),
    ("wide-bind-without-key", None, None, "0.0.0.0", "would listen on 0.0.0.0"),
    ("ipv6-wide-bind-without-key", None, None, "::", "would listen on ::"),
]


@pytest.mark.parametrize("value, key_from, host, says", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_key_that_cannot_work_is_refused_at_start_naming_the_variable_not_the_value(
        value: str | None, key_from: SecretKeyRef | None, host: str, says: str) -> None:
    environ = {} if value is None else {ENV: value}
    with pytest.raises(SessionKeyError) as err:
        session_key(environ, external=True, bind_host=host, key_from=key_from)
    text = str(err.value)
    assert says in text, text
    assert KEY not in text and "xxxx" not in text  # the value is never shown


def test_a_good_key_is_used_as_given_and_loopback_without_one_is_open_locally() -> None:
    assert session_key({ENV: KEY}, external=True, bind_host="0.0.0.0", key_from=REF) == KEY
    assert session_key({ENV: KEY}, external=True, bind_host="127.0.0.1") == KEY  # a local run that asks for one
    for host in ("127.0.0.1", "::1", "localhost"):  # a local run without a key: loopback only
        assert session_key({}, external=True, bind_host=host) is None
    # an in-process agent's sessions are never taken over HTTP: no key is read, whatever the environment says
    assert session_key({ENV: ""}, external=False, bind_host="0.0.0.0") is None
    assert [is_loopback(h) for h in ("127.0.0.5", "[::1]", "10.0.0.1", "0.0.0.0", "pod")] == \
        [True, True, False, False, False]


# ---------------------------------------------------------------- through a worker

def _worker(tmp_path: Path, **task: Any) -> RolloutWorker:
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({**ROW, "prompt": f"{ROW['prompt']} {i}"}) for i in range(8)) + "\n")
    spec = TaskSpec(agent="external", dataset={"path": str(data)}, reward="my_reward:score", python_path=[TASKS],
                    **{"group_size": 1, "max_new_tokens": 8, "env_timeout_seconds": 30.0, **task})
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True))
    w.load_weights(build_model(w.arch, seed=0).state_dict(), version=0)
    return w


def _take(base: str, key: str | None) -> tuple[int, dict[str, Any], bytes]:
    """POST /v1/sessions with ``key`` as the Bearer key (None: no Authorization header at all)."""
    req = urllib.request.Request(f"{base}/sessions", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw), raw
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw), raw


def test_a_worker_with_a_padded_key_does_not_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY + "\n")  # what `kubectl create secret --from-file` of an echoed file holds
    with pytest.raises(SessionKeyError, match="starts or ends with whitespace"):
        _worker(tmp_path)


def test_keyless_clients_claim_nothing_and_the_harness_gets_its_sample_without_the_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    w = _worker(tmp_path)
    try:
        assert w.agent is not None and w.endpoint_url is not None
        base = w.endpoint_url
        for i in range(4):
            w.agent.open(f"w0-g{i}-s0", f"w0-g{i}", dict(ROW), w.tokenizer, w.runner, "hermes")
        # four keyless clients, 25 tries each, while four sessions wait: each try is refused
        answers: list[int] = []
        lock = threading.Lock()

        def keyless(k: int) -> None:
            for j in range(25):
                status = _take(base, (None, "", "wrong", KEY[:-1])[(k + j) % 4])[0]
                with lock:
                    answers.append(status)

        threads = [threading.Thread(target=keyless, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        honest = [_take(base, KEY) for _ in range(4)]
        counters = w.agent_counters()
    finally:
        w.close()
    assert answers == [401] * 100
    assert counters["unauthorized"] == 100 and counters["sessions_claimed"] == 4
    for status, body, raw in honest:
        assert status == 200
        assert body["sample"] == {"prompt": ROW["prompt"], "category": "capital"}  # no answerField
        assert b"paris" not in raw


def test_the_worker_keeps_the_answer_for_its_scorer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    w = _worker(tmp_path)
    try:
        assert w.agent is not None and w.endpoint_url is not None
        w.agent.open("w0-g0-s0", "w0-g0", dict(ROW), w.tokenizer, w.runner, "hermes")
        status, body, _ = _take(w.endpoint_url, KEY)
        session = w.agent.endpoint.sessions.by_id(body["id"])
    finally:
        w.close()
    assert status == 200 and "answer" not in body["sample"]
    assert session is not None and session.sample["answer"] == "paris"  # task.reward reads it here, in the worker


# ---------------------------------------------------------------- asyncrl run: refused before Ray starts

@pytest.mark.parametrize("value, endpoint, says", [
    ("", "{}", "is empty"),
    (KEY + "\n", "{sessionKeyFrom: {name: harness, key: token}}", "starts or ends with whitespace"),
    (None, "{sessionKeyFrom: {name: harness, key: token}}", "is not set"),
], ids=["empty", "trailing-newline", "secret-named-but-unset"])
def test_asyncrl_run_refuses_an_unusable_key_before_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                        endpoint: str, says: str) -> None:
    import asyncrl.trainer.driver.loop.training_loop as loop
    from asyncrl.trainer.cli.commands import main

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray must not start for a job that is refused")

    monkeypatch.setattr(loop, "local_ray", refuse)
    monkeypatch.delenv("ASYNCRL_AGENT_BIND", raising=False)
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    job = tmp_path / "agent.yaml"
    job.write_text("apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: ext}\n"
                   f"spec:\n  task: {{agent: external, endpoint: {endpoint}}}\n")
    for command in (["run", str(job), "--run-dir", str(tmp_path / "run")], ["driver", "--spec", str(job), "--local"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"{job}: " in err and says in err and "ASYNCRL_AGENT_SESSION_KEY" in err, err
        assert KEY not in err
    assert not (tmp_path / "run").exists()
