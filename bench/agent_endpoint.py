"""The agent endpoint's throughput and latency, side by side with the same episodes as an environment class.

    .venv/bin/python bench/agent_endpoint.py [--rounds 5] [--sessions 1 8 32] [--models h64 h256] [--profile]
    .venv/bin/python bench/agent_endpoint.py --smoke --out /tmp/agent_endpoint.json   (seconds; the test runs it)

The episodes (``tests/rollout/plugins/bench_agents.py``): a system and a user message (64 characters), 4 assistant
turns of exactly 16 sampled tokens, each but the last answered by a 12-character user message, run by
``RolloutWorker.generate`` in three paths:

- ``env``: an environment class (``spec.task.environment: "bench_agents:Conversation"``, ``async def step``);
- ``endpoint``: an agent function whose real ``openai`` client asks the worker's endpoint for each turn with
  ``max_tokens: 16``, as shipped: the agent runs in the worker's agent runner process (``rollout/agent/runner.py``);
- ``endpoint-in-process``: the same agent function run as the worker ran it before its agent runner process: one
  asyncio loop in a thread of the worker's own interpreter (:class:`InProcess`, the bench's copy of that design),
  so the ``openai`` client's CPU shares the decode loop's GIL.

The agent function is ``bench_agents_runner:conversation``: ``bench_agents.converse`` at the shape this bench names
in ``$ASYNCRL_BENCH_SHAPE``, its request latencies written to ``$ASYNCRL_BENCH_LATENCIES`` (the runner is a process
of its own: module state set here does not reach it).

The model never samples its end-of-turn token and always samples ``a`` (:func:`one_char_weights`: a residual
dimension held constant feeds one logit), so every turn is exactly ``max_tokens`` long in every path; the
environment class ends its turns with a stop string of 16 ``a`` s (it has no per-turn token limit) and forces one
character where the endpoint forces the end-of-turn token after a turn cut at ``max_tokens`` (an environment's
messages are data: it cannot write that id). Every path therefore samples and forces as many tokens (checked: the
counts are equal), and a forward costs the same whatever it samples. Three
models by default: ``h64`` (hidden 64, 2 layers: the endpoint's cost shows), ``h256`` (hidden 256, 4 layers, ~4x
the engine time per token) and ``smollm2`` (SmolLM2-135M's transformer, hidden 576, 30 layers, 9 heads of which 3
key/value, with the bench's small vocabulary: a real model's forward); ``--models h512`` (hidden 512, 4 layers) sits
between them.

``sessions`` is the number of episodes in flight in one ``generate`` call (``groups x groupSize``, here groupSize
1). A round runs every path once at every session count (the order of the paths reversed every other round, so a
load spike of this shared machine hits all alike), each path ``--episodes`` episodes per cell (one ``generate``
call at 8 and 32 sessions, 8 at 1). Reported per cell:

- tokens/s: sampled tokens over the wall time of ``generate``; the ratio to ``env`` is the mean over rounds of the
  per-round ratio, with a 95 % t interval (``bench/side_by_side.py``'s ``ci``);
- p50/p99 request latency: the agent function's time from ``chat.completions.create`` to its response, all turns;
- added ms: the endpoint's added latency per request, the p50 request latency of follow-up turns minus the p50
  turn gap of the environment class at the same session count (from its observation handed back to the next turn
  reaching ``step``: that turn's engine time, hops included). The engine's own time differs a little between the
  paths, so this is an estimate; at 32 sessions it is mostly queueing: the sessions run in lock step, so all 32
  requests of a turn arrive together and are served one after another while the engine waits;
- decode steps per episode: the engine's forwards (a forward decodes every row; a row waiting for its agent
  reads a masked pad), so the paths' engine work can be compared;
- CPU ms per turn: the CPU time (user + system, every thread) of the worker's process and of its agent runner
  process over ``generate``, per request (per environment step on ``env``): what each side of the pipe costs;
- ``null engine``: the endpoint path with the engine out of the way: the same agent function against the worker's
  endpoint, each session's ``AgentEnvironment`` answered at once with a canned 16-token turn (``reset`` and
  ``step`` driven directly): requests/s and the p50/p99 round trip of the client, HTTP, the session's mailbox and
  the answer, nothing else.

``--profile``: one extra ``generate`` of each path at the largest session count under cProfile, every thread with
its own CPU clock (the decode loop, the endpoint's uvicorn loop, the agents' loop, the environment runner's loop:
:class:`LoopProfiles`); prints each thread's CPU ms per request and its top functions.

Measured (2 cores, nothing else running, nice 0, 1 torch thread, 5 rounds, 20 min; the record is
``docs/results/data/agent_endpoint.json``): tokens/s, and the ratio to ``env`` with its 95 % interval::

    model   sessions   env     endpoint (runner process)   endpoint-in-process
    h64        1         561     407 (0.72 +- 0.14)          412 (0.73 +- 0.11)
    h64        8       3,273   1,476 (0.45 +- 0.08)        1,356 (0.42 +- 0.07)
    h64       32       7,342   2,267 (0.31 +- 0.07)        1,779 (0.26 +- 0.08)
    h256       1         155     157 (1.00 +- 0.15)          161 (1.03 +- 0.15)
    h256       8         762     632 (0.83 +- 0.11)          554 (0.73 +- 0.17)
    h256      32       1,495   1,166 (0.78 +- 0.07)          990 (0.66 +- 0.06)
    smollm2    1          14      14 (0.99 +- 0.14)           14 (0.99 +- 0.08)
    smollm2    8          56      55 (0.99 +- 0.07)           56 (0.99 +- 0.06)
    smollm2   32          96      96 (1.01 +- 0.14)           93 (0.97 +- 0.13)

The target holds for SmolLM2-135M's forward (1.01x at 32 sessions), not for the tiny ones. CPU ms per turn at 32
sessions, worker + runner: h64 5.8 + 4.0 (env 2.3), h256 13.2 + 3.1 (env 10.8), smollm2 167 + 2.9 (env 169): a few
milliseconds per request whatever the model, which a 75 ms turn (h64) cannot hide and a 4.7 s one (smollm2) can.
The null engine: 172 requests/s at 1 session, 299 at 32 (p50 5 / 104 ms). The HTTP stack is Starlette on
uvicorn's ``httptools`` and ``uvloop``; with FastAPI on ``h11`` and asyncio's loop (one round each, h64, 32 sessions)
the endpoint thread spent 3.08 CPU ms per request under cProfile (now 1.10) and the ratio was 0.25x (0.34x).

The record before (2 cores shared with other jobs, nice 10, h11 and FastAPI)::

    model sessions   env     endpoint (runner process)   endpoint-in-process
    h64      1         270     210 (0.79 +- 0.14)          207 (0.77 +- 0.12)
    h64     32       3,647   1,395 (0.39 +- 0.12)        1,158 (0.32 +- 0.07)
    h256    32         958     699 (0.73 +- 0.13)          649 (0.67 +- 0.10)

(a loaded machine slows the environment class more than the endpoint, so its ratios are higher at h64).

An earlier record (the same bench before the runner process, then the two fixes below, then a helper process as a
what-if), kept for where the time went::

    model sessions   env     endpoint             +fixes               +fixes+agent-process
    h64      1         670     239 (0.36 +- 0.01)   546 (0.82 +- 0.07)   553 (0.83 +- 0.06)
    h64     32       9,510   1,440 (0.15 +- 0.02) 3,030 (0.32 +- 0.06) 3,345 (0.35 +- 0.10)
    h256    32       1,928     903 (0.47 +- 0.02) 1,169 (0.61 +- 0.11) 1,171 (0.61 +- 0.19)

In that earlier record the target, >= 0.9x the environment class at 32 sessions, did not hold for either tiny model,
with or without the fixes. Where the time went:

- every response waits ~40 ms: the endpoint's listening socket comes from ``socket.create_server`` (proto 0), so
  asyncio never sets ``TCP_NODELAY`` on the connections uvicorn accepts, and uvicorn sends a response's head and
  body in two writes: Nagle holds the body until the client's delayed ACK. The null engine's round trip at 1
  session is 46 ms, 4 ms with ``TCP_NODELAY``; the added latency per request 47-50 ms, 4-7 ms with the fixes;
- every episode pays ~19 ms of CPU for its ``AsyncOpenAI`` client, whose transport loads the CA bundle into a new
  SSL context (for an ``http://`` loopback URL), under the GIL the decode loop needs: at 32 sessions the first
  requests wait for 32 of them (p99 774 ms);
- the rest is CPU per request, all in the worker's interpreter. cProfile at h64 / 32 sessions, CPU ms per
  request: env path 3.8 (decode loop 3.5, runner 0.3); endpoint 25.8: the agents' loop 19.1 (the ``openai``
  client: 4.8 its SSL context, 6.9 ``_async_transform_recursive`` of the request's messages, the rest httpx and
  parsing), uvicorn (h11) and FastAPI 2.4, the session's hop on the runner 0.6, the decode loop 3.6;
- the sessions run in lock step (the same shape), so all 32 requests of a turn arrive together and are served one
  after another while the engine waits (decode steps per episode barely change: 3.2 env, 3.4 endpoint): a turn
  costs the engine's turn (55 ms at h64, 248 ms at h256) plus 32 x the path's per-request cost (~2.5-3 ms after
  the fixes: the null engine's 327 requests/s at 32 sessions). For 0.9x that cost must stay under a ninth of the
  turn over 32 requests: 0.2 ms at h64, 0.9 ms at h256, less than the ``openai`` client alone spends per request.
  Moving the agents to a process of their own (the shipped runner) gains 0.06-0.07x at 32 sessions on 2 shared
  cores (the runner competes for them); it is there for isolation (a crashing agent costs its sessions, never the
  worker).
"""

import argparse
import asyncio
import cProfile
import gc
import io
import json
import math
import os
import platform
import pstats
import socket
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "tests" / "rollout" / "plugins"
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(PLUGINS))
import bench_agents as ba  # noqa: E402  (the plugin module the workers import: the same module object)
import torch  # noqa: E402
from side_by_side import ci  # noqa: E402

from asyncrl.api.job import AsyncSpec  # noqa: E402
from asyncrl.api.model import ModelSpec  # noqa: E402
from asyncrl.api.task import TaskSpec  # noqa: E402
from asyncrl.rollout.agent.environment import AgentEnvironment  # noqa: E402
from asyncrl.rollout.envs.interface import AssistantMessage  # noqa: E402
from asyncrl.rollout.hf_model import build_model  # noqa: E402
from asyncrl.rollout.trajectory import TrajectoryStatus  # noqa: E402
from asyncrl.rollout.worker import RolloutWorker  # noqa: E402

MODELS: dict[str, dict[str, int]] = {  # ModelSpec sizes; the tiny one makes the endpoint's cost visible
    "h64": {"hidden_size": 64, "ffn_hidden_size": 128, "num_layers": 2},
    "h256": {"hidden_size": 256, "ffn_hidden_size": 1024, "num_layers": 4},
    "h512": {"hidden_size": 512, "ffn_hidden_size": 2048, "num_layers": 4},  # --models h512: ~4x h256's forward
    # SmolLM2-135M's transformer (the model the package ships) with the bench's small vocabulary: a real model's
    # forward, less its 49,152-row head (which would only make the forward longer and the endpoint's share smaller)
    "smollm2": {"hidden_size": 576, "ffn_hidden_size": 1536, "num_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3},
}
ENV, ENDPOINT, INPROC = "env", "endpoint", "endpoint-in-process"
TARGET_SESSIONS, TARGET_RATIO = 32, 0.9


# ------------------------------------------------------------------------------------------ the model
def one_char_weights(state: dict[str, torch.Tensor], fill_id: int, eos_id: int) -> dict[str, torch.Tensor]:
    """``state`` (an untied Llama's HF weights) changed so the model samples ``fill_id`` with probability 1 (in
    float32) and never ``eos_id``: residual dimension 0 is 1 in every embedding and nothing writes to it (row 0 of
    every ``o_proj`` and ``down_proj`` is zero), so after the final norm it is positive at every position; the head
    reads only that dimension into the ``fill_id`` logit (+30 per unit: > 200 nats above every other token). The
    rest of the network is the random init: a forward costs what it costs."""
    out = {k: v.clone() for k, v in state.items()}
    out["model.embed_tokens.weight"][:, 0] = 1.0
    for k, v in out.items():
        if k.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            v[0, :] = 0.0
    out["model.norm.weight"][0] = 1.0
    head = out["lm_head.weight"]
    head[:, 0] = 0.0
    head[fill_id, 0] = 30.0
    assert fill_id != eos_id
    return out


# ------------------------------------------------------------------------------------------ the paths
def _run_in_process(fn: Callable[..., Any], base_url: str, key: str, sample: dict[str, Any], timeout_s: float,
                    tls: Any) -> Any:
    """The previous design's coroutine: one session's agent with its own client, in the worker's interpreter."""
    import openai

    async def run() -> Any:
        http = openai.DefaultAsyncHttpxClient(verify=tls, timeout=timeout_s)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s,
                                      http_client=http) as client:
            return await fn(client, dict(sample))

    return run()


class InProcess:
    """The agent runner's interface (``start`` -> a future of the agent's return value) served the way the worker
    did before the runner process: one asyncio loop in a thread of the worker's own interpreter (its GIL shared
    with the decode loop and the endpoint), one SSL context per process, ``TCP_NODELAY`` (both shipped then)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        import ssl

        self.fn, self._tls = fn, ssl.create_default_context()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bench-agents-in-process", daemon=True)
        self._thread.start()

    def start(self, base_url: str, key: str, sample: dict[str, Any], timeout_s: float) -> Any:
        return asyncio.run_coroutine_threadsafe(
            _run_in_process(self.fn, base_url, key, sample, timeout_s, self._tls), self._loop)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


def _nodelay(sock: socket.socket) -> bool:
    """Whether connections accepted on ``sock`` get ``TCP_NODELAY``: asyncio sets it on sockets whose ``proto`` is
    TCP (``socket.create_server`` makes them with proto 0), and Linux copies it from the listener."""
    return sock.proto == socket.IPPROTO_TCP or bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


LATENCY_FILE = Path(os.environ.setdefault("ASYNCRL_BENCH_LATENCIES", f"/tmp/asyncrl-bench-latencies-{os.getpid()}"))


def take_latencies() -> list[tuple[int, float]]:
    """The agents' request latencies since the last call (written by ``bench_agents_runner``, any process)."""
    try:
        text = LATENCY_FILE.read_text()
    except FileNotFoundError:
        return []
    LATENCY_FILE.write_text("")
    return [(int(k), float(x)) for line in text.splitlines() if line for k, x in json.loads(line)]


def runner_cpu_s(w: RolloutWorker) -> float:
    """CPU seconds (user + system) of ``w``'s agent runner process so far (0 without one)."""
    host = w.agent
    proc = getattr(host.loop, "_proc", None) if host is not None else None
    if proc is None:
        return 0.0
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Paths:
    """One model's workers: the environment class's, the agent function's as shipped (its runner process), and
    (``variant``) the agent function in the worker's own interpreter, as before the runner."""

    workers: dict[str, RolloutWorker]
    nodelay_upstream: bool  # the endpoint already sets TCP_NODELAY on its connections

    def run(self, path: str, sessions: int, calls: int) -> "Cell":
        return run_cell(self.workers[path], sessions, calls)

    def null(self, path: str, sessions: int, shape: ba.Shape) -> "Cell":
        return null_engine(self.workers[path], sessions, shape)

    def close(self) -> None:
        for w in self.workers.values():
            w.close()


def build_paths(model: str, shape: ba.Shape, *, variant: bool = True) -> Paths:
    spec = ModelSpec(**MODELS[model], rollout_dtype="float32", tie_embeddings=False)
    budget = shape.turns * (shape.max_tokens + shape.follow_chars + 1) + 16
    common: dict[str, Any] = {"python_path": [str(PLUGINS)], "group_size": 1, "max_new_tokens": budget}
    env_task = TaskSpec(environment="bench_agents:Conversation", args=asdict(shape), **common)
    agent_task = TaskSpec(agent="bench_agents_runner:conversation", **common)
    ba.SHAPE = shape
    os.environ["ASYNCRL_BENCH_SHAPE"] = ",".join(str(x) for x in astuple(shape))  # before the runners start
    workers = {ENV: RolloutWorker(env_task, spec, AsyncSpec(partial_rollout=True)),
               ENDPOINT: RolloutWorker(agent_task, spec, AsyncSpec(partial_rollout=True))}
    host = workers[ENDPOINT].agent
    assert host is not None
    upstream = _nodelay(host.endpoint._sock)
    if variant:
        workers[INPROC] = RolloutWorker(agent_task, spec, AsyncSpec(partial_rollout=True))
        inproc = workers[INPROC].agent
        fn = workers[INPROC].binding.agent.fn if workers[INPROC].binding.agent else None
        assert inproc is not None and inproc.loop is not None and fn is not None
        inproc.loop.close()  # its runner process: this path runs the agents in the worker's interpreter instead
        inproc.loop = InProcess(fn)  # type: ignore[assignment]
    tok = workers[ENV].tokenizer
    weights = one_char_weights(build_model(workers[ENV].arch, seed=0).state_dict(), tok.token_id(ba.FILL),
                               tok.eos_id)
    for w in workers.values():
        w.load_weights(weights, version=0)
    return Paths(workers, upstream)


@dataclass
class Cell:
    """What one path did at one session count in one round."""

    seconds: float = 0.0
    sampled: int = 0
    forced: int = 0
    episodes: int = 0
    decode_steps: int = 0  # the engine's forwards over its rows (prefills not counted)
    worker_cpu_s: float = 0.0  # CPU of this (the worker's) process over the cell, every thread
    runner_cpu_s: float = 0.0  # CPU of the worker's agent runner process over the cell
    latencies: list[tuple[int, float]] = field(default_factory=list)  # (turn, s): requests, or env turn gaps

    @property
    def tok_s(self) -> float:
        return self.sampled / self.seconds if self.seconds > 0 else 0.0


def run_cell(w: RolloutWorker, sessions: int, calls: int) -> Cell:
    """``calls`` ``generate`` calls of ``sessions`` episodes; every episode must finish."""
    cell = Cell()
    counters = getattr(w.engine, "counters", None)  # the transformers engine's EngineCounters
    for _ in range(calls):
        take_latencies()
        ba.STEP_GAPS.clear()
        steps = getattr(counters, "decode_steps", 0)
        c0, r0 = time.process_time(), runner_cpu_s(w)
        t0 = time.perf_counter()
        out = w.generate(sessions)
        cell.seconds += time.perf_counter() - t0
        cell.worker_cpu_s += time.process_time() - c0
        cell.runner_cpu_s += runner_cpu_s(w) - r0
        cell.decode_steps += getattr(counters, "decode_steps", 0) - steps
        bad = [t.info.get("end_reason") for t in out if t.status is not TrajectoryStatus.FINISHED]
        if len(out) != sessions or bad:
            raise RuntimeError(f"{len(out)} of {sessions} trajectories came back, not finished: {bad[:3]}")
        cell.episodes += len(out)
        for t in out:
            n = sum(t.loss_mask)
            cell.sampled += n
            cell.forced += len(t.tokens) - t.prompt_len - n
        cell.latencies += take_latencies() if w.agent is not None else list(ba.STEP_GAPS)
    return cell


# ------------------------------------------------------------------------------------------ the null engine
def null_engine(w: RolloutWorker, sessions: int, shape: ba.Shape) -> Cell:
    """The endpoint path with the engine out of the way: ``sessions`` agent sessions on ``w``'s endpoint, each
    answered at once (``AgentEnvironment.reset``/``step`` driven here with a canned turn)."""
    host = w.agent
    assert host is not None and w.binding.agent is not None
    agent = w.binding.agent.fn  # the worker's copy (what the runner runs: the function of the same name)
    text = ba.FILL * shape.max_tokens
    msg = AssistantMessage(text, text, ended_by="length", eos=False)

    async def drive(i: int) -> int:
        env = AgentEnvironment(host.endpoint, agent, traj_id=f"null-{i}", timeout_s=30.0,
                               loop=host.loop)
        sample = {"seed": i, "split": "train"}
        env.open(sample)
        try:
            await env.reset(sample)
            n = 1
            while not (await env.step(msg)).done:
                n += 1
            return n
        finally:
            env.close()

    async def main() -> list[int]:
        return await asyncio.gather(*(drive(i) for i in range(sessions)))

    take_latencies()
    t0 = time.perf_counter()
    turns = asyncio.run(main())
    cell = Cell(seconds=time.perf_counter() - t0, episodes=sessions, latencies=take_latencies())
    if turns != [shape.turns] * sessions:
        raise RuntimeError(f"null engine: turns per session {turns}, expected {shape.turns}")
    return cell


# ------------------------------------------------------------------------------------------ the profile
class LoopProfiles:
    """cProfile in every thread that runs an asyncio loop (the endpoint's uvicorn loop, the agents' loop, the
    environment runner's loop), each with its own CPU clock: cProfile sees one thread, and the endpoint's work is
    spread over these and the decode loop (profiled by the caller). Each profiler is made, enabled and disabled by
    a callback scheduled on its own loop, so it only ever runs in its thread."""

    def __init__(self) -> None:
        self.profiles: dict[int, tuple[str, cProfile.Profile]] = {}

    def _each_loop(self, fn: Callable[[], None]) -> None:
        with warnings.catch_warnings():  # isinstance() over every object wakes deprecated module attributes
            warnings.simplefilter("ignore")
            loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]
        done = [threading.Event() for _ in loops]
        def call(ev: threading.Event) -> None:
            fn()
            ev.set()

        for loop, ev in zip(loops, done, strict=True):
            loop.call_soon_threadsafe(call, ev)
        for ev in done:
            ev.wait(10)

    def start(self) -> None:
        def on() -> None:
            me = threading.current_thread()
            prof = cProfile.Profile(time.thread_time)
            self.profiles[me.ident or 0] = (me.name, prof)
            prof.enable()

        self.profiles.clear()
        self._each_loop(on)

    def stop(self) -> dict[str, pstats.Stats]:
        """Disable every loop's profiler (in its own thread); the stats by thread name."""
        def off() -> None:
            entry = self.profiles.get(threading.get_ident())
            if entry is not None:
                entry[1].disable()

        self._each_loop(off)
        out: dict[str, pstats.Stats] = {}
        for name, prof in self.profiles.values():
            try:
                st = pstats.Stats(prof, stream=io.StringIO())
            except TypeError:  # a profiler that recorded nothing
                continue
            if name in out:
                out[name].add(st)
            else:
                out[name] = st
        return out


def profile_report(stats: dict[str, pstats.Stats], requests: int, top: int = 12) -> list[str]:
    """Per thread: CPU ms per request and its ``top`` functions by own CPU time."""
    lines = []
    for name, st in sorted(stats.items(), key=lambda kv: -kv[1].total_tt):  # type: ignore[attr-defined]
        total = st.total_tt  # type: ignore[attr-defined]
        if total < 1e-3:
            continue
        lines.append(f"  thread {name}: {1e3 * total / requests:.2f} CPU ms per request")
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
        for (path, line, fn), (_cc, nc, tt, ct, _callers) in rows:
            where = path.split("site-packages/")[-1].split(str(REPO) + "/")[-1]
            lines.append(f"    {1e3 * tt / requests:7.3f} own {1e3 * ct / requests:7.3f} cum ms/req "
                         f"{nc / requests:6.1f} calls/req  {where}:{line}({fn})")
    return lines


# ------------------------------------------------------------------------------------------ the statistics
def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summarise(rounds: list[dict[tuple[int, str], Cell]], sessions: Sequence[int], paths: Sequence[str]
              ) -> list[dict[str, Any]]:
    """One row per (session count, path): tokens/s, the ratio to ``env`` per round (mean, 95 % half-width),
    request latency p50/p99 (ms) and the added latency per follow-up request (ms)."""
    rows = []
    for c in sessions:
        env_gap = statistics.median([x for r in rounds for k, x in r[(c, ENV)].latencies if k > 0] or [math.nan])
        for p in paths:
            cells = [r[(c, p)] for r in rounds]
            ratios = [r[(c, p)].tok_s / r[(c, ENV)].tok_s for r in rounds if r[(c, ENV)].tok_s > 0]
            mean, half = ci(ratios)
            lat = [x for cell in cells for _k, x in cell.latencies]
            follow = [x for cell in cells for k, x in cell.latencies if k > 0]
            episodes = sum(cell.episodes for cell in cells)
            row: dict[str, Any] = {
                "sessions": c, "path": p, "tok_s": statistics.fmean(cell.tok_s for cell in cells),
                "ratio": mean, "ratio_ci95": half, "sampled_tokens": sum(cell.sampled for cell in cells),
                "forced_tokens": sum(cell.forced for cell in cells), "episodes": episodes,
                "decode_steps_per_episode": sum(cell.decode_steps for cell in cells) / max(1, episodes),
                # CPU per turn (a request, or an environment step), every thread of the process
                "worker_cpu_ms_per_turn": 1e3 * sum(cell.worker_cpu_s for cell in cells) / max(1, len(lat)),
                "runner_cpu_ms_per_turn": 1e3 * sum(cell.runner_cpu_s for cell in cells) / max(1, len(lat)),
            }
            if p == ENV:
                row |= {"turn_gap_p50_ms": 1e3 * env_gap}
            else:
                row |= {"p50_ms": 1e3 * percentile(lat, 50), "p99_ms": 1e3 * percentile(lat, 99),
                        "added_ms": 1e3 * (statistics.median(follow or [math.nan]) - env_gap)}
            rows.append(row)
    return rows


def summarise_null(cells: dict[tuple[int, str], list[Cell]]) -> list[dict[str, Any]]:
    """One row per (session count, path) of the null engine: requests/s (mean over rounds), round trip p50/p99."""
    rows = []
    for (c, p), runs in sorted(cells.items()):
        lat = [x for cell in runs for _k, x in cell.latencies]
        rows.append({"sessions": c, "path": p, "requests_s": statistics.fmean(len(r.latencies) / r.seconds for r in runs),
                     "p50_ms": 1e3 * percentile(lat, 50), "p99_ms": 1e3 * percentile(lat, 99)})
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or math.isnan(x) else format(x, spec)


def table(model: str, rows: list[dict[str, Any]]) -> list[str]:
    out = [f"{model}: | sessions | path | tok/s | vs env (95% CI) | p50 ms | p99 ms | added ms/request | "
           "decode steps/episode | CPU ms/turn worker + runner |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x +- {_fmt(r['ratio_ci95'], '.2f')}"
        steps = f"{r['decode_steps_per_episode']:.1f}"
        cpu = f"{r['worker_cpu_ms_per_turn']:.1f} + {r['runner_cpu_ms_per_turn']:.1f}"
        if r["path"] == ENV:
            out.append(f"| {r['sessions']} | env | {r['tok_s']:,.0f} | 1 | turn gap {r['turn_gap_p50_ms']:.1f} | | | "
                       f"{steps} | {cpu} |")
        else:
            out.append(f"| {r['sessions']} | {r['path']} | {r['tok_s']:,.0f} | {ratio} | {r['p50_ms']:.1f} | "
                       f"{r['p99_ms']:.1f} | {_fmt(r['added_ms'], '.1f')} | {steps} | {cpu} |")
    return out


# ------------------------------------------------------------------------------------------ the run
def measure_model(model: str, args: argparse.Namespace, shape: ba.Shape, log: Callable[[str], None]
                  ) -> dict[str, Any]:
    paths_ = build_paths(model, shape, variant=not args.no_variant)
    try:
        names = list(paths_.workers)
        for p in names:  # warm-up: the first generate of a worker pays for imports, the first connections
            paths_.run(p, min(4, max(args.sessions)), 1)
        rounds: list[dict[tuple[int, str], Cell]] = []
        null: dict[tuple[int, str], list[Cell]] = {}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            cells: dict[tuple[int, str], Cell] = {}
            for c in args.sessions:
                calls = max(1, args.episodes // c)
                for p in order:
                    cells[(c, p)] = paths_.run(p, c, calls)
                if model == args.models[0]:  # the endpoint alone does not depend on the model
                    for p in order:
                        if p != ENV:
                            null.setdefault((c, p), []).append(paths_.null(p, c, shape))
            rounds.append(cells)
            log(f"{model} round {r + 1}/{args.rounds}: " + ", ".join(
                f"{c}x {p} {cells[(c, p)].tok_s:,.0f}" for c in args.sessions for p in names) + " tok/s")
        out: dict[str, Any] = {"model": MODELS[model], "paths": names, "endpoint_sets_nodelay": paths_.nodelay_upstream,
                               "rows": summarise(rounds, args.sessions, names)}
        if null:
            out["null_engine"] = summarise_null(null)
        if args.profile:
            out["profile_cpu_ms_per_request"] = run_profiles(paths_, max(args.sessions), log)
        return out
    finally:
        paths_.close()


def run_profiles(paths_: Paths, sessions: int, log: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """One ``generate`` of each path under every thread's profiler: CPU ms per request by thread."""
    out: dict[str, dict[str, float]] = {}
    loops = LoopProfiles()
    for p in paths_.workers:
        loops.start()
        main = cProfile.Profile(time.thread_time)
        main.enable()
        cell = paths_.run(p, sessions, 1)
        main.disable()
        stats = loops.stop()
        stats["decode loop (MainThread)"] = pstats.Stats(main, stream=io.StringIO())
        requests = cell.episodes * ba.SHAPE.turns
        log(f"profile of {p} at {sessions} sessions ({requests} turns, {cell.seconds:.2f} s wall, "
            f"{cell.tok_s:,.0f} tok/s under the profiler):")
        for line in profile_report(stats, requests):
            log(line)
        out[p] = {name: round(1e3 * st.total_tt / requests, 3) for name, st in stats.items()}  # type: ignore[attr-defined]
    return out


def verdict(models: dict[str, Any]) -> dict[str, Any]:
    """The target: the endpoint at >= 0.9x the environment class's tokens/s at 32 sessions, per model and path."""
    out: dict[str, Any] = {"sessions": TARGET_SESSIONS, "min_ratio": TARGET_RATIO, "holds": {}}
    for m, rec in models.items():
        for r in rec["rows"]:
            if r["sessions"] == TARGET_SESSIONS and r["path"] != ENV:
                lo = r["ratio"] - (r["ratio_ci95"] if math.isfinite(r["ratio_ci95"]) else 0.0)
                out["holds"][f"{m}/{r['path']}"] = {"ratio": round(r["ratio"], 3), "holds": r["ratio"] >= TARGET_RATIO,
                                                   "holds_at_ci_low": lo >= TARGET_RATIO}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["h64", "h256", "smollm2"], choices=list(MODELS))
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--episodes", type=int, default=8, help="episodes per path per cell (calls = episodes / sessions)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt-chars", type=int, default=64)
    p.add_argument("--follow-chars", type=int, default=12)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--no-variant", action="store_true", help="only env and endpoint (no what-if paths)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--smoke", action="store_true", help="h64, 1 and 4 sessions, 1 round, 2 turns of 4 tokens")
    p.add_argument("--out", default=str(REPO / "docs" / "results" / "data" / "agent_endpoint.json"))
    args = p.parse_args(argv)
    if args.smoke:
        args.models, args.sessions, args.rounds, args.episodes = ["h64"], [1, 4], 1, 4
        args.turns, args.max_tokens, args.prompt_chars, args.follow_chars = 2, 4, 16, 6
    shape = ba.Shape(args.turns, args.max_tokens, args.prompt_chars, args.follow_chars)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    models = {m: measure_model(m, args, shape, log) for m in args.models}
    record = {
        "bench": "bench/agent_endpoint.py", "argv": list(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                    "torch_threads": args.threads, "nice": os.nice(0)},
        "shape": asdict(shape), "rounds": args.rounds, "episodes_per_cell": args.episodes,
        "models": models, "target": verdict(models), "wall_s": round(time.perf_counter() - t0, 1),
    }
    record["sampled_tokens_equal"] = all(
        len({r["sampled_tokens"] for r in rec["rows"] if r["sessions"] == c}) == 1
        for rec in models.values() for c in args.sessions)
    for m, rec in models.items():
        print("\n".join(table(m, rec["rows"])))
        for r in rec.get("null_engine", []):
            print(f"null engine, {r['sessions']} sessions, {r['path']}: {r['requests_s']:,.0f} requests/s, "
                  f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms")
    for k, v in record["target"]["holds"].items():
        print(f"target >= {TARGET_RATIO}x env at {TARGET_SESSIONS} sessions, {k}: {v['ratio']:.2f}x "
              f"{'holds' if v['holds'] else 'does not hold'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(_rounded(record), indent=1) + "\n")
    print(f"wrote {args.out}")


def _rounded(x: Any) -> Any:
    """``x`` with floats to 4 significant digits (a small record) and NaN as null."""
    if isinstance(x, float):
        return None if not math.isfinite(x) else float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


if __name__ == "__main__":
    main()
