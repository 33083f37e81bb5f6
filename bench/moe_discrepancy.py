"""Benchmark: MoE routing replay (R3 / R2) against no replay, under exact and current old logits (issue 37).

Usage::

    .venv/bin/python bench/moe_discrepancy.py [--episodes 32] [--tokens 24] [--experts 8] [--top-k 2]
                                              [--json docs/results/data/moe_replay/tiny-qwen3-moe.json]

One run, side by side: a tiny random Qwen3-MoE folder (``asyncrl models make-tiny qwen3_moe``'s shape with
``--experts`` experts, top ``--top-k``), a **bf16** transformers rollout (routes captured) against the **fp32**
megatron actor. Three versions: v0 is the folder, v1 and v2 add a small random step to every weight (a stand-in
for two optimizer steps: relative size ``--step``). Rollout starts under v0 and receives v1 in the middle of
every trajectory (partial rollout: the engine re-prefills the prefix under v1), so each trajectory spans two
versions; the actor is at v2 ("current").

Per row (replay off / R2 / R3 x reference exact / current), over the sampled tokens:

- positions routed differently: share of the fed positions (prompt and sampled, not padding) that the
  reference forward's own routers send to another expert set, in at least one layer, than the rollout did (the
  R3 paper's statistic); tokens reached: share of sampled tokens whose context (positions ``0..t-1``) holds
  such a position. Replay removes both from the reference forward; R2 does not change r_d (its reference
  forward routes by itself; only the training forward replays those routes);
- |log r_d| mean / p50 / p99 with ``r_d = pi_ref / mu``, the keep ratio at ``[0.99, 1.01]``, and k3 KL
  ``E_mu[r - 1 - log r]``.

Cost: route bytes per token (every version's block, and the newest only, which the training forward replays),
rollout seconds with capture against without, and a training forward+backward with replay against without
(each measured ``--repeats`` times alternately in this process, best of each: the machine is shared,
compare the ratios). R2 with exact is not
built (refused at validation); it has no row.
"""

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from asyncrl.rollout.envs.base import CONTINUE, EnvStep
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.tiny_models import make_tiny
from asyncrl.rollout.tokenizer import HFTokenizer
from asyncrl.trainer.driver.loop.grpo_batch import assemble_batch
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.convert import load_folder_into, megatron_to_hf
from asyncrl.trainer.megatron.hf_folder import HFFolder
from asyncrl.trainer.megatron.logprobs import token_logprobs
from asyncrl.trainer.megatron.model import build_gpt_model
from asyncrl.trainer.megatron.routing_replay import flipped_positions, recording, replays_of
from asyncrl.trainer.oldlogits.snapshot import slot_of_version

BAND = (0.99, 1.01)


class FreeText:
    """Prompts of random ids; the agent writes until the token budget (truncated)."""

    task = "free"
    truncated_reward = 0.0

    def __init__(self, tokenizer: Any, on_token: Any = None) -> None:
        self.tokenizer, self.on_token, self.seen = tokenizer, on_token, 0

    def reset(self, rng: random.Random) -> list[int]:
        return [rng.randrange(3, 200) for _ in range(rng.randint(4, 10))]

    def step(self, turn_text: str) -> EnvStep:
        self.seen += 1
        if self.on_token is not None:
            self.on_token(self.seen)
        return CONTINUE

    def info(self) -> dict[str, Any]:
        return {}


def _versions(folder: Path, arch: Any, step: float, seed: int) -> list[torch.nn.Module]:
    """fp32 megatron models of v0 (the folder), v1, v2 (each the previous plus a relative random step)."""
    models = []
    g = torch.Generator().manual_seed(seed)
    for v in range(3):
        gpt = build_gpt_model(arch, random_init=False).eval()
        load_folder_into(gpt, arch, HFFolder(folder))
        if v:
            gpt.load_state_dict(models[-1].state_dict())
            with torch.no_grad():
                for p in gpt.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * step * (p.std() if p.numel() > 1 else 1.0))
        models.append(gpt)
    return models


def _rollout(folder: Path, arch: Any, hf: list[dict], episodes: int, tokens: int, capture: bool,
             seed: int) -> tuple[list, float]:
    eng = HFEngine(arch, dtype="bfloat16", seed=seed, capture_routes=capture)
    eng.load_weights(hf[0], version=0)
    tok = HFTokenizer.from_folder(folder)
    half = tokens // 2

    def swap(seen: int) -> None:
        if seen == half:
            eng.update_weights(hf[1], version=1)

    eps = [Episode.start(f"t{i}", "g", FreeText(tok, swap if i == 0 else None), random.Random(seed * 1000 + i))
           for i in range(episodes)]
    t0 = time.perf_counter()
    eng.generate(eps, max_new_tokens=tokens, partial_rollout=True)
    return [e.to_trajectory() for e in eps], time.perf_counter() - t0


def _logp(model: torch.nn.Module, tokens: torch.Tensor, routes: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
    with torch.no_grad():
        logp = token_logprobs(model, tokens, routes=routes)
    return logp, flipped_positions(replays_of(model), *tokens.shape) if routes is not None else None


def _by_token(flips: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` per position -> per token: token t's logit is computed at position t - 1 and attends to
    positions 0..t-1, so a flip at any of them reaches it (the cumulative "any")."""
    return torch.nn.functional.pad(flips[:, :-1].int().cummax(dim=1).values.bool(), (1, 0))


def _stats(logp_ref: torch.Tensor, logp_mu: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    d = (logp_ref - logp_mu)[mask].double()  # log r_d
    a = d.abs()
    r = d.exp()
    return {"abs_log_rd_mean": float(a.mean()), "abs_log_rd_p50": float(a.quantile(0.5)),
            "abs_log_rd_p99": float(a.quantile(0.99)),
            "keep_ratio": float(((r >= BAND[0]) & (r <= BAND[1])).double().mean()),
            "kl_k3": float((r - 1 - d).mean())}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    compat.init_megatron(seed=args.seed, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny("qwen3_moe", Path(tmp) / "moe", seed=args.seed, num_experts=args.experts,
                           num_experts_per_tok=args.top_k)
        from asyncrl.api.model_arch import arch_from_hf_config, folder_config

        arch = arch_from_hf_config(folder_config(str(folder)))
        models = _versions(folder, arch, args.step, args.seed)
        hf = [megatron_to_hf(m.state_dict(), arch) for m in models[:2]]
        trajs, _ = _rollout(folder, arch, hf, args.episodes, args.tokens, True, args.seed)
        t_on, t_off = [], []  # the same episodes, capture on and off alternately (the machine is shared)
        for _ in range(args.repeats):
            t_on.append(_rollout(folder, arch, hf, args.episodes, args.tokens, True, args.seed)[1])
            t_off.append(_rollout(folder, arch, hf, args.episodes, args.tokens, False, args.seed)[1])
        batch = assemble_batch([trajs], pad_id=0)
        m = batch.loss_mask
        tokens = batch.tokens
        lengths = torch.tensor([len(t.tokens) for t in trajs])
        fed = torch.arange(tokens.shape[1])[None] < (lengths - 1)[:, None]  # every position fed to the engine
        assert batch.routes is not None and batch.route_slots is not None and batch.route_slot_versions is not None

        def exact(replay: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """pi_old of every token under its own version (rows holding it), and the routes-differ flags."""
            out = torch.zeros_like(batch.logp_mu)
            differ = torch.zeros_like(m)
            positions = torch.zeros_like(m)
            for v in (0, 1):
                sel = m & (batch.versions == v)
                rows = sel.any(dim=1).nonzero().squeeze(1)
                routes = slot_of_version(batch.route_slots[rows], batch.route_slot_versions[rows], v)
                logp, flips = _logp(models[v], tokens[rows], routes if replay else None)
                if not replay:  # the same forward replayed once, for the flags only
                    _, flips = _logp(models[v], tokens[rows], routes)
                out[rows] = torch.where(sel[rows], logp, out[rows])
                differ[rows] |= _by_token(flips) & sel[rows]
                covered = torch.tensor([[p < (t.routes.length(v) if t.routes else 0) for p in range(tokens.shape[1])]
                                        for t in (trajs[int(r)] for r in rows)])  # slot v's positions
                positions[rows] |= flips & fed[rows] & covered
            return out, differ, positions

        rows: list[dict[str, Any]] = []
        for replay in ("off", "R3"):
            logp, differ, positions = exact(replay == "R3")
            rows.append({"replay": replay, "reference": "exact",
                         "positions_routed_differently": float(positions[fed].double().mean()),
                         "tokens_reached": float(differ[m].double().mean()), **_stats(logp, batch.logp_mu, m)})
        current, current_r3 = models[2], batch.routes
        logp_off, flips = _logp(current, tokens, None)
        _, flips = _logp(current, tokens, current_r3)
        differ_current = {"positions_routed_differently": float(flips[fed].double().mean()),
                          "tokens_reached": float(_by_token(flips)[m].double().mean())}
        logp_r3, _ = _logp(current, tokens, current_r3)
        with torch.no_grad(), recording(current) as rec:  # R2: the reference forward's own routes, recorded
            logp_r2 = token_logprobs(current, tokens)
        r2_routes = rec.routes(*tokens.shape)
        for replay, logp in (("off", logp_off), ("R2", logp_r2), ("R3", logp_r3)):
            rows.append({"replay": replay, "reference": "current", **differ_current,
                         **_stats(logp, batch.logp_mu, m)})

        # training forward + backward at v2 with and without replay (alternated, best of each)
        def train(routes: torch.Tensor | None) -> float:
            current.zero_grad()
            t0 = time.perf_counter()
            logp = token_logprobs(current, tokens, routes=routes)
            (logp * m).sum().backward()
            return time.perf_counter() - t0

        plain, replayed = [], []
        for _ in range(args.repeats):
            plain.append(train(None))
            replayed.append(train(r2_routes))
        total_tokens = sum(len(t.tokens) for t in trajs)
        log_bytes = sum(t.routes.nbytes for t in trajs if t.routes is not None)
        return {
            "model": {"family": "qwen3_moe", "layers": arch.num_layers, "experts": arch.num_experts,
                      "top_k": arch.moe_top_k, "hidden": arch.hidden_size, "vocab": arch.vocab_size},
            "setup": {"episodes": args.episodes, "max_new_tokens": args.tokens, "rollout_dtype": "bfloat16",
                      "actor_dtype": "float32", "versions_per_trajectory": 2, "weight_step": args.step,
                      "seed": args.seed, "sampled_tokens": int(m.sum())},
            "rows": rows,
            "cost": {
                "route_bytes_per_token_all_versions": log_bytes / total_tokens,
                "route_bytes_per_token_newest": float(arch.num_layers * arch.moe_top_k * batch.routes.element_size()),
                "rollout_capture_over_plain": min(t_on) / min(t_off),
                "rollout_seconds": {"capture": t_on, "plain": t_off},
                "train_fwd_bwd_replay_over_plain": min(replayed) / min(plain),
                "train_fwd_bwd_seconds": {"replay": replayed, "plain": plain},
            },
        }


def print_table(record: dict[str, Any]) -> None:
    s = record["setup"]
    print(f"tiny Qwen3-MoE {record['model']}; bf16 rollout vs fp32 actor; {s['sampled_tokens']} sampled tokens, "
          f"two versions per trajectory (v0 -> v1 mid-trajectory), actor at v2")
    print(f"{'replay':<6} {'reference':<9} {'positions differ':>16} {'tokens reached':>14} {'|log r_d| mean':>14} "
          f"{'p50':>9} {'p99':>9} {'keep [.99,1.01]':>15} {'k3 KL':>10}")
    for r in record["rows"]:
        print(f"{r['replay']:<6} {r['reference']:<9} {r['positions_routed_differently']:>16.3f} "
              f"{r['tokens_reached']:>14.3f} {r['abs_log_rd_mean']:>14.2e} "
              f"{r['abs_log_rd_p50']:>9.2e} {r['abs_log_rd_p99']:>9.2e} {r['keep_ratio']:>15.3f} {r['kl_k3']:>10.2e}")
    c = record["cost"]
    print(f"route bytes/token: {c['route_bytes_per_token_all_versions']:.1f} (every version's block), "
          f"{c['route_bytes_per_token_newest']:.0f} (newest, in the training batch)")
    print(f"rollout with capture / without: {c['rollout_capture_over_plain']:.3f}; "
          f"training fwd+bwd with replay / without: {c['train_fwd_bwd_replay_over_plain']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=24, help="max new tokens per episode")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--step", type=float, default=0.02, help="relative size of each version's weight step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    record = measure(args)
    print_table(record)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
