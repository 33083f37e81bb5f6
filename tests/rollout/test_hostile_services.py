"""A reward service that attacks its client (tests/support/hostile_services.py): every answer of
HOSTILE_ANSWERS ends in its reason, bounded by the call's deadline or the body cap, never by the
server's patience; header secrets and URL tokens never show; validation names the destinations a
job should not call."""

import pytest

from asyncrl.api.dataset import RewardServiceSpec
from asyncrl.api.service import HeaderFromSecret, destination_warnings, header_env_var, redact_url
from asyncrl.api.task import TaskSpec
from asyncrl.api.task_services import REMOTE_ENVIRONMENT, header_env, service_warnings, task_services
from asyncrl.rollout.envs.remote import RemoteEnvironment, RemoteReward
from asyncrl.rollout.envs.runner import EnvFault
from tests.support.hostile_services import HOSTILE_ANSWERS, MIB, HostileAnswer, HostileServer
from tests.support.reward_server import RewardServer

CAP = 64 * 1024  # maxResponseBytes of these tests
SECRET = "Bearer s3cr3t-value"


def client(url: str, **kw: object) -> RemoteReward:
    spec = RewardServiceSpec.model_validate({
        "url": url, "timeoutSeconds": 1.0, "retries": 2, "backoffSeconds": 0.01, "maxResponseBytes": CAP, **kw})
    return RemoteReward(spec, sleep=lambda s: None)


def fault(call) -> EnvFault:
    with pytest.raises(EnvFault) as info:
        call()
    return info.value


@pytest.mark.parametrize("row", HOSTILE_ANSWERS, ids=lambda r: r.mode)
def test_a_hostile_answer_ends_in_its_reason_within_the_deadline_and_the_cap(row: HostileAnswer) -> None:
    with HostileServer("ok") as elsewhere:
        target = f"{elsewhere.url}?token=t0ken-in-query"  # e.g. http://169.254.169.254/latest/meta-data/
        with HostileServer(row.mode, redirect_to=target) as server:
            score = client(server.url)
            f = fault(lambda: score("4", 4, {}))
            assert f.reason == row.reason, str(f)
            assert all(s in str(f) for s in row.says), str(f)
            assert len(server.heads) == 1  # refused answers are not retried; a timeout leaves no time to retry
            assert elsewhere.heads == []  # the redirect was not followed
            if row.mode == "redirect":  # where it pointed, without its query
                assert "t0ken" not in str(f) and f"to http://127.0.0.1:{elsewhere.port}/score:" in str(f)
            if row.mode in ("huge-streamed", "huge-chunked"):
                # the cap logic read exactly CAP + 1 bytes (read asks for at most what is left under the cap)
                assert f"refused after reading {CAP + 1}" in str(f)
            if row.mode.startswith("huge"):
                assert server.sent < 300 * MIB  # the client stopped reading; the rest never left the server
            if row.reason == "remote_timeout":
                assert "deadline of 1 s" in str(f) and "2 retries left out" in str(f)


def test_a_redirect_to_the_same_service_is_not_followed_either() -> None:
    with RewardServer() as real:
        with HostileServer("redirect", redirect_to=real.url) as server:
            f = fault(lambda: client(server.url)("4", 4, {}))
            assert f.reason == "remote_http_error" and real.requests == 0


def test_headers_from_secrets_are_sent_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_SERVICE_HEADER_AUTHORIZATION", SECRET + "\n")  # a Secret made from a file
    monkeypatch.setenv("ASYNCRL_SERVICE_HEADER_X_API_KEY", "k-123")
    headers = [{"name": "Authorization", "secretKeyRef": {"name": "reward-token", "key": "token"}},
               {"name": "X-Api-Key", "secretKeyRef": {"name": "reward-token", "key": "key"}}]
    with RewardServer("400") as server:
        score = client(server.url + "?token=q-secret", headersFrom=headers)
        f = fault(lambda: score("4", 4, {}))
        sent = server.headers[0]
        assert sent["Authorization"] == SECRET and sent["X-Api-Key"] == "k-123"  # stripped of the newline
        shown = f"{f} {score.stats} {score.client.__dict__.keys()}"
        assert "s3cr3t" not in shown and "k-123" not in shown and "q-secret" not in shown
        assert f"http://127.0.0.1:{server.port}/score refused" in str(f)


def test_a_missing_header_variable_names_the_header_and_the_variable_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCRL_SERVICE_HEADER_AUTHORIZATION", raising=False)
    monkeypatch.setenv("ASYNCRL_SERVICE_HEADER_X_API_KEY", "bad\r\nInjected: 1")
    spec = RewardServiceSpec.model_validate({"url": "http://r.ns.svc:8/s", "headersFrom": [
        {"name": "Authorization", "secretKeyRef": {"name": "reward-token", "key": "token"}},
        {"name": "X-Api-Key", "secretKeyRef": {"name": "reward-token", "key": "key"}}]})
    with pytest.raises(ValueError) as info:
        RemoteReward(spec)
    text = str(info.value)
    assert "spec.task.rewardService.headersFrom[0] (Authorization): the environment variable " \
           "ASYNCRL_SERVICE_HEADER_AUTHORIZATION is not set" in text and "Secret 'reward-token' key 'token'" in text
    assert "headersFrom[1] (X-Api-Key): the value in ASYNCRL_SERVICE_HEADER_X_API_KEY" in text
    assert "Injected" not in text


def test_header_names_map_to_one_variable_each_and_reserved_or_repeated_names_are_refused() -> None:
    assert header_env_var("X-Api-Key") == "ASYNCRL_SERVICE_HEADER_X_API_KEY"
    assert header_env_var("authorization") == header_env_var("Authorization") == "ASYNCRL_SERVICE_HEADER_AUTHORIZATION"
    ref = {"name": "s", "key": "k"}
    with pytest.raises(ValueError, match="set by the client itself"):
        HeaderFromSecret.model_validate({"name": "Content-Type", "secretKeyRef": ref})
    with pytest.raises(ValueError, match="String should match pattern"):
        HeaderFromSecret.model_validate({"name": "X_Api_Key", "secretKeyRef": ref})  # '_' would alias '-'
    with pytest.raises(ValueError, match="'authorization' is given twice"):
        RewardServiceSpec.model_validate({"url": "http://r:8/s", "headersFrom": [
            {"name": "Authorization", "secretKeyRef": ref}, {"name": "authorization", "secretKeyRef": ref}]})


def test_credentials_in_the_url_are_refused_and_queries_never_shown() -> None:
    with pytest.raises(ValueError, match=r"holds credentials \(user:password@\).*headersFrom"):
        RewardServiceSpec(url="http://user:pw@reward.ns.svc:8000/score")
    RewardServiceSpec(url="http://reward.ns.svc:8000/score/@v2")  # '@' in the path is a path
    assert redact_url("https://reward.ns.svc:8443/score?token=abc#frag") == "https://reward.ns.svc:8443/score"
    assert redact_url("http://[fe80::1]:80/x?y") == "http://[fe80::1]:80/x"
    task = TaskSpec.model_validate({"dataset": {"path": "d.jsonl"},
                                    "rewardService": {"url": "http://r.ns.svc/score?token=abc"}})
    assert task.label == "dataset:d.jsonl+http://r.ns.svc/score"  # asyncrl_job_info{task}


@pytest.mark.parametrize(("url", "local", "says"), [
    ("http://169.254.169.254/latest/meta-data/", False, "instance-metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", True, "instance-metadata"),
    ("http://[fd00:ec2::254]/latest/", True, "instance-metadata"),
    ("http://169.254.10.1:8000/score", True, "link-local"),
    ("http://[fe80::1%25eth0]:8000/score", True, "link-local"),
    ("https://kubernetes.default.svc/api/v1/secrets", False, "API server"),
    ("https://kubernetes/api", True, "API server"),
    ("http://127.0.0.1:8000/score", False, "loopback"),
    ("http://localhost:8000/score", False, "loopback"),
    ("http://[::1]:8000/score", False, "loopback"),
])
def test_destinations_a_job_should_not_call_are_named(url: str, local: bool, says: str) -> None:
    (warning,) = destination_warnings(url, "spec.task.rewardService.url", local=local)
    assert warning.startswith(f"spec.task.rewardService.url: {redact_url(url)} is ") and says in warning


@pytest.mark.parametrize("url", ["http://reward.ns.svc:8000/score", "http://10.0.3.4:8000/score",
                                 "https://judge.example.com/score", "http://metadata-store.ns.svc/score"])
def test_ordinary_destinations_draw_no_warning(url: str) -> None:
    assert destination_warnings(url, "f", local=False) == []
    assert destination_warnings("http://127.0.0.1:8000/score", "f", local=True) == []  # a local run's service


def test_the_environment_service_is_found_and_its_headers_go_into_the_pods() -> None:
    ref = {"name": "env-token", "key": "token"}
    task = TaskSpec.model_validate({"environment": REMOTE_ENVIRONMENT, "args": {
        "url": "http://169.254.169.254/x", "headersFrom": [{"name": "Authorization", "secretKeyRef": ref}]}})
    assert list(task_services(task)) == ["spec.task.args"]
    assert header_env(task) == [{"name": "ASYNCRL_SERVICE_HEADER_AUTHORIZATION",
                                 "valueFrom": {"secretKeyRef": {"name": "env-token", "key": "token"}}}]
    (warning,) = service_warnings(task, local=False)
    assert warning.startswith("spec.task.args.url: http://169.254.169.254/x is a cloud instance-metadata")
    assert REMOTE_ENVIRONMENT == f"{RemoteEnvironment.__module__}:{RemoteEnvironment.__qualname__}"


def test_a_service_deadline_the_environment_timeout_would_cut_first_is_named() -> None:
    task = TaskSpec.model_validate({"dataset": {"path": "d.jsonl"}, "envTimeoutSeconds": 10,
                                    "rewardService": {"url": "http://r.ns.svc/score", "timeoutSeconds": 10}})
    (warning,) = service_warnings(task, local=False)
    assert "spec.task.rewardService.timeoutSeconds: 10 s is not below spec.task.envTimeoutSeconds=10" in warning


def test_asyncrl_validate_warns_about_the_metadata_endpoint_and_loopback_in_a_cluster(tmp_path, capsys) -> None:
    from asyncrl.trainer.cli import main

    (tmp_path / "d.jsonl").write_text('{"prompt": "2+2?", "answer": 4}\n')
    job = tmp_path / "job.yaml"
    job.write_text("apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: ssrf}\nspec:\n  task:\n"
                   f"    dataset: {{path: {tmp_path / 'd.jsonl'}, heldoutFraction: 0}}\n"
                   "    rewardService: {url: 'http://169.254.169.254/latest/meta-data/?token=abc'}\n")
    assert main(["validate", str(job)]) == 0  # a warning, not a refusal: the egress policy enforces
    err = capsys.readouterr().err
    assert f"{job}: warning: spec.task.rewardService.url: http://169.254.169.254/latest/meta-data/ is a cloud " \
           "instance-metadata endpoint" in err and "token=abc" not in err
    job.write_text(job.read_text().replace("169.254.169.254/latest/meta-data/?token=abc", "127.0.0.1:8000/score"))
    assert main(["validate", str(job)]) == 0
    assert "is loopback: in a cluster that is the rollout pod itself" in capsys.readouterr().err
    assert main(["validate", "--local", str(job)]) == 0  # a run on this machine: loopback is where its service is
    assert "warning" not in capsys.readouterr().err


def test_a_job_whose_header_variable_is_missing_fails_at_start(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from asyncrl.rollout.envs.binding import EnvLoadError, bind_task

    monkeypatch.delenv("ASYNCRL_SERVICE_HEADER_AUTHORIZATION", raising=False)
    (tmp_path / "d.jsonl").write_text('{"prompt": "2+2?", "answer": 4}\n')
    task = TaskSpec.model_validate({"dataset": {"path": str(tmp_path / "d.jsonl"), "heldoutFraction": 0}, "rewardService": {
        "url": "http://r.ns.svc/score", "headersFrom": [{"name": "Authorization",
                                                          "secretKeyRef": {"name": "reward-token", "key": "t"}}]}})
    with pytest.raises(EnvLoadError, match="ASYNCRL_SERVICE_HEADER_AUTHORIZATION is not set"):
        bind_task(task)
