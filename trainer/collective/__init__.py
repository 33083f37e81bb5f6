"""The rendezvous of the job's collective groups, authenticated: the actor's process group and the
weight-sync broadcast group meet at a key-value store that only members holding the group's token can use.

- :mod:`.endpoint`: where a group meets (host, port) and its per-group token, drawn on rank 0's node and
  handed to the members through Ray (already authenticated by the job's Ray token);
- :mod:`.wire`: the handshake (each side proves the token by an HMAC of the other's nonce) and the framing
  (length-capped, HMAC-tagged JSON frames);
- :mod:`.store`: the server (rank 0 runs it in a thread); :mod:`.client`: a member's side, a
  ``torch.distributed.Store`` that gloo, NCCL and ``init_process_group`` use as they would a ``TCPStore``;
- :mod:`.groups`: joining a group (the broadcast group's store, the process's default group).

Why not torch's ``TCPStore``: it has no authentication, listens on every interface, and answers
``list_keys``, ``get`` and ``set`` to anyone who connects (so a secret key prefix would not hide anything).
"""
