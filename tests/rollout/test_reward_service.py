"""The HTTP reward service client (rollout/envs/remote.py over service_client.py) against a real loopback
server (tests/support/reward_server.py) that can be down, slow, fail with 500s or answer garbage; the
hostile answers (redirects, drips, 300 MiB) are tests/rollout/test_hostile_services.py's."""

import json
import threading
from pathlib import Path

import pytest

from asyncrl.api.dataset import DatasetSpec, RewardServiceSpec
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.charset import TEXT_TOKENIZER
from asyncrl.rollout.envs.dataset import load_dataset
from asyncrl.rollout.envs.remote import RemoteReward
from asyncrl.rollout.envs.reward import DatasetEnv
from asyncrl.rollout.envs.runner import ENV_ERROR_REASONS, EnvFault, EnvRunner
from asyncrl.rollout.envs.service_client import REMOTE_ERROR_REASONS
from tests.support.helpers import wait_for
from tests.support.hostile_services import HostileServer
from tests.support.reward_server import RewardServer

HANG_S = 60.0  # a "slow" server's delay far past every deadline below: it answers only when stopped


def client(url: str, waits: list[float] | None = None, **kw: object) -> RemoteReward:
    spec = RewardServiceSpec.model_validate({"url": url, "timeoutSeconds": 2.0, "backoffSeconds": 0.01, **kw})
    return RemoteReward(spec, sleep=(waits.append if waits is not None else lambda s: None))


def fault(call) -> EnvFault:
    with pytest.raises(EnvFault) as info:
        call()
    return info.value


def test_every_remote_reason_is_a_label_of_the_env_error_counter() -> None:
    assert set(REMOTE_ERROR_REASONS) <= set(ENV_ERROR_REASONS)


def test_the_protocol_round_trip() -> None:
    with RewardServer() as server:
        score = client(server.url)
        assert score(" 4", 4, {"prompt": "2+2?", "answer": 4}) == 1.0
        assert score("5", 4, {"prompt": "2+2?", "answer": 4}) == 0.0
        assert server.bodies[0] == {"completion": " 4", "answer": 4, "sample": {"prompt": "2+2?", "answer": 4}}
        assert score.stats.requests == 2 and score.stats.retries == 0


def test_a_service_that_is_down_is_retried_with_backoff_then_unreachable() -> None:
    server = RewardServer()
    url = server.url
    server.stop()  # the port is closed: connections are refused
    waits: list[float] = []
    score = client(url, waits, retries=3, backoffSeconds=0.5, timeoutSeconds=10.0)  # the waits (3.5 s) fit
    f = fault(lambda: score("4", 4, {}))
    assert f.reason == "remote_unreachable" and "4 attempt(s) failed" in str(f)
    assert waits == [0.5, 1.0, 2.0]  # backoff doubles: 0.5, 0.5*2, 0.5*4
    assert score.stats.requests == 4 and score.stats.faults["remote_unreachable"] == 1


def test_a_slow_service_times_out_once_for_all_attempts() -> None:
    with RewardServer("slow", delay_s=HANG_S) as server:
        score = client(server.url, timeoutSeconds=0.2, retries=1)
        f = fault(lambda: score("4", 4, {}))
        assert f.reason == "remote_timeout" and "deadline of 0.2 s" in str(f)
        assert server.requests == 1 and "1 retries left out" in str(f)  # the one deadline is spent: no retry


def test_500s_are_retried_and_a_recovery_within_the_retries_loses_nothing() -> None:
    with RewardServer("500") as server:
        f = fault(lambda: client(server.url, retries=2)("4", 4, {}))
        assert f.reason == "remote_http_error" and "HTTP 500" in str(f)
        assert server.requests == 3
    with RewardServer("flaky", fail_first=2) as server:
        score = client(server.url, retries=2)
        assert score("4", 4, {}) == 1.0  # two 500s, then the answer
        assert score.stats.retries == 2 and sum(score.stats.faults.values()) == 0


@pytest.mark.parametrize(("mode", "reason", "text"), [
    ("400", "remote_http_error", "not retried"),
    ("garbage", "remote_bad_response", "not JSON"),
])
def test_answers_retrying_cannot_fix_are_not_retried(mode: str, reason: str, text: str) -> None:
    with RewardServer(mode) as server:
        f = fault(lambda: client(server.url, retries=3)("4", 4, {}))
        assert f.reason == reason and text in str(f)
        assert server.requests == 1


def test_a_json_answer_without_a_reward_is_a_bad_response() -> None:
    from asyncrl.rollout.envs.remote import need

    f = fault(lambda: need({"score": 1}, "reward", "reward service http://x/s", '{"reward": <number>}'))
    assert f.reason == "remote_bad_response" and '{"score": 1}' in str(f) and '{"reward": <number>}' in str(f)


def test_the_concurrency_limit_holds() -> None:
    """12 callers at once, limit 3: the server holds every answer at a gate, so the count is settled when the 3
    held requests and the 9 callers queued for a slot account for all 12; a 4th request would be held too."""
    with HostileServer("gate") as server:
        score = client(server.url, maxConcurrency=3, timeoutSeconds=120.0, retries=0)
        rewards: list[float] = []
        threads = [threading.Thread(target=lambda: rewards.append(score("4", 4, {}))) for _ in range(12)]
        for t in threads:
            t.start()
        try:
            # polled: a state that, once reached, stays until the gate opens
            wait_for(lambda: server.waiting + score.stats.waiting == 12, timeout=60, interval=0.005,
                     message="3 requests held and 9 callers queued")
            assert (server.waiting, score.stats.waiting, score.stats.in_flight) == (3, 9, 3)
        finally:
            server.open_gate()
            for t in threads:
                t.join()
        assert rewards == [1.0] * 12 and len(server.heads) == 12
        assert score.stats.most_in_flight == 3 and score.stats.in_flight == 0  # counted where the limit is decided


@pytest.fixture
def dataset(tmp_path: Path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "2+2?", "answer": 4}) + "\n")
    return load_dataset(DatasetSpec(path=str(tmp_path / "d.jsonl"), heldout_fraction=0.0))  # the one row trains


@pytest.mark.parametrize(("mode", "reason"), [
    ("down", "remote_unreachable"), ("slow", "remote_timeout"), ("500", "remote_http_error"),
    ("garbage", "remote_bad_response"), ("nan", "nonfinite_reward"),
])
def test_each_fault_reaches_the_episode_as_its_reason(dataset, mode: str, reason: str) -> None:
    """Through the same path a rollout worker takes: DatasetEnv behind a TurnAdapter, step on the runner."""
    server = RewardServer("ok" if mode == "down" else mode, delay_s=HANG_S if mode == "slow" else 0.0)
    if mode == "down":
        server.stop()
    runner = EnvRunner(timeout_s=10.0)
    try:
        env = DatasetEnv(dataset, client(server.url, timeoutSeconds=0.2, retries=1), "rewardService")
        adapter = TurnAdapter("dataset", env, dict(dataset.rows[0]), TEXT_TOKENIZER, runner=runner)
        adapter.reset()
        msg = adapter.end_of_turn("4" + TEXT_TOKENIZER.eos_token)
        assert msg is not None
        with pytest.raises(EnvFault) as info:
            adapter.finish_turn(msg, adapter.submit(msg).result())
        assert info.value.reason == reason
    finally:
        runner.close()
        if mode != "down":
            server.stop()


def test_the_copyable_example_service_speaks_the_protocol() -> None:
    """examples/tasks/reward_service.py (what docs/tasks.md tells users to copy) against this client."""
    import subprocess
    import sys

    from tests.support.helpers import ROOT

    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "tasks" / "reward_service.py"), "--port", "0"],
                            cwd=ROOT / "examples" / "tasks", stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]  # "scoring on http://127.0.0.1:<port>/score"
        score = client(url)
        assert score(" Paris\n", "paris", {"prompt": "Capital of France?"}) == 1.0
        assert 0.0 < score("parus", "paris", {}) < 0.5  # my_reward's partial credit
        # a request that is not a scoring request is the service's 400: not retried
        bad = RemoteReward(RewardServiceSpec(url=url, retries=3), sleep=lambda s: None)
        assert fault(lambda: bad._attempt(b'{"no": "completion"}')).reason == "remote_http_error"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_docs_fault_table_has_every_reason() -> None:
    from tests.support.helpers import ROOT

    table = (ROOT / "docs" / "tasks.md").read_text().split("## When user code fails", 1)[1]
    assert [r for r in ENV_ERROR_REASONS if f"`{r}`" not in table] == []


# ----------------------------------------------------------------------------- the environment service
def _remote_adapter(url: str, runner: EnvRunner, **args: object):
    from asyncrl.rollout.envs.remote import RemoteEnvironment

    env = RemoteEnvironment(url=url, timeoutSeconds=1.0, retries=1, backoffSeconds=0.01, **args)
    return TurnAdapter("remote", env, {"prompt": "2+2?", "answer": 4}, TEXT_TOKENIZER, runner=runner)


def test_an_environment_service_plays_a_two_turn_episode() -> None:
    eos = TEXT_TOKENIZER.eos_token
    with RewardServer() as server:
        runner = EnvRunner(timeout_s=10.0)
        try:
            adapter = _remote_adapter(server.url.removesuffix("/score"), runner)
            prompt = TEXT_TOKENIZER.decode(adapter.reset())
            assert "2+2?" in prompt
            first = adapter.end_of_turn("5" + eos)
            assert first is not None
            obs = adapter.finish_turn(first, adapter.submit(first).result())
            assert not obs.done and "Sure?" in TEXT_TOKENIZER.decode(list(obs.tokens))
            second = adapter.end_of_turn("4" + eos)
            assert second is not None
            done = adapter.finish_turn(second, adapter.submit(second).result())
            assert (done.done, done.reward, done.success) == (True, 1.0, True)
            assert server.bodies[-1]["message"] == {"role": "assistant", "content": "4"}
            assert adapter.info() == {"episode": "e1"}
        finally:
            runner.close()


def test_an_environment_service_that_fails_at_reset_is_an_env_fault() -> None:
    with RewardServer("500") as server:
        runner = EnvRunner(timeout_s=10.0)
        try:
            adapter = _remote_adapter(server.url.removesuffix("/score"), runner)
            assert fault(adapter.reset).reason == "remote_http_error"
            assert server.requests == 2  # retried once
        finally:
            runner.close()


def test_environment_service_args_are_checked_when_the_factory_is_built() -> None:
    from asyncrl.rollout.envs.remote import RemoteEnvironment

    with pytest.raises(ValueError, match=r"spec.task.args.url: .*not an http\(s\) URL"):
        RemoteEnvironment(url="env:8000")
    with pytest.raises(ValueError, match=r"spec.task.args.retry"):
        RemoteEnvironment(url="http://env:8000", retry=3)


def test_the_environment_timeout_bounds_the_call_when_it_is_shorter() -> None:
    with RewardServer("slow", delay_s=HANG_S) as server:
        spec = RewardServiceSpec(url=server.url, timeout_seconds=30.0, retries=5, backoff_seconds=0.01)
        score = RemoteReward(spec, budget_s=0.3)  # envTimeoutSeconds 0.3 < timeoutSeconds 30: 0.3 s for the call
        f = fault(lambda: score("4", 4, {}))
        assert f.reason == "remote_timeout"  # the service's own reason, not the runner's "timeout"
        assert server.requests == 1 and "5 retries left out" in str(f) and "envTimeoutSeconds=0.3" in str(f)
