"""Build the transformers model of a :class:`~asyncrl.api.model_arch.ModelArch` (any supported family) and
load HF-named weights into it.

Weights travel between actor and rollout under the names of a Hugging Face checkpoint
(``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``, ...,
``model.layers.N.mlp.experts.E.gate_proj.weight`` for MoE, ``lm_head.weight``): what the actor's
converter writes, what ``save_pretrained`` stores and what vLLM loads. transformers 5 keeps a MoE
layer's experts fused in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` = per expert ``[gate; up]``,
``mlp.experts.down_proj`` ``[E, H, I]``); :func:`load_hf_state_dict` writes the per-expert tensors
into those slices, so nothing upstream sees the in-memory layout.
"""

import re
from collections.abc import Mapping

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from asyncrl.api.model_arch import ModelArch

DTYPES: Mapping[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
LM_HEAD = "lm_head.weight"
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def torch_dtype(name: str) -> torch.dtype:
    """``'bfloat16'``/``'float32'`` (``spec.model.rolloutDtype``) as a torch dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"rollout dtype {name!r} is not supported; valid: {', '.join(DTYPES)}") from None


def hf_config(arch: ModelArch) -> PretrainedConfig:
    """The transformers config of ``arch``'s family (no dropout; transformers picks SDPA attention)."""
    cfg = arch.to_hf_config()
    cfg.pop("architectures")
    cfg.pop("dtype")
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.architectures = [arch.architecture]
    return config


llama_config = hf_config  # the Llama-only name, kept for its callers


def build_model(arch: ModelArch, dtype: torch.dtype = torch.float32, *, seed: int | None = None) -> PreTrainedModel:
    """A freshly initialised model of ``arch`` in ``dtype``, in eval mode (``seed`` fixes the init)."""
    config = hf_config(arch)
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(dtype).eval()  # type: ignore[arg-type]  # transformers types .to() narrowly


def _num_experts(model: PreTrainedModel) -> int:
    return int(getattr(model.config, "num_experts", 0) or 0)


def expected_keys(model: PreTrainedModel) -> set[str]:
    """HF checkpoint names a full state dict for ``model`` must hold (``lm_head.weight`` optional when tied).

    Fused in-memory experts are listed per expert (``...experts.E.{gate,up,down}_proj.weight``).
    """
    keys: set[str] = set()
    for key in model.state_dict():
        if m := _FUSED.match(key):
            names = ("gate_proj", "up_proj") if m.group(2) == "gate_up_proj" else ("down_proj",)
            keys |= {f"{m.group(1)}.{e}.{n}.weight" for e in range(_num_experts(model)) for n in names}
        else:
            keys.add(key)
    if model.config.tie_word_embeddings:
        keys.discard(LM_HEAD)
    return keys


def _targets(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """Checkpoint name -> the (view of the) model tensor it is copied into."""
    out: dict[str, torch.Tensor] = {}
    for key, param in model.state_dict().items():
        if m := _FUSED.match(key):
            base = m.group(1)
            for e in range(param.shape[0]):
                if m.group(2) == "gate_up_proj":  # [E, 2I, H]: rows [0, I) gate, [I, 2I) up
                    gate, up = param[e].chunk(2, dim=0)
                    out[f"{base}.{e}.gate_proj.weight"], out[f"{base}.{e}.up_proj.weight"] = gate, up
                else:  # [E, H, I]
                    out[f"{base}.{e}.down_proj.weight"] = param[e]
        else:
            out[key] = param
    return out


def load_hf_state_dict(model: PreTrainedModel, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state_dict`` (HF checkpoint names, any float dtype) into ``model``, casting to its dtype.

    With tied embeddings ``lm_head.weight`` is ignored when given (it is ``embed_tokens``). Raises a
    ``ValueError`` listing every missing/unexpected name and every shape mismatch at once.
    """
    want = expected_keys(model)
    got = set(state_dict) - ({LM_HEAD} if model.config.tie_word_embeddings else set())
    params = _targets(model)
    problems = []
    if missing := sorted(want - got):
        problems.append(f"missing {missing}")
    if unexpected := sorted(got - want):
        problems.append(f"unexpected {unexpected}")
    for k in sorted(want & got):
        if tuple(state_dict[k].shape) != tuple(params[k].shape):
            problems.append(f"{k}: got shape {tuple(state_dict[k].shape)}, model has {tuple(params[k].shape)}")
    if problems:
        raise ValueError(
            "load_hf_state_dict: the weights do not fit the rollout model (check that actor and rollout "
            "resolve the same spec.model): " + "; ".join(problems)
        )
    with torch.no_grad():
        for k in want:
            params[k].copy_(state_dict[k])


def hf_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """``model``'s weights under HF checkpoint names (views; experts per expert; tied head left out)."""
    targets = _targets(model)
    return {k: targets[k] for k in sorted(expected_keys(model))}
