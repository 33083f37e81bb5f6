"""What one version's weight sync says, as typed records: in a receiver, and across Ray back to the driver.

- :class:`Received`: what a receiver took off a transport (the HF state dict, in its own process);
- :class:`Delivered`: a receiver (a rollout worker, a dedicated scorer) took the version -- what it answers;
- :class:`Sent`: the source broadcast the version -- what the actor's rank 0 answers;
- :class:`SyncFailed`: the broadcast group broke (a member died): the driver hands the version over through
  the object store instead and forms the group again (``trainer/driver/loop/weight_sync.py``).

A receiver answers a :data:`SyncOutcome`, the source a :data:`SendOutcome`; the driver tells success from
failure by the record's type (``isinstance(o, SyncFailed)``), never by which keys a dict holds. They are
frozen dataclasses of plain numbers and strings, so they pickle across Ray. Seconds are wall-clock
(``time.perf_counter``) in the process that did the work.
"""

from dataclasses import dataclass
from typing import TypeAlias

import torch


@dataclass(frozen=True)
class Received:
    """What a receiver got and how long taking it off the transport took (the generation keeps running)."""

    state: dict[str, torch.Tensor]  # HF names -> tensors (views of the buckets: copy before writing into them)
    version: int | None  # None: a plain HF dict, which names no version
    transfer_seconds: float
    nbytes: int


@dataclass(frozen=True)
class Delivered:
    """A receiver took one version: off the transport, and (a rollout worker) into its engine."""

    transfer_seconds: float  # taken off the transport and reassembled (generation running meanwhile)
    nbytes: int  # the version's payload as this receiver got it
    # A rollout worker's engine: its private copy, and how long generation stood still installing weights since
    # the last call (this version when applied at once, else the boundary swaps of earlier versions). A
    # dedicated scorer installs nothing here (it loads a version when it advances to it): 0 for both.
    handover_seconds: float = 0.0
    pause_seconds: float = 0.0


@dataclass(frozen=True)
class Sent:
    """The source broadcast one version to its group."""

    nbytes: int  # payload bytes (once, whatever the number of receivers)
    seconds: float


@dataclass(frozen=True)
class SyncFailed:
    """This member missed the version: the broadcast group broke (a member died) or it is in no group."""

    reason: str


SyncOutcome: TypeAlias = Delivered | SyncFailed  # a receiver's answer
SendOutcome: TypeAlias = Sent | SyncFailed  # the source's answer (rank 0; the other actor ranks answer None)
