"""One table of bad AsyncRLJob inputs for ``asyncrl validate`` AND a real API server.

Each :class:`BadInput` breaks exactly one thing of a small valid job (:data:`BASE_SPEC`): a real
API server evaluates CEL rules only on an object without a blocking schema error (wrong type,
unsupported enum value, missing field, ...), so a case that broke two things could hide a rule.

- ``path``: the field path both must name (``spec.correction.mask.bounds``; list items as ``[0]``).
- ``message``: a fragment both error texts contain: the rule's own message, shared by the model
  and the CRD's CEL rule. ``""`` for a schema-only error whose server wording differs from ours
  (an enum, a type); then only the path is checked on the server.
- ``cli_message``: a further fragment only ``asyncrl validate``'s text must contain (e.g. the new
  spelling shown for a bare-number ``bounds``).
- ``name``: metadata.name for the cases that test names (else the caller's name is used).

``bad_manifest(case, name)`` gives the whole manifest (namespace ``default``). Used by
``tests/api/test_validation.py`` (the model and the offline CRD validator) and by the real-server
suite.
"""

from dataclasses import dataclass, field
from typing import Any

from asyncrl.api import kube_types as K
from asyncrl.api import pod_security as P
from asyncrl.api.agent import AGENT_WITH_ENVIRONMENT_MESSAGE, IN_PROCESS_ENDPOINT_MESSAGE
from asyncrl.api.correction import (
    AUDIT_EXACT_MESSAGE,
    AUDIT_FRACTION_UNUSED_MESSAGE,
    BOUNDS_FACTOR_MESSAGE,
    BOUNDS_FORM_MESSAGE,
    BOUNDS_ORDER_MESSAGE,
    DECAY_AUTO_HINT,
    DECAY_MESSAGE,
    EWMA_UNUSED_MESSAGE,
)
from asyncrl.api.dataset import (
    DATASET_NEEDS_SCORER_MESSAGE,
    REWARD_EXCLUSIVE_MESSAGE,
    REWARD_NEEDS_DATASET_MESSAGE,
    REWARD_WITH_ENVIRONMENT_MESSAGE,
)
from asyncrl.api.evaluation import EVAL_UNUSED_MESSAGE
from asyncrl.api.job import (
    AGENT_PORT_MESSAGE,
    EXACT_NEEDS_STRATEGY_MESSAGE,
    MAX_VERSIONS_MESSAGE,
    MINIBATCHES_MESSAGE,
    STRATEGY_NEEDS_EXACT_MESSAGE,
    TRAINING_SIDE_MEMORY_UNUSED_MESSAGE,
)
from asyncrl.api.metadata import NAME_MESSAGE
from asyncrl.api.model import GQA_MESSAGE
from asyncrl.api.old_logits import (
    DEDICATED_UNUSED_MESSAGE,
    INTERRUPT_SYNC_UNUSED_MESSAGE,
    SCORER_TP_DIVIDES_GPUS_MESSAGE,
    SNAPSHOT_UNUSED_MESSAGE,
)
from asyncrl.api.paths import CHECKPOINT_DIR_MESSAGE
from asyncrl.api.pods import (
    ENV_SOURCE_MESSAGE,
    EXPERT_PARALLEL_CPU_MESSAGE,
    EXTRA_RESOURCE_MESSAGE,
    MASK_GUARD_ORDER_MESSAGE,
    MP_DIVIDES_WORLD_MESSAGE,
    PIPELINE_PARALLEL_MESSAGE,
    RESERVED_ENV_MESSAGE,
    RESERVED_VOLUME_MESSAGE,
    ROLLOUT_GPUS_MESSAGE,
    TP_DIVIDES_GPUS_MESSAGE,
)
from asyncrl.operator.pod_policy import merge as deep_merge  # the operator's own override merge

# A small job that runs on CPU pods (every case starts from it).
BASE_SPEC: dict[str, Any] = {
    "rollout": {"replicas": 2, "gpusPerReplica": 0},
    "actor": {"replicas": 1, "gpusPerReplica": 0},
    "runPolicy": {"backoffLimit": 2},
}
EXACT = {"correction": {"reference": "exact"}}
# rollout.trainingSideMemory without strategy interruptSync: refused today by the field itself (api/pods.py,
# whose words predate the strategy) and by the job-level cross-field rule (api/job.py); both begin with this.
TRAINING_SIDE_MEMORY_FRAGMENT = "rollout.trainingSideMemory is only used by oldLogits.strategy interruptSync"
assert TRAINING_SIDE_MEMORY_UNUSED_MESSAGE.startswith(TRAINING_SIDE_MEMORY_FRAGMENT)  # the lasting rule


@dataclass(frozen=True)
class BadInput:
    """One input both ``asyncrl validate`` and the API server refuse, at ``path``."""

    id: str
    spec: dict[str, Any]
    path: str
    message: str
    cli_message: str = ""
    name: str | None = field(default=None)


def bad_manifest(case: BadInput, name: str) -> dict[str, Any]:
    """The whole AsyncRLJob of ``case`` (``name`` unless the case tests names)."""
    return {
        "apiVersion": "asyncrl.io/v1alpha1",
        "kind": "AsyncRLJob",
        "metadata": {"name": case.name or name, "namespace": "default"},
        "spec": deep_merge(BASE_SPEC, case.spec),
    }


def _types(cases: list[tuple[str, dict[str, Any], str, str]]) -> list[BadInput]:
    # Schema-only: the server says 'Invalid value: "boolean": ... must be of type integer'.
    return [BadInput(case_id, spec, path, "", cli_message=cli) for case_id, spec, path, cli in cases]


def _enum(case_id: str, spec: dict[str, Any], path: str) -> BadInput:
    # Schema-only: the server says 'Unsupported value: "bogus": supported values: ...'.
    return BadInput(case_id, spec, path, "", cli_message="expected one of")


def _template(role: str, case_id: str, template: dict[str, Any], path: str, message: str) -> BadInput:
    return BadInput(case_id, {role: {"template": template}}, f"spec.{role}.template.{path}", message)


_DATA = {"volumes": [{"name": "data", "emptyDir": {}}]}  # a volume the mount cases mount


def _mount(case_id: str, mount: dict[str, Any], path: str, message: str) -> BadInput:
    return _template("rollout", case_id, {**_DATA, "volumeMounts": [{"name": "data", **mount}]},
                     f"volumeMounts[0].{path}", message)


# Pod hardening (the restricted Pod Security level, api/pod_security.py), ownership labels, volumes and mounts.
_SECURITY_CASES: list[BadInput] = [
    _template("rollout", "psa-privileged", {"securityContext": {"privileged": True}}, "securityContext.privileged",
              P.PRIVILEGED_MESSAGE),
    _template("actor", "psa-privilege-escalation", {"securityContext": {"allowPrivilegeEscalation": True}},
              "securityContext.allowPrivilegeEscalation", P.ESCALATION_MESSAGE),
    _template("actor", "psa-pod-run-as-root", {"podSecurityContext": {"runAsUser": 0}},
              "podSecurityContext.runAsUser", P.ROOT_USER_MESSAGE),
    _template("rollout", "psa-container-run-as-root", {"securityContext": {"runAsUser": 0}},
              "securityContext.runAsUser", P.ROOT_USER_MESSAGE),
    _template("rollout", "psa-pod-run-as-non-root-false", {"podSecurityContext": {"runAsNonRoot": False}},
              "podSecurityContext.runAsNonRoot", P.NON_ROOT_MESSAGE),
    _template("actor", "psa-container-run-as-non-root-false", {"securityContext": {"runAsNonRoot": False}},
              "securityContext.runAsNonRoot", P.NON_ROOT_MESSAGE),
    _template("rollout", "psa-capabilities-add", {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
              "securityContext.capabilities.add", P.CAPABILITIES_ADD_MESSAGE),
    _template("actor", "psa-capabilities-drop-empty", {"securityContext": {"capabilities": {"drop": []}}},
              "securityContext.capabilities.drop", P.CAPABILITIES_DROP_MESSAGE),
    _template("rollout", "psa-capabilities-drop-without-all",
              {"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
              "securityContext.capabilities.drop", P.CAPABILITIES_DROP_MESSAGE),
    _template("rollout", "psa-pod-seccomp-unconfined", {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
              "podSecurityContext.seccompProfile.type", P.SECCOMP_MESSAGE),
    _template("actor", "psa-container-seccomp-unconfined",
              {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
              "securityContext.seccompProfile.type", P.SECCOMP_MESSAGE),
    _template("rollout", "psa-seccomp-localhost-without-profile",
              {"securityContext": {"seccompProfile": {"type": "Localhost"}}},
              "securityContext.seccompProfile", K.PROFILE_MESSAGE),
    _template("actor", "psa-pod-apparmor-unconfined",
              {"podSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}},
              "podSecurityContext.appArmorProfile.type", P.APPARMOR_MESSAGE),
    _template("rollout", "psa-container-apparmor-unconfined",
              {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
              "securityContext.appArmorProfile.type", P.APPARMOR_MESSAGE),
    _template("rollout", "psa-apparmor-annotation-unconfined",
              {"annotations": {"container.apparmor.security.beta.kubernetes.io/rollout": "unconfined"}},
              "annotations", P.APPARMOR_ANNOTATION_MESSAGE),
    _template("actor", "psa-proc-mount-unmasked", {"securityContext": {"procMount": "Unmasked"}},
              "securityContext.procMount", P.PROC_MOUNT_MESSAGE),
    _template("rollout", "psa-unsafe-sysctl",
              {"podSecurityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}},
              "podSecurityContext.sysctls", P.SYSCTLS_MESSAGE),
    _template("actor", "psa-pod-selinux-user", {"podSecurityContext": {"seLinuxOptions": {"user": "system_u"}}},
              "podSecurityContext.seLinuxOptions", P.SELINUX_MESSAGE),
    _template("rollout", "psa-container-selinux-spc-type", {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
              "securityContext.seLinuxOptions", P.SELINUX_MESSAGE),
    _template("rollout", "psa-pod-windows-host-process",
              {"podSecurityContext": {"windowsOptions": {"hostProcess": True}}},
              "podSecurityContext.windowsOptions.hostProcess", P.HOST_PROCESS_MESSAGE),
    _template("actor", "psa-container-windows-host-process",
              {"securityContext": {"windowsOptions": {"hostProcess": True}}},
              "securityContext.windowsOptions.hostProcess", P.HOST_PROCESS_MESSAGE),
    _template("rollout", "psa-host-path-root", {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
              "volumes", P.VOLUME_TYPE_MESSAGE),
    _template("actor", "psa-host-path-runtime-socket",
              {"volumes": [{"name": "cri", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}}]},
              "volumes", P.VOLUME_TYPE_MESSAGE),
    _template("rollout", "psa-nfs-volume", {"volumes": [{"name": "n", "nfs": {"server": "10.0.0.2", "path": "/"}}]},
              "volumes", P.VOLUME_TYPE_MESSAGE),
    _template("rollout", "privileged-without-escalation",  # even where the admin allows privileged pods
              {"podSecurityLevel": "privileged", "securityContext": {"privileged": True,
                                                                     "allowPrivilegeEscalation": False}},
              "securityContext", K.ESCALATION_CONFLICT_MESSAGE),
    # ---- the operator's ownership labels and annotations
    _template("rollout", "label-asyncrl-job", {"labels": {"asyncrl.io/job": "someone-elses-job"}}, "labels",
              P.RESERVED_LABEL_MESSAGE),
    _template("actor", "label-app-instance", {"labels": {"app.kubernetes.io/instance": "other"}}, "labels",
              P.RESERVED_LABEL_MESSAGE),
    _template("rollout", "label-ray-cluster", {"labels": {"ray.io/cluster": "other"}}, "labels",
              P.RESERVED_LABEL_MESSAGE),
    _template("actor", "label-managed-by", {"labels": {"app.kubernetes.io/managed-by": "asyncrl-operator"}},
              "labels", P.RESERVED_LABEL_MESSAGE),
    _template("rollout", "annotation-epoch", {"annotations": {"asyncrl.io/epoch": "0"}}, "annotations",
              P.RESERVED_ANNOTATION_MESSAGE),
    # ---- volumes and mounts (reserved names and paths after normalisation)
    _template("rollout", "volume-reserved-name", {"volumes": [{"name": "dshm", "emptyDir": {}}]},
              "volumes[0].name", K.RESERVED_VOLUME_MESSAGE),
    _template("actor", "volume-two-sources",
              {"volumes": [{"name": "data", "emptyDir": {}, "persistentVolumeClaim": {"claimName": "d"}}]},
              "volumes[0]", K.ONE_SOURCE_MESSAGE),
    _template("rollout", "volume-no-source", {"volumes": [{"name": "data"}]}, "volumes[0]", K.ONE_SOURCE_MESSAGE),
    _mount("mount-path-dot-dot", {"mountPath": "/dev/shm/../shm"}, "mountPath", K.MOUNT_PATH_MESSAGE),
    _mount("mount-path-trailing-slash", {"mountPath": "/dev/shm/"}, "mountPath", K.MOUNT_PATH_MESSAGE),
    _mount("mount-path-double-slash", {"mountPath": "//dev/shm"}, "mountPath", K.MOUNT_PATH_MESSAGE),
    _mount("mount-path-relative", {"mountPath": "dev/shm"}, "mountPath", K.MOUNT_PATH_MESSAGE),
    _mount("mount-path-below-reserved", {"mountPath": "/checkpoints/mine"}, "mountPath", K.RESERVED_VOLUME_MESSAGE),
    _mount("mount-sub-path-parent", {"mountPath": "/data", "subPath": "../../etc"}, "subPath", K.SUB_PATH_MESSAGE),
    _template("rollout", "mount-undeclared-volume", {"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
              "volumeMounts", P.MOUNT_NEEDS_VOLUME_MESSAGE),
]


BAD_INPUTS: list[BadInput] = [
    # ---- job names: RFC 1035 labels of at most 40 characters (root CEL rule on metadata.name)
    BadInput("name-starts-with-digit", {}, "metadata.name", NAME_MESSAGE, name="1calc"),
    BadInput("name-with-dot", {}, "metadata.name", NAME_MESSAGE, name="calc.ewma"),
    BadInput("name-41-chars", {}, "metadata.name", NAME_MESSAGE, name="a" * 41),
    # ---- correction.mask.bounds: {low, high} or {factor}
    BadInput("bounds-bare-number", {"correction": {"mask": {"bounds": 2.0}}}, "spec.correction.mask.bounds", "",
             cli_message="bounds: {factor: 2.0}"),
    BadInput("bounds-both-forms", {"correction": {"mask": {"bounds": {"low": 0.5, "high": 2.0, "factor": 2.0}}}},
             "spec.correction.mask.bounds", BOUNDS_FORM_MESSAGE),
    BadInput("bounds-low-only", {"correction": {"mask": {"bounds": {"low": 0.5}}}},
             "spec.correction.mask.bounds", BOUNDS_FORM_MESSAGE),
    BadInput("bounds-low-above-one", {"correction": {"mask": {"bounds": {"low": 1.5, "high": 2.0}}}},
             "spec.correction.mask.bounds", BOUNDS_ORDER_MESSAGE),
    BadInput("bounds-factor-one", {"correction": {"mask": {"bounds": {"factor": 1.0}}}},
             "spec.correction.mask.bounds", BOUNDS_FACTOR_MESSAGE),
    # ---- correction.ewma
    BadInput("decay-one", {"correction": {"ewma": {"decay": 1.0}}}, "spec.correction.ewma.decay", DECAY_MESSAGE),
    BadInput("decay-auto-string", {"correction": {"ewma": {"decay": "auto"}}}, "spec.correction.ewma.decay", "",
             cli_message=DECAY_AUTO_HINT),
    BadInput("ewma-knobs-without-ewma", {"correction": {"reference": "current", "ewma": {"decay": 0.9}}},
             "spec.correction.ewma", EWMA_UNUSED_MESSAGE),
    # ---- exact old logits
    BadInput("exact-without-strategy", EXACT, "spec", EXACT_NEEDS_STRATEGY_MESSAGE),
    BadInput("strategy-without-exact", {"oldLogits": {"strategy": "snapshot"}}, "spec", STRATEGY_NEEDS_EXACT_MESSAGE),
    BadInput("snapshots-within-window",
             {**EXACT, "async": {"maxStaleness": 3}, "oldLogits": {"strategy": "snapshot", "snapshot": {"maxVersions": 3}}},
             "spec.oldLogits.snapshot.maxVersions", MAX_VERSIONS_MESSAGE),
    BadInput("snapshots-within-default-window",  # W defaults to 2: maxVersions 2 < W+1 = 3
             {**EXACT, "oldLogits": {"strategy": "snapshot", "snapshot": {"maxVersions": 2}}},
             "spec.oldLogits.snapshot.maxVersions", MAX_VERSIONS_MESSAGE),
    BadInput("snapshot-knobs-without-snapshot", {"oldLogits": {"snapshot": {"maxVersions": 8}}},
             "spec.oldLogits.snapshot", SNAPSHOT_UNUSED_MESSAGE),
    BadInput("snapshot-device-with-dedicated",
             {**EXACT, "oldLogits": {"strategy": "dedicated", "snapshot": {"device": "disk"}}},
             "spec.oldLogits.snapshot", SNAPSHOT_UNUSED_MESSAGE),
    BadInput("dedicated-knobs", {"oldLogits": {"dedicated": {"replicas": 2}}}, "spec.oldLogits.dedicated",
             DEDICATED_UNUSED_MESSAGE),
    BadInput("dedicated-tp-not-dividing-its-gpus",
             {**EXACT, "oldLogits": {"strategy": "dedicated", "dedicated": {"tensorParallel": 2, "gpusPerReplica": 3}}},
             "spec.oldLogits.dedicated.tensorParallel", SCORER_TP_DIVIDES_GPUS_MESSAGE,
             cli_message="(got tensorParallel 2 with 3 GPUs per scorer pod)"),
    BadInput("dedicated-knobs-with-snapshot",
             {**EXACT, "oldLogits": {"strategy": "snapshot", "dedicated": {"maxLagVersions": 3}}},
             "spec.oldLogits.dedicated", DEDICATED_UNUSED_MESSAGE),
    BadInput("interrupt-sync-knobs", {"oldLogits": {"interruptSync": {"phaseTimeoutSeconds": 60}}},
             "spec.oldLogits.interruptSync", INTERRUPT_SYNC_UNUSED_MESSAGE),
    BadInput("interrupt-sync-knobs-with-dedicated",
             {**EXACT, "oldLogits": {"strategy": "dedicated", "interruptSync": {"releaseRolloutResources": False}}},
             "spec.oldLogits.interruptSync", INTERRUPT_SYNC_UNUSED_MESSAGE),
    _enum("snapshot-device-enum",
          {**EXACT, "oldLogits": {"strategy": "snapshot", "snapshot": {"device": "gpu"}}},
          "spec.oldLogits.snapshot.device"),
    _enum("strategy-enum", {**EXACT, "oldLogits": {"strategy": "brute"}}, "spec.oldLogits.strategy"),
    # ---- correction.audit
    BadInput("audit-with-exact",
             {"correction": {"reference": "exact", "audit": {"everyNSteps": 5}}, "oldLogits": {"strategy": "snapshot"}},
             "spec.correction.audit", AUDIT_EXACT_MESSAGE),
    BadInput("audit-fraction-while-off", {"correction": {"audit": {"fraction": 0.5}}},
             "spec.correction.audit.fraction", AUDIT_FRACTION_UNUSED_MESSAGE),
    BadInput("audit-fraction-zero", {"correction": {"audit": {"everyNSteps": 5, "fraction": 0.0}}},
             "spec.correction.audit.fraction", "greater than 0"),
    BadInput("audit-fraction-above-one", {"correction": {"audit": {"everyNSteps": 5, "fraction": 1.5}}},
             "spec.correction.audit.fraction", "less than or equal to 1"),
    BadInput("audit-every-negative", {"correction": {"audit": {"everyNSteps": -1}}},
             "spec.correction.audit.everyNSteps", "greater than or equal to 0"),
    BadInput("eval-settings-without-every-steps", {"eval": {"prompts": 8}}, "spec.eval", EVAL_UNUSED_MESSAGE),
    # ---- what the driver runs: one device per rollout worker
    BadInput("rollout-two-gpus", {"rollout": {"gpusPerReplica": 2}}, "spec.rollout.gpusPerReplica",
             ROLLOUT_GPUS_MESSAGE),
    BadInput("vllm-two-gpus", {"rollout": {"engine": "vllm", "gpusPerReplica": 2}}, "spec.rollout.gpusPerReplica",
             ROLLOUT_GPUS_MESSAGE),
    BadInput("training-side-memory", {"rollout": {"trainingSideMemory": "32Gi"}}, "spec.rollout.trainingSideMemory",
             TRAINING_SIDE_MEMORY_FRAGMENT),
    BadInput("training-side-memory-with-snapshot",
             {**EXACT, "oldLogits": {"strategy": "snapshot"}, "rollout": {"trainingSideMemory": "32Gi"}},
             "spec.rollout.trainingSideMemory", TRAINING_SIDE_MEMORY_FRAGMENT),
    # ---- device-plugin resources (RDMA): GPUs are gpusPerReplica, counts are whole and >= 1
    BadInput("extra-resources-gpu", {"actor": {"resources": {"extra": {"nvidia.com/gpu": 8}}}},
             "spec.actor.resources.extra", EXTRA_RESOURCE_MESSAGE),
    BadInput("extra-resources-zero", {"rollout": {"resources": {"extra": {"rdma/hca": 0}}}},
             "spec.rollout.resources.extra", EXTRA_RESOURCE_MESSAGE),
    # ---- actor layouts that cannot work (api/pods.py actor_layout_problems)
    BadInput("tensor-parallel-not-dividing-gpus", {"actor": {"gpusPerReplica": 3, "megatron": {"tensorParallel": 2}}},
             "spec.actor.megatron.tensorParallel", TP_DIVIDES_GPUS_MESSAGE),
    BadInput("tensor-parallel-over-cpu-ranks", {"actor": {"replicas": 3, "megatron": {"tensorParallel": 2}}},
             "spec.actor.megatron.tensorParallel", MP_DIVIDES_WORLD_MESSAGE),
    BadInput("expert-parallel-on-cpu", {"actor": {"replicas": 2, "megatron": {"expertParallel": 2}}},
             "spec.actor.megatron.expertParallel", EXPERT_PARALLEL_CPU_MESSAGE),
    BadInput("pipeline-parallel-two", {"actor": {"replicas": 2, "megatron": {"pipelineParallel": 2}}},
             "spec.actor.megatron.pipelineParallel", PIPELINE_PARALLEL_MESSAGE),
    BadInput("weight-sync-bucket-zero", {"actor": {"weightSync": {"bucketMiB": 0}}},
             "spec.actor.weightSync.bucketMiB", "greater than or equal to 1"),
    # ---- other cross-field rules
    BadInput("gqa-heads", {"model": {"numAttentionHeads": 6, "numKeyValueHeads": 4}}, "spec.model", GQA_MESSAGE),
    BadInput("mask-guard-order", {"monitoring": {"maskGuard": {"warnKeepRatio": 0.5, "criticalKeepRatio": 0.8}}},
             "spec.monitoring.maskGuard", MASK_GUARD_ORDER_MESSAGE),
    # ---- task.dataset / task.reward / task.rewardService (api/dataset.py)
    BadInput("reward-and-reward-service",
             {"task": {"dataset": {"path": "d.jsonl"}, "reward": "m:f", "rewardService": {"url": "http://r:8/s"}}},
             "spec.task.rewardService", REWARD_EXCLUSIVE_MESSAGE),
    BadInput("reward-without-dataset", {"task": {"reward": "m:f"}}, "spec.task", REWARD_NEEDS_DATASET_MESSAGE),
    BadInput("dataset-without-reward", {"task": {"dataset": {"path": "d.jsonl"}}}, "spec.task.dataset",
             DATASET_NEEDS_SCORER_MESSAGE),
    BadInput("reward-with-environment",
             {"task": {"dataset": {"path": "d.jsonl"}, "environment": "pkg.env:Env", "reward": "m:f"}},
             "spec.task.environment", REWARD_WITH_ENVIRONMENT_MESSAGE),
    BadInput("agent-with-environment", {"task": {"agent": "my_agent:run", "environment": "pkg.env:Env"}},
             "spec.task.agent", AGENT_WITH_ENVIRONMENT_MESSAGE),
    BadInput("agent-port-is-the-metrics-port", {"task": {"agent": "external", "endpoint": {"port": 9400}}},
             "spec.task.endpoint.port", AGENT_PORT_MESSAGE),
    BadInput("agent-not-an-import-path", {"task": {"agent": "my_agent.run"}}, "spec.task.agent", "",
             cli_message="or 'external'"),
    BadInput("agent-peer-empty", {"task": {"agent": "external", "endpoint": {"allowFrom": [{}]}}},
             "spec.task.endpoint.allowFrom[0]", "names podSelector, namespaceSelector or ipBlock"),
    BadInput("agent-peer-ipblock-and-selector",
             {"task": {"agent": "external", "endpoint": {"allowFrom": [
                 {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {"matchLabels": {"app": "h"}}}]}}},
             "spec.task.endpoint.allowFrom[0]", "with ipBlock names no selector"),
    # an in-process agent is served on loopback: peers and a session key would be accepted and then ignored
    BadInput("agent-in-process-allow-from",
             {"task": {"agent": "my_agent:run", "endpoint": {"allowFrom": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}}},
             "spec.task.endpoint.allowFrom", IN_PROCESS_ENDPOINT_MESSAGE),
    BadInput("agent-in-process-session-key",
             {"task": {"agent": "my_agent:run", "endpoint": {"sessionKeyFrom": {"name": "k", "key": "key"}}}},
             "spec.task.endpoint.sessionKeyFrom", IN_PROCESS_ENDPOINT_MESSAGE),
    BadInput("reward-not-an-import-path", {"task": {"dataset": {"path": "d.jsonl"}, "reward": "my_reward.score"}},
             "spec.task.reward", "", cli_message="is not an import path"),
    BadInput("reward-service-not-http", {"task": {"dataset": {"path": "d.jsonl"}, "rewardService": {"url": "r:8"}}},
             "spec.task.rewardService.url", "", cli_message="is not an http(s) URL"),
    BadInput("heldout-fraction-one", {"task": {"dataset": {"path": "d.jsonl", "heldoutFraction": 1.0},
                                               "reward": "m:f"}},
             "spec.task.dataset.heldoutFraction", "less than 1"),
    # ---- pod overrides
    BadInput("env-asyncrl-prefix", {"rollout": {"template": {"env": [{"name": "ASYNCRL_ROLE", "value": "x"}]}}},
             "spec.rollout.template.env[0].name", RESERVED_ENV_MESSAGE),
    BadInput("env-ray-prefix", {"actor": {"template": {"env": [{"name": "RAY_ADDRESS", "value": "x"}]}}},
             "spec.actor.template.env[0].name", RESERVED_ENV_MESSAGE),
    BadInput("env-no-source", {"actor": {"template": {"env": [{"name": "HF_HOME"}]}}},
             "spec.actor.template.env[0]", ENV_SOURCE_MESSAGE),
    BadInput("env-two-sources",
             {"rollout": {"template": {"env": [{"name": "HF_HOME", "value": "/x",
                                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}}},
             "spec.rollout.template.env[0]", ENV_SOURCE_MESSAGE),
    BadInput("mount-reserved-name", {"actor": {"template": {"volumeMounts": [{"name": "dshm", "mountPath": "/x"}]}}},
             "spec.actor.template.volumeMounts[0].name", RESERVED_VOLUME_MESSAGE),
    BadInput("mount-reserved-path",
             {"rollout": {"template": {"volumeMounts": [{"name": "data", "mountPath": "/etc/asyncrl"}]}}},
             "spec.rollout.template.volumeMounts[0].mountPath", RESERVED_VOLUME_MESSAGE),
    *_SECURITY_CASES,
    # ---- enums (schema only)
    _enum("reference-enum", {"correction": {"reference": "ewmaa"}}, "spec.correction.reference"),
    _enum("mask-mode-enum", {"correction": {"mask": {"mode": "hard"}}}, "spec.correction.mask.mode"),
    _enum("mask-level-enum", {"correction": {"mask": {"level": "batch"}}}, "spec.correction.mask.level"),
    _enum("loss-aggregation-enum", {"correction": {"lossAggregation": "sum"}}, "spec.correction.lossAggregation"),
    _enum("ewma-window-enum", {"correction": {"ewma": {"window": "guessed"}}}, "spec.correction.ewma.window"),
    _enum("rollout-dtype-enum", {"model": {"rolloutDtype": "float16"}}, "spec.model.rolloutDtype"),
    _enum("mask-guard-action-enum", {"monitoring": {"maskGuard": {"action": "Panic"}}},
          "spec.monitoring.maskGuard.action"),
    _enum("gang-scheduler-enum", {"scheduling": {"gangScheduler": "kueue"}}, "spec.scheduling.gangScheduler"),
    # ---- minimums and maximums (both say "greater/less than ...")
    BadInput("train-steps-zero", {"train": {"steps": 0}}, "spec.train.steps", "greater than or equal to 1"),
    BadInput("train-minibatches-zero", {"train": {"minibatches": 0}}, "spec.train.minibatches",
             "greater than or equal to 1"),
    BadInput("train-epochs-above-64", {"train": {"epochs": 65}}, "spec.train.epochs", "less than or equal to 64"),
    BadInput("train-micro-batch-tokens-negative", {"train": {"microBatchTokens": -1}},
             "spec.train.microBatchTokens", "greater than or equal to 0"),
    # ---- train.minibatches <= promptsPerStep x groupSize (root CEL rule with the defaults spelled out)
    BadInput("minibatches-above-rows", {"train": {"promptsPerStep": 2, "minibatches": 5},
                                        "task": {"groupSize": 2}}, "spec.train.minibatches", MINIBATCHES_MESSAGE),
    BadInput("minibatches-above-default-rows", {"train": {"minibatches": 129}}, "spec.train.minibatches",
             MINIBATCHES_MESSAGE),
    BadInput("rollout-replicas-zero", {"rollout": {"replicas": 0}}, "spec.rollout.replicas",
             "greater than or equal to 1"),
    BadInput("staleness-above-64", {"async": {"maxStaleness": 65}}, "spec.async.maxStaleness",
             "less than or equal to 64"),
    BadInput("clip-low-one", {"correction": {"clip": {"low": 1.0}}}, "spec.correction.clip.low", "less than 1"),
    BadInput("backoff-limit-negative", {"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit",
             "greater than or equal to 0"),
    BadInput("preemption-limit-negative", {"runPolicy": {"preemptionLimit": -1}}, "spec.runPolicy.preemptionLimit",
             "greater than or equal to 0"),
    # ---- strict scalars, as strict as the CRD's types (schema only: the server says "must be of type ...")
    *_types([
        ("staleness-bool", {"async": {"maxStaleness": True}}, "spec.async.maxStaleness", "expected an integer, got true"),
        ("partial-rollout-string", {"async": {"partialRollout": "yes"}}, "spec.async.partialRollout",
         "expected true or false, got 'yes'"),
        ("steps-string", {"train": {"steps": "3"}}, "spec.train.steps", "expected an integer, got '3'"),
        ("steps-fraction", {"train": {"steps": 3.5}}, "spec.train.steps", "expected an integer, got 3.5"),
        ("learning-rate-string", {"train": {"learningRate": "1e-4"}}, "spec.train.learningRate",
         "expected a number, got '1e-4'"),
        ("rollout-replicas-bool", {"rollout": {"replicas": True}}, "spec.rollout.replicas", "expected an integer"),
        ("resume-int", {"checkpoint": {"resume": 1}}, "spec.checkpoint.resume", "expected true or false, got 1"),
        ("checkpoint-dir-number", {"checkpoint": {"dir": 3}}, "spec.checkpoint.dir", "expected a string, got 3"),
        ("bounds-low-string", {"correction": {"mask": {"bounds": {"low": "0.5", "high": 2.0}}}},
         "spec.correction.mask.bounds.low", "expected a number"),
    ]),
    # ---- every float in a sensible, finite range (.inf/.nan never reach the server: tests/api/test_job_file.py)
    BadInput("learning-rate-above-one", {"train": {"learningRate": 2.0}}, "spec.train.learningRate",
             "less than or equal to 1"),
    BadInput("learning-rate-zero", {"train": {"learningRate": 0.0}}, "spec.train.learningRate", "greater than 0"),
    BadInput("temperature-above-10", {"task": {"temperature": 11.0}}, "spec.task.temperature",
             "less than or equal to 10"),
    BadInput("temperature-zero", {"task": {"temperature": 0}}, "spec.task.temperature", "greater than 0"),
    BadInput("weight-decay-above-one", {"train": {"weightDecay": 1.5}}, "spec.train.weightDecay",
             "less than or equal to 1"),
    BadInput("max-grad-norm-above-1000", {"train": {"maxGradNorm": 1.0e4}}, "spec.train.maxGradNorm",
             "less than or equal to 1000"),
    BadInput("clip-high-above-10", {"correction": {"clip": {"high": 11.0}}}, "spec.correction.clip.high",
             "less than or equal to 10"),
    BadInput("dual-clip-above-100", {"correction": {"clip": {"dualClip": 101.0}}}, "spec.correction.clip.dualClip",
             "less than or equal to 100"),
    BadInput("bounds-high-above-1000", {"correction": {"mask": {"bounds": {"low": 0.5, "high": 2000.0}}}},
             "spec.correction.mask.bounds.high", "less than or equal to 1000"),
    BadInput("bounds-factor-above-1000", {"correction": {"mask": {"bounds": {"factor": 1.0e6}}}},
             "spec.correction.mask.bounds.factor", "less than or equal to 1000"),
    # ---- every count has a maximum a cluster can honour (the operator is never asked for 20 000 pods)
    BadInput("rollout-replicas-20000", {"rollout": {"replicas": 20000}}, "spec.rollout.replicas",
             "less than or equal to 512"),
    BadInput("actor-replicas-20000", {"actor": {"replicas": 20000}}, "spec.actor.replicas",
             "less than or equal to 64"),
    BadInput("dedicated-replicas-above-64", {**EXACT, "oldLogits": {"strategy": "dedicated",
                                                                    "dedicated": {"replicas": 65}}},
             "spec.oldLogits.dedicated.replicas", "less than or equal to 64"),
    BadInput("train-steps-1e8", {"train": {"steps": 100_000_000}}, "spec.train.steps",
             "less than or equal to 1000000"),
    BadInput("prompts-per-step-above-4096", {"train": {"promptsPerStep": 4097}}, "spec.train.promptsPerStep",
             "less than or equal to 4096"),
    BadInput("group-size-above-256", {"task": {"groupSize": 257}}, "spec.task.groupSize", "less than or equal to 256"),
    BadInput("max-new-tokens-above-32768", {"task": {"maxNewTokens": 32769}}, "spec.task.maxNewTokens",
             "less than or equal to 32768"),
    BadInput("micro-batch-tokens-above", {"train": {"microBatchTokens": 1 << 30}}, "spec.train.microBatchTokens",
             "less than or equal to 16777216"),
    BadInput("checkpoint-keep-above-100", {"checkpoint": {"keep": 101}}, "spec.checkpoint.keep",
             "less than or equal to 100"),
    BadInput("seed-above-2-32", {"train": {"seed": 2**32}}, "spec.train.seed", "less than or equal to 4294967295"),
    BadInput("snapshot-max-versions-above-65",
             {**EXACT, "oldLogits": {"strategy": "snapshot", "snapshot": {"maxVersions": 66}}},
             "spec.oldLogits.snapshot.maxVersions", "less than or equal to 65"),
    BadInput("active-deadline-above-a-year", {"runPolicy": {"activeDeadlineSeconds": 10**9}},
             "spec.runPolicy.activeDeadlineSeconds", "less than or equal to 31536000"),
    BadInput("hidden-size-above", {"model": {"hiddenSize": 1 << 20}}, "spec.model.hiddenSize",
             "less than or equal to 65536"),
    # ---- anchored patterns: a value ending in a newline is refused (re.match's '$' matched before it)
    BadInput("name-trailing-newline", {}, "metadata.name", NAME_MESSAGE, name="calc\n"),
    BadInput("preset-trailing-newline", {"model": {"preset": "tiny-llama\n"}}, "spec.model.preset", "",
             cli_message="expected one of"),
    BadInput("cpu-trailing-newline", {"rollout": {"resources": {"cpu": "4\n"}}}, "spec.rollout.resources.cpu", ""),
    # ---- paths the job owns: checkpoint.dir stays in the run directory or the checkpoint volume
    BadInput("checkpoint-dir-escapes", {"checkpoint": {"dir": "../../x"}}, "spec.checkpoint.dir",
             CHECKPOINT_DIR_MESSAGE, cli_message="normalises to '../../x'"),
    BadInput("checkpoint-dir-escapes-after-normalising", {"checkpoint": {"dir": "a/../../x"}}, "spec.checkpoint.dir",
             CHECKPOINT_DIR_MESSAGE, cli_message="normalises to '../x'"),
    BadInput("checkpoint-dir-absolute-outside-the-volume", {"checkpoint": {"dir": "/etc/ckpt"}}, "spec.checkpoint.dir",
             CHECKPOINT_DIR_MESSAGE),
    BadInput("checkpoint-dir-volume-prefix", {"checkpoint": {"dir": "/checkpointsx"}}, "spec.checkpoint.dir",
             CHECKPOINT_DIR_MESSAGE),
]


# Inputs both accept (the refusals this table once held for them were lifted: every strategy runs).
GOOD_INPUTS: list[tuple[str, dict[str, Any]]] = [
    ("snapshot-auto", {**EXACT, "oldLogits": {"strategy": "snapshot"}}),
    ("snapshot-cap-at-window", {**EXACT, "async": {"maxStaleness": 3},
                                "oldLogits": {"strategy": "snapshot", "snapshot": {"maxVersions": 4}}}),
    ("snapshot-on-disk", {**EXACT, "oldLogits": {"strategy": "snapshot", "snapshot": {"device": "disk"}}}),
    ("dedicated", {**EXACT, "oldLogits": {"strategy": "dedicated", "dedicated": {"replicas": 2, "maxLagVersions": 0}}}),
    ("interrupt-sync", {**EXACT, "oldLogits": {"strategy": "interruptSync",
                                               "interruptSync": {"phaseTimeoutSeconds": 60,
                                                                 "releaseRolloutResources": False}}}),
    ("audit-ewma", {"correction": {"reference": "ewma", "audit": {"everyNSteps": 10, "fraction": 0.5}}}),
    ("audit-behavior", {"correction": {"reference": "behavior", "audit": {"everyNSteps": 1}}}),
    ("dataset-with-reward", {"task": {"dataset": {"path": "d.parquet", "promptField": "question",
                                                  "answerField": None, "systemPrompt": "Be brief."},
                                      "reward": "pkg.mod:Scorer.score", "pythonPath": ["examples/tasks"]}}),
    ("dataset-with-environment", {"task": {"dataset": {"path": "d.jsonl", "answerField": "solution"},
                                           "environment": "pkg.env:Env", "args": {"turns": 3}}}),
    ("dataset-with-reward-service", {"task": {"dataset": {"path": "/data/d.jsonl", "shuffle": False, "seed": 3},
                                              "rewardService": {"url": "https://r.ns.svc:8000/score",
                                                                "retries": 0, "maxConcurrency": 64}}}),
    ("audit-off-with-exact", {"correction": {"reference": "exact", "audit": {"everyNSteps": 0}},
                              "oldLogits": {"strategy": "interruptSync"}}),
]


def good_manifest(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The whole AsyncRLJob of a :data:`GOOD_INPUTS` spec."""
    return bad_manifest(BadInput("good", spec, "", ""), name)
