"""The rollout engines by ``spec.rollout.engine`` name: :data:`ENGINES` and :func:`make_engine`.

This module sits above the backends (it imports them; they import only :mod:`asyncrl.rollout.engine`,
the protocol and the shared base), so the import graph runs one way: registry -> backend -> base.

- ``transformers``: :class:`~asyncrl.rollout.hf_engine.HFEngine`, in-process, CPU or one GPU.
- ``vllm``: :class:`~asyncrl.rollout.vllm_engine.VLLMEngine`, vLLM in an engine process of its own
  interpreter, driven step by step (float32 on vLLM's CPU build; its ``engineArgs`` are
  :data:`asyncrl.rollout.vllm_engine.VLLM_ENGINE_ARGS`).
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING

from asyncrl.rollout.engine import RolloutEngine

if TYPE_CHECKING:
    from asyncrl.api.model_arch import LlamaArch

ENGINES: tuple[str, ...] = ("transformers", "vllm")


def make_engine(
    name: str,
    arch: "LlamaArch",
    *,
    dtype: str = "bfloat16",
    seed: int = 0,
    pad_id: int = 0,
    engine_args: Mapping[str, object] | None = None,
    capture_routes: bool = False,
) -> RolloutEngine:
    """The engine ``spec.rollout.engine`` names, for ``arch``.

    The backend is imported here, when it is asked for: the transformers one loads ``transformers``, the
    vLLM one starts an engine process; a worker pays only for the one its spec names.
    """
    if name not in ENGINES:
        raise ValueError(f"spec.rollout.engine {name!r} is unknown; valid engines: {', '.join(ENGINES)}")
    if name == "vllm":
        from asyncrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(arch, dtype=dtype, seed=seed, pad_id=pad_id, engine_args=engine_args,
                          capture_routes=capture_routes)
    args = dict(engine_args or {})
    fp32_head = args.pop("fp32Head", False)
    if args or not isinstance(fp32_head, bool):
        raise ValueError(
            f"spec.rollout.engineArgs {dict(engine_args or {})} do not fit the transformers engine; "
            "it takes only fp32Head: true|false (final norm and LM head in float32)"
        )
    from asyncrl.rollout.hf_engine import HFEngine

    return HFEngine(arch, dtype=dtype, seed=seed, pad_id=pad_id, fp32_head=fp32_head, capture_routes=capture_routes)
