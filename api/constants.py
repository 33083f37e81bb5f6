"""Names that the operator, the driver and the job's pods must agree on: one definition each.

The operator writes them into pods (ports, environment, Ray resources); the driver reads them
back inside the job. Nothing here imports anything heavy.
"""

from typing import Final

# ---------------------------------------------------------------- the API
GROUP: Final = "asyncrl.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "AsyncRLJob"
PLURAL: Final = "asyncrljobs"
SINGULAR: Final = "asyncrljob"
SHORT_NAMES: Final = ("arj",)

# ---------------------------------------------------------------- Ray inside a job
# The driver pod runs the Ray head on these ports; the headless Service, the worker pods'
# `ray start --address` and the probes use the same numbers.
PORT_GCS: Final = 6379
PORT_DASHBOARD: Final = 8265
PORT_CLIENT: Final = 10001
GCS_HEALTH_PATH: Final = "/api/gcs_healthz"

# Custom Ray resources a pod advertises (`ray start --resources`); the driver places its
# processes by them (one unit per pod of that role).
RESOURCE_DRIVER: Final = "driver"
RESOURCE_ROLLOUT: Final = "rollout"
RESOURCE_ACTOR: Final = "actor"
RESOURCE_OLD_LOGITS: Final = "oldlogits"
# Actor pod i advertises {RESOURCE_ACTOR: g, actor_pod_resource(i): g} (g = max(gpusPerReplica, 1)): one
# unit per rank process it hosts, so rank r = i*g + j asks for {actor_pod_resource(i): 1} and lands on pod i.
ACTOR_POD_RESOURCE_PREFIX: Final = "actor-"


def actor_pod_resource(index: int) -> str:
    """The Ray resource only actor pod ``index`` advertises (``actor-0``, ``actor-1``, ...)."""
    return f"{ACTOR_POD_RESOURCE_PREFIX}{index}"


# Dedicated scorer pod i of a tensor-parallel scorer (k ranks) also advertises {old_logits_pod_resource(i): k}:
# the gang's ranks ask for one unit each and land together on pod i.
OLD_LOGITS_POD_RESOURCE_PREFIX: Final = "oldlogits-"


def old_logits_pod_resource(index: int) -> str:
    """The Ray resource only dedicated scorer pod ``index`` advertises (``oldlogits-0``, ...)."""
    return f"{OLD_LOGITS_POD_RESOURCE_PREFIX}{index}"


# Ray would give each rank's worker process only its own GPU in CUDA_VISIBLE_DEVICES; with this set
# every rank sees all of the pod's GPUs (NCCL's peer-to-peer paths) and picks LOCAL_RANK = its Ray GPU id.
ENV_RAY_NOSET_CUDA_VISIBLE_DEVICES: Final = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"

# ---------------------------------------------------------------- environment of the job's pods
ENV_JOB_NAME: Final = "ASYNCRL_JOB_NAME"
ENV_JOB_NAMESPACE: Final = "ASYNCRL_JOB_NAMESPACE"
ENV_ROLE: Final = "ASYNCRL_ROLE"
ENV_REPLICA_INDEX: Final = "ASYNCRL_REPLICA_INDEX"
ENV_SPEC: Final = "ASYNCRL_SPEC"
ENV_CHECKPOINT_DIR: Final = "ASYNCRL_CHECKPOINT_DIR"
ENV_ROLLOUT_ENGINE: Final = "ASYNCRL_ROLLOUT_ENGINE"
ENV_ENGINE_ARGS: Final = "ASYNCRL_ENGINE_ARGS"
ENV_HOSTED_ROLES: Final = "ASYNCRL_HOSTED_ROLES"
ENV_TENSOR_PARALLEL: Final = "ASYNCRL_TENSOR_PARALLEL"
ENV_PIPELINE_PARALLEL: Final = "ASYNCRL_PIPELINE_PARALLEL"
ENV_DATA_PARALLEL: Final = "ASYNCRL_DATA_PARALLEL"
ENV_WORLD_SIZE: Final = "ASYNCRL_WORLD_SIZE"
# The driver container's way to status.training: the socket of the driver pod's status sidecar.
ENV_STATUS_RELAY: Final = "ASYNCRL_STATUS_RELAY"
# Operator settings are ASYNCRL_OPERATOR_<FIELD> (asyncrl.operator.config).
ENV_OPERATOR_PREFIX: Final = "ASYNCRL_OPERATOR_"

# Ray's own variables in the job's pods: token auth from the job's Secret (key TOKEN_KEY).
ENV_RAY_ADDRESS: Final = "RAY_ADDRESS"
ENV_RAY_AUTH_MODE: Final = "RAY_AUTH_MODE"
ENV_RAY_AUTH_TOKEN: Final = "RAY_AUTH_TOKEN"
TOKEN_KEY: Final = "token"

# ---------------------------------------------------------------- the job's pods
JOB_UID: Final = 10001  # the user (and group) of docker/job.Dockerfile
SPEC_DIR: Final = "/etc/asyncrl"
SPEC_FILE: Final = "job.yaml"
CHECKPOINT_MOUNT: Final = "/checkpoints"
SHM_MOUNT: Final = "/dev/shm"
# The driver pod's status sidecar: the relay's socket folder (both containers) and the <job>-status
# ServiceAccount token (the sidecar only; Kubernetes' own path, which the in-cluster client reads).
STATUS_RELAY_DIR: Final = "/var/run/asyncrl"
STATUS_RELAY_SOCKET: Final = f"{STATUS_RELAY_DIR}/status.sock"
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# The operator's own volumes (name -> mount path); pod overrides may not reuse either.
OPERATOR_VOLUMES: Final = {"spec": SPEC_DIR, "dshm": SHM_MOUNT, "checkpoints": CHECKPOINT_MOUNT,
                           "status-relay": STATUS_RELAY_DIR, "status-token": SERVICE_ACCOUNT_DIR}

# ---------------------------------------------------------------- the agent endpoint (spec.task.agent)
# Where a rollout worker's OpenAI-compatible endpoint listens (host:port; unset: loopback on a free port) and
# the base URL its sessions hand out (in a cluster: the pod's own address); the operator sets both on rollout pods.
AGENT_BIND_ENV: Final = "ASYNCRL_AGENT_BIND"
AGENT_ADVERTISE_ENV: Final = "ASYNCRL_AGENT_ADVERTISE"
# The key a harness sends to take a session (spec.task.endpoint.sessionKeyFrom; unset: none needed).
AGENT_SESSION_KEY_ENV: Final = "ASYNCRL_AGENT_SESSION_KEY"

# ---------------------------------------------------------------- ownership labels and annotations
# Label keys the operator sets on every child and selects on (asyncrl.operator.names.labels, the
# gang scheduler's group label): a role's template may not set them, and the job's own
# metadata.labels are copied onto children without them.
RESERVED_LABEL_PREFIXES: Final = (f"{GROUP}/", "ray.io/")
RESERVED_LABEL_KEYS: Final = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of", "app.kubernetes.io/component", "scheduling.x-k8s.io/pod-group",
)
# Annotation keys the operator writes on pods (epoch, spec hash; kopf's own state; Volcano's group).
RESERVED_ANNOTATION_PREFIXES: Final = (f"{GROUP}/", f"kopf.{GROUP}/")
RESERVED_ANNOTATION_KEYS: Final = ("scheduling.k8s.io/group-name",)


def reserved_label(key: str) -> bool:
    """Whether ``key`` is one of the operator's ownership labels (see RESERVED_LABEL_*)."""
    return key in RESERVED_LABEL_KEYS or key.startswith(RESERVED_LABEL_PREFIXES)
