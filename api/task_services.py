"""The HTTP services a job's task calls, found in its spec, and what ``asyncrl validate`` warns about them.

A job calls at most one service: ``spec.task.rewardService``, or an environment service
(``environment: asyncrl.rollout.envs.remote:RemoteEnvironment`` with the same settings in ``args``);
the two exclude each other (``api/dataset.py``'s task rules). The operator reads :func:`task_services`
to put each ``headersFrom`` Secret into the pods (``operator/builders.py``); the CLI prints
:func:`service_warnings`.
"""

from typing import Final

from pydantic import ValidationError

from asyncrl.api.dataset import RewardServiceSpec
from asyncrl.api.service import destination_warnings, header_env_var
from asyncrl.api.task import TaskSpec

REMOTE_ENVIRONMENT: Final = "asyncrl.rollout.envs.remote:RemoteEnvironment"


def task_services(task: TaskSpec) -> dict[str, RewardServiceSpec]:
    """``{field path: settings}`` of the services ``task`` calls. Environment ``args`` that are not valid
    settings are left out here: building the environment at job start reports them."""
    if task.reward_service is not None:
        return {"spec.task.rewardService": task.reward_service}
    if task.environment == REMOTE_ENVIRONMENT:
        try:
            return {"spec.task.args": RewardServiceSpec.model_validate(task.args)}
        except ValidationError:
            return {}
    return {}


def header_env(task: TaskSpec) -> list[dict[str, object]]:
    """The pod ``env`` entries that carry ``task``'s service headers, each ``valueFrom`` its Secret key."""
    return [
        {"name": header_env_var(h.name),
         "valueFrom": {"secretKeyRef": {"name": h.secret_key_ref.name, "key": h.secret_key_ref.key}}}
        for service in task_services(task).values() for h in service.headers_from
    ]


def service_warnings(task: TaskSpec, *, local: bool) -> list[str]:
    """Destinations a job should not call (:func:`~asyncrl.api.service.destination_warnings`), and a service
    deadline the environment timeout would cut first."""
    out = []
    for field, service in task_services(task).items():
        url_field = f"{field}.url"
        out += destination_warnings(service.url, url_field, local=local)
        if service.timeout_seconds >= task.env_timeout_seconds:
            out.append(f"{field}.timeoutSeconds: {service.timeout_seconds:g} s is not below spec.task."
                       f"envTimeoutSeconds={task.env_timeout_seconds:g}: a slow call is cut as 'timeout' before the "
                       "service's own remote_timeout; lower timeoutSeconds")
    return out
