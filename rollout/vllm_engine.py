"""The vLLM backend of :class:`~asyncrl.rollout.engine.RolloutEngine`.

vLLM runs in an engine process of its own (``rollout/vllm_server.py``, started with the vLLM
environment's interpreter by :class:`~asyncrl.rollout.vllm_process.EngineProcess`); this class keeps
the episodes (their environments are Python objects of this process) and drives vLLM's ``LLMEngine``
one ``step()`` at a time, so every decode step is a token boundary where weight updates, interrupts
and environment answers take effect.

- **Log-probs.** vLLM runs with ``logprobs_mode="processed_logprobs"``: the log-prob it returns for
  the sampled token is ``log_softmax(z / T)`` over float32 logits (vLLM's sampler upcasts before
  scaling), with no top-k/top-p (disabled here): the distribution actually sampled from, what
  :mod:`asyncrl.rollout.engine` asks of ``logp_mu`` and what the actor computes at the same ``T``.
  (vLLM's default, ``raw_logprobs``, would be ``log_softmax(z)`` before temperature.)
- **Environment tokens.** vLLM cannot insert tokens into a running request. When the environment
  answers, the episode's request is aborted, the answer appended (``loss_mask`` False, version -1) and
  a new request submitted with the whole prefix as its prompt (a re-prefill; vLLM's prefix cache, reset
  at every weight update, makes it cheap when enabled).
- **Weight updates.** The actor's HF-named tensors go as float32 bytes over the socket and are
  reloaded in place (``Worker.reload_weights``), no engine restart. With ``partial_rollout`` an update
  applies at the next step boundary: every in-flight request is aborted and resubmitted with its
  prefix, so its KV cache is recomputed under the new weights (as the transformers engine does).
- **Release/acquire.** ``sleep``/``wake_up`` where the platform has a sleep mode (CUDA). The CPU build
  has none (its worker logs "sleep mode is not supported on CPU, ignore it" and keeps everything), so
  there ``release`` tears the ``LLMEngine`` down inside the engine process (model and KV cache freed;
  the process and its imports stay) and ``acquire`` rebuilds it and reloads the host copy of the
  last weights: the cost is one engine build (``counters.rebuild_seconds``), the memory handed back
  is measured (``counters.release_freed_bytes``).
- **Refused before any generation:** bfloat16/float16 on the CPU build (wrong tokens in eager mode),
  a head dimension the CPU attention kernel lacks, vLLM not installed (the install command).
"""

import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncrl.rollout.engine import EngineReleasedError, RolloutError, add_sampled_token, end_at_budget
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.generation_loop import Boundary, BoundaryEngine, TokenBatch
from asyncrl.rollout.routes import RouteLog, route_dtype
from asyncrl.rollout.trajectory import NO_VERSION
from asyncrl.rollout.vllm_process import EngineProcess, VLLMProcessError

if TYPE_CHECKING:
    import torch

    from asyncrl.api.model_arch import LlamaArch

# spec.rollout.engineArgs of the vLLM engine: name -> (type, default, what it sets)
DEFAULT_KV_CAP_BYTES = 1 << 30  # kvCacheMemoryBytes 0: never reserve more than this by default (see _kv_bytes)
VLLM_ENGINE_ARGS: dict[str, tuple[type, object, str]] = {
    "enforceEager": (bool, True, "eager mode (engine start ~20 s) instead of torch.compile (~70-100 s)"),
    "maxNumSeqs": (int, 128, "requests vLLM runs at once (more wait in its queue)"),
    "kvCacheMemoryBytes": (int, 0, "KV cache size in bytes; 0 = enough for maxNumSeqs full-length sequences, "
                           "capped at 1 GiB (or one full-length sequence)"),
    "enablePrefixCaching": (bool, True, "reuse the KV of a resubmitted prefix (reset at every weight update)"),
    "cpuThreads": (int, 1, "CPU build: N unbound OpenMP threads; 0 = vLLM's own binding of one thread per core"),
}
# cpuThreads: vLLM's CPU build binds its OpenMP threads to cores by default. On cores shared with other
# processes (a laptop, CI, the job's own actor) every kernel call then waits for its core: measured on 2
# loaded cores, 329 ms per decode step bound vs 23 ms with one unbound thread (same model and batch).
# 0 keeps vLLM's binding, the faster choice on a dedicated rollout machine.


def engine_options(engine_args: Mapping[str, object] | None) -> dict[str, Any]:
    """``spec.rollout.engineArgs`` with the defaults filled in; all problems in one ``ValueError``."""
    args = dict(engine_args or {})
    problems = [f"unknown {k!r}" for k in sorted(set(args) - set(VLLM_ENGINE_ARGS))]
    out: dict[str, Any] = {}
    for k, (typ, default, _) in VLLM_ENGINE_ARGS.items():
        v = args.get(k, default)
        if type(v) is not typ or (typ is int and v < 0):  # type: ignore[operator]
            problems.append(f"{k}: {v!r} is not a {'non-negative ' if typ is int else ''}{typ.__name__}")
        out[k] = v
    if problems:
        valid = "; ".join(f"{k} ({t.__name__}, default {d!r}): {doc}" for k, (t, d, doc) in VLLM_ENGINE_ARGS.items())
        raise ValueError(f"spec.rollout.engineArgs {args} do not fit the vllm engine: {', '.join(problems)}. Valid: {valid}")
    return out


def hf_weight_shapes(arch: "LlamaArch") -> dict[str, tuple[int, ...]]:
    """The HF names and shapes of a full state dict of ``arch`` (``lm_head.weight`` only when untied)."""
    from asyncrl.api.model_arch import hf_param_shapes

    return hf_param_shapes(arch, with_tied_head=False)


# vLLM's in-place reload breaks a tied LM head: the reload re-materialises each layer's parameters and
# puts the old tensor back into a layer that received none, so a tied lm_head (skipped by the loader)
# kept the first weights (measured: log-probs ~20 nats off). The engine process therefore gets an
# untied model and the embedding sent a second time as lm_head.weight (the same values; V x H more memory).
UNTIED_HEAD = "lm_head.weight"


def hf_config(arch: "LlamaArch", dtype: str) -> dict[str, Any]:
    """``config.json`` of ``arch`` for vLLM: the family's own (``ModelArch.to_hf_config``: its
    ``architectures`` entry makes vLLM build Llama, Mistral, Qwen2, Qwen3 or Qwen3-MoE), untied."""
    return arch.to_hf_config(dtype) | {"tie_word_embeddings": False}  # see UNTIED_HEAD


def config_problems(arch: "LlamaArch", dtype: str, hello: Mapping[str, Any]) -> list[str]:
    """Known bad combinations for the engine process described by ``hello``; empty when fine."""
    problems = []
    if dtype not in ("float32", "bfloat16"):
        problems.append(f"spec.model.rolloutDtype {dtype!r} is not supported; use float32 or bfloat16")
    cpu = hello.get("platform") == "cpu"
    if cpu and dtype != "float32":
        problems.append(
            f"spec.model.rolloutDtype {dtype!r} on vLLM's CPU build gives wrong tokens in eager mode (measured: "
            "bfloat16 answered gibberish where float32 and transformers answer correctly); set "
            "spec.model.rolloutDtype: float32 for engine vllm on CPU"
        )
    heads = hello.get("cpu_head_sizes") or []
    if cpu and heads and arch.head_dim not in heads:
        problems.append(
            f"head_dim {arch.head_dim} (spec.model.hiddenSize {arch.hidden_size} / numAttentionHeads "
            f"{arch.num_attention_heads}) is not supported by vLLM's CPU attention kernel (head sizes "
            f"{heads}); pick hiddenSize and numAttentionHeads whose ratio is one of them, e.g. hiddenSize "
            f"{64 * arch.num_attention_heads} for head_dim 64"
        )
    return problems


@dataclass
class VLLMCounters:
    """Monotonic counters and timings of one engine (seconds are wall time in this process)."""

    sampled_tokens: int = 0
    forced_tokens: int = 0
    steps: int = 0  # LLMEngine.step() calls
    submits: int = 0  # requests added (episode starts, resumes, after environment answers or swaps)
    swaps_in_flight: int = 0
    updates_superseded: int = 0
    interrupts: int = 0
    weight_loads: int = 0
    weight_seconds: float = 0.0  # all weight transfers + reloads (per-version time: weight_seconds/loads)
    last_weight_seconds: float = 0.0
    start_seconds: float = 0.0  # engine process start + vLLM import + handshake
    build_seconds: float = 0.0  # first LLMEngine build
    rebuilds: int = 0  # acquire() after release() on a platform without sleep mode
    rebuild_seconds: float = 0.0
    release_freed_bytes: int = 0  # RSS of the engine process handed back by the last release()


Weights = tuple[list[str], list[np.ndarray]]


class VLLMEngine(BoundaryEngine[Weights, random.Random]):
    """Samples episodes with vLLM in an engine process (see the module docstring).

    Args:
        arch: the architecture both actor and rollout resolve from ``spec.model``.
        dtype: ``spec.model.rolloutDtype`` (float32 on the CPU build).
        seed: seed of the per-request sampling seeds (when ``generate`` gets no ``seed``).
        pad_id: unused (vLLM batches without padding); kept for ``make_engine``'s signature.
        engine_args: ``spec.rollout.engineArgs`` (:data:`VLLM_ENGINE_ARGS`).
        python: the vLLM interpreter (default: :func:`~asyncrl.rollout.vllm_process.vllm_python`).
        capture_routes: record the top-k experts of every MoE layer for every position vLLM computes into each
            trajectory's ``routes`` (rollout/routes.py), as the transformers engine does: a (re)submitted prefix
            from position 0, then one position per decode step, stamped with the version that computed them
            (``RouteTap`` in rollout/vllm_server.py). Turns vLLM's prefix cache off: a cached prefix is not
            computed, so its routes would be missing.
    """

    counters: VLLMCounters

    def __init__(
        self,
        arch: "LlamaArch",
        *,
        dtype: str = "float32",
        seed: int = 0,
        pad_id: int = 0,
        engine_args: Mapping[str, object] | None = None,
        python: str | None = None,
        capture_routes: bool = False,
    ) -> None:
        if capture_routes and not arch.is_moe:
            raise ValueError(f"VLLMEngine: capture_routes needs a mixture-of-experts model; {arch.architecture} is dense")
        self.arch, self.dtype = arch, dtype
        self.capture_routes = capture_routes
        self.options = engine_options(engine_args)
        self.shapes = hf_weight_shapes(arch)
        self.counters = VLLMCounters()
        self._rng = random.Random(seed)
        self._version = NO_VERSION
        self._released = False
        self._host: Weights | None = None  # the last loaded weights (rebuild after release); under _lock
        self._init_boundary()  # locks, interrupt/hold state, pending update (rollout/engine.py)
        self._next_id = 0
        threads = self.options["cpuThreads"]
        env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)} if threads else {}
        self.proc = EngineProcess(python, env=env)
        self.counters.start_seconds = self.proc.start_s
        try:
            if problems := config_problems(arch, dtype, self.proc.hello):
                raise ValueError("rollout.engine vllm: " + "; ".join(problems))
            self.counters.build_seconds = self._build()
        except BaseException:
            self.proc.close()  # no engine process outlives a failed construction
            raise
        # If this process dies without close(), the engine process reads EOF on its socket and exits.

    # ----------------------------------------------------------------------------- process
    def _build(self) -> float:
        kv = self.options["kvCacheMemoryBytes"] or self._kv_bytes()
        engine = {
            "enforce_eager": self.options["enforceEager"],
            "max_num_seqs": self.options["maxNumSeqs"],
            "enable_prefix_caching": self.options["enablePrefixCaching"] and not self.capture_routes,
            "kv_cache_memory_bytes": kv,
            "max_model_len": self.arch.max_sequence_length,
            "max_num_batched_tokens": max(2048, self.arch.max_sequence_length),
            # whole prompts only: a prompt split across steps has its seeded sampler rewound, which vLLM's CPU
            # build cannot ("CPU Generator does not use offset", measured: 16 arithmetic prompts past the 2048-token
            # budget without prefix caching); a prompt that does not fit this step waits for the next
            "enable_chunked_prefill": False,
            "enable_sleep_mode": bool(self.proc.hello.get("sleep_mode")),  # release/acquire by sleep/wake_up
            "seed": 0,
        }
        out = self.proc.call("build", hf_config=hf_config(self.arch, self.dtype), dtype=self.dtype, engine=engine,
                             capture_routes=self.capture_routes)
        return float(out["build_s"])

    def _kv_bytes(self) -> int:
        """KV cache for ``maxNumSeqs`` sequences of ``max_sequence_length`` tokens, at least 16 MiB and at
        most :data:`DEFAULT_KV_CAP_BYTES` (but always one full-length sequence): a pretrained preset's
        context (SmolLM2: 8192 tokens) times 128 sequences would reserve tens of GB of host memory, while
        a task's episodes are a few hundred tokens; vLLM queues what does not fit. Set
        ``engineArgs.kvCacheMemoryBytes`` to size it yourself."""
        a = self.arch
        per_token = 2 * a.num_layers * a.num_key_value_heads * a.head_dim * 4  # K and V, float32
        full = per_token * a.max_sequence_length
        return max(16 << 20, min(full * self.options["maxNumSeqs"], max(DEFAULT_KV_CAP_BYTES, full)))

    def close(self) -> None:
        """Stop the engine process (also done when the engine is garbage-collected)."""
        self.proc.close()

    # ----------------------------------------------------------------------------- state
    def _copy(self, state_dict: Mapping[str, "torch.Tensor"]) -> Weights:
        """Float32 host copies of the weights vLLM takes, checked against ``arch`` (all problems at once)."""
        got = {k: tuple(v.shape) for k, v in state_dict.items()}
        extra = {"lm_head.weight"} if self.arch.tie_embeddings else set()  # tied: ignored when given
        problems = []
        if missing := sorted(set(self.shapes) - set(got)):
            problems.append(f"missing {missing}")
        if unexpected := sorted(set(got) - set(self.shapes) - extra):
            problems.append(f"unexpected {unexpected}")
        problems += [
            f"{k}: got shape {got[k]}, the model has {s}" for k, s in self.shapes.items() if k in got and got[k] != s
        ]
        if problems:
            raise ValueError(
                "VLLMEngine: the weights do not fit the rollout model (check that actor and rollout resolve the "
                "same spec.model): " + "; ".join(problems)
            )
        names = list(self.shapes)
        # Copy now: an in-process actor may update its tensors in place right after.
        arrays = [state_dict[k].detach().to("cpu").float().numpy().copy() for k in names]
        if self.arch.tie_embeddings:  # see UNTIED_HEAD
            names.append(UNTIED_HEAD)
            arrays.append(arrays[names.index("model.embed_tokens.weight")])
        return names, arrays

    def _send(self, weights: Weights) -> None:
        t0 = time.perf_counter()
        self.proc.send_weights(*weights)
        dt = time.perf_counter() - t0
        self.counters.weight_loads += 1
        self.counters.weight_seconds += dt
        self.counters.last_weight_seconds = dt

    def _apply(self, weights: Weights, version: int) -> None:
        """Install ``weights`` as ``version`` (no step is running)."""
        if not self._released:
            self._send(weights)
        self._host = weights
        self._version = version

    def release(self) -> None:
        with self._lock:
            if self._generating:
                raise RuntimeError("VLLMEngine.release: a generate() is running; interrupt() it first")
            if self._released:
                return
            if self.proc.hello.get("sleep_mode"):
                self.proc.call("sleep")
            else:
                out = self.proc.call("teardown")
                self.counters.release_freed_bytes = int(out["rss_before"]) - int(out["rss_after"])
            self._released = True

    def acquire(self) -> None:
        with self._lock:
            if not self._released:
                return
            if self.proc.hello.get("sleep_mode"):
                self.proc.call("wake_up")
            else:
                t0 = time.perf_counter()
                self._build()
                self.counters.rebuilds += 1
                self.counters.rebuild_seconds += time.perf_counter() - t0
            self._released = False
            if self._host is not None:
                self._send(self._host)  # the last loaded weights, or an update that arrived while released

    # ----------------------------------------------------------------------------- generate
    # interrupt, resume, held and generate() are BoundaryEngine's; these are the hooks of its generate().
    def _begin(self, seed: int | None) -> random.Random:
        if self._released:
            raise EngineReleasedError("VLLMEngine: the engine is released; call acquire() first")
        if self._version == NO_VERSION:
            raise RuntimeError("VLLMEngine: no weights loaded yet; call load_weights(state_dict, version) first")
        return random.Random(seed) if seed is not None else self._rng

    def _loop_rows(self, episodes: list[Episode], max_new_tokens: int, temperature: float, partial_rollout: bool,
                   state: random.Random) -> None:
        self._run(episodes, max_new_tokens, temperature, partial_rollout, state)

    def _end(self) -> None:
        self.proc.call("abort_all")  # nothing of this batch stays queued in vLLM

    def _run(
        self,
        episodes: list[Episode],
        max_new_tokens: int,
        temperature: float,
        partial_rollout: bool,
        rng: random.Random,
    ) -> None:
        # Before a swap: the requests' KV cache holds old-weight keys/values; abort them first (the prefix
        # cache can only be reset with no request running), then resubmit each with its prefix (recomputed).
        batch = TokenBatch.start(self, episodes, max_new_tokens, partial_rollout=partial_rollout,
                                 before_swap=lambda: self.proc.call("abort_all"))
        live: dict[str, Episode] = {}  # request id -> its episode (in vLLM now)
        submit = list(batch.rows)  # episodes needing a request (new, resumed, after an environment answer)
        aborts: list[str] = []
        while (at := batch.boundary()) is not Boundary.STOP:
            if at is Boundary.SWAPPED:
                live.clear()
                aborts, submit = [], list(batch.rows)
            adds = self._requests(submit, batch.rows, live, max_new_tokens, temperature, rng)
            self.counters.submits += len(adds)
            if not batch.rows:
                return
            version = self._version
            try:
                outputs = self.proc.call("step", aborts=aborts, adds=adds)
            except VLLMProcessError as exc:
                raise batch.failure(f"vLLM step failed: {exc}") from exc
            self.counters.steps += 1
            if self.capture_routes:
                try:
                    self._record_routes(self.proc.call("take_routes"), live, version)
                except (VLLMProcessError, ValueError) as exc:
                    raise batch.failure(f"vLLM route capture failed: {exc}") from exc
            aborts, submit = self._take(outputs, live, batch.rows, version, max_new_tokens)

    def _requests(self, submit: list[Episode], rows: list[Episode], live: dict[str, Episode], max_new_tokens: int,
                  temperature: float, rng: random.Random) -> list[dict[str, Any]]:
        """A new request per episode of ``submit`` (its queued environment tokens forced first; one that
        this ends leaves ``rows``), each recorded in ``live``; returns the ``step`` command's ``adds``."""
        adds = []
        for e in submit:
            if self._force(e, max_new_tokens):
                rows.remove(e)
                continue
            rid = f"{e.traj_id}#{self._next_id}"
            self._next_id += 1
            live[rid] = e
            adds.append(
                {
                    "id": rid,
                    "tokens": list(e.tokens),
                    "max_tokens": max_new_tokens - e.new_tokens,
                    "temperature": float(temperature),
                    "seed": rng.randrange(2**31),
                }
            )
        return adds

    def _take(self, outputs: list[tuple[str, list[int], list[float], bool]], live: dict[str, Episode],
              rows: list[Episode], version: int, max_new_tokens: int) -> tuple[list[str], list[Episode]]:
        """Append one ``step``'s tokens to their episodes (stamped ``version``); returns the requests to abort
        at the next step and the episodes to resubmit. An episode that ends leaves ``live`` and ``rows``."""
        aborts: list[str] = []
        submit: list[Episode] = []
        for rid, tokens, logps, finished in outputs:
            ep = live.get(rid)
            if ep is None:
                continue  # a request aborted at this boundary
            for tok, lp in zip(tokens, logps, strict=True):
                self._sampled(ep, tok, lp, version, max_new_tokens)
                if ep.done or ep.forced:
                    break
            if ep.done or ep.forced or finished:
                del live[rid]
                if not finished:
                    aborts.append(rid)
                if ep.done:
                    rows.remove(ep)
                else:
                    submit.append(ep)  # environment answer to force (or vLLM stopped early): resubmit
        return aborts, submit

    def _record_routes(self, routes: Mapping[str, tuple[int, list[int], bytes]], live: dict[str, Episode],
                       version: int) -> None:
        """Append one step's routes (``take_routes``: first position, shape ``[n, L, k]``, int16 bytes) to the
        route log of each request's episode, under the version the step ran with."""
        dtype = route_dtype(self.arch.num_experts)
        for rid, (start, shape, data) in routes.items():
            ep = live.get(rid)
            if ep is None:
                continue  # a request aborted at this boundary
            if ep.record.routes is None:
                ep.record.routes = RouteLog(self.arch.num_layers, self.arch.moe_top_k)
            ep.record.routes.record(version, start, np.frombuffer(data, dtype=np.int16).reshape(shape).astype(dtype))

    def _force(self, e: Episode, max_new_tokens: int) -> bool:
        """Append the queued environment tokens of ``e``; True when that ends it (token budget)."""
        while e.forced:
            e.add_forced(e.forced.popleft())
            self.counters.forced_tokens += 1
            end_at_budget(e, max_new_tokens)
        return e.done

    def _sampled(self, e: Episode, tok: int, logp: float, version: int, max_new_tokens: int) -> None:
        """Append one sampled token and step the environment (as the transformers engine does)."""
        if not math.isfinite(logp):
            raise RolloutError(f"vLLM returned log-prob {logp} for token {tok}", task=e.task, traj_ids=[e.traj_id])
        add_sampled_token(e, tok, version, logp, max_new_tokens)
        self.counters.sampled_tokens += 1
