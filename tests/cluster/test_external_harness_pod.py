"""The agent endpoint on real pods: ``task.agent: external``, driven by a harness pod in the job's namespace.

The operator gives the rollout pod an ``agent`` port, the ClusterIP Service ``<job>-agent`` over it and the Secret
``<job>-agent-key``; ``status.agentEndpoint`` names the Service. A harness pod (the job image, so the real ``openai``
client, under the restricted Pod Security level) reads the key from that Secret through ``secretKeyRef``, takes
sessions at the Service's DNS name, talks to the pod each session names and posts rewards, until the job has
trained. A request without the key is refused (401) first. Nothing in the test talks to the endpoint itself.
"""

import json
import re

import pytest

from tests.support.cluster import RUN_DIR, Cluster
from tests.support.cluster_images import job_ref
from tests.support.cluster_jobs import load_job, submit
from tests.support.helpers import ROOT

pytestmark = pytest.mark.cluster

TWIN = ROOT / "examples" / "quickstart-cluster.yaml"
NAME, NS, STEPS, PROMPTS, GROUP = "agentjob", "agent", 2, 2, 2

# The harness, as docs/agents.md gives it, with a line of output per event the test counts.
HARNESS = r'''
import json, os, sys, time, urllib.error, urllib.request
import openai

base, key = os.environ["ENDPOINT"], os.environ["SESSION_KEY"]


def post(url, key="", body=None):
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


while True:  # the endpoint is up once the rollout pod is Ready: until then, connection errors
    try:
        status, _ = post(f"{base}/sessions", "not-the-key")
        break
    except OSError as exc:
        print("waiting for the endpoint:", exc, flush=True)
        time.sleep(2)
print("without the key:", status, flush=True)
done = 0
while True:
    try:
        status, s = post(f"{base}/sessions", key)
    except OSError as exc:  # the job finished: its rollout pod and Service are gone
        print("endpoint gone:", exc, flush=True)
        time.sleep(2)
        continue
    if status == 429:
        time.sleep(0.5)
        continue
    if status != 200:
        print("session refused:", status, s, flush=True)
        time.sleep(1)
        continue
    c = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    a = c.chat.completions.create(model="policy", messages=msgs, max_tokens=6)
    text = a.choices[0].message.content or ""
    status, _ = post(f"{base}/sessions/{s['id']}/reward", s["api_key"], {"reward": float("5" in text)})
    done += 1
    print(json.dumps({"session": s["id"], "pod_url": s["base_url"], "reward_status": status, "done": done}),
          flush=True)
'''


def harness_pod(job: str) -> dict:
    restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                  "capabilities": {"drop": ["ALL"]}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "harness", "namespace": NS, "labels": {"app": "harness"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "harness", "image": job_ref(), "imagePullPolicy": "Never",
                "command": ["python", "-c", HARNESS],
                "env": [{"name": "ENDPOINT", "value": f"http://{job}-agent.{NS}.svc:8100/v1"},
                        {"name": "SESSION_KEY",
                         "valueFrom": {"secretKeyRef": {"name": f"{job}-agent-key", "key": "key"}}}],
                "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                "securityContext": restricted,
            }],
        },
    }


def test_an_external_harness_pod_trains_the_job_through_the_endpoint_service(cluster: Cluster,
                                                                             operator: str) -> None:
    ns = cluster.namespace(NS)  # restricted: the harness pod is admitted under the same level as the job's
    job = load_job(TWIN, ns, train={"steps": STEPS, "promptsPerStep": PROMPTS}, eval={"everySteps": 100},
                   rollout={"replicas": 1})
    job["metadata"]["name"] = NAME
    job["spec"]["task"] = {"agent": "external", "groupSize": GROUP, "maxNewTokens": 16, "envTimeoutSeconds": 300,
                           "endpoint": {"port": 8100, "allowFrom": [{"podSelector": {"matchLabels": {"app": "harness"}}}]}}
    rec = submit(cluster, job)
    cluster.apply(harness_pod(NAME))  # waits (CreateContainerConfigError) until the operator made the key's Secret
    endpoint = f"http://{NAME}-agent.{ns}.svc:8100/v1"
    rec.wait_for("status.agentEndpoint", lambda r: r.status.get("agentEndpoint") == endpoint
                 or r.phase in ("Succeeded", "Failed"), timeout=900)
    assert rec.status.get("agentEndpoint") == endpoint, rec.status
    rec.mark("agentEndpoint in status")
    rec.wait_for("a terminal phase", lambda r: r.phase in ("Succeeded", "Failed"), timeout=1500)
    RUN_DIR.joinpath("timeline-agent.json").write_text(json.dumps(rec.timeline, indent=1))
    log = cluster.logs("harness", ns)
    cluster.kubectl("delete", "pod", "harness", "-n", ns, "--wait=false")
    assert rec.phase == "Succeeded", (rec.status, log[-3000:])
    assert rec.status["training"]["policyVersion"] == STEPS
    # the endpoint refused the harness's request without the session key, then served it sessions with it
    assert "without the key: 401" in log, log[-3000:]
    sessions = [json.loads(line) for line in log.splitlines() if line.startswith('{"session"')]
    # every trained group came from the harness: STEPS x PROMPTS groups of GROUP sessions, each with its reward
    assert len(sessions) >= STEPS * PROMPTS * GROUP, log[-3000:]
    assert all(s["reward_status"] == 200 for s in sessions[: STEPS * PROMPTS * GROUP]), sessions
    # each session named the one rollout pod's own address on the pod network (ASYNCRL_AGENT_ADVERTISE), and the
    # harness pod reached it there: pod-to-pod traffic across the bridge
    urls = {s["pod_url"] for s in sessions}
    assert len(urls) == 1 and re.fullmatch(r"http://10\.244\.0\.\d+:8100/v1", urls.pop()), sessions
    # the job's NetworkPolicy admits the harness on the agent port (declared; the bridge plugin does not enforce it)
    policy = json.loads(cluster.kubectl("get", "networkpolicy", "-n", ns, "-o", "json").stdout)["items"]
    peers = [p for pol in policy for rule in pol["spec"].get("ingress", []) for p in rule.get("from", [])]
    assert {"podSelector": {"matchLabels": {"app": "harness"}}} in peers, policy
