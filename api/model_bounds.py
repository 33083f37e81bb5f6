"""The bounds of every ``config.json`` field a family reads, checked before anything is built from them.

A model folder is untrusted data: its ``config.json`` sizes the actor, both rollout engines and the
pre-checks, so a number there is a memory request. Each field the families read
(:func:`asyncrl.api.model_arch.arch_from_hf_config`) has a :class:`Bound`: a strict JSON type (``true``
is not an integer, ``"1e-6"`` is not a number, ``2048.0`` is not an integer), positive where a size must
be, and capped. The caps of the sizes a job spec can also set (``spec.model.hiddenSize``, ``numLayers``,
``numAttentionHeads``, ``numKeyValueHeads``, ``ffnHiddenSize``) are read from the spec model's own fields,
so a folder can never ask for more than a spec can; the others are named constants here. After the
fields, the whole architecture's parameter and tensor counts are estimated and capped
(:func:`asyncrl.api.model_arch.size_problems`) before any table or tensor is allocated.

:func:`field_problems` returns every problem at once, each naming the field, the bad value, the rule and
the fix. Pure (no torch, no file reading).
"""

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from asyncrl.api.model import ModelSpec

Kind = Literal["int", "number", "bool", "str", "list", "object"]
FIX = "correct it in config.json (re-save it from the model's own config with save_pretrained)"


def _spec_range(field: str) -> tuple[int, int]:
    """``(ge, le)`` of a ``spec.model`` size override: the one definition both bounds come from."""
    meta = ModelSpec.model_fields[field].metadata
    ge = next(m.ge for m in meta if hasattr(m, "ge"))
    le = next(m.le for m in meta if hasattr(m, "le"))
    return int(ge), int(le)


HIDDEN = _spec_range("hidden_size")  # (8, 65536)
LAYERS = _spec_range("num_layers")  # (1, 1024)
HEADS = _spec_range("num_attention_heads")  # (1, 1024)
KV_HEADS = _spec_range("num_key_value_heads")  # (1, 1024)
FFN = _spec_range("ffn_hidden_size")  # (8, 262144)
MAX_VOCAB = 1 << 20  # 1,048,576 ids; the largest vocabularies of these families are ~152k (Qwen), 262k elsewhere
MAX_POSITIONS = 1 << 20  # context length; sizes RoPE tables (vLLM caches cos/sin for every position)
MAX_HEAD_DIM = 1024  # real models use 64-256
MAX_EXPERTS = 1024  # routed experts per MoE layer (Qwen3-MoE: 128)
MAX_ROPE_THETA = 1e12  # RoPE base (real: 1e4-1e7)
MAX_PARAMETERS = 2 * 10**12  # 2T: above every open decoder of these families; sized before any allocation
MAX_TENSORS = 1 << 18  # 262,144 tensor names (Qwen3-235B-A22B has ~37k): bounds the pre-check's name tables


@dataclass(frozen=True)
class Bound:
    """What one ``config.json`` field may hold. ``lo``/``hi`` are inclusive unless ``open_lo``/``open_hi``;
    ``nullable``: JSON ``null`` means "the default"; ``spec``: the spec override that shares this bound."""

    kind: Kind
    lo: float | None = None
    hi: float | None = None
    required: bool = False
    nullable: bool = False
    open_lo: bool = False
    open_hi: bool = False
    spec: str | None = None


def _int(span: tuple[int, int], spec: str | None = None, **kw: Any) -> Bound:
    return Bound("int", span[0], span[1], spec=spec, **kw)


COMMON: Mapping[str, Bound] = {
    "architectures": Bound("list", nullable=True),
    "model_type": Bound("str", nullable=True),
    "hidden_size": _int(HIDDEN, "hiddenSize", required=True),
    "num_hidden_layers": _int(LAYERS, "numLayers", required=True),
    "num_attention_heads": _int(HEADS, "numAttentionHeads", required=True),
    "num_key_value_heads": _int(KV_HEADS, "numKeyValueHeads", nullable=True),
    "intermediate_size": _int(FFN, "ffnHiddenSize", required=True),
    "vocab_size": _int((1, MAX_VOCAB), required=True),
    "head_dim": _int((1, MAX_HEAD_DIM), nullable=True),
    "max_position_embeddings": _int((1, MAX_POSITIONS)),
    "hidden_act": Bound("str"),
    "rms_norm_eps": Bound("number", 0.0, 1.0, open_lo=True, open_hi=True),
    "rope_theta": Bound("number", 0.0, MAX_ROPE_THETA, open_lo=True),
    "rope_parameters": Bound("object", nullable=True),
    "rope_scaling": Bound("object", nullable=True),
    "tie_word_embeddings": Bound("bool"),
    "mlp_bias": Bound("bool"),
    "attention_bias": Bound("bool"),
}
ROPE: Mapping[str, Bound] = {  # inside rope_parameters / rope_scaling
    "rope_type": Bound("str"),
    "type": Bound("str"),
    "rope_theta": COMMON["rope_theta"],
}
MISTRAL: Mapping[str, Bound] = {"sliding_window": _int((1, MAX_POSITIONS), nullable=True)}
QWEN: Mapping[str, Bound] = {"use_sliding_window": Bound("bool")}
MOE: Mapping[str, Bound] = {
    "num_experts": _int((1, MAX_EXPERTS)),
    "num_local_experts": _int((1, MAX_EXPERTS)),
    "num_experts_per_tok": _int((1, MAX_EXPERTS)),
    "moe_intermediate_size": _int(FFN),
    "norm_topk_prob": Bound("bool"),
    "decoder_sparse_step": _int(LAYERS),
    "mlp_only_layers": Bound("list", nullable=True),
    "shared_expert_intermediate_size": _int((0, FFN[1]), nullable=True),
}


def family_bounds(family: str, moe: bool) -> dict[str, Bound]:
    """Every field ``family`` reads and its bound (the table :func:`field_problems` checks)."""
    out = dict(COMMON)
    if family == "mistral":
        out |= MISTRAL
    if family.startswith("qwen"):
        out |= QWEN
    if moe:
        out |= MOE
    return out


def show(value: Any, limit: int = 40) -> str:
    """``value`` as config.json spells it (``true``, ``"abc"``, ``1e+12``), cut to ``limit`` characters."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_JSON_TYPE = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
              dict: "an object", type(None): "null"}
_WANTED = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string",
           "list": "a list", "object": "an object"}


def _type_ok(kind: Kind, value: Any) -> bool:
    # type() rather than isinstance: bool is a subclass of int, and true must not pass as 1
    if kind == "int":
        return type(value) is int
    if kind == "number":
        return type(value) is int or (type(value) is float and math.isfinite(value))
    return {"bool": bool, "str": str, "list": list, "object": dict}[kind] is type(value)


def _range_rule(b: Bound) -> str:
    left = "(" if b.open_lo else "["
    right = ")" if b.open_hi else "]"
    return f"{left}{_num(b.lo, '-inf')}, {_num(b.hi, 'inf')}{right}"


def _num(x: float | None, none: str) -> str:
    if x is None:
        return none
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def value_problem(key: str, value: Any, b: Bound) -> str | None:
    """Why ``value`` breaks ``b`` (one line naming ``key``, the value, the rule and the fix), or None."""
    if value is None and b.nullable:
        return None
    if not _type_ok(b.kind, value):
        if b.kind == "number" and type(value) is float:  # NaN, Infinity, or 1e400 read as inf
            return f"{key} {show(value)} is not a finite number; {FIX}"
        got = _JSON_TYPE.get(type(value), type(value).__name__)
        return f"{key} {show(value)} is {got}, not {_WANTED[b.kind]}; {FIX}"
    if b.lo is None and b.hi is None:
        return None
    low = b.lo is not None and (value <= b.lo if b.open_lo else value < b.lo)
    high = b.hi is not None and (value >= b.hi if b.open_hi else value > b.hi)
    if not (low or high):
        return None
    same = f" (spec.model.{b.spec}'s bound too)" if b.spec else ""
    return f"{key} {show(value)} is outside {_range_rule(b)}{same}; {FIX}"


def field_problems(cfg: Mapping[str, Any], bounds: Mapping[str, Bound]) -> list[str]:
    """Every field of ``cfg`` that breaks its bound, a missing required one included (all at once)."""
    out = []
    for key, b in bounds.items():
        if key not in cfg:
            if b.required:
                out.append(f"{key} is missing (it must be {_WANTED[b.kind]} in {_range_rule(b)}); {FIX}")
            continue
        if (problem := value_problem(key, cfg[key], b)) is not None:
            out.append(problem)
    for key in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(key)
        if isinstance(rope, dict):
            out += [p for k, b in ROPE.items() if k in rope and (p := value_problem(f"{key}.{k}", rope[k], b))]
    archs = cfg.get("architectures")
    if isinstance(archs, list) and not all(type(a) is str for a in archs):
        out.append(f"architectures {show(archs)} must list strings (class names); {FIX}")
    return out


__all__ = [
    "COMMON", "FFN", "HEADS", "HIDDEN", "KV_HEADS", "LAYERS", "MAX_EXPERTS", "MAX_HEAD_DIM", "MAX_PARAMETERS",
    "MAX_POSITIONS", "MAX_ROPE_THETA", "MAX_TENSORS", "MAX_VOCAB", "Bound", "family_bounds", "field_problems",
    "show", "value_problem",
]
