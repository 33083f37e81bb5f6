"""The training-side model outside the actor: scores sampled tokens under one resident version.

Used where ``pi_old`` is computed away from the actor (paper §5.1): by the dedicated old-logit model
(:mod:`.dedicated`, its own process) and by a rollout worker's host during the interrupt-sync window.
It is the actor's model code and nothing else: the same megatron ``GPTModel``
(:func:`~asyncrl.trainer.megatron.model.build_gpt_model`), the same HF -> megatron mapping
(:func:`~asyncrl.trainer.megatron.convert.hf_to_megatron`) and the same log-prob function
(:func:`~asyncrl.trainer.megatron.logprobs.token_logprobs`) at the rollout temperature, with no
optimizer and no grad. On the same weights it gives the actor's numbers: bit for bit for the same
padded ``[B, T]`` input, and within fp32 rounding (test: 2e-6 absolute) for another batching,
because a GEMM's reduction order may depend on the shapes it is given. It computes in the actor's precision
(``ScorerSettings.bf16``, :func:`~.precision.actor_bf16`): a bf16 actor's published fp32 weights are rounded back
to its bf16 values on load, and the forward is the bf16 model's (bit for bit against a bf16 actor on the same
input; an fp32 scorer of a bf16 actor was 2.7e-3 nats off on the tests' tiny model).

A *segment* is one trajectory's tokens and the positions to score (``logp[t] = log pi(tokens[t] |
tokens[:t])``, the convention of :mod:`~asyncrl.trainer.megatron.logprobs`). Only the prefix up to the
last scored position is fed to the model (later tokens cannot change earlier log-probs under the
causal mask); segments are sorted by length and packed into right-padded forwards of at most
``token_budget`` padded tokens.

Memory: the model is built on the first :meth:`SegmentScorer.load` and dropped by
:meth:`SegmentScorer.free` (a rollout worker frees it when its interrupt-sync window closes, and the
next ``load`` builds it again); ``build_seconds`` and ``load_seconds`` say what that costs.

Tensor parallel (a dedicated scorer that is a gang, :mod:`.dedicated`): with a ``layout`` of ``tp`` ranks every
rank of the gang builds its shard of the model (megatron's ``tp``-way ``GPTModel``), loads its slice of each HF
tensor (:func:`~asyncrl.trainer.megatron.parallel.shard_of`, the actor's rule) and runs the same forward: the
vocab-parallel log-probs are reduced inside the gang, so every rank returns the whole ``[B, T]`` result.

Process-global state: :func:`~asyncrl.trainer.megatron.compat.init_megatron` sets up the process group (a
world-size-1 one, or the gang's over ``layout.init_method``) and megatron's parallel state once per process,
and seeds torch's global generators.
The scorer runs it under :func:`torch.random.fork_rng`, so a process that also samples (a rollout
worker's engine) keeps its random stream; the transformers engine samples from its own generator
anyway. On a CPU-only host the shim also answers ``torch.cuda.current_device()`` with ``"cpu"``,
which the CPU transformers engine never calls.
"""

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
import torch
from torch import Tensor

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.model_arch import LlamaArch, ModelArch, parallel_problems, resolve_arch
from asyncrl.api.old_logits import SCORER_TP_FIX
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.convert import iter_hf_to_megatron
from asyncrl.trainer.megatron.logprobs import DEFAULT_CHUNK_BYTES, token_logprobs
from asyncrl.trainer.megatron.model import build_gpt_model
from asyncrl.trainer.megatron.parallel import Layout, shard_of
from asyncrl.trainer.oldlogits.precision import actor_bf16

HfWeights: TypeAlias = Mapping[str, np.ndarray | Tensor]  # HF Llama names, what the actor sends the rollout workers
# (tokens, positions to score) or (tokens, positions, routes): routes [n, L, k] (numpy, rollout/routes.py) of the
# prefix under the scored version, replayed (routing replay R3); None or absent: the routers choose
Segment: TypeAlias = tuple[Sequence[int], Sequence[int]] | tuple[Sequence[int], Sequence[int], Any]

DEFAULT_TOKEN_BUDGET = 16384  # padded tokens per forward (rows * longest row)


@dataclass(frozen=True)
class ScorerSettings:
    """What the scorer needs: the actor's architecture, temperature and device choice."""

    arch: LlamaArch
    temperature: float = 1.0  # the rollout's sampling temperature (the actor's logp_theta uses it too)
    seed: int = 0
    token_budget: int = DEFAULT_TOKEN_BUDGET
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # The actor's parameter dtype (spec.actor.megatron.precision, :func:`actor_bf16`): the scorer computes in it,
    # so that its pi_old is the actor's own log-prob of the version (an fp32 scorer of a bf16 actor is not).
    bf16: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not self.temperature > 0.0:
            problems.append(f"temperature must be > 0, got {self.temperature}")
        if self.token_budget < 1:
            problems.append(f"token_budget must be >= 1, got {self.token_budget}")
        if problems:
            raise ValueError("ScorerSettings: " + "; ".join(problems))

    @classmethod
    def from_spec(
        cls,
        spec: AsyncRLJobSpec,
        vocab_size: int,
        *,
        max_sequence_length: int | None = None,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        device: Literal["auto", "cpu", "cuda"] = "auto",
    ) -> "ScorerSettings":
        """The settings the job's actor runs with (``ActorSettings.from_spec``: ``spec.model``,
        ``spec.task.temperature``, ``spec.train.seed``)."""
        return cls(
            arch=resolve_arch(spec.model, vocab_size, max_sequence_length),
            temperature=spec.task.temperature,
            seed=spec.train.seed,
            token_budget=token_budget,
            device=device,
            bf16=actor_bf16(spec),
        )


class SegmentScorer:
    """One resident weight version of the training-side model; scores segments under it.

    ``layout``: this process's place in a tensor-parallel gang (``Layout(tp=k, rank=r, world=k,
    init_method=...)``); every rank of the gang makes the same calls in the same order (SPMD). None: one
    process (a world-size-1 group)."""

    def __init__(self, settings: ScorerSettings, layout: Layout | None = None) -> None:
        self.settings = settings
        self.layout = layout if layout is not None else Layout()
        if self.layout.tp != self.layout.world or self.layout.pp != 1 or self.layout.ep != 1:
            raise ValueError(f"SegmentScorer: a scorer gang is tensor parallel only (tp == world, pp = ep = 1); "
                             f"got {self.layout}")
        if self.layout.tp > 1 and (bad := parallel_problems(settings.arch, self.layout.tp, fix=SCORER_TP_FIX)):
            raise ValueError("SegmentScorer: " + "; ".join(bad))
        self._runtime: compat.MegatronRuntime | None = None
        self._gpt: Any = None  # megatron GPTModel, built lazily
        self._version = NO_VERSION
        self._device: torch.device | None = None
        self.build_seconds = 0.0  # last model build (0 until the first load)
        self.load_seconds = 0.0  # last weight load (conversion + copy)
        self.builds = 0
        self.forwards = 0
        self.scored_tokens = 0

    # ---------------------------------------------------------------- weights
    @property
    def version(self) -> int:
        """The resident version (``NO_VERSION`` = none: never loaded, or freed)."""
        return self._version

    @property
    def built(self) -> bool:
        return self._gpt is not None

    def load(self, weights: HfWeights, version: int) -> None:
        """Make ``weights`` (HF names, numpy or torch, any float dtype) resident as ``version``;
        builds the model first when there is none. Shapes are checked against the architecture."""
        if version < 0:
            raise ValueError(f"SegmentScorer.load: version must be >= 0, got {version}")
        if self._gpt is None:
            self._build()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            # Arrays from Ray's object store are read-only; the copy into the parameters reads them once.
            warnings.simplefilter("ignore", UserWarning)
            hf = {k: torch.as_tensor(v) for k, v in weights.items()}
        load_shards(self._gpt, self.settings.arch, hf)
        self._version = version
        self.load_seconds = time.perf_counter() - t0

    def free(self) -> None:
        """Drop the model and its weights (the next :meth:`load` builds it again)."""
        self._gpt = None
        self._version = NO_VERSION
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.empty_cache()

    def connect(self) -> compat.MegatronRuntime:
        """Join the process group and megatron's parallel state (once; a gang's ranks meet here, so a gang
        calls it when its ranks start, not at the first load)."""
        if self._runtime is None:
            s, lay = self.settings, self.layout
            with torch.random.fork_rng(devices=self._rng_devices()):
                self._runtime = compat.init_megatron(s.seed, device=s.device, tp=lay.tp, init_method=lay.init_method,
                                                     rank=lay.rank, world=lay.world)
        return self._runtime

    def _rng_devices(self) -> list[int]:
        # Device indices, not torch.cuda.current_device(): the CPU shim answers that with "cpu".
        on_gpu = self.settings.device != "cpu" and torch.cuda.is_available()
        return list(range(torch.cuda.device_count())) if on_gpu else []

    def _build(self) -> None:
        t0 = time.perf_counter()
        s = self.settings
        self.connect()
        # init_megatron and the random init of the model seed torch's global generators: keep the
        # caller's random stream (a rollout worker samples in this process).
        with torch.random.fork_rng(devices=self._rng_devices()):
            runtime = compat.init_megatron(s.seed, device=s.device, tp=self.layout.tp,
                                           init_method=self.layout.init_method, rank=self.layout.rank,
                                           world=self.layout.world)
            # No random init: load() writes every weight right after (load_shards checks it).
            gpt = build_gpt_model(s.arch, use_cpu_initialization=runtime.use_cpu_initialization, random_init=False)
        if s.bf16:  # the actor's compute dtype (load() rounds the fp32 wire tensors: exact for a bf16 actor's)
            gpt = compat.cast_model(gpt, compat.OptimizerSettings(lr=0.0, bf16=True))
        self._device = runtime.device
        self._gpt = gpt.to(runtime.device)
        for p in self._gpt.parameters():
            p.requires_grad_(False)
        self.builds += 1
        self.build_seconds = time.perf_counter() - t0

    # ---------------------------------------------------------------- scoring
    def score(self, trajectories: Sequence[Trajectory], version: int) -> list[tuple[list[int], list[float]]]:
        """For each trajectory: the positions of its sampled tokens of ``version`` still unscored
        (``Trajectory.unscored(version)``) and their log-probs under the resident weights.

        ``version`` must be the resident one: a token is only ever scored under its own version.
        """
        self._require(version)
        positions = [t.unscored(version) for t in trajectories]
        values = self.score_segments([
            (t.tokens, p, None if t.routes is None or not p else t.routes.for_version(version))
            for t, p in zip(trajectories, positions, strict=True)
        ])
        return list(zip(positions, values, strict=True))

    def score_segments(self, segments: Sequence[Segment]) -> list[list[float]]:
        """Log-probs of ``tokens[p]`` given ``tokens[:p]`` for each ``(tokens, positions)``, under the
        resident weights, aligned with ``positions`` (positions >= 1: nothing predicts token 0)."""
        self._require(None)
        assert self._gpt is not None and self._device is not None  # _require checked it
        lengths = []
        for i, (seq, positions, *_) in enumerate(segments):
            bad = [p for p in positions if not 1 <= p < len(seq)]
            if bad:
                raise ValueError(
                    f"segment {i}: positions {bad[:5]} outside 1..{len(seq) - 1} (tokens has {len(seq)} "
                    "entries; position 0 has no log-prob)"
                )
            lengths.append(max(positions) + 1 if positions else 0)  # the prefix that matters
        out: list[list[float]] = [[] for _ in segments]
        order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
        for rows in _pack(order, lengths, self.settings.token_budget):
            T = lengths[rows[0]]  # longest first
            tokens = torch.zeros(len(rows), T, dtype=torch.long)  # [b, T]; padding only follows the prefix
            for r, i in enumerate(rows):
                tokens[r, : lengths[i]] = torch.as_tensor(list(segments[i][0][: lengths[i]]), dtype=torch.long)
            routes = _segment_routes([segments[i] for i in rows], T)
            with torch.no_grad():
                logp = token_logprobs(
                    self._gpt, tokens.to(self._device), temperature=self.settings.temperature,
                    max_chunk_bytes=self.settings.max_chunk_bytes,
                    routes=None if routes is None else routes.to(self._device),
                ).cpu()  # [b, T]
            self.forwards += 1
            for r, i in enumerate(rows):
                pos = list(segments[i][1])
                out[i] = logp[r, pos].tolist()
                self.scored_tokens += len(pos)
        return out

    def logprobs(self, tokens: Tensor) -> Tensor:
        """No-grad ``[B, T]`` log-probs of ``tokens`` ``[B, T]`` as given (the actor's ``logprobs``)."""
        self._require(None)
        with torch.no_grad():
            return token_logprobs(
                self._gpt, tokens.to(self._device), temperature=self.settings.temperature,
                max_chunk_bytes=self.settings.max_chunk_bytes,
            )

    def _require(self, version: int | None) -> None:
        if self._gpt is None or self._version == NO_VERSION:
            raise RuntimeError("SegmentScorer: no weights are resident; call load(weights, version) first")
        if version is not None and version != self._version:
            raise ValueError(
                f"SegmentScorer: asked to score version {version} but version {self._version} is resident; "
                "a token is scored only under its own version (load that version first)"
            )


def load_shards(gpt: torch.nn.Module, arch: ModelArch, hf: Mapping[str, Tensor]) -> int:
    """Copy HF-named full tensors into ``gpt``'s parameters, this TP rank's slice of each (the actor's
    mapping :func:`~asyncrl.trainer.megatron.convert.iter_hf_to_megatron` and slicing
    :func:`~asyncrl.trainer.megatron.parallel.shard_of`), one tensor at a time; returns the bytes written.
    Every parameter must be written (a left-over one is an error)."""
    params = {k: v for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
    owners = dict(gpt.named_parameters())  # their tensor-parallel attributes (partition dim and stride)
    done, nbytes = set(), 0
    with torch.no_grad():
        for name, full in iter_hf_to_megatron(hf, arch):
            if name not in params:
                raise ValueError(f"SegmentScorer.load: megatron parameter {name!r} is not in the model")
            params[name].copy_(shard_of(owners.get(name, params[name]), full))
            done.add(name)
            nbytes += params[name].numel() * params[name].element_size()
    if left := sorted(set(params) - done):
        raise ValueError(f"SegmentScorer.load: no weights for megatron parameters {left[:5]} (of {len(left)})")
    return nbytes


def _segment_routes(segments: Sequence[Segment], T: int) -> torch.Tensor | None:
    """``[b, T, L, k]`` routes of the packed ``segments`` (positions past a segment's routes: experts 0..k-1,
    which no scored logit attends to); None when no segment carries routes."""
    given = [s[2] if len(s) > 2 else None for s in segments]
    blocks: list[np.ndarray] = [b for b in given if b is not None]
    if not blocks:
        return None
    if len(blocks) != len(given):
        raise ValueError("routing replay: some segments of a forward carry routes and others do not")
    _, L, k = blocks[0].shape
    out = np.empty((len(blocks), T, L, k), dtype=blocks[0].dtype)
    out[:] = np.arange(k, dtype=out.dtype)
    for r, block in enumerate(blocks):
        out[r, : min(T, len(block))] = block[:T]
    return torch.from_numpy(out)


def _pack(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive runs of ``order`` (longest first) whose rows * first length stay within ``budget``
    padded tokens; a row longer than the budget goes alone."""
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches
