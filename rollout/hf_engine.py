"""The transformers backend of :class:`~asyncrl.rollout.engine.RolloutEngine`.

A manual lock-step sampling loop over a batch of episodes with one HF ``DynamicCache``
(``docs/architecture.md`` (the embedded model and tasks): 15-20 % faster than ``generate`` and the only way to force
environment tokens without re-prefilling). Each decode step feeds one token per in-flight episode:
the next queued environment token (``loss_mask`` False, version -1) or the token the policy sampled
at the previous step. Episodes of different lengths are left-padded with an attention mask and
explicit position ids; finished episodes are dropped from the batch and the cache.

Precision: the model runs in ``dtype`` (bfloat16 by default, ``spec.model.rolloutDtype``); logits
are upcast to float32 before ``log_softmax`` (a bf16 softmax alone puts ~15 % of tokens outside a
±1 % ratio window, measured on the embedded model).

Device: CUDA when the process sees one (a rollout pod's GPU, handed over by Ray), else the CPU;
``device`` pins it. Weights arrive and are kept (``release``) on the CPU; the model, the KV cache,
the fp32 head copies and the sampling generator live on the device.

Temperature: tokens are sampled from ``softmax(z / T)`` and ``logp_mu`` is the log-prob under that
same temperature-scaled distribution, so the actor must divide its logits by ``T`` too.
"""

import gc
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from asyncrl.api.model_arch import ModelArch
from asyncrl.rollout.adapter_merge import AdapterMerge, is_hf_adapter_name
from asyncrl.rollout.engine import EngineReleasedError, add_sampled_token, end_at_budget, settle, wait_any
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.generation_loop import Boundary, BoundaryEngine, TokenBatch
from asyncrl.rollout.hf_model import LM_HEAD, build_model, hf_state_dict, load_hf_state_dict, torch_dtype
from asyncrl.rollout.route_capture import RouteTap, capturing
from asyncrl.rollout.routes import RouteLog
from asyncrl.rollout.trajectory import NO_VERSION

StateDict = Mapping[str, torch.Tensor]
NORM = "model.norm.weight"
_FP32 = "fp32:"  # key prefix of the fp32 head copies travelling with a weight update


@dataclass
class EngineCounters:
    """Monotonic counters of one engine (read them as a snapshot with ``dataclasses.replace``)."""

    sampled_tokens: int = 0
    forced_tokens: int = 0
    decode_steps: int = 0
    prefills: int = 0  # full-prefix forwards (batch start, resume, re-prefill after a swap)
    swaps_in_flight: int = 0  # weight updates applied while episodes were in flight
    updates_superseded: int = 0  # pending updates replaced by a newer one before being applied
    interrupts: int = 0


class HFEngine(BoundaryEngine[dict[str, torch.Tensor], tuple[PreTrainedModel, torch.Generator]]):
    """Samples episodes with the transformers model of ``arch``'s family (``rollout/hf_model.build_model``).

    Args:
        arch: the architecture both actor and rollout resolve from ``spec.model``.
        dtype: ``"bfloat16"`` or ``"float32"``.
        seed: seed of the engine's sampling generator (used when ``generate`` gets no ``seed``).
        pad_id: token fed at left-padding positions (masked out; any valid id works).
        fp32_head: compute the final RMSNorm and the LM head in float32 from float32 copies of
            their weights (the body and its residual stream stay in ``dtype``). Measured on the
            chain-calculator SFT policy (256 episodes, ~4.3k tokens): mean |logp_mu - logp_fp32|
            4.3e-3 -> 3.6e-3, tokens outside a ±1 % ratio 10.1 % -> 7.2 %; a modest gain, smaller
            than measured for that variant on a larger vocabulary.
        device: ``"cuda"``, ``"cpu"`` or None: CUDA when available, else the CPU.
        capture_routes: record every forward's top-k experts per MoE layer into each trajectory's
            ``routes`` (rollout/routes.py; prefills, decode steps and re-prefills after a swap), for routing
            replay (``spec.correction.routingReplay: rollout``). Mixture-of-experts models only.
    """

    counters: EngineCounters

    def __init__(
        self,
        arch: ModelArch,
        *,
        dtype: str = "bfloat16",
        seed: int = 0,
        pad_id: int = 0,
        fp32_head: bool = False,
        device: str | None = None,
        capture_routes: bool = False,
    ) -> None:
        if capture_routes and not arch.is_moe:
            raise ValueError(f"HFEngine: capture_routes needs a mixture-of-experts model; {arch.architecture} is dense")
        self.arch = arch
        self.capture_routes = capture_routes
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = torch_dtype(dtype)
        self.pad_id = pad_id
        self.fp32_head = fp32_head
        self._head: tuple[torch.Tensor, torch.Tensor] | None = None  # fp32 (final norm [H], lm_head [V, H])
        self.counters = EngineCounters()
        self._model: PreTrainedModel | None = None
        self._host: dict[str, torch.Tensor] | None = None  # weights kept while released
        self._adapters = AdapterMerge()  # spec.model.lora: the base kept, each version's adapters merged
        self._released = False
        self._version = NO_VERSION
        self._sampler = torch.Generator(device=self.device).manual_seed(seed)
        self._init_boundary()  # locks, interrupt/hold state, pending update (rollout/engine.py)

    # ----------------------------------------------------------------------------- state
    @property
    def model(self) -> PreTrainedModel:
        """The live model (for tests and tools); raises when released or never loaded."""
        if self._released:
            raise EngineReleasedError("HFEngine: the model is released; call acquire() first")
        if self._model is None:
            raise RuntimeError(
                "HFEngine: no weights loaded yet; call load_weights(state_dict, version) first"
            )
        return self._model

    def _copy(self, state_dict: StateDict) -> dict[str, torch.Tensor]:
        # Copy now: the caller (an in-process actor) may update its tensors in place right after. LoRA adapters
        # stay fp32 until they are merged (rollout/adapter_merge.py).
        out = {k: v.detach().to("cpu", torch.float32 if is_hf_adapter_name(k) else self.dtype, copy=True)
               for k, v in state_dict.items()}
        if self.fp32_head:  # full-precision copies of the head's weights, before any rounding
            head = "model.embed_tokens.weight" if self.arch.tie_embeddings else LM_HEAD
            for k in (NORM, head):
                if k in state_dict:
                    out[_FP32 + k] = state_dict[k].detach().to("cpu", torch.float32, copy=True)
        return out

    def _set_head(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Take the fp32 head copies out of ``weights`` (kept across release); returns the rest."""
        head = "model.embed_tokens.weight" if self.arch.tie_embeddings else LM_HEAD
        extra = {k[len(_FP32) :]: weights[k] for k in weights if k.startswith(_FP32)}
        if self.fp32_head and NORM in extra and head in extra:
            self._head = (extra[NORM].to(self.device), extra[head].to(self.device))
        return {k: v for k, v in weights.items() if not k.startswith(_FP32)}

    def _apply(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Install ``weights`` as ``version`` (caller holds ``_lock`` and no forward is running)."""
        weights = self._adapters.resolve(self._set_head(weights))  # LoRA: the base with this version merged
        if self._released:
            self._host = weights  # installed on acquire()
        else:
            if self._model is None:
                self._model = build_model(self.arch, self.dtype).to(self.device)  # type: ignore[arg-type]
            load_hf_state_dict(self._model, weights)
        self._version = version

    def release(self) -> None:
        with self._lock:
            if self._generating:
                raise RuntimeError("HFEngine.release: a generate() is running; interrupt() it first")
            if self._released:
                return
            if self._model is not None:  # under checkpoint names (per expert), which acquire() loads back
                self._host = {k: v.detach().to("cpu") for k, v in hf_state_dict(self._model).items()}
            self._model = None
            self._released = True
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the freed blocks back (interrupt-sync hosts pi_old there)

    def acquire(self) -> None:
        with self._lock:
            if not self._released:
                return
            self._released = False
            if self._host is not None:
                self._model = build_model(self.arch, self.dtype).to(self.device)  # type: ignore[arg-type]
                load_hf_state_dict(self._model, self._host)
            self._host = None

    # ----------------------------------------------------------------------------- generate
    # interrupt, resume, held and generate() are BoundaryEngine's; these are the hooks of its generate().
    def _begin(self, seed: int | None) -> tuple[PreTrainedModel, torch.Generator]:
        model = self.model  # raises when released / never loaded
        sampler = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else self._sampler
        return model, sampler

    def _loop_rows(self, episodes: list[Episode], max_new_tokens: int, temperature: float, partial_rollout: bool,
                   state: tuple[PreTrainedModel, torch.Generator]) -> None:
        model, sampler = state
        self._loop(model, episodes, max_new_tokens, temperature, partial_rollout, sampler)

    def _loop(
        self,
        model: PreTrainedModel,
        episodes: list[Episode],
        max_new_tokens: int,
        temperature: float,
        partial_rollout: bool,
        sampler: torch.Generator,
    ) -> None:
        captured: list[torch.Tensor] = []  # fp32 head: input of the final norm at the last position
        handle = None
        if self._head is not None:

            def grab(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
                captured.append(args[0][:, -1, :])

            handle = model.model.norm.register_forward_pre_hook(grab)
        try:
            if self.capture_routes:
                with capturing(model) as tap:
                    self._run(model, episodes, max_new_tokens, temperature, partial_rollout, sampler, captured, tap)
            else:
                self._run(model, episodes, max_new_tokens, temperature, partial_rollout, sampler, captured)
        finally:
            if handle is not None:
                handle.remove()

    def _fp32_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` pre-norm hidden state -> ``[B, V]`` fp32 logits (RMSNorm as in HF Llama)."""
        assert self._head is not None
        norm_w, head_w = self._head
        h = hidden.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.arch.norm_epsilon)
        return (norm_w * h) @ head_w.T

    def _run(
        self,
        model: PreTrainedModel,
        episodes: list[Episode],
        max_new_tokens: int,
        temperature: float,
        partial_rollout: bool,
        sampler: torch.Generator,
        captured: list[torch.Tensor],
        tap: RouteTap | None = None,
    ) -> None:
        batch = TokenBatch.start(self, episodes, max_new_tokens, partial_rollout=partial_rollout)
        kv = _Decode(fresh=[True] * len(batch.rows))
        while (at := batch.boundary()) is not Boundary.STOP:
            if at is Boundary.SWAPPED:
                model, kv.need_prefill = self.model, True  # the old cache was computed with the old weights
                if tap is not None and not tap.watches(model):  # weights load in place: the same routers
                    raise batch.failure("engine model was rebuilt mid-generate; its routers are not captured")
            rows = batch.rows
            if not kv.need_prefill and not any(kv.fresh):
                # every row waits for its environment: block briefly (no forward on pads), then force
                # the answers that arrived; the loop comes back to the boundary checks either way
                wait_any(rows, 0.05)
                kv.fresh = self._settle_waiting(rows, max_new_tokens)
                batch.rows = self._compact([i for i, e in enumerate(rows) if not e.done], rows, kv)
                continue
            version, prefill, fed = self._version, kv.need_prefill, list(kv.fresh)
            try:
                with torch.inference_mode():
                    sampled, sampled_logp = self._sample(model, rows, kv, temperature, sampler, captured)
                if tap is not None:
                    _record_routes(tap, rows, version, prefill, fed, self.arch)
            except Exception as exc:
                raise batch.failure(f"engine forward failed: {exc!r}") from exc
            keep, kv.fresh = self._advance(
                rows, sampled.squeeze(1).tolist(), sampled_logp.tolist(), version, max_new_tokens
            )
            batch.rows = self._compact(keep, rows, kv)

    def _sample(
        self, model: PreTrainedModel, rows: list[Episode], kv: "_Decode", temperature: float,
        sampler: torch.Generator, captured: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over ``rows`` (the whole prefixes when ``kv.need_prefill``, else one token each) and
        one token sampled per row -> ``(sampled [B, 1], its log-prob [B])`` under ``softmax(z / T)``."""
        if kv.need_prefill:
            ids, kv.attn, pos = (t.to(self.device) for t in _left_pad([e.tokens for e in rows], self.pad_id))
            kv.cache = DynamicCache(config=model.config)
            out = model(
                input_ids=ids, attention_mask=kv.attn, position_ids=pos, cache=kv.cache, use_cache=True,
                logits_to_keep=1,
            )
            kv.last_pos = pos[:, -1]
            kv.need_prefill = False
            self.counters.prefills += 1
        else:
            if all(kv.fresh):  # every row reads its newest token (always so when environments answer inline)
                ids = torch.tensor([[e.tokens[-1]] for e in rows], dtype=torch.long, device=self.device)
                kv.attn = torch.cat([kv.attn, kv.attn.new_ones((len(rows), 1))], dim=1)
                kv.last_pos = kv.last_pos + 1
            else:  # a waiting row reads a masked pad and keeps its position (it samples nothing)
                ids = torch.tensor([[e.tokens[-1] if f else self.pad_id] for e, f in zip(rows, kv.fresh, strict=True)],
                                   dtype=torch.long, device=self.device)
                step = torch.tensor(kv.fresh, dtype=torch.long, device=self.device)
                kv.attn = torch.cat([kv.attn, step[:, None].to(kv.attn.dtype)], dim=1)
                kv.last_pos = kv.last_pos + step
            out = model(
                input_ids=ids, attention_mask=kv.attn, position_ids=kv.last_pos[:, None], cache=kv.cache,
                use_cache=True,
            )
            self.counters.decode_steps += 1
        logits = self._fp32_logits(captured[-1]) if captured else out.logits[:, -1, :].float()
        captured.clear()
        # [B, V] fp32 log-probs of the temperature-scaled sampling distribution
        logp = torch.log_softmax(logits / temperature, dim=-1)
        sampled = torch.multinomial(logp.exp(), 1, generator=sampler)  # [B, 1]
        return sampled, logp.gather(1, sampled).squeeze(1)

    def _compact(self, keep: list[int], rows: list[Episode], kv: "_Decode") -> list[Episode]:
        """Drop the finished rows from the batch: ``keep`` indexes the rows that go on; ``kv.attn`` [B, L],
        ``kv.last_pos`` [B], ``kv.fresh`` and the KV cache (batch dimension) are cut to them."""
        if len(keep) == len(rows):
            return rows
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        if kv.cache is not None and keep:
            kv.cache.batch_select_indices(idx)
        kv.fresh, kv.attn, kv.last_pos = [kv.fresh[i] for i in keep], kv.attn[idx], kv.last_pos[idx]
        return [rows[i] for i in keep]

    def _advance(
        self, rows: list[Episode], tokens: list[int], logps: list[float], version: int, max_new_tokens: int
    ) -> tuple[list[int], list[bool]]:
        """Append one token to every row (forced, else sampled) unless it waits for its environment;
        returns the indices still in flight and, per row, whether it appended a token."""
        keep, fresh = [], []
        for i, e in enumerate(rows):
            appended = True
            if e.pending is not None and not settle(e, max_new_tokens, wait=False):
                appended = False  # its environment is still answering: this row's logits are unused
            elif e.done:
                pass
            elif e.forced:
                e.add_forced(e.forced.popleft())
                self.counters.forced_tokens += 1
                end_at_budget(e, max_new_tokens)
            else:
                add_sampled_token(e, tokens[i], version, logps[i], max_new_tokens, block=False)  # ends at the budget
                self.counters.sampled_tokens += 1
            fresh.append(appended)
            if not e.done:
                keep.append(i)
        return keep, fresh

    def _settle_waiting(self, rows: list[Episode], max_new_tokens: int) -> list[bool]:
        """Without a forward: take the environment answers that arrived and force their first token."""
        fresh = []
        for e in rows:
            appended = False
            if settle(e, max_new_tokens, wait=False) and not e.done and e.forced:
                e.add_forced(e.forced.popleft())
                self.counters.forced_tokens += 1
                end_at_budget(e, max_new_tokens)
                appended = True
            fresh.append(appended)
        return fresh


def _record_routes(tap: RouteTap, rows: list[Episode], version: int, prefill: bool, fed: list[bool],
                   arch: ModelArch) -> None:
    """Append the routes of the forward that just ran to each row's ``record.routes``: a prefill routed every
    position of each (left-padded) prefix; a decode step one position per row that read a token (``fed``)."""
    if prefill:
        L = max(len(e.tokens) for e in rows)
        routes = tap.take(len(rows), L)  # [B, L, layers, k]
        for b, e in enumerate(rows):
            _log(e, arch).record(version, 0, routes[b, L - len(e.tokens):])
        return
    routes = tap.take(len(rows), 1)  # [B, 1, layers, k]
    for b, e in enumerate(rows):
        if fed[b]:
            _log(e, arch).record(version, len(e.tokens) - 1, routes[b])


def _log(e: Episode, arch: ModelArch) -> RouteLog:
    if e.record.routes is None:
        e.record.routes = RouteLog(arch.num_layers, arch.moe_top_k)
    return e.record.routes


@dataclass
class _Decode:
    """The lock-step decode's state over the rows in flight (row ``b`` of each is episode ``rows[b]``)."""

    fresh: list[bool]  # row appended a token the model has not read yet (False: waiting for its env)
    need_prefill: bool = True  # next forward reads whole prefixes (batch start, after a weight swap)
    cache: DynamicCache | None = None
    attn: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [B, L] attention mask
    last_pos: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [B] position of each row's last token


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad ``seqs`` -> ``(ids [B, L], attention_mask [B, L], position_ids [B, L])``."""
    B, L = len(seqs), max(len(s) for s in seqs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, L - len(s) :] = torch.tensor(s, dtype=torch.long)
        attn[b, L - len(s) :] = 1
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return ids, attn, pos
