"""What the sections of ``bench/scale.py`` share: the model shapes, a free local port, the Markdown table."""

import socket
from dataclasses import replace
from typing import Any

# M parameters -> (hidden, layers, heads, KV heads, SwiGLU inner, vocab): Llama-shaped, untied; the largest is
# the 100 M-parameter shape of docs/architecture.md (hidden 768, 12/4 heads, vocab 32768) at 8 layers.
SHAPES: dict[int, tuple[int, int, int, int, int, int]] = {
    10: (384, 2, 6, 2, 1024, 8192),
    35: (512, 6, 8, 2, 1408, 16384),
    100: (768, 8, 12, 4, 2048, 32768),
}


def arch_of(millions: int) -> Any:
    """The architecture of :data:`SHAPES` ``[millions]`` (valid keys: its sizes)."""
    from asyncrl.api.model_arch import PRESETS

    if millions not in SHAPES:
        raise SystemExit(f"--sizes: {millions} has no shape; valid: {sorted(SHAPES)}")
    h, layers, heads, kv, ffn, vocab = SHAPES[millions]
    base = next(a for a in PRESETS.values() if a.family == "llama")
    return replace(base, hidden_size=h, num_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                   ffn_hidden_size=ffn, vocab_size=vocab, tie_embeddings=False, kv_channels=None)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the broadcast group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(rows: list[dict[str, Any]]) -> str:
    """``rows`` (one dict per row, the first row's keys are the columns) as a Markdown table."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
