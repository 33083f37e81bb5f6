"""A reward or environment service's ``headersFrom``: the operator gives each header's Secret key to the pods
that build (driver) and call (rollout) the service, under the variable the client reads, and to no other pod;
the value never enters the pod spec, the spec ConfigMap or the job."""

from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.service import header_env_var
from asyncrl.api.task_services import REMOTE_ENVIRONMENT
from asyncrl.operator import names
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.names import Role

REF = JobRef("j", "ns", "uid-1")
HEADERS = [{"name": "Authorization", "secretKeyRef": {"name": "reward-token", "key": "token"}},
           {"name": "X-Api-Key", "secretKeyRef": {"name": "reward-keys", "key": "api"}}]
WANT = {"ASYNCRL_SERVICE_HEADER_AUTHORIZATION": {"secretKeyRef": {"name": "reward-token", "key": "token"}},
        "ASYNCRL_SERVICE_HEADER_X_API_KEY": {"secretKeyRef": {"name": "reward-keys", "key": "api"}}}


def header_vars(task: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{pod name: {variable: valueFrom}}`` of the header variables in each pod's main container."""
    spec = AsyncRLJobSpec.model_validate({"task": task, "rollout": {"replicas": 2}})
    d = desired(REF, spec, OperatorSettings(job_image="img:1"), epoch=1, ray_token="t")
    out = {}
    for name, slot in d.pods.items():
        env = slot.manifest["spec"]["containers"][0]["env"]
        out[name] = {e["name"]: e.get("valueFrom", e.get("value")) for e in env
                     if e["name"].startswith("ASYNCRL_SERVICE_HEADER_")}
    return out


def test_reward_service_headers_reach_the_driver_and_rollout_pods_only() -> None:
    got = header_vars({"dataset": {"path": "/data/d.jsonl"},
                       "rewardService": {"url": "http://r.ns.svc:8000/score", "headersFrom": HEADERS}})
    callers = {names.pod_name("j", Role.DRIVER, 0), names.pod_name("j", Role.ROLLOUT, 0),
               names.pod_name("j", Role.ROLLOUT, 1)}
    assert {n for n, v in got.items() if v} == callers
    assert all(got[n] == WANT for n in callers)
    assert set(WANT) == {header_env_var(h["name"]) for h in HEADERS}  # the client reads the same names


def test_environment_service_headers_too_and_none_without_headers() -> None:
    got = header_vars({"environment": REMOTE_ENVIRONMENT, "args": {"url": "http://env.ns.svc", "headersFrom": HEADERS}})
    assert got[names.pod_name("j", Role.ROLLOUT, 1)] == WANT
    plain = header_vars({"dataset": {"path": "/d.jsonl"}, "rewardService": {"url": "http://r.ns.svc:8000/score"}})
    assert all(v == {} for v in plain.values())
