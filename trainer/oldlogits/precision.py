"""The actor's parameter dtype as every process of a job sees it (``spec.actor.megatron.precision``).

The exact strategies that score away from the actor (``dedicated``, ``interruptSync``: :mod:`.segment_scorer`)
must compute in the actor's precision, or their ``pi_old`` is not the actor's own log-prob of the version: an
fp32 scorer of a bf16 actor is off by bf16 noise (measured 2.7e-3 nats on the tests' tiny model, where the bf16
scorer matches bit for bit). Light (torch and ``api`` only): the driver resolves ``auto`` here without importing
megatron.
"""

from typing import Literal

import torch

from asyncrl.api.job import AsyncRLJobSpec


def actor_bf16(spec: AsyncRLJobSpec, placement: Literal["local", "cluster"] = "local") -> bool:
    """Whether the job's actor trains with bf16 parameters (``spec.actor.megatron.precision``). ``auto`` is
    ``OptimizerSettings.resolved``'s rule, bf16 on CUDA, decided for the actor's device and not the caller's,
    so that a scorer on another device follows the actor: in a cluster the actor pods have GPUs
    (``actor.gpusPerReplica`` > 0); locally every process sees this machine's devices. The driver resolves
    ``auto`` once (``start_hosts``), so every host reads the same explicit value."""
    precision = spec.actor.megatron.precision
    if precision != "auto":
        return precision == "bf16"
    return spec.actor.gpus_per_replica > 0 if placement == "cluster" else torch.cuda.is_available()
