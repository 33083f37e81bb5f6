"""Joining a group through its authenticated store: :func:`join` (the store) and :func:`init_default_group`
(the process's ``torch.distributed`` default group, the actor's or a scorer gang's).

Rank 0 starts the :class:`~.store.StoreServer` before it connects, the other ranks connect (retrying while
it starts) and prove the token; then torch builds the group over the store as it would over a ``TCPStore``.
The server must outlive the group's set-up: NCCL creates its communicators lazily, at a group's first
collective, and exchanges their id through the store then. So the default group's server lives as long
as the process, and a weight-sync group's as long as its :class:`~asyncrl.trainer.weight_sync.broadcast.SyncGroup`.
"""

import datetime

import torch.distributed as dist

from asyncrl.trainer.collective.client import AuthStore
from asyncrl.trainer.collective.endpoint import Endpoint
from asyncrl.trainer.collective.store import StoreServer

_DEFAULT_GROUP_SERVERS: list[StoreServer] = []  # rank 0's server of the default group: kept for the process
_DEFAULT_GROUP_STORES: list[AuthStore] = []  # the default group's client: torch holds only its C++ side


def join(endpoint: Endpoint, rank: int, timeout: datetime.timedelta) -> tuple[AuthStore, StoreServer | None]:
    """The group's store as member ``rank`` sees it, and the server when ``rank == 0`` (which serves it)."""
    server = StoreServer(endpoint) if rank == 0 else None
    try:
        return AuthStore(endpoint, timeout), server
    except BaseException:
        if server is not None:
            server.close()
        raise


def init_default_group(endpoint: Endpoint, backend: str, rank: int, world: int, timeout_s: float) -> None:
    """``torch.distributed.init_process_group`` over the authenticated store at ``endpoint``."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store, server = join(endpoint, rank, timeout)
    if server is not None:
        _DEFAULT_GROUP_SERVERS.append(server)
    _DEFAULT_GROUP_STORES.append(store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
