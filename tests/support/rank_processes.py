"""The start method for the tests' rank groups: a fork server with torch and megatron-core imported once.

A spawned rank starts a fresh interpreter and imports torch and megatron-core again (seconds per rank on two
loaded cores, several per test). The fork server imports them once per test session, before any rank
exists, and forks each rank from that state: only imports are shared, and every rank still builds its own
process group, model and state after the fork. The server itself runs no torch operation, so no thread pool
exists to be copied half-initialised. ``bench/rank_start.py`` measures both start methods side by side.
"""

from __future__ import annotations

from multiprocessing.context import BaseContext

import torch.multiprocessing as mp  # its tensor reductions (shared memory) registered with the pickler

# imported once in the fork server; each is what a rank imports first (a module that fails to import here is
# skipped by the server and imported by the rank itself, as under spawn)
PRELOAD = (
    "torch",
    "torch.distributed",
    "megatron.core",
    "megatron.core.parallel_state",
    "megatron.core.tensor_parallel",
    "asyncrl.trainer.megatron.parallel",
    "asyncrl.trainer.actor.megatron_actor",
)


def rank_context() -> BaseContext:
    """The multiprocessing context rank groups start from (the fork server, its imports preloaded)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # takes effect when the server starts (first use a session)
    return ctx
