"""Benchmark: the exact route over rows that span two versions, each (row, version) pair cut after its version's
last token, against the uncut pairs it replaced, side by side.

Usage::

    .venv/bin/python bench/lora_spans.py [--model small-llama] [--rank 16] [--rows 8] [--tokens 128]
                                         [--switch 0.5] [--rounds 9] [--threads 1] [--profile] [--mix]
                                         [--json out.json]
    .venv/bin/python bench/lora_spans.py --mix-from docs/results/data/lora_learning/<lora record>.json ... \
                                         [--mix-batches 40] [--model tiny-llama] [--rounds 9] [--threads 1]

``--mix-from`` replays the batches real jobs trained on (the LoRA arm's records of ``bench/lora_learning.py``
keep each batch's per-token versions): the same rows, lengths, tool-token gaps and version switches, random token
ids (the cost does not depend on them), each batch's versions mapped onto as many resident versions. Per round it
times EWMA's forward and the exact route over every replayed batch, and the exact route over the same batches with
each row's tokens under one version (what the batch would cost if no row spanned versions), for LoRA and full
fine-tuning side by side, and counts the token positions each route's forwards compute (span_plan's cut). The exact
route also runs with span_plan's split into length groups turned off (one group: each forward pads its pairs to
the longest), to weigh the split's saved positions against the extra forwards' fixed cost on batches this small.

A row whose tokens were sampled under two versions is scored under both: the rollout engine re-prefills its
cache after every weight swap, so a token's behaviour log-prob is its own version's over the whole prefix, and
the two versions share no hidden state. ``score_exact`` used to score every (row, version) pair over the whole
row, twice the rows of a batch whose every row spans two versions. A pair needs its row only up to its
version's last token (causal attention), so ``trainer/oldlogits/span_plan.py`` now cuts it there and runs the
pairs in the fewest forwards their lengths call for. Rows switched at ``--switch`` of their length then cost
``1 + switch`` rows' forwards instead of 2.

Both actors of ``bench/lora_versions.py`` (LoRA with the adapter bank, and full fine-tuning with one forward per
version) time EWMA's forward (one version) and the exact route over rows of one version and over rows spanning two.
Each exact op runs once per round cut and once uncut (the old rule patched in for that call alone), so a load
spike hits both alike. Ratios are medians of per-round ratios. The max log-prob difference between cut and
uncut is recorded. No time is asserted anywhere.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lora_versions as lv  # noqa: E402 -- the sibling bench's actors, versions and batches


def _batch(rows: int, tokens: int, switch: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``lora_versions``' batch whose every row spans two versions, switched at ``switch`` of its length."""
    ids, mask, one = lv._batch(rows, tokens, spans=False)
    two = one.clone()
    at = int(tokens * switch)
    two[:, at:] = torch.where(mask[:, at:], (one[:, at:] + 1) % lv.VERSIONS, -1)
    return ids, mask, two


def measure(model: str, rank: int, rows: int, tokens: int, rounds: int, switch: float = 0.5) -> dict[str, Any]:
    from asyncrl.trainer.oldlogits import span_plan
    from asyncrl.trainer.oldlogits.snapshot import score_exact

    cut = span_plan.needed_lengths

    def whole_rows(sel: torch.Tensor) -> torch.Tensor:  # the old rule: every pair over the whole row
        return sel.any(dim=1).long() * sel.shape[1]

    @contextlib.contextmanager
    def uncut() -> Iterator[None]:
        span_plan.needed_lengths = whole_rows
        try:
            yield
        finally:
            span_plan.needed_lengths = cut

    def under_old(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with uncut():
                return fn()
        return run

    ids, mask, one = lv._batch(rows, tokens, spans=False)
    _, _, two = _batch(rows, tokens, switch)
    ops: dict[str, Callable[[], Any]] = {}
    diffs: dict[str, float] = {}
    actors = {"lora": lv._actor(model, {"rank": rank, "alpha": 2.0 * rank}, "exact"),
              "full": lv._actor(model, None, "exact")}
    for kind, actor in actors.items():
        versions = lv._versions(actor, lv.VERSIONS)
        store = lv._store(versions)
        exact = {"exact_one": lambda a=actor, st=store: score_exact(st, a, ids, one, mask),
                 "exact_two": lambda a=actor, st=store: score_exact(st, a, ids, two, mask)}
        ops[f"{kind}.ewma"] = lambda a=actor, v=versions: a.logprobs_under(v[0], ids)
        for k, fn in exact.items():
            ops[f"{kind}.new.{k}"], ops[f"{kind}.old.{k}"] = fn, under_old(fn)
            diffs[f"{kind}.{k}"] = float((under_old(fn)() - fn()).abs().max())
    times = lv._rounds(ops, rounds)
    for actor in actors.values():
        actor.close()
    out: dict[str, Any] = {"model": model, "rank": rank, "rows": rows, "tokens": tokens, "switch": switch,
                           "median_s": {k: statistics.median(v) for k, v in times.items()},
                           "max_abs_logp_diff_new_vs_old": diffs}
    for kind in actors:
        out[kind] = {
            "new_over_old": {k: lv._ratio(times, f"{kind}.new.{k}", f"{kind}.old.{k}")
                             for k in ("exact_one", "exact_two")},
            "exact_over_ewma": {tag: {k: lv._ratio(times, f"{kind}.{tag}.{k}", f"{kind}.ewma")
                                      for k in ("exact_one", "exact_two")} for tag in ("new", "old")},
        }
    return out


def profile(model: str, rank: int, rows: int, tokens: int, switch: float = 0.5, calls: int = 5) -> dict[str, Any]:
    """The torch profiler over LoRA's EWMA forward and the exact route over rows spanning two versions, cut and
    uncut, the three taking turns call by call in one profiling session (so a load spike hits all alike): each
    one's ms per call and its top 6 ops by self CPU time (ms per call), where the second version's cost goes."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    from asyncrl.trainer.oldlogits import span_plan
    from asyncrl.trainer.oldlogits.snapshot import score_exact

    actor = lv._actor(model, {"rank": rank, "alpha": 2.0 * rank}, "exact")
    ids, mask, two = _batch(rows, tokens, switch)
    versions = lv._versions(actor, lv.VERSIONS)
    store = lv._store(versions)
    cut = span_plan.needed_lengths

    def uncut_two() -> Any:
        span_plan.needed_lengths = lambda sel: sel.any(dim=1).long() * sel.shape[1]
        try:
            return score_exact(store, actor, ids, two, mask)
        finally:
            span_plan.needed_lengths = cut

    work = {"ewma": lambda: actor.logprobs_under(versions[0], ids),
            "exact_two_cut": lambda: score_exact(store, actor, ids, two, mask), "exact_two_uncut": uncut_two}
    for fn in work.values():
        fn()  # warm-up
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            for name, fn in work.items():
                with record_function(f"bench.{name}"):
                    fn()
    total: dict[str, float] = dict.fromkeys(work, 0.0)
    ops: dict[str, dict[str, float]] = {name: {} for name in work}
    for ev in prof.events():
        top = ev
        while top.cpu_parent is not None:
            top = top.cpu_parent
        name = top.name.removeprefix("bench.")
        if name not in work:
            continue
        if ev is top:
            total[name] += ev.cpu_time_total / calls / 1e3
        else:
            ops[name][ev.name] = ops[name].get(ev.name, 0.0) + ev.self_cpu_time_total / calls / 1e3
    actor.close()
    return {name: {"total_ms": total[name],
                   "top_ms": dict(sorted(ops[name].items(), key=lambda kv: -kv[1])[:6])} for name in work}


def per_position_mix(model: str, rank: int, rows: int, tokens: int, switch: float = 0.5,
                     gaps: tuple[float, ...] = (1e-3, 1e-2, 1e-1)) -> dict[str, Any]:
    """What one base pass with each position's own version's adapter would score, against the exact route.

    Version 1's adapters: the live ``A`` and a random ``B`` (0.02 per entry); version 2's: each entry of version
    1's times ``1 + gap * N(0, 1)``. Rows switch from version 1 to 2 at ``switch``. The mix computes every
    adapted layer's output as ``W x + s B_v A_v x`` with ``v`` the version of the position, so a position after
    the switch attends to keys and values the earlier positions computed under version 1, which is not what
    the engine sampled from (it re-prefills after a swap). Returns the max and mean ``|log-prob difference|``
    over the second version's tokens (the first version's are exact under the mix: checked, 0)."""
    from asyncrl.trainer.oldlogits.snapshot import score_exact

    actor = lv._actor(model, {"rank": rank, "alpha": 2.0 * rank}, "exact")
    named = actor.named_weights()
    g = torch.Generator().manual_seed(0)
    v1 = {n: p.detach() + (0.02 * torch.randn(p.shape, generator=g) if n.endswith(".lora_B") else 0.0)
          for n, p in named.items()}
    ids, mask, _ = lv._batch(rows, tokens, spans=False)
    at = int(tokens * switch)
    vers = torch.where(mask, (torch.arange(tokens) >= at).long().expand(rows, tokens), -1)
    modules, scale = dict(actor.gpt.named_modules()), actor.lora.spec.scale
    out: dict[str, Any] = {}
    with torch.no_grad():
        live_b = {n: p.clone() for n, p in named.items() if n.endswith(".lora_B")}
        for gap in gaps:
            v2 = {n: t * (1 + gap * torch.randn(t.shape, generator=g)) for n, t in v1.items()}
            exact = score_exact(lv._store([v1, v2]), actor, ids, vers, mask)
            hooks = []
            for name in actor.lora.names:
                pair = [(v[name + ".lora_A"], v[name + ".lora_B"]) for v in (v1, v2)]

                def mix(layer: Any, args: Any, output: Any, pair: Any = pair) -> Any:
                    x, (o, bias) = args[0], output  # x [S, N, in]
                    d1, d2 = (scale * (x @ a.t()) @ b.t() for a, b in pair)
                    return o + torch.where(torch.arange(x.shape[0])[:, None, None] < at, d1, d2), bias

                hooks.append(modules[name].register_forward_hook(mix))
            for n in live_b:
                named[n].zero_()  # the live adapter adds 0: the mix hook adds each position's version
            try:
                mixed = actor.logprobs(ids)
            finally:
                for h in hooks:
                    h.remove()
                for n, b in live_b.items():
                    named[n].copy_(b)
            late, early = mask & (vers == 1), mask & (vers == 0)
            d, d_early = (mixed - exact)[late].abs(), (mixed - exact)[early].abs()
            out[f"{gap:g}"] = {"max_abs_logp_diff": float(d.max()), "mean_abs_logp_diff": float(d.mean()),
                               "first_version_max_abs_logp_diff": float(d_early.max()) if d_early.numel() else 0.0}
    actor.close()
    return out


def replayed_batches(paths: Sequence[Path], limit: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], dict[str, Any]]:
    """``(versions [rows, T], loss_mask)`` of up to ``limit`` batches of the records (spread evenly over them), each
    batch's versions renumbered 0..k-1 in order, padded with -1; and the span summary of ALL their batches."""
    import lora_learning as ll

    every = []
    for path in paths:
        every += json.loads(Path(path).read_text()).get("batches", [])
    if not every:
        raise SystemExit(f"no batches in {[str(p) for p in paths]}: pass the LoRA arm's records of bench/lora_learning.py")
    step = max(1, len(every) // limit)
    out = []
    for b in every[::step][:limit]:
        rows = [ll.expand(r) for r in b["rows"]]
        width = max(len(r) for r in rows)
        vers = torch.full((len(rows), width), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            vers[i, :len(r)] = torch.tensor(r)
        distinct = sorted(int(v) for v in torch.unique(vers[vers >= 0]))
        mapped = vers.clone()
        for k, v in enumerate(distinct):
            mapped[vers == v] = k
        out.append((mapped, mapped >= 0))
    return out, {"batches_in_records": len(every), **ll.span_summary(every)}


def positions(batch: tuple[torch.Tensor, torch.Tensor], overhead_rows: int = 1) -> dict[str, int]:
    """Token positions computed for one batch: EWMA's one forward (rows x T), and the exact route's forwards by
    span_plan (each (row, version) pair cut after its version's last token, grouped by length)."""
    from asyncrl.trainer.oldlogits import span_plan

    vers, mask = batch
    rows, width = vers.shape
    pair_lengths = []
    for v in sorted(int(x) for x in torch.unique(vers[mask])):
        sel = mask & (vers == v)
        pair_lengths += span_plan.needed_lengths(sel[sel.any(dim=1)]).tolist()
    groups = span_plan.plan(pair_lengths, overhead=width * overhead_rows)
    return {"ewma": rows * width, "exact": sum(len(idx) * n for idx, n in groups), "forwards": len(groups)}


def measure_replayed(paths: Sequence[Path], model: str, rank: int, rounds: int, limit: int) -> dict[str, Any]:
    """EWMA's forward against the exact route on the batches real jobs made, LoRA and full side by side."""
    from asyncrl.trainer.oldlogits import span_plan
    from asyncrl.trainer.oldlogits.snapshot import score_exact

    planned = span_plan.plan

    def one_group(fn: Callable[[], Any]) -> None:
        """``fn`` with span_plan's split turned off for this call alone: each forward (LoRA: one over every
        (row, version) pair; full: one per version) pads its pairs to the longest, whatever their lengths."""
        span_plan.plan = lambda lengths, overhead: planned(lengths, overhead=1 << 40)
        try:
            fn()
        finally:
            span_plan.plan = planned

    batches, spans = replayed_batches(paths, limit)
    k = max(int(v.max()) + 1 for v, _ in batches)
    g = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, lv.VOCAB, v.shape, generator=g) for v, _ in batches]
    # the same rows with every token under the row's last version: the cost if no row spanned versions
    flat = [torch.where(m, v.amax(dim=1, keepdim=True).expand_as(v), -1) for v, m in batches]
    actors = {"lora": lv._actor(model, {"rank": rank, "alpha": 2.0 * rank}, "exact"),
              "full": lv._actor(model, None, "exact")}
    ops: dict[str, Callable[[], Any]] = {}
    for kind, actor in actors.items():
        versions = lv._versions(actor, k)
        store = lv._store(versions)

        def ewma(a: Any = actor, v: Any = versions) -> None:
            for t in ids:
                a.logprobs_under(v[0], t)

        def exact(a: Any = actor, st: Any = store, which: Any = None) -> None:
            for t, (v, m), f in zip(ids, batches, flat, strict=True):
                score_exact(st, a, t, v if which is None else f, m)

        ops[f"{kind}.ewma"], ops[f"{kind}.exact"] = ewma, exact
        ops[f"{kind}.exact_flat"] = lambda e=exact: e(which="flat")
        ops[f"{kind}.exact_one_group"] = lambda e=exact: one_group(e)
    times = lv._rounds(ops, rounds)
    for actor in actors.values():
        actor.close()
    counted = [positions(b) for b in batches]
    shapes = [tuple(v.shape) for v, _ in batches]
    out: dict[str, Any] = {
        "model": model, "rank": rank, "records": [str(p) for p in paths], "batches_replayed": len(batches),
        "rows_per_batch": statistics.median(s[0] for s in shapes), "tokens_per_batch_median": statistics.median(s[1] for s in shapes),
        "versions_resident": k, "spans": spans,
        "positions_exact_over_ewma": sum(c["exact"] for c in counted) / sum(c["ewma"] for c in counted),
        "median_s": {k2: statistics.median(v) for k2, v in times.items()},
    }
    out["exact_forwards_per_batch"] = statistics.fmean(c["forwards"] for c in counted)  # LoRA's (the bank)
    for kind in actors:
        out[kind] = {"exact_over_ewma": lv._ratio(times, f"{kind}.exact", f"{kind}.ewma"),
                     "exact_flat_over_ewma": lv._ratio(times, f"{kind}.exact_flat", f"{kind}.ewma"),
                     "exact_over_exact_flat": lv._ratio(times, f"{kind}.exact", f"{kind}.exact_flat"),
                     "exact_one_group_over_ewma": lv._ratio(times, f"{kind}.exact_one_group", f"{kind}.ewma")}
    out["goal"] = {"exact_over_ewma_at_most": lv.GOAL_EXACT_OVER_EWMA,
                   "lora_met": out["lora"]["exact_over_ewma"] <= lv.GOAL_EXACT_OVER_EWMA}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lv.one_model_args(p)
    p.add_argument("--switch", type=float, default=0.5, help="where each row's second version starts (fraction)")
    p.add_argument("--profile", action="store_true", help="also the torch profiler's top ops (LoRA)")
    p.add_argument("--mix", action="store_true",
                   help="also how far one pass with per-position adapters lands from the exact route")
    p.add_argument("--mix-from", nargs="+", type=Path, metavar="RECORD",
                   help="replay the batches of these bench/lora_learning.py records instead of synthetic rows")
    p.add_argument("--mix-batches", type=int, default=40, help="--mix-from: batches replayed (spread evenly)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from asyncrl.trainer.megatron import compat

    compat.init_megatron(seed=0, device="cpu")
    before = os.getloadavg()
    if args.mix_from:
        record = measure_replayed(args.mix_from, args.model, args.rank, args.rounds, args.mix_batches)
        return lv.emit(record, "lora_spans_replayed", args, before)
    record = measure(args.model, args.rank, args.rows, args.tokens, args.rounds, args.switch)
    if args.mix:
        record["per_position_mix_vs_exact"] = per_position_mix(args.model, args.rank, args.rows, args.tokens,
                                                               args.switch)
    if args.profile:
        record["profile_ms_per_call"] = profile(args.model, args.rank, args.rows, args.tokens, args.switch)
    return lv.emit(record, "lora_spans", args, before)


if __name__ == "__main__":
    sys.exit(main())
