"""Checkpoints on a PersistentVolume, export of the finished job, and faults on real pods.

One job with its checkpoints on a static hostPath PersistentVolume (bound to its claim) runs through the
drills in order: a deleted rollout pod is replaced alone and training goes on; a deleted actor pod restarts
the gang, which resumes from its last checkpoint at that version; ``runPolicy.suspend`` stops every pod and
resuming (with ``train.steps`` cut to a few steps past the suspension, patched while suspended) goes on from the
checkpoint to the new end; the job succeeds; ``asyncrl export`` of its checkpoint (in a pod of the
job image, on the same claim) gives a folder transformers loads; deleting the job garbage-collects every
child object. The kubelet and the job's status sidecar report every phase; nothing here writes a status.
"""

import json
import os
import time
from pathlib import Path

import pytest

from tests.support.cluster import RUN_DIR, Cluster
from tests.support.cluster_images import job_ref
from tests.support.cluster_jobs import JobRecord, load_job, submit
from tests.support.helpers import ROOT

pytestmark = pytest.mark.cluster

TWIN = ROOT / "examples" / "quickstart-cluster.yaml"
# The job is submitted with more steps than the drills can reach (a step takes ~0.35 s here, and the status sidecar
# reports at most every 30 s, api/status.py, so the test sees versions only that often); while it is suspended, the
# drill cuts train.steps to TAIL steps past the version it stopped at, and the resumed job ends there. So no drill
# races the end of training, and the test does not train hundreds of steps nobody looks at.
NAME, STEPS, TAIL, EVERY, JOB_UID = "drills", 5000, 20, 20, 10001
DRIVER, ROLLOUT0, ACTOR = f"{NAME}-driver-0", f"{NAME}-rollout-0", f"{NAME}-actor-0"
CHILD_KINDS = "pods,services,configmaps,secrets,serviceaccounts,roles,rolebindings,networkpolicies"


def static_volume(cluster: Cluster, ns: str, host_dir: Path) -> str:
    """A hostPath PersistentVolume bound to the claim ``checkpoints`` (the job's pods run as uid 10001, and a
    hostPath volume ignores fsGroup: the folder is theirs)."""
    host_dir.mkdir(parents=True, exist_ok=True)
    os.chown(host_dir, JOB_UID, JOB_UID)
    cluster.apply([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-checkpoints"},
         "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "manual",
                  "hostPath": {"path": str(host_dir), "type": "Directory"},
                  "claimRef": {"namespace": ns, "name": "checkpoints"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "checkpoints", "namespace": ns},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                  "resources": {"requests": {"storage": "5Gi"}}, "volumeName": f"{ns}-checkpoints"}},
    ])
    cluster.wait("pvc", "checkpoints", "jsonpath={.status.phase}=Bound", ns)
    return "checkpoints"


def uid(rec: JobRecord, pod: str) -> set[str]:
    return set(rec.pod_uids.get(pod, set()))


def ready_again(rec: JobRecord, pod: str, generations: int) -> bool:
    """Pod ``pod`` of its ``generations``-th incarnation (a new uid) is Ready."""
    return len(uid(rec, pod)) >= generations and pod in rec.pods and rec.pods[pod].ready


def first_version_after(rec: JobRecord, t: float) -> int | None:
    return next((v for at, v, _ in rec.versions if at > t), None)


def test_checkpoints_export_and_faults_on_real_pods(cluster: Cluster, operator: str) -> None:
    ns = cluster.namespace("drills")
    claim = static_volume(cluster, ns, RUN_DIR / "pv" / ns)
    job = load_job(TWIN, ns, train={"steps": STEPS}, eval={"everySteps": 100, "prompts": 16},
                   checkpoint={"volumeClaimName": claim, "everySteps": EVERY, "keep": 2})
    job["metadata"]["name"] = NAME
    rec = submit(cluster, job)
    rec.wait_for("a first version", lambda r: r.version >= 1, timeout=900)

    # 1. a rollout pod deleted: replaced alone (new uid), the others keep theirs, training goes on
    before = {p: uid(rec, p) for p in (DRIVER, ACTOR)}
    v_delete = rec.version
    cluster.kubectl("delete", "pod", ROLLOUT0, "-n", ns, "--wait=false")
    rec.wait_for("a new rollout-0", lambda r: len(uid(r, ROLLOUT0)) >= 2 and r.pods.get(ROLLOUT0) is not None
                 and r.pods[ROLLOUT0].ready, timeout=600)
    v_replaced = rec.version
    rec.wait_for("a version after the replacement", lambda r: r.version > max(v_delete, v_replaced), timeout=600)
    assert {p: uid(rec, p) for p in (DRIVER, ACTOR)} == before, "only the deleted rollout pod was replaced"
    rec.mark("drill 1: rollout pod replaced, training continued")

    # 2. the actor pod deleted: the gang restarts and resumes from its last checkpoint. The old driver writes a
    # final checkpoint and reports its version on the way out; the new driver's first report is its resume point.
    v_kill = rec.version
    cluster.kubectl("delete", "pod", ACTOR, "-n", ns, "--wait=false")
    rec.wait_for("a new driver, Ready", lambda r: ready_again(r, DRIVER, 2), timeout=600)
    t_new = time.monotonic() - rec.submitted
    rec.wait_for("a report of the new gang", lambda r: first_version_after(r, t_new) is not None, timeout=900)
    resumed_at = first_version_after(rec, t_new)
    restarts = rec.status.get("restarts")
    # from a checkpoint: at most EVERY versions below what the old gang had reached (>= v_kill); from nothing: ~1
    assert resumed_at is not None and resumed_at > max(1, v_kill - EVERY), (v_kill, rec.versions)
    assert (restarts or 0) >= 1, rec.status
    rec.mark("drill 2: gang restarted and resumed")

    # 3. suspend, then resume with train.steps cut (one patch, as a user shortens a run): every pod goes, the job
    # comes back from its checkpoint (the old driver's final report is the version it stopped at) and ends there
    cluster.kubectl("patch", "arj", NAME, "-n", ns, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    rec.wait_for("phase Suspended", lambda r: r.phase == "Suspended", timeout=300)
    rec.wait_for("no pods", lambda r: not r.pods, timeout=300)
    v_suspended = rec.version
    assert v_suspended < STEPS, rec.versions
    end = v_suspended + TAIL
    cluster.kubectl("patch", "arj", NAME, "-n", ns, "--type=merge", "-p",
                    json.dumps({"spec": {"runPolicy": {"suspend": False}, "train": {"steps": end}}}))
    rec.wait_for("a driver, Ready, after the suspension", lambda r: ready_again(r, DRIVER, 3), timeout=600)
    t_back = time.monotonic() - rec.submitted
    rec.wait_for("a terminal phase", lambda r: r.phase in ("Succeeded", "Failed"), timeout=1500)
    rec.mark("drill 3: suspended and resumed to the end")
    back_at = first_version_after(rec, t_back)
    RUN_DIR.joinpath("timeline-drills.json").write_text(json.dumps(
        {"timeline": rec.timeline, "versions": rec.versions, "restarts": restarts, "resumed_at": resumed_at,
         "killed_at": v_kill, "suspended_at": v_suspended, "back_at": back_at, "end": end}, indent=1))
    assert rec.phase == "Succeeded", rec.status
    assert rec.status["training"]["policyVersion"] == end
    assert back_at is not None and back_at > max(1, v_suspended - EVERY), (v_suspended, rec.versions)

    # 4. asyncrl export of the finished job's checkpoint, loaded by transformers, in a pod on the same claim
    # the driver's run directory is /checkpoints/runs/<job>, its checkpoints /checkpoints/<checkpoint.dir>
    script = ("set -e; asyncrl export /checkpoints/checkpoints --job /checkpoints/runs/drills/job.yaml "
              "--out /checkpoints/export --quiet; "
              "python -c \"from transformers import AutoModelForCausalLM as M; "
              "m = M.from_pretrained('/checkpoints/export'); print('loaded', type(m).__name__, "
              "sum(p.numel() for p in m.parameters()))\"")
    restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "export", "namespace": ns}, "spec": {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": JOB_UID, "runAsGroup": JOB_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "export", "image": job_ref(), "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script], "securityContext": restricted,
                        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
                        "volumeMounts": [{"name": "ckpt", "mountPath": "/checkpoints"},
                                         {"name": "tmp", "mountPath": "/tmp"}]}],
        "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": claim}},
                    {"name": "tmp", "emptyDir": {}}]}})
    cluster.wait("pod", "export", "jsonpath={.status.phase}=Succeeded", ns, timeout=600)
    assert "loaded LlamaForCausalLM" in cluster.logs("export", ns)

    # 5. kubectl delete arj: every child object is garbage-collected (the real controller-manager)
    cluster.kubectl("delete", "pod", "export", "-n", ns)
    cluster.kubectl("delete", "arj", NAME, "-n", ns, "--wait=true", timeout=300)
    cluster.kubectl("wait", "--for=delete", CHILD_KINDS.replace(",", " ").split()[0], "-l",
                    f"asyncrl.io/job={NAME}", "-n", ns, "--timeout=300s", check=False, timeout=330)
    left = cluster.kubectl("get", CHILD_KINDS, "-n", ns, "-l", f"asyncrl.io/job={NAME}", "-o", "name").stdout
    assert left.strip() == "", left
