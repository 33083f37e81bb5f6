"""The engine process of the vLLM backend: one vLLM ``LLMEngine`` driven token by token over a socket.

Runs in the vLLM environment's own interpreter (``.ci/build-vllm-env.sh``), started by
:class:`asyncrl.rollout.vllm_engine.VLLMEngine` as ``<vllm python> vllm_server.py``. It imports nothing
from asyncrl (that interpreter has another torch and transformers than the project's), and it speaks
plain data only: pickled tuples of str/int/float/list/dict and raw float32 byte buffers for weights.

Protocol (``multiprocessing.connection`` over a unix socket at ``$ASYNCRL_VLLM_ADDRESS``, authkey
``$ASYNCRL_VLLM_AUTHKEY`` in hex): the server listens, accepts one client, sends a hello dict (platform,
versions, what the platform supports), then answers each ``(command, kwargs)`` with ``("ok", result)``
or ``("error", message, traceback)``:

- ``build(hf_config, dtype, engine, capture_routes=False)``: write the HF config, build the engine with dummy
  weights; ``capture_routes`` hooks a :class:`RouteTap` on its MoE routers (prefix caching must be off).
- ``weights(names, shapes)``, then one ``send_bytes`` of float32 data per tensor: reload the weights
  in place (``Worker.reload_weights``; the CPU build repacks linear weights, so the model's own
  ``load_weights`` does not work there; its MoE experts are packed again after it, :func:`repack_cpu_experts`)
  and reset the prefix cache (its blocks hold old-weight KV).
- ``step(aborts, adds)``: abort requests, add requests, run one ``LLMEngine.step()``; returns
  ``[(request_id, new_token_ids, new_logprobs, finished)]``.
- ``take_routes()``: ``{request id: (first position, [n, layers, k], int16 bytes)}`` of the positions the
  steps since the last call computed (built with ``capture_routes``).
- ``abort_all()``, ``teardown()`` (drop the engine and its KV cache; the process stays), ``rss()``,
  ``exit()``.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its worker is reachable by a
plain function call, so a weight reload needs no serialization of its own.
"""

import gc
import json
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection, Listener
from typing import Any


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise, so RSS would not show a release)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def repack_cpu_experts(worker: Any) -> int:
    """Re-pack the MoE experts of vLLM's CPU build after an in-place reload; returns the layers re-packed.

    The CPU experts (``CPUUnquantizedExperts``) pack ``w13``/``w2`` into their grouped-gemm layout in
    ``process_weights_after_loading``, which vLLM 0.32 runs on the first load only: a reload copies the new
    weights, in checkpoint layout, into the packed parameters, and the kernel reads them as packed (measured on a
    tiny Qwen3-MoE: layer 0 routed as the reference, layer 1 not, log-probs up to 3.7 nats off). Packing again
    here gives the reference's log-probs (1.4e-6 max) and routes (every position, every layer). No-op elsewhere.
    """
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    n = 0
    for m in worker.model_runner.model.modules():
        experts = getattr(getattr(getattr(m, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        if hasattr(m, "w13_weight") and isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(m)
            n += 1
    return n


class RouteTap:
    """The top-k experts of every MoE layer for every position a step computes, per request (routing replay).

    vLLM's routers call ``capture_fn(topk_ids)`` (``[tokens of the step, k]``) in each forward, the hook vLLM's
    own routed-experts capturer binds; the model runner's ``execute_model`` is wrapped to know which request
    owns which rows (the input batch's order, ``num_scheduled_tokens`` each) and where each starts
    (``num_computed_tokens`` before the step). With prefix caching off every position of a request is computed,
    so its routes run contiguously from position 0 (a resubmitted prefix starts again at 0).
    """

    def __init__(self, worker: Any) -> None:
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        self.runner = worker.model_runner
        if not hasattr(self.runner, "input_batch"):  # model runner V2 (GPU builds with Triton) keeps its batch elsewhere
            raise RuntimeError(
                f"route capture reads vLLM's V1 model runner (the CPU build's); this engine runs "
                f"{type(self.runner).__module__}, where vLLM's own enable_return_routed_experts would be the source "
                "(not read by asyncrl yet); set correction.routingReplay: none or use rollout.engine: transformers"
            )
        self.layers: dict[int, list[Any]] = {}  # layer id -> this step's topk_ids
        self.steps: dict[str, tuple[int, Any]] = {}  # vLLM request id -> (first position, [n, L, k] int64)
        self.external: dict[str, str] = {}  # vLLM's internal request id -> the id asyncrl gave it
        runners = [m for m in self.runner.model.modules() if isinstance(m, MoERunner)]
        if not runners:
            raise RuntimeError("route capture: the model has no MoE layer")
        for m in runners:
            m.router.set_capture_fn(lambda ids, lid=m.layer_id: self.layers.setdefault(lid, []).append(ids.clone()))
        self.num_layers = len(runners)
        inner = self.runner.execute_model

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            starts = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
            cached = scheduler_output.scheduled_cached_reqs
            starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
            self.layers.clear()
            out = inner(scheduler_output, *args, **kwargs)
            self._split(scheduler_output.num_scheduled_tokens, starts)
            return out

        self.runner.execute_model = execute_model

    def _split(self, scheduled: dict[str, int], starts: dict[str, int]) -> None:
        import torch

        if not scheduled or not self.layers:
            return
        if len(self.layers) != self.num_layers or any(len(v) != 1 for v in self.layers.values()):
            raise RuntimeError(f"route capture: one forward per step expected; got {[len(v) for v in self.layers.values()]}")
        ids = torch.stack([self.layers[lid][0] for lid in sorted(self.layers)], dim=1)  # [tokens, L, k]
        row = 0
        for rid in self.runner.input_batch.req_ids[: self.runner.input_batch.num_reqs]:
            n = scheduled.get(rid, 0)
            if n:
                self.steps[rid] = (starts[rid], ids[row : row + n].to("cpu").numpy())
                row += n
        if row != sum(scheduled.values()):
            raise RuntimeError(f"route capture: {row} rows mapped to requests, {sum(scheduled.values())} scheduled")

    def take(self, live: set[str]) -> dict[str, tuple[int, list[int], bytes]]:
        """``{request id: (first position, shape, int16 bytes)}`` of the steps since the last take, by asyncrl's
        ids; forgets the ids of requests no longer ``live``."""
        out = {self.external.get(rid, rid): (start, list(a.shape), a.astype("int16").tobytes())
               for rid, (start, a) in self.steps.items()}
        self.steps.clear()
        self.external = {i: e for i, e in self.external.items() if e in live}
        return out


class Server:
    def __init__(self, conn: Connection, workdir: str) -> None:
        self.conn = conn
        self.workdir = workdir
        self.engine: Any = None
        self.live: set[str] = set()  # request ids added and not yet finished or aborted
        self.build_args: dict[str, Any] | None = None
        self.routes: RouteTap | None = None  # set by build(capture_routes=True)

    # ------------------------------------------------------------------ commands
    def hello(self) -> dict[str, Any]:
        import torch
        import vllm
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON

        heads: list[int] = []
        if current_platform.is_cpu():
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            heads = list(CPUAttentionBackend.get_supported_head_sizes())
        return {
            "pid": os.getpid(),
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "platform": current_platform.device_type,
            "sleep_mode": bool(current_platform.is_sleep_mode_available()),
            "cpu_head_sizes": heads,
            "has_triton": bool(HAS_TRITON),  # on CPU: a Triton CPU backend, which vLLM's model runner V2 needs
            "rss_bytes": rss_bytes(),
        }

    def build(
        self, hf_config: dict[str, Any], dtype: str, engine: dict[str, Any], capture_routes: bool = False
    ) -> dict[str, Any]:
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        t0 = time.perf_counter()
        model_dir = os.path.join(self.workdir, "model")
        os.makedirs(model_dir, exist_ok=True)  # the family's config.json as is: vLLM picks the model class
        with open(os.path.join(model_dir, "config.json"), "w") as f:  # from its architectures entry
            json.dump(hf_config, f, indent=2, sort_keys=True)
        args = EngineArgs(
            model=model_dir,
            skip_tokenizer_init=True,
            load_format="dummy",  # the real weights arrive by reload_weights
            dtype=dtype,
            logprobs_mode="processed_logprobs",  # log softmax(z / T) of the distribution sampled from
            **engine,
        )
        self.engine = LLMEngine.from_engine_args(args)
        self.routes = None
        if capture_routes:
            if engine.get("enable_prefix_caching"):
                raise ValueError("route capture needs every position computed: build with enable_prefix_caching False")
            self.routes = self.engine.collective_rpc(RouteTap)[0]
        self.build_args = {"hf_config": hf_config, "dtype": dtype, "engine": engine}
        return {"build_s": time.perf_counter() - t0, "rss_bytes": rss_bytes()}

    def weights(self, names: list[str], shapes: list[list[int]]) -> dict[str, Any]:
        import torch

        t0 = time.perf_counter()
        tensors = []
        for name, shape in zip(names, shapes, strict=True):
            buf = bytearray(self.conn.recv_bytes())
            tensors.append((name, torch.frombuffer(buf, dtype=torch.float32).view(*shape)))
        t_recv = time.perf_counter() - t0
        if self.live:
            raise RuntimeError(f"weights arrived while {len(self.live)} requests run; abort them first")
        self._engine().collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors)})
        self._engine().collective_rpc(repack_cpu_experts)
        if not self._engine().reset_prefix_cache():  # cached blocks hold KV of the old weights
            raise RuntimeError("vLLM could not reset its prefix cache after a weight reload")
        return {"recv_s": t_recv, "load_s": time.perf_counter() - t0 - t_recv}

    def step(self, aborts: list[str], adds: list[dict[str, Any]]) -> list[tuple[str, list[int], list[float], bool]]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self._engine()
        gone = [r for r in aborts if r in self.live]
        if gone:
            engine.abort_request(gone)
            self.live.difference_update(gone)
        for a in adds:
            params = SamplingParams(
                n=1,
                temperature=a["temperature"],
                top_p=1.0,
                top_k=0,
                min_p=0.0,
                max_tokens=a["max_tokens"],
                logprobs=0,  # the sampled token's own log-prob
                ignore_eos=True,  # the environment ends an episode, not an EOS id
                detokenize=False,
                seed=a["seed"],
                output_kind=RequestOutputKind.DELTA,
            )
            internal = engine.add_request(a["id"], {"prompt_token_ids": a["tokens"]}, params)
            if self.routes is not None:  # the model runner knows vLLM's internal id (ours plus a suffix)
                self.routes.external[internal] = a["id"]
            self.live.add(a["id"])
        out = []
        for r in engine.step():
            c = r.outputs[0]
            toks = list(c.token_ids)
            lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(toks)] if toks else []
            if r.finished:
                self.live.discard(r.request_id)
            out.append((r.request_id, toks, lps, bool(r.finished)))
        return out

    def abort_all(self) -> int:
        n = len(self.live)
        if self.live:
            self._engine().abort_request(sorted(self.live))
            self.live.clear()
        return n

    def take_routes(self) -> dict[str, tuple[int, list[int], bytes]]:
        """The routes computed since the last call (:meth:`RouteTap.take`); build(capture_routes=True) first."""
        if self.routes is None:
            raise RuntimeError("take_routes: the engine was built without capture_routes")
        return self.routes.take(self.live)

    def teardown(self) -> dict[str, Any]:
        before = rss_bytes()
        t0 = time.perf_counter()
        if self.engine is not None:
            self.abort_all()
        self.engine = None
        self.routes = None
        gc.collect()
        _trim()
        return {"rss_before": before, "rss_after": rss_bytes(), "teardown_s": time.perf_counter() - t0}

    def sleep(self) -> None:
        """Platforms with a sleep mode (CUDA): weights offloaded to host memory, KV cache dropped."""
        self._engine().sleep(level=1)

    def wake_up(self) -> None:
        self._engine().wake_up()

    def rss(self) -> int:
        return rss_bytes()

    def _engine(self) -> Any:
        if self.engine is None:
            raise RuntimeError("the vLLM engine is not built (build() first, or it was torn down)")
        return self.engine

    # ------------------------------------------------------------------ loop
    def serve(self) -> bool:
        """Answer commands until ``exit`` (returns False) or the client is gone (returns True)."""
        self.conn.send(("ok", self.hello()))
        while True:
            try:
                cmd, kwargs = self.conn.recv()
            except (EOFError, OSError):
                return True
            if cmd == "exit":
                self.conn.send(("ok", None))
                return False
            try:
                result = getattr(self, cmd)(**kwargs)
            except Exception as exc:  # every failure goes back to the client, which raises it
                self.conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            else:
                self.conn.send(("ok", result))


def main() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    address = os.environ["ASYNCRL_VLLM_ADDRESS"]
    authkey = bytes.fromhex(os.environ["ASYNCRL_VLLM_AUTHKEY"])
    workdir = os.path.dirname(address)
    with Listener(address, family="AF_UNIX", authkey=authkey) as listener:
        print(f"asyncrl vllm server {os.getpid()} listening on {address}", file=sys.stderr, flush=True)
        conn = listener.accept()
    try:
        orphaned = Server(conn, workdir).serve()
    finally:
        conn.close()
    if orphaned:  # the client died without closing (its own cleanup never ran): remove our folder
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
